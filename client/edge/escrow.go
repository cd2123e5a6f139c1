package edge

// Local consumes against an allowance (issue 27 item 2). For a customer
// and metric the Evaluator takes an ordinary reservation (the allowance's
// reservation), charges Consume calls against it in memory, and settles in the
// background: every SettleInterval a partial commit (commit with final:
// false) of the units used since the last one, and an extend that tops the
// hold up to the size the observed rate asks for, or prolongs it before it
// expires. Close settles what was used and returns the rest (a final
// commit). The server's books always include the whole reservation, so a process
// that dies loses at most the units it charged and had not settled (one
// settle interval's worth, counted in EscrowStats.AtRiskUnits); the rest of
// its reservation returns by itself at expires_at.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"math"
	"math/bits"
	"net/http"
	"sync"
	"time"

	"github.com/creditd/creditd/client"
)

// Defaults of EscrowConfig (invariant 11: every bound named).
const (
	// DefaultSettleInterval is how often an allowance settles: the bound
	// on the usage a dying process loses, against one partial commit and
	// at most one extend per interval on the server.
	DefaultSettleInterval = 200 * time.Millisecond
	// DefaultHorizon is how much usage, at the observed rate, an allowance
	// holds ("a few hundred ms", issue 27): enough that a top-up, asked
	// when half of it is left, lands before the rest is used.
	DefaultHorizon = 500 * time.Millisecond
	// DefaultMaxUnits bounds one allowance's reservation, in metric units: the
	// credit one process can keep from the others.
	DefaultMaxUnits = 10_000
	// DefaultReservationTTL is the reservation's ttl_seconds, renewed by extends: how
	// long the rest of a dead process's reservation stays taken (plus the
	// server's sweep, once a minute).
	DefaultReservationTTL = 30 * time.Second
	// DefaultHoldTTL is DefaultReservationTTL's name before v0.4.
	//
	// Deprecated: use DefaultReservationTTL.
	DefaultHoldTTL = DefaultReservationTTL
	// DefaultMaxWait bounds how long a consume beyond the allowance waits
	// for a top-up under OverflowWait.
	DefaultMaxWait = time.Second
	// DefaultMaxAllowances bounds the allowances (and their goroutines)
	// an Evaluator keeps; past it consumes go to the server.
	DefaultMaxAllowances = 1_000
	// DefaultCloseTimeout bounds Close's final settles.
	DefaultCloseTimeout = 10 * time.Second
	// callTimeout bounds one settle, extend or create (the client's own
	// retries included).
	callTimeout = 5 * time.Second
)

// Overflow is what a consume that the allowance cannot cover does.
type Overflow int

const (
	// OverflowWait waits up to MaxWait for a top-up, then goes to the
	// server (an HTTP consume).
	OverflowWait Overflow = iota
	// OverflowHTTP goes to the server at once and asks for a top-up in the
	// background.
	OverflowHTTP
)

// EscrowConfig configures local consumes; the zero value takes the
// defaults.
type EscrowConfig struct {
	// SettleInterval is the period of partial commits; <= 0 means
	// DefaultSettleInterval.
	SettleInterval time.Duration
	// Horizon is the usage, at the observed rate, a reservation is sized for;
	// <= 0 means DefaultHorizon.
	Horizon time.Duration
	// MinUnits is the smallest reservation taken (metric units); <= 0 means 1.
	MinUnits int64
	// MaxUnits bounds a reservation (metric units); <= 0 means DefaultMaxUnits.
	// A consume of more units goes to the server.
	MaxUnits int64
	// ReservationTTL is the reservation's lifetime, renewed while in use; whole seconds,
	// 1 s to 24 h; <= 0 means DefaultReservationTTL.
	ReservationTTL time.Duration
	// HoldTTL is ReservationTTL's name before v0.4, read when
	// ReservationTTL is not set.
	//
	// Deprecated: use ReservationTTL.
	HoldTTL time.Duration
	// Overflow is what a consume beyond the allowance does.
	Overflow Overflow
	// MaxWait bounds an OverflowWait; <= 0 means DefaultMaxWait.
	MaxWait time.Duration
	// MaxAllowances bounds the allowances kept; <= 0 means
	// DefaultMaxAllowances.
	MaxAllowances int
	// CloseTimeout bounds Close's final settles; <= 0 means
	// DefaultCloseTimeout.
	CloseTimeout time.Duration
	// Metadata is written on every reservation and HTTP consume (to tell the
	// processes of a fleet apart in the ledger).
	Metadata map[string]any
}

