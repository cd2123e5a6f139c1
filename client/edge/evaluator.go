// Package edge answers entitlement checks in the caller's process (issue
// 27 item 1): an Evaluator keeps the entitlement snapshots of the
// customers it is asked about, follows the tenant's change stream
// (GET /v1/changes/stream) to drop what a change made stale, and answers
// Check from memory with the fields of the HTTP check plus the answer's
// age. It imports nothing of the server.
//
// What it answers from memory: boolean and static metrics, and metered
// metrics priced flat or per unit. Gauges (their counts change without an
// event), tiered prices (the snapshot carries the price of one unit only)
// and metrics the snapshot does not list are asked over HTTP every time.
package edge

import (
	"container/list"
	"context"
	"encoding/json"
	"errors"
	"math"
	"math/bits"
	"strings"
	"sync"
	"time"

	"github.com/creditd/creditd/client"
)

// Defaults of Config (invariant 11: every bound named).
const (
	// DefaultMaxCustomers bounds the snapshots an Evaluator keeps.
	DefaultMaxCustomers = 10_000
	// DefaultMaxAge is how old an answer from memory may be. The change
	// stream beats once a second, so a live stream keeps answers well
	// under it; past it the stream is down or stuck.
	DefaultMaxAge = 3 * time.Second
	// DefaultRefetchers bounds the snapshot fetches running in the
	// background after changes.
	DefaultRefetchers = 4
	// reconnectMin and reconnectMax bound the wait before the stream is
	// opened again (doubling from the first to the second).
	reconnectMin = 100 * time.Millisecond
	reconnectMax = 5 * time.Second
)

// Fallback is what Check does when memory cannot answer within MaxAge.
type Fallback int

const (
	// FallbackHTTP asks creditd (GET /v1/customers/{id}/entitlements/{metric}).
	FallbackHTTP Fallback = iota
	// FallbackOpen answers allowed, with the figures memory has (if any).
	FallbackOpen
	// FallbackClosed answers not allowed, with the figures memory has.
	FallbackClosed
)

// Source says where an answer came from.
type Source string

const (
	SourceMemory Source = "memory" // a snapshot within MaxAge
	SourceHTTP   Source = "http"   // an HTTP check, just now
	SourcePolicy Source = "policy" // the Fallback policy (open or closed)
)

// Config configures an Evaluator; the zero value takes the defaults.
type Config struct {
	// MaxCustomers bounds the snapshots kept (least recently checked go
	// first); <= 0 means DefaultMaxCustomers.
	MaxCustomers int
	// MaxAge bounds the age of an answer from memory; <= 0 means
	// DefaultMaxAge.
	MaxAge time.Duration
	// Fallback is used past MaxAge, and when creditd cannot be asked.
	Fallback Fallback
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
	// OnError, when set, hears of stream and background fetch failures,
	// and of settles, top-ups and reservations creditd did not take.
	OnError func(error)
	// Escrow configures local consumes (Consume).
	Escrow EscrowConfig
}

// Answer is a check's result: the HTTP check's fields, its age (how long
// before the answer the figures were known current) and its source.
type Answer struct {
	client.CheckResult
	Age    time.Duration
	Source Source
}

// Evaluator answers checks from memory. Safe for concurrent use. Start
// the stream with Start; Close stops it.
type Evaluator struct {
	c   *client.Client
	cfg Config

	mu sync.Mutex
	// byID holds the snapshots by customer id, in an LRU list (front: last
	// checked); refs maps every id or external id asked under to its entry.
	byID map[string]*entry
	refs map[string]*entry
	lru  *list.List
	// epoch moves on every change that may alter any customer's check (a
	// config change, a reset): every entry of an older epoch is stale.
	epoch uint64
	// tenantPolicy is the tenant's default overage policy ("" unknown).
	tenantPolicy string
	// Stream state: cursor to resume from, up while a stream is open,
	// beat the last heartbeat (figures known current up to it).
	cursor string
	up     bool
	beat   time.Time
	// events counts customer events; during fetches, recent remembers the
	// count at each customer's last one, so a fetch that raced an event is
	// not kept as current.
	events   uint64
	fetching int
	recent   map[string]uint64
	// flights are the fetches running, by the id asked under.
	flights map[string]*flight

	refetch chan string
	cancel  context.CancelFunc
	done    sync.WaitGroup

	// escrow holds the allowances of Consume, made on first use.
	escrowOnce sync.Once
	escrow     *escrow
}