func (c *EscrowConfig) defaults() {
	if c.SettleInterval <= 0 {
		c.SettleInterval = DefaultSettleInterval
	}
	if c.Horizon <= 0 {
		c.Horizon = DefaultHorizon
	}
	if c.MinUnits <= 0 {
		c.MinUnits = 1
	}
	if c.MaxUnits <= 0 {
		c.MaxUnits = DefaultMaxUnits
	}
	c.MinUnits = min(c.MinUnits, c.MaxUnits)
	if c.ReservationTTL <= 0 {
		c.ReservationTTL = c.HoldTTL
	}
	if c.ReservationTTL <= 0 {
		c.ReservationTTL = DefaultReservationTTL
	}
	c.ReservationTTL = min(max(c.ReservationTTL.Truncate(time.Second), time.Second), 24*time.Hour)
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.MaxAllowances <= 0 {
		c.MaxAllowances = DefaultMaxAllowances
	}
	if c.CloseTimeout <= 0 {
		c.CloseTimeout = DefaultCloseTimeout
	}
}

// Charge is what a Consume charged.
type Charge struct {
	// Units charged, of the metric.
	Units int64
	// Cost in millicredits: units at the reservation's unit price when Local,
	// else the HTTP consume's cost.
	Cost int64
	// Local is true when the units were charged against the allowance in
	// memory (settled later); false when creditd charged them (Result).
	Local bool
	// Result is the HTTP consume's answer when not Local.
	Result *client.ConsumeResult
}

// EscrowStats are an Evaluator's local consume counters, in metric units
// (summed over every customer and metric). AtRiskUnits is what a crash now
// would lose: charged locally, not yet confirmed by creditd.
type EscrowStats struct {
	// ConsumedLocalUnits were charged against allowances in memory.
	ConsumedLocalUnits int64
	// SettledUnits of those were charged by creditd (partial and final
	// commits answered 2xx).
	SettledUnits int64
	// AtRiskUnits were charged locally and are not settled yet: lost if
	// the process dies now (bounded by one settle interval's usage plus a
	// settle in flight).
	AtRiskUnits int64
	// MaxAtRiskUnits is AtRiskUnits' high-water mark.
	MaxAtRiskUnits int64
	// UncollectedUnits were charged locally but creditd refused to settle
	// them (the reservation was gone, or a price rise made them cost more than
	// the reservation and the free balance under block).
	UncollectedUnits int64
	// HTTPUnits were charged by creditd through HTTP consumes.
	HTTPUnits int64
	// RefusedUnits were refused locally after creditd refused a top-up.
	RefusedUnits int64
	// Allowances is the number of customer and metric allowances kept
	// (each with its goroutine; at most MaxAllowances).
	Allowances int
	// Settles, TopUps and TopUpsRefused count the calls that moved reservations.
	Settles, TopUps, TopUpsRefused int64
}

// ErrClosed is returned by Consume after Close.
var ErrClosed = errors.New("edge: evaluator closed")

// escrow holds the allowances of an Evaluator.
type escrow struct {
	e   *Evaluator
	cfg EscrowConfig

	mu     sync.RWMutex
	by     map[string]*allowance
	closed bool
	ctx    context.Context
	cancel context.CancelFunc
	done   sync.WaitGroup

	statsMu sync.Mutex
	stats   EscrowStats
}