type entry struct {
	id     string // the customer's service id
	refs   []string
	snap   *client.Snapshot
	policy string // the customer's own overage policy, "" for the tenant's
	at     time.Time
	epoch  uint64
	stale  bool
	queued bool
	elem   *list.Element
}

// New builds an Evaluator over c.
func New(c *client.Client, cfg Config) *Evaluator {
	if cfg.MaxCustomers <= 0 {
		cfg.MaxCustomers = DefaultMaxCustomers
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Evaluator{c: c, cfg: cfg, byID: map[string]*entry{}, refs: map[string]*entry{},
		lru: list.New(), recent: map[string]uint64{}, flights: map[string]*flight{}, refetch: make(chan string, 1024)}
}

// Start follows the change stream until ctx ends or Close.
func (e *Evaluator) Start(ctx context.Context) {
	ctx, e.cancel = context.WithCancel(ctx)
	e.done.Add(1 + DefaultRefetchers)
	go e.follow(ctx)
	for range DefaultRefetchers {
		go e.refetcher(ctx)
	}
}

// Close settles what Consume charged locally and returns the rest of
// every reservation (bounded by EscrowConfig.CloseTimeout), then stops the stream
// and the background fetches and waits for them.
func (e *Evaluator) Close() {
	e.closeEscrow()
	if e.cancel != nil {
		e.cancel()
	}
	e.done.Wait()
}

// StreamUp reports whether the change stream is open.
func (e *Evaluator) StreamUp() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.up
}

// Cursor is the change stream's last id seen ("" before the first).
func (e *Evaluator) Cursor() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cursor
}

// Check answers whether customer (own or external id) may use metric for
// units now, as GET /v1/customers/{id}/entitlements/{metric} would. The
// first check of a customer fetches its snapshot. Errors: a *client.Problem
// creditd answered (404 for a metered metric without a rule, 400 for
// units), or a transport error under FallbackHTTP.
func (e *Evaluator) Check(ctx context.Context, customer, metric string, units int64) (Answer, error) {
	if units < 1 {
		units = 1
	}
	now := e.cfg.Now()
	e.mu.Lock()
	en := e.refs[customer]
	if en != nil && e.current(en) {
		e.lru.MoveToFront(en.elem)
		age := e.ageLocked(en, now)
		res, ok := local(en.snap, e.policyOf(en), metric, units)
		e.mu.Unlock()
		switch {
		case !ok:
			return e.viaHTTP(ctx, customer, metric, units, nil)
		case age <= e.cfg.MaxAge:
			return Answer{CheckResult: res, Age: age, Source: SourceMemory}, nil
		case e.cfg.Fallback == FallbackHTTP:
			return e.viaHTTP(ctx, customer, metric, units, nil)
		}
		return policyAnswer(e.cfg.Fallback, &res, age), nil
	}
	e.mu.Unlock()
	en, err := e.fetchShared(ctx, customer)
	if err != nil {
		if e.cfg.Fallback == FallbackHTTP {
			return Answer{}, err
		}
		return policyAnswer(e.cfg.Fallback, &client.CheckResult{BillableMetricKey: metric}, 0), nil
	}
	e.mu.Lock()
	age := e.ageLocked(en, e.cfg.Now())
	res, ok := local(en.snap, e.policyOf(en), metric, units)
	e.mu.Unlock()
	if !ok {
		return e.viaHTTP(ctx, customer, metric, units, nil)
	}
	return Answer{CheckResult: res, Age: age, Source: SourceMemory}, nil
}

// current reports whether en may answer: fetched, not made stale by a
// change since, and the tenant's policy known.
func (e *Evaluator) current(en *entry) bool {
	return en.snap != nil && !en.stale && en.epoch == e.epoch && (en.policy != "" || e.tenantPolicy != "")
}