// allowance is one customer's and metric's reservation and what was charged
// against it. Units are metric units; the reservation's estimated_units total
// every unit it ever held, so held - charged is what is left.
type allowance struct {
	customer, metric string
	perUnit          int64 // millicredits, the per_unit rule's price
	policy           string

	mu       sync.Mutex
	id       string // the reservation's id; "" until taken
	held     int64  // the reservation's estimated_units
	charged  int64  // units charged locally, settled or not
	pending  int64  // charged, not yet in a settle
	inflight int64  // in the settle being sent
	expires  time.Time
	closed   bool
	// need is the largest consume waiting for a top-up, demand the units
	// asked since the last tick (charged or not), rate the smoothed demand
	// per settle interval.
	need, demand, rate int64
	// refusedUntil: a top-up was refused; until then consumes beyond the
	// reservation are refused (block) or sent to the server, without asking again.
	refusedUntil time.Time
	// idle counts settle intervals without a consume; returning is set
	// while an idle allowance's final commit gives its reservation back, and no
	// consume may be charged against it.
	idle      int
	returning bool
	// exact, when set, is the size the next top-up asks for: a waiting
	// consume's, after a bigger top-up was refused.
	exact   int64
	changed chan struct{} // closed when what is left or the refusal changes
	kick    chan struct{}

	// Calls awaiting an answer keep their Idempotency-Key, so a retry of
	// the same settle applies once (invariant 4).
	settle *call
	extend *call
	create *call
}

// call is one server call with its own Idempotency-Key and body.
type call struct {
	key             string
	units, addUnits int64
	ttl, final      bool
}

func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return "edge-" + hex.EncodeToString(b[:])
}

// retryable reports whether err may be sent again with the same key: a
// transport error, a 429 or 5xx, or a twin still in progress.
func retryable(err error) bool {
	p, ok := client.AsProblem(err)
	return !ok || p.Status >= 500 || p.Status == http.StatusTooManyRequests || p.InProgress()
}

func (x *escrow) add(f func(*EscrowStats)) {
	x.statsMu.Lock()
	f(&x.stats)
	if x.stats.AtRiskUnits > x.stats.MaxAtRiskUnits {
		x.stats.MaxAtRiskUnits = x.stats.AtRiskUnits
	}
	x.statsMu.Unlock()
}

// Stats returns the local consume counters. Safe for concurrent use.
func (e *Evaluator) Stats() EscrowStats {
	x := e.escrowOf()
	x.statsMu.Lock()
	s := x.stats
	x.statsMu.Unlock()
	x.mu.RLock()
	s.Allowances = len(x.by)
	x.mu.RUnlock()
	return s
}

func (e *Evaluator) escrowOf() *escrow {
	e.escrowOnce.Do(func() {
		cfg := e.cfg.Escrow
		cfg.defaults()
		ctx, cancel := context.WithCancel(context.Background())
		e.escrow = &escrow{e: e, cfg: cfg, by: map[string]*allowance{}, ctx: ctx, cancel: cancel}
	})
	return e.escrow
}

// Consume charges units of metric to customer (own or external id). A
// per_unit metric is charged in memory against the customer's allowance
// when it covers the units (Local; settled within a settle interval);
// beyond it the consume waits for a top-up or goes to the server, as
// Overflow says. Metrics priced otherwise (flat, tiered: a settle of summed
// units would not cost the sum of the calls' prices), metrics the plan
// denies, and consumes larger than MaxUnits go to the server. When creditd
// refused a top-up under block, a consume beyond what is held is refused
// with a *client.Problem of type insufficient-credits, as the server would.
// Errors: that refusal, ErrClosed, the context's, or the HTTP consume's.
// Safe for concurrent use.
func (e *Evaluator) Consume(ctx context.Context, customer, metric string, units int64) (Charge, error) {
	x := e.escrowOf()
	if units < 1 {
		return x.viaHTTP(ctx, customer, metric, units) // its 422 is the server's
	}
	a, err := x.allowance(ctx, customer, metric)
	if err != nil {
		return Charge{}, err
	}
	if a == nil || units > x.cfg.MaxUnits {
		return x.viaHTTP(ctx, customer, metric, units)
	}
	var deadline <-chan time.Time
	counted := false
	for {
		a.mu.Lock()
		if a.closed {
			a.mu.Unlock()
			return Charge{}, ErrClosed
		}
		if !counted {
			a.demand += units
			counted = true
		}
		if a.id != "" && !a.returning && a.held-a.charged >= units {
			a.charged += units
			a.pending += units
			cost := units * a.perUnit
			a.mu.Unlock()
			x.add(func(s *EscrowStats) { s.ConsumedLocalUnits += units; s.AtRiskUnits += units })
			return Charge{Units: units, Cost: cost, Local: true}, nil
		}
		if e.cfg.Now().Before(a.refusedUntil) {
			a.mu.Unlock()
			if a.policy == "block" {
				x.add(func(s *EscrowStats) { s.RefusedUnits += units })
				return Charge{}, &client.Problem{Type: client.ProblemInsufficientCredits, Title: "Insufficient credits",
					Status: http.StatusConflict, Detail: "refused by the evaluator: creditd refused to top up the allowance, and the customer's policy is block"}
			}
			return x.viaHTTP(ctx, customer, metric, units)
		}
		a.need = max(a.need, units)
		ch := a.changed
		a.mu.Unlock()
		select {
		case a.kick <- struct{}{}:
		default:
		}
		if x.cfg.Overflow == OverflowHTTP {
			return x.viaHTTP(ctx, customer, metric, units)
		}
		if deadline == nil {
			t := time.NewTimer(x.cfg.MaxWait)
			defer t.Stop()
			deadline = t.C
		}
		select {
		case <-ch:
		case <-deadline:
			return x.viaHTTP(ctx, customer, metric, units)
		case <-ctx.Done():
			return Charge{}, ctx.Err()
		}
	}
}

func (x *escrow) viaHTTP(ctx context.Context, customer, metric string, units int64) (Charge, error) {
	in := client.ConsumeInput{CustomerID: customer, BillableMetricKey: metric, Units: units, Metadata: x.cfg.Metadata}
	res, err := x.e.c.Consume(ctx, in)
	if err != nil {
		return Charge{}, err
	}
	x.add(func(s *EscrowStats) { s.HTTPUnits += units })
	return Charge{Units: units, Cost: res.Charged, Result: res}, nil
}

// allowance returns customer's and metric's allowance, made (with its
// goroutine) on first use; nil when the metric is not charged locally.
func (x *escrow) allowance(ctx context.Context, customer, metric string) (*allowance, error) {
	k := customer + "\x00" + metric
	x.mu.RLock()
	a, closed := x.by[k], x.closed
	x.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	if a != nil {
		return a, nil
	}
	e := x.e
	e.mu.Lock()
	en := e.refs[customer]
	if en == nil || en.snap == nil || e.policyOf(en) == "" {
		e.mu.Unlock()
		var err error
		if en, err = e.fetchShared(ctx, customer); err != nil {
			return nil, err
		}
		e.mu.Lock()
	}
	per, policy, ok := priced(en.snap, e.policyOf(en), metric, x.cfg.MaxUnits)
	id := en.id
	e.mu.Unlock()
	if !ok {
		return nil, nil
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil, ErrClosed
	}
	if a := x.by[k]; a != nil {
		return a, nil
	}
	if len(x.by) >= x.cfg.MaxAllowances {
		return nil, nil
	}
	a = &allowance{customer: id, metric: metric, perUnit: per, policy: policy,
		changed: make(chan struct{}), kick: make(chan struct{}, 1)}
	x.by[k] = a
	x.done.Add(1)
	go x.run(a)
	return a, nil
}

// priced says whether metric may be charged locally for a snapshot: a
// per_unit rule (the cost of summed units is the sum of their costs, so a
// settle charges what the calls would have) that the plan does not deny.
func priced(snap *client.Snapshot, policy, metric string, maxUnits int64) (perUnit int64, pol string, ok bool) {
	se, found := snap.Entitlements[metric]
	if !found || se.Type != "metered" || se.CostType == nil || *se.CostType != "per_unit" ||
		se.EstimatedCostPerUnit == nil || *se.EstimatedCostPerUnit < 0 || policy == "" {
		return 0, "", false
	}
	per := *se.EstimatedCostPerUnit
	if !se.Allowed && (per <= snap.AvailableMC || policy != "block") {
		return 0, "", false // the plan or an overdue subscription denies it
	}
	if hi, lo := bits.Mul64(uint64(per), uint64(maxUnits)*2); hi != 0 || lo > math.MaxInt64 {
		return 0, "", false // a reservation's cost could pass int64 (invariant 7)
	}
	return per, policy, true
}