// ageLocked is how long ago en's figures were last known current: its
// fetch, or the moment the stream's last heartbeat vouches for, when later
// and the stream is up.
func (e *Evaluator) ageLocked(en *entry, now time.Time) time.Duration {
	known := en.at
	if e.up && e.beat.After(known) {
		known = e.beat
	}
	return max(now.Sub(known), 0)
}

func (e *Evaluator) policyOf(en *entry) string {
	if en.policy != "" {
		return en.policy
	}
	return e.tenantPolicy
}

// viaHTTP asks creditd; a transport failure under FallbackOpen or
// FallbackClosed is answered by the policy, with stale's figures.
func (e *Evaluator) viaHTTP(ctx context.Context, customer, metric string, units int64, stale *client.CheckResult) (Answer, error) {
	res, err := e.c.CheckCustomerEntitlement(ctx, customer, metric, &client.CheckCustomerEntitlementParams{Units: &units})
	if err != nil {
		var p *client.Problem
		if errors.As(err, &p) && p.Status < 500 || e.cfg.Fallback == FallbackHTTP {
			return Answer{}, err
		}
		if stale == nil {
			stale = &client.CheckResult{BillableMetricKey: metric}
		}
		return policyAnswer(e.cfg.Fallback, stale, 0), nil
	}
	return Answer{CheckResult: *res, Source: SourceHTTP}, nil
}

// policyAnswer is res with allowed set by the fail-open or fail-closed
// policy.
func policyAnswer(f Fallback, res *client.CheckResult, age time.Duration) Answer {
	a := Answer{CheckResult: *res, Age: age, Source: SourcePolicy}
	a.Allowed = f == FallbackOpen
	return a
}

// flight is one fetch of a customer that concurrent callers share.
type flight struct {
	done chan struct{}
	en   *entry
	err  error
}

// fetchShared fetches ref once for every caller that needs it at the same
// time (a config change makes every busy customer's next checks miss at
// once). A waiter whose leader failed fetches on its own, so one caller's
// cancelled context is not another's error.
func (e *Evaluator) fetchShared(ctx context.Context, ref string) (*entry, error) {
	e.mu.Lock()
	if fl := e.flights[ref]; fl != nil {
		e.mu.Unlock()
		select {
		case <-fl.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if fl.err == nil {
			return fl.en, nil
		}
		return e.fetch(ctx, ref)
	}
	fl := &flight{done: make(chan struct{})}
	e.flights[ref] = fl
	e.mu.Unlock()
	fl.en, fl.err = e.fetch(ctx, ref)
	e.mu.Lock()
	delete(e.flights, ref)
	e.mu.Unlock()
	close(fl.done)
	return fl.en, fl.err
}

// fetch reads customer's snapshot and overage policy (and the tenant's
// default, when not known) and keeps them. A change that arrived while it
// ran leaves the entry stale: this caller gets the figures, the next
// fetches again.
func (e *Evaluator) fetch(ctx context.Context, ref string) (*entry, error) {
	e.mu.Lock()
	start, epoch, events := e.cfg.Now(), e.epoch, e.events
	needTenant := e.tenantPolicy == ""
	e.fetching++
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		if e.fetching--; e.fetching == 0 {
			clear(e.recent)
		}
		e.mu.Unlock()
	}()
	snap, err := e.c.EntitlementSnapshot(ctx, ref, &client.EntitlementSnapshotParams{CacheControl: client.Ptr("no-cache")})
	if err != nil {
		return nil, err
	}
	cust, err := e.c.GetCustomer(ctx, snap.CustomerID)
	if err != nil {
		return nil, err
	}
	var tenantPolicy string
	if needTenant {
		t, err := e.c.GetTenant(ctx)
		if err != nil {
			return nil, err
		}
		tenantPolicy = t.DefaultOveragePolicy
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if tenantPolicy != "" && e.epoch == epoch {
		e.tenantPolicy = tenantPolicy
	}
	en := e.byID[snap.CustomerID]
	if en == nil {
		en = &entry{id: snap.CustomerID}
		en.elem = e.lru.PushFront(en)
		e.byID[en.id] = en
		e.evictLocked()
	} else {
		e.lru.MoveToFront(en.elem)
	}
	if e.refs[ref] != en {
		if old := e.refs[ref]; old != nil {
			old.refs = dropRef(old.refs, ref)
		}
		e.refs[ref] = en
		en.refs = append(en.refs, ref)
	}
	en.snap, en.at, en.epoch = snap, start, epoch
	en.policy = ""
	if cust.OveragePolicy != nil {
		en.policy = *cust.OveragePolicy
	}
	en.stale = e.epoch != epoch || e.recent[snap.CustomerID] > events
	if needTenant && tenantPolicy == "" {
		en.stale = true
	}
	return en, nil
}

func dropRef(refs []string, ref string) []string {
	out := refs[:0]
	for _, r := range refs {
		if r != ref {
			out = append(out, r)
		}
	}
	return out
}

// evictLocked drops the least recently checked snapshots past the bound.
func (e *Evaluator) evictLocked() {
	for e.lru.Len() > e.cfg.MaxCustomers {
		en := e.lru.Remove(e.lru.Back()).(*entry)
		delete(e.byID, en.id)
		for _, r := range en.refs {
			if e.refs[r] == en {
				delete(e.refs, r)
			}
		}
	}
}

// Len is the number of customers kept.
func (e *Evaluator) Len() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lru.Len()
}