// reservationUnits is the reservation an allowance asks for: the smoothed demand per
// settle interval scaled to horizon, at least the largest waiting consume,
// within [minUnits, maxUnits].
func reservationUnits(ratePerInterval int64, horizon, interval time.Duration, need, minUnits, maxUnits int64) int64 {
	n := ratePerInterval
	if interval > 0 && n > 0 {
		hi, lo := bits.Mul64(uint64(n), uint64(horizon))
		if hi != 0 {
			n = maxUnits
		} else {
			n = int64((lo + uint64(interval) - 1) / uint64(interval))
		}
		if n < 0 {
			n = maxUnits
		}
	}
	return min(max(n, need, minUnits), maxUnits)
}

// topUpUnits is what to add to a reservation with left units unused to reach
// target: nothing while at least half of target is left (a top-up per
// consume would cost what local consumes save).
func topUpUnits(left, target, need int64) int64 {
	if left >= need && left*2 >= target {
		return 0
	}
	return max(target-left, need-left, 0)
}

// smooth folds one interval's demand into the rate (an exponential
// average with weight 1/2: a burst doubles the reservation within two intervals,
// a pause halves it).
func smooth(rate, demand int64) int64 {
	return rate/2 + demand/2 + (rate%2+demand%2)/2
}

// wakeLocked tells the consumes waiting on a that what is left, or the
// refusal, changed; a.mu is held.
func (a *allowance) wakeLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// run keeps one allowance: a settle and a top-up check every interval, a
// top-up at once when a consume waits, the final settle when the escrow
// closes.
func (x *escrow) run(a *allowance) {
	defer x.done.Done()
	t := time.NewTicker(x.cfg.SettleInterval)
	defer t.Stop()
	for {
		select {
		case <-x.ctx.Done():
			x.finish(a)
			return
		case <-t.C:
			a.mu.Lock()
			a.rate = smooth(a.rate, a.demand)
			if a.demand == 0 {
				a.idle++
			} else {
				a.idle = 0
			}
			a.demand = 0
			idle := a.idle >= x.idleTicks() && a.id != "" && a.need == 0
			if idle {
				a.returning = true
			}
			a.mu.Unlock()
			x.settle(a, idle)
			if !x.returned(a) {
				x.topUp(a)
			}
		case <-a.kick:
			x.topUp(a)
		}
	}
}

// idleTicks is how many settle intervals without a consume make an
// allowance give its reservation back: half its lifetime, when it would otherwise
// be prolonged, so an idle process keeps no credit from the others.
func (x *escrow) idleTicks() int {
	return max(int(x.cfg.ReservationTTL/2/x.cfg.SettleInterval), 1)
}

// returned ends a return of the reservation that the final commit finished (the
// next consume takes a new reservation), and reports whether one is still under
// way (its final commit to be sent again).
func (x *escrow) returned(a *allowance) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.returning {
		return false
	}
	if a.settle != nil && a.settle.final && a.id != "" {
		return true
	}
	a.returning, a.idle = false, 0
	if a.id == "" {
		a.held, a.charged = 0, 0
	}
	a.wakeLocked()
	return false
}

func (x *escrow) callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(x.ctx, callTimeout)
}

// settle sends the units charged since the last settle as a partial
// commit, or (final) the final commit of what is left to charge, which
// returns the rest of the reservation. A settle that failed in a way that may be
// retried is sent again first, with its key and units (a retried partial
// commit applies once, invariant 4).
func (x *escrow) settle(a *allowance, final bool) {
	a.mu.Lock()
	closing := a.closed
	a.mu.Unlock()
	ctx, cancel := x.callCtx()
	if closing {
		// Close waits for it, past the escrow's cancelled context.
		ctx, cancel = context.WithTimeout(context.Background(), x.cfg.CloseTimeout)
	}
	defer cancel()
	for {
		a.mu.Lock()
		if a.id == "" {
			a.mu.Unlock()
			return
		}
		if a.settle == nil {
			switch {
			case a.pending > 0 && !final:
				a.settle = &call{key: newKey(), units: a.pending}
			case final:
				a.settle = &call{key: newKey(), units: a.pending, final: true}
			default:
				a.mu.Unlock()
				return
			}
			a.inflight, a.pending = a.inflight+a.pending, 0
		}
		s, id := a.settle, a.id
		a.mu.Unlock()
		in := client.CommitInput{ActualUnits: &s.units}
		if !s.final {
			in.Final = client.Ptr(false)
		}
		res, err := x.e.c.CommitReservation(ctx, id, in, client.WithIdempotencyKey(s.key))
		a.mu.Lock()
		switch {
		case err == nil:
			a.inflight -= s.units
			a.settle = nil
			if s.final {
				a.id = ""
			} else {
				a.fitLocked(s.units, res)
			}
			a.mu.Unlock()
			x.add(func(st *EscrowStats) { st.Settles++; st.SettledUnits += s.units; st.AtRiskUnits -= s.units })
			if s.final || !final {
				return
			}
		case retryable(err):
			a.mu.Unlock()
			x.e.report(err)
			if !closing || !sleep(ctx, x.cfg.SettleInterval) {
				return
			}
		default:
			// Refused: the reservation is gone (expired, 404) or the units cost
			// more than it and the free balance (a price rise under
			// block). They were given and cannot be charged now.
			a.inflight -= s.units
			a.settle = nil
			lost := s.units
			if gone(err) {
				lost += a.pending
				a.pending = 0
				a.id, a.held, a.charged, a.extend = "", 0, 0, nil
				a.wakeLocked()
			}
			a.mu.Unlock()
			x.e.report(err)
			x.add(func(st *EscrowStats) { st.UncollectedUnits += lost; st.AtRiskUnits -= lost })
			if !final {
				return
			}
		}
	}
}

// fitLocked makes what is left match what the reservation still holds after a
// partial commit of units: priced at the rule current at the commit, the
// reservation's remaining_cost covers remaining_cost / price units, less those
// charged since. With the price unchanged this changes nothing; after a
// price change the allowance follows it within one settle (a rise would
// otherwise have every unit held at the old price settled at the new one,
// refused under block once the free balance is short).
func (a *allowance) fitLocked(units int64, res *client.CommitResult) {
	if units >= 1 && res.ActualCost >= 0 {
		a.perUnit = res.ActualCost / units
	}
	a.fitRemainingLocked(res.RemainingCost)
}

// fitRemainingLocked sets what is left from the reservation's remaining_cost
// (millicredits) at the last price seen: the units pending and in flight
// will draw on it too.
func (a *allowance) fitRemainingLocked(remainingCost int64) {
	if a.perUnit > 0 && remainingCost >= 0 {
		a.held = a.charged - a.pending - a.inflight + remainingCost/a.perUnit
	}
}

// gone reports whether err says the reservation no longer takes commits.
func gone(err error) bool {
	p, ok := client.AsProblem(err)
	return ok && (p.Status == http.StatusNotFound || p.Type == client.ProblemReservationExpired || p.Type == client.ProblemConflict)
}

// topUp takes the reservation if there is none, else extends it by what the rate
// asks for and prolongs it when half its lifetime is gone (also while
// top-ups are refused: the reservation must outlive the settle of what it covered).
func (x *escrow) topUp(a *allowance) {
	now := x.e.cfg.Now()
	a.mu.Lock()
	refused := now.Before(a.refusedUntil)
	// No reservation is taken until a consume asks for one.
	if a.closed || a.returning || (a.id == "" && (refused || a.need == 0)) {
		a.mu.Unlock()
		return
	}
	target := reservationUnits(a.rate, x.cfg.Horizon, x.cfg.SettleInterval, a.need, x.cfg.MinUnits, x.cfg.MaxUnits)
	if a.exact > 0 {
		target = a.exact
	}
	need := a.need
	if a.id == "" {
		if a.create == nil {
			a.create = &call{key: newKey(), units: target}
			a.exact = 0
		}
		c := a.create
		a.mu.Unlock()
		ctx, cancel := x.callCtx()
		defer cancel()
		x.take(ctx, a, c, need)
		return
	}
	left := a.held - a.charged
	add := int64(0)
	if !refused {
		add = topUpUnits(left, target, need)
		if a.exact > 0 {
			add = max(a.exact-left, 0)
		}
		// A reservation never covers more than MaxUnits beyond what was charged.
		add = min(add, x.cfg.MaxUnits-left)
	}
	prolong := a.expires.Sub(now) < x.cfg.ReservationTTL/2
	if a.extend == nil && (add > 0 || prolong) {
		a.extend = &call{key: newKey(), addUnits: max(add, 0), ttl: prolong}
		a.exact = 0
	}
	c, id := a.extend, a.id
	a.mu.Unlock()
	if c == nil {
		return
	}
	ctx, cancel := x.callCtx()
	defer cancel()
	in := client.ExtendInput{}
	if c.addUnits > 0 {
		in.AdditionalUnits = client.Ptr(c.addUnits)
	}
	if c.ttl {
		in.TTLSeconds = client.Ptr(int(x.cfg.ReservationTTL / time.Second))
	}
	res, err := x.e.c.ExtendReservation(ctx, id, in, client.WithIdempotencyKey(c.key))
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err == nil:
		a.extend = nil
		if a.id == id {
			// An extend's units are priced now, the reservation's older ones were
			// priced then: what it covers is its remaining cost at the price
			// the last settle showed.
			a.expires = res.ExpiresAt
			a.fitRemainingLocked(res.RemainingCost)
			if a.held-a.charged >= a.need {
				a.need = 0
			}
			a.wakeLocked()
		}
		if c.addUnits > 0 {
			x.add(func(s *EscrowStats) { s.TopUps++ })
		}
	case retryable(err):
		x.e.report(err)
	case client.IsProblem(err, client.ProblemInsufficientCredits):
		a.extend = nil
		x.refusedLocked(a, now, c.addUnits, need, a.held-a.charged)
	default:
		a.extend = nil
		x.e.report(err)
		if gone(err) && a.id == id && a.settle == nil && a.pending == 0 && a.inflight == 0 {
			a.id, a.held, a.charged = "", 0, 0
			a.wakeLocked()
		}
	}
}