// local answers a check from a snapshot; ok is false when it cannot
// (the metric is not listed, a gauge, a tiered or unpriced rule, a cost
// past int64, the overage policy unknown).
func local(snap *client.Snapshot, policy, metric string, units int64) (client.CheckResult, bool) {
	se, found := snap.Entitlements[metric]
	if !found {
		return client.CheckResult{}, false
	}
	res := client.CheckResult{Type: se.Type, CustomerID: snap.CustomerID, BillableMetricKey: metric}
	if snap.SubscriptionStatus != nil {
		res.SubscriptionStatus = client.Ptr(*snap.SubscriptionStatus)
	}
	switch se.Type {
	case "boolean":
		if se.Enabled == nil {
			return client.CheckResult{}, false
		}
		res.Enabled, res.Allowed = client.Ptr(*se.Enabled), *se.Enabled
	case "static":
		res.Config, res.Allowed = se.Config, true
	case "metered":
		if se.CostType == nil || se.EstimatedCostPerUnit == nil || policy == "" {
			return client.CheckResult{}, false
		}
		per := *se.EstimatedCostPerUnit
		var cost int64
		switch *se.CostType {
		case "flat":
			cost = per
		case "per_unit":
			hi, lo := bits.Mul64(uint64(per), uint64(units))
			if per < 0 || hi != 0 || lo > math.MaxInt64 {
				return client.CheckResult{}, false
			}
			cost = int64(lo)
		default:
			return client.CheckResult{}, false
		}
		eff := snap.EffectiveBalance
		if eff < math.MinInt64+cost {
			return client.CheckResult{}, false
		}
		after := eff - cost
		// What the customer may spend: the effective balance plus its
		// credit line under block (the snapshot's available_mc,
		// docs/rules.md "Credit line").
		avail := snap.AvailableMC
		// An account with scoped blocks: what this metric may spend
		// (docs/rules.md "Credits scoped to metrics").
		if se.AvailableMC != nil {
			avail = *se.AvailableMC
		}
		// The snapshot's allowed is the one-unit check with the plan's
		// denial folded in: refused although one unit fits (or the policy
		// lets it through) means the plan or an overdue subscription
		// denies the metric.
		denied := !se.Allowed && (per <= avail || policy != "block")
		res.Allowed = (cost <= avail || policy != "block") && !denied
		res.Units, res.EstimatedCost, res.BalanceAfter = client.Ptr(units), client.Ptr(cost), client.Ptr(after)
		res.Balance, res.ReservedBalance = client.Ptr(snap.Balance), client.Ptr(snap.ReservedBalance)
		res.PendingBalance, res.EffectiveBalance = client.Ptr(snap.PendingBalance), client.Ptr(eff)
		res.CreditLimitMC, res.AvailableMC = client.Ptr(snap.CreditLimitMC), client.Ptr(avail)
		res.OveragePolicy = client.Ptr(policy)
	default:
		return client.CheckResult{}, false
	}
	return res, true
}

// follow keeps the change stream open, resuming from the last id seen.
func (e *Evaluator) follow(ctx context.Context) {
	defer e.done.Done()
	wait := reconnectMin
	for ctx.Err() == nil {
		e.mu.Lock()
		from := e.cursor
		e.mu.Unlock()
		st, err := e.c.StreamChanges(ctx, from)
		if err != nil {
			e.report(err)
			if !sleep(ctx, wait) {
				return
			}
			wait = min(wait*2, reconnectMax)
			continue
		}
		st.OnHeartbeat = e.heartbeat
		for {
			ev, err := st.Next()
			if err != nil {
				if ctx.Err() == nil {
					e.report(err)
				}
				break
			}
			wait = reconnectMin
			e.apply(ev, from == "")
		}
		_ = st.Close()
		e.mu.Lock()
		e.up = false
		e.mu.Unlock()
		if !sleep(ctx, reconnectMin) {
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (e *Evaluator) report(err error) {
	if e.cfg.OnError != nil {
		e.cfg.OnError(err)
	}
}

// heartbeat notes that every change made up to lag ago was sent.
func (e *Evaluator) heartbeat(lag time.Duration) {
	at := e.cfg.Now().Add(-lag)
	e.mu.Lock()
	if e.up && at.After(e.beat) {
		e.beat = at
	}
	e.mu.Unlock()
}

// apply takes one message of the stream; fresh is true on a stream opened
// without a cursor (it starts now, so what was fetched before is not
// covered by it).
func (e *Evaluator) apply(ev client.ChangeEvent, fresh bool) {
	var ids []string
	e.mu.Lock()
	switch {
	case ev.Type == client.ChangeEventOpen:
		e.up = true
		if fresh {
			e.epoch++
		}
	case ev.Type == client.ChangeEventReset:
		e.up = true
		e.epoch++
		e.tenantPolicy = ""
	case ev.Type == client.ChangeEventReservations:
		// A reservation of one customer moved its effective balance: as an event.
		ids = e.customerChangedLocked(ev.Data)
	case strings.HasPrefix(ev.Type, client.ChangeEventPrefix):
		// The stamps say which kind of facts changed, not whose: every
		// snapshot is stale, and is fetched again on its next check.
		e.epoch++
		if ev.Type == client.ChangeEventPrefix+"tenant" {
			e.tenantPolicy = ""
		}
	default:
		ids = e.customerChangedLocked(ev.Data)
	}
	if ev.ID != "" {
		e.cursor = ev.ID
	}
	e.mu.Unlock()
	for _, id := range ids {
		select {
		case e.refetch <- id:
		default: // full: the next check fetches it
			e.mu.Lock()
			if en := e.refs[id]; en != nil {
				en.queued = false
			}
			e.mu.Unlock()
		}
	}
}

// customerChangedLocked marks stale the snapshot of the customer a
// message names (data's customer_id) and returns the id to refetch it
// under, if it is kept and not queued already.
func (e *Evaluator) customerChangedLocked(data json.RawMessage) []string {
	var body struct {
		CustomerID string `json:"customer_id"`
	}
	if json.Unmarshal(data, &body) != nil || body.CustomerID == "" {
		return nil
	}
	e.events++
	if e.fetching > 0 {
		e.recent[body.CustomerID] = e.events
	}
	en := e.byID[body.CustomerID]
	if en == nil {
		return nil
	}
	en.stale = true
	if en.queued || len(en.refs) == 0 {
		return nil
	}
	en.queued = true
	return []string{en.refs[0]}
}

// refetcher fetches the snapshots a customer's event made stale, so the
// next check answers from memory again.
func (e *Evaluator) refetcher(ctx context.Context) {
	defer e.done.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case ref := <-e.refetch:
			e.mu.Lock()
			if en := e.refs[ref]; en != nil {
				en.queued = false
			}
			e.mu.Unlock()
			fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if _, err := e.fetchShared(fctx, ref); err != nil && ctx.Err() == nil {
				e.report(err)
			}
			cancel()
		}
	}
}