// refusedLocked notes a refused top-up of asked units, with left units
// unused and need the largest waiting consume. A refusal of more than the
// waiting consume needs (at least one unit) is asked again at a quarter of
// the size at once: the free balance may cover a smaller reservation, and the
// server would let those consumes through. Once even that is refused,
// consumes beyond what is left are refused (or sent to the server) for one
// settle interval.
func (x *escrow) refusedLocked(a *allowance, now time.Time, asked, need, left int64) {
	x.add(func(s *EscrowStats) { s.TopUpsRefused++ })
	if floor := max(need-left, 1); asked > floor {
		a.exact = left + max(asked/4, floor)
		select {
		case a.kick <- struct{}{}:
		default:
		}
		return
	}
	a.refusedUntil = now.Add(x.cfg.SettleInterval)
	a.need = 0
	a.wakeLocked()
}

// take creates the reservation.
func (x *escrow) take(ctx context.Context, a *allowance, c *call, need int64) {
	ttl := int(x.cfg.ReservationTTL / time.Second)
	in := client.ReserveInput{CustomerID: &a.customer, BillableMetricKey: a.metric, EstimatedUnits: c.units,
		TTLSeconds: &ttl, Metadata: x.cfg.Metadata}
	res, err := x.e.c.CreateReservation(ctx, in, client.WithIdempotencyKey(c.key))
	now := x.e.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case err == nil:
		a.create = nil
		a.id, a.held, a.charged, a.expires = res.ID, res.EstimatedUnits, 0, res.ExpiresAt
		if a.held >= a.need {
			a.need = 0
		}
		a.wakeLocked()
	case retryable(err):
		x.e.report(err)
	case client.IsProblem(err, client.ProblemInsufficientCredits):
		a.create = nil
		x.refusedLocked(a, now, c.units, need, 0)
	default:
		a.create = nil
		x.e.report(err)
		a.refusedUntil = now.Add(x.cfg.SettleInterval)
		a.wakeLocked()
	}
}

// finish stops local consumes on a, then settles what was used and
// returns the rest of the reservation.
func (x *escrow) finish(a *allowance) {
	a.mu.Lock()
	a.closed = true
	a.wakeLocked()
	c := a.create
	a.mu.Unlock()
	if c != nil {
		// A create whose answer was lost may have taken a reservation: the same
		// key answers it, and the final commit returns it.
		ctx, cancel := context.WithTimeout(context.Background(), x.cfg.CloseTimeout)
		defer cancel()
		x.take(ctx, a, c, 0)
	}
	x.settle(a, true)
}

// closeEscrow ends local consumes and waits for the final settles.
func (e *Evaluator) closeEscrow() {
	x := e.escrowOf()
	x.mu.Lock()
	x.closed = true
	x.mu.Unlock()
	x.cancel()
	x.done.Wait()
}
