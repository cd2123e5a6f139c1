package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creditd/creditd/client"
)

// TestReservationUnits: a reservation is sized to the horizon's worth of the smoothed
// rate, never below a waiting consume or MinUnits, never above MaxUnits.
func TestReservationUnits(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	cases := []struct {
		name                   string
		rate                   int64
		horizon, interval      time.Duration
		need, minUnits, maxUnt int64
		want                   int64
	}{
		{"no usage yet: the minimum", 0, 500 * ms, 200 * ms, 0, 5, 1000, 5},
		{"a waiting consume beats the minimum", 0, 500 * ms, 200 * ms, 40, 5, 1000, 40},
		{"horizon / interval times the rate", 100, 500 * ms, 200 * ms, 0, 1, 1000, 250},
		{"rounded up", 3, 500 * ms, 200 * ms, 0, 1, 1000, 8},
		{"capped by max", 10_000, 500 * ms, 200 * ms, 0, 1, 1000, 1000},
		{"a waiting consume is capped too", 0, 500 * ms, 200 * ms, 5000, 1, 1000, 1000},
		{"a rate that would overflow is capped", 1 << 62, time.Hour, ms, 0, 1, 1000, 1000},
		{"horizon shorter than the interval", 100, 100 * ms, 200 * ms, 0, 1, 1000, 50},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := reservationUnits(tc.rate, tc.horizon, tc.interval, tc.need, tc.minUnits, tc.maxUnt); got != tc.want {
				t.Errorf("reservationUnits = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestTopUpUnits: nothing is asked while half the target is left and the
// waiting consume fits; otherwise enough to reach the target (or the
// waiting consume).
func TestTopUpUnits(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                     string
		left, target, need, want int64
	}{
		{"plenty left", 80, 100, 0, 0},
		{"exactly half left", 50, 100, 0, 0},
		{"under half left", 49, 100, 0, 51},
		{"nothing left", 0, 100, 0, 100},
		{"a waiting consume bigger than what is left", 60, 100, 70, 40},
		{"a waiting consume bigger than the target", 10, 100, 150, 140},
		{"more left than the target", 300, 100, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := topUpUnits(tc.left, tc.target, tc.need); got != tc.want {
				t.Errorf("topUpUnits(%d, %d, %d) = %d, want %d", tc.left, tc.target, tc.need, got, tc.want)
			}
		})
	}
}

// TestSmooth: the rate halves towards each interval's demand.
func TestSmooth(t *testing.T) {
	t.Parallel()
	cases := []struct{ rate, demand, want int64 }{
		{0, 0, 0}, {0, 100, 50}, {100, 0, 50}, {100, 100, 100}, {1, 1, 1}, {3, 0, 1}, {1 << 62, 1 << 62, 1 << 62},
	}
	for _, tc := range cases {
		if got := smooth(tc.rate, tc.demand); got != tc.want {
			t.Errorf("smooth(%d, %d) = %d, want %d", tc.rate, tc.demand, got, tc.want)
		}
	}
}

// TestPriced: only a per_unit metric the plan does not deny is charged
// locally.
func TestPriced(t *testing.T) {
	t.Parallel()
	snap := &client.Snapshot{EffectiveBalance: 100, AvailableMC: 100, Entitlements: map[string]client.SnapshotEntry{
		"api":    {Type: "metered", Allowed: true, EstimatedCostPerUnit: p(int64(10)), CostType: p("per_unit")},
		"poor":   {Type: "metered", Allowed: false, EstimatedCostPerUnit: p(int64(1000)), CostType: p("per_unit")},
		"denied": {Type: "metered", Allowed: false, EstimatedCostPerUnit: p(int64(10)), CostType: p("per_unit")},
		"flat":   {Type: "metered", Allowed: true, EstimatedCostPerUnit: p(int64(10)), CostType: p("flat")},
		"tiered": {Type: "metered", Allowed: true, EstimatedCostPerUnit: p(int64(10)), CostType: p("tiered")},
		"huge":   {Type: "metered", Allowed: true, EstimatedCostPerUnit: p(int64(1) << 60), CostType: p("per_unit")},
		"sso":    {Type: "boolean", Allowed: true, Enabled: p(true)},
	}}
	cases := []struct {
		metric, policy string
		ok             bool
	}{
		{"api", "block", true}, {"api", "allow", true}, {"api", "", false},
		{"poor", "block", true}, {"poor", "allow", false}, {"denied", "block", false},
		{"flat", "block", false}, {"tiered", "block", false}, {"huge", "block", false},
		{"sso", "block", false}, {"nope", "block", false},
	}
	for _, tc := range cases {
		per, _, ok := priced(snap, tc.policy, tc.metric, 10_000)
		if ok != tc.ok || ok && per != *snap.Entitlements[tc.metric].EstimatedCostPerUnit {
			t.Errorf("priced(%s, %s) = %d, %v; want ok %v", tc.metric, tc.policy, per, ok, tc.ok)
		}
	}
}

// books is a fake creditd keeping a block customer's credit, reservations and
// idempotency records, priced per unit at 10 millicredits (flat for
// metric "export").
type books struct {
	t  testing.TB
	mu sync.Mutex
	// balance and reserved are millicredits.
	balance, reserved int64
	policy            string
	reservations      map[string]*fakeReservation
	replays           map[string][]byte
	// charged is every millicredit taken by commits and consumes.
	charged, consumeUnits int64
	commits, extends      int
	// failAfterApply makes the next n partial commits apply and then
	// answer 503, as a reply lost after the change.
	failAfterApply int
	commitKeys     []string
	// price is the per_unit rule's millicredits a unit (perUnitMC unless a
	// test changes the rule).
	price int64
	srv   *httptest.Server
}

type fakeReservation struct {
	units, cost, settled int64
	remaining            int64
	active               bool
	expires              time.Time
}

const perUnitMC = 10

func newBooks(t testing.TB, balance int64, policy string) *books {
	b := &books{t: t, balance: balance, policy: policy, reservations: map[string]*fakeReservation{}, replays: map[string][]byte{}, price: perUnitMC}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.srv.Close)
	return b
}

func problem(w http.ResponseWriter, status int, typ string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(client.Problem{Type: typ, Title: typ, Status: status, Detail: typ})
}

func (b *books) serve(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	b.mu.Lock()
	defer b.mu.Unlock()
	write := func(v any) []byte {
		raw, _ := json.Marshal(v)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(raw)
		return raw
	}
	key := r.Header.Get("Idempotency-Key")
	if r.Method == "POST" {
		if key == "" {
			problem(w, 422, client.ProblemValidation)
			return
		}
		if raw, ok := b.replays[key]; ok {
			w.Header().Set("X-Idempotent-Replayed", "true")
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(raw)
			return
		}
	}
	eff := b.balance - b.reserved
	switch {
	case path == "/v1/tenant":
		write(map[string]any{"default_overage_policy": b.policy})
	case strings.HasSuffix(path, "/entitlements"):
		write(client.Snapshot{CustomerID: "uuid-1", Balance: b.balance, ReservedBalance: b.reserved, EffectiveBalance: eff, AvailableMC: eff,
			Entitlements: map[string]client.SnapshotEntry{
				"api":    {Type: "metered", Allowed: eff >= b.price || b.policy != "block", EstimatedCostPerUnit: p(int64(b.price)), CostType: p("per_unit")},
				"export": {Type: "metered", Allowed: true, EstimatedCostPerUnit: p(int64(b.price)), CostType: p("flat")},
			}})
	case strings.HasPrefix(path, "/v1/customers/"):
		write(map[string]any{"id": "uuid-1", "overage_policy": nil})
	case path == "/v1/entitlements/consume":
		var in client.ConsumeInput
		_ = json.NewDecoder(r.Body).Decode(&in)
		cost := in.Units * b.price
		if in.BillableMetricKey == "export" {
			cost = b.price
		}
		if b.policy == "block" && cost > eff {
			problem(w, 409, client.ProblemInsufficientCredits)
			return
		}
		charged := min(cost, max(eff, 0))
		if b.policy == "block" {
			charged = cost
		}
		b.balance -= charged
		b.charged += charged
		b.consumeUnits += in.Units
		b.replays[key] = write(client.ConsumeResult{CustomerID: "uuid-1", Units: &in.Units, Cost: cost, Charged: charged})
	case path == "/v1/reservations":
		var in client.ReserveInput
		_ = json.NewDecoder(r.Body).Decode(&in)
		cost := in.EstimatedUnits * b.price
		if cost > eff {
			problem(w, 409, client.ProblemInsufficientCredits)
			return
		}
		id := fmt.Sprintf("res-%d", len(b.reservations)+1)
		h := &fakeReservation{units: in.EstimatedUnits, cost: cost, remaining: cost, active: true,
			expires: time.Now().Add(time.Duration(*in.TTLSeconds) * time.Second)}
		b.reservations[id] = h
		b.reserved += cost
		b.replays[key] = write(client.ReserveResult{ID: id, CustomerID: "uuid-1", EstimatedUnits: h.units, EstimatedCost: cost,
			Status: "active", ExpiresAt: h.expires})
	case strings.HasSuffix(path, "/extend"):
		h := b.reservations[strings.Split(path, "/")[3]]
		if h == nil || !h.active {
			problem(w, 409, client.ProblemConflict)
			return
		}
		var in client.ExtendInput
		_ = json.NewDecoder(r.Body).Decode(&in)
		if in.AdditionalUnits != nil {
			cost := *in.AdditionalUnits * b.price
			if cost > eff {
				problem(w, 409, client.ProblemInsufficientCredits)
				return
			}
			h.units += *in.AdditionalUnits
			h.cost += cost
			h.remaining += cost
			b.reserved += cost
		}
		if in.TTLSeconds != nil {
			h.expires = time.Now().Add(time.Duration(*in.TTLSeconds) * time.Second)
		}
		b.extends++
		b.replays[key] = write(client.ExtendResult{EstimatedUnits: h.units, EstimatedCost: h.cost, Status: "active",
			ExpiresAt: h.expires, SettledUnits: h.settled, RemainingCost: h.remaining})
	case strings.HasSuffix(path, "/commit"):
		h := b.reservations[strings.Split(path, "/")[3]]
		if h == nil || !h.active {
			problem(w, 409, client.ProblemConflict)
			return
		}
		var in client.CommitInput
		_ = json.NewDecoder(r.Body).Decode(&in)
		units := *in.ActualUnits
		cost := units * b.price
		fromReservation := min(cost, h.remaining)
		if cost-fromReservation > eff {
			problem(w, 409, client.ProblemInsufficientCredits)
			return
		}
		b.commits++
		b.commitKeys = append(b.commitKeys, key)
		h.remaining -= fromReservation
		b.reserved -= fromReservation
		b.balance -= cost
		b.charged += cost
		h.settled += units
		status := "active"
		if in.Final == nil || *in.Final {
			b.reserved -= h.remaining
			h.remaining, h.active, status = 0, false, "committed"
		}
		raw, _ := json.Marshal(client.CommitResult{Status: status, ActualUnits: units, ActualCost: cost, SettledUnits: h.settled, RemainingCost: h.remaining})
		b.replays[key] = raw
		if b.failAfterApply > 0 && in.Final != nil && !*in.Final {
			b.failAfterApply--
			problem(w, 503, client.ProblemUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(raw)
	default:
		http.NotFound(w, r)
	}
}

func (b *books) read(f func(*books)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f(b)
}

func escrowSetup(t *testing.T, balance int64, policy string, cfg EscrowConfig) (*books, *Evaluator) {
	t.Helper()
	b := newBooks(t, balance, policy)
	if cfg.SettleInterval == 0 {
		cfg.SettleInterval = 20 * time.Millisecond
	}
	e := New(client.New(b.srv.URL, "ck_test_x", client.WithRetry(1, time.Millisecond, time.Millisecond)), Config{Escrow: cfg})
	t.Cleanup(e.Close)
	return b, e
}

// TestEscrowAccounting: every unit charged locally is settled exactly once
// by partial commits and the final commit of Close, which returns the rest
// of the reservation; Stats agree with the server's books.
func TestEscrowAccounting(t *testing.T) {
	t.Parallel()
	b, e := escrowSetup(t, 1_000_000, "block", EscrowConfig{MaxUnits: 500})
	ctx := context.Background()
	var local, units int64
	for i := range 2000 {
		n := int64(i%3 + 1)
		c, err := e.Consume(ctx, "alice", "api", n)
		if err != nil {
			t.Fatal(err)
		}
		if c.Units != n || c.Local && c.Cost != n*perUnitMC {
			t.Fatalf("charge %+v for %d units", c, n)
		}
		if c.Local {
			local += n
		}
		units += n
		if i%100 == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	if local == 0 {
		t.Fatal("nothing was charged locally")
	}
	time.Sleep(60 * time.Millisecond)
	mid := e.Stats()
	if mid.Settles == 0 || mid.SettledUnits == 0 {
		t.Errorf("no partial commit before Close: %+v", mid)
	}
	b.read(func(b *books) {
		for _, h := range b.reservations {
			if h.units-h.settled > 500+500 {
				t.Errorf("reservation of %d units with %d settled: more than MaxUnits beyond the charged", h.units, h.settled)
			}
		}
	})
	e.Close()
	st := e.Stats()
	if st.ConsumedLocalUnits != local || st.SettledUnits != local || st.AtRiskUnits != 0 || st.UncollectedUnits != 0 {
		t.Errorf("stats %+v, want %d consumed locally and settled, none at risk", st, local)
	}
	b.read(func(b *books) {
		if b.charged != units*perUnitMC || b.balance != 1_000_000-units*perUnitMC || b.reserved != 0 {
			t.Errorf("server charged %d, balance %d, reserved %d; want %d charged, nothing reserved", b.charged, b.balance, b.reserved, units*perUnitMC)
		}
		for id, h := range b.reservations {
			if h.active {
				t.Errorf("hold %s still active after Close", id)
			}
		}
	})
	if _, err := e.Consume(ctx, "alice", "api", 1); err != ErrClosed {
		t.Errorf("consume after Close: %v, want ErrClosed", err)
	}
}

// TestEscrowRetriedSettleAppliesOnce: a partial commit whose answer is lost
// is sent again with the same Idempotency-Key, so creditd charges it once.
func TestEscrowRetriedSettleAppliesOnce(t *testing.T) {
	t.Parallel()
	b, e := escrowSetup(t, 1_000_000, "block", EscrowConfig{MaxUnits: 100})
	b.read(func(b *books) { b.failAfterApply = 1 })
	ctx := context.Background()
	var local int64
	for range 50 {
		c, err := e.Consume(ctx, "alice", "api", 1)
		if err != nil {
			t.Fatal(err)
		}
		if c.Local {
			local++
		}
	}
	waitFor(t, "the lost settle retried", func() bool {
		var n int
		b.read(func(b *books) { n = len(b.commitKeys) })
		return e.Stats().SettledUnits == local && n >= 1
	})
	e.Close()
	b.read(func(b *books) {
		if b.charged != 50*perUnitMC {
			t.Errorf("charged %d, want %d: a retried settle applied twice or not at all", b.charged, 50*perUnitMC)
		}
		seen := map[string]bool{}
		for _, k := range b.commitKeys {
			if seen[k] {
				t.Errorf("key %s applied twice", k)
			}
			seen[k] = true
		}
	})
	if st := e.Stats(); st.SettledUnits != local || st.AtRiskUnits != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestEscrowRefusedTopUp: under block, with consumes racing, once creditd refuses a top-up,
// consumes beyond what is held are refused as insufficient-credits, and
// no more than the credit is ever charged (no overspend); under allow they
// go to the server, which lets them through.
func TestEscrowRefusedTopUp(t *testing.T) {
	t.Parallel()
	t.Run("block", func(t *testing.T) {
		t.Parallel()
		b, e := escrowSetup(t, 1000*perUnitMC, "block", EscrowConfig{MaxUnits: 300, MaxWait: 200 * time.Millisecond})
		ctx := context.Background()
		var mu sync.Mutex
		var ok, refused int64
		var wg sync.WaitGroup
		for range 4 { // racing consumes: exactly the credit's units succeed
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 750 {
					c, err := e.Consume(ctx, "alice", "api", 1)
					mu.Lock()
					switch {
					case err == nil:
						ok += c.Units
					case client.IsProblem(err, client.ProblemInsufficientCredits):
						refused++
					default:
						t.Error(err)
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		e.Close()
		if ok != 1000 || refused != 2000 {
			t.Errorf("%d units charged, %d refused; want exactly the credit's 1000 charged, 2000 refused", ok, refused)
		}
		st := e.Stats()
		if st.TopUpsRefused == 0 || st.RefusedUnits == 0 {
			t.Errorf("stats %+v: no refusal counted", st)
		}
		b.read(func(b *books) {
			if b.balance != 0 || b.charged != 1000*perUnitMC || b.reserved != 0 {
				t.Errorf("balance %d, charged %d, reserved %d; want 0, all, 0", b.balance, b.charged, b.reserved)
			}
		})
	})
	t.Run("allow", func(t *testing.T) {
		t.Parallel()
		b, e := escrowSetup(t, 100*perUnitMC, "allow", EscrowConfig{MaxUnits: 50, MaxWait: 200 * time.Millisecond})
		ctx := context.Background()
		for range 300 {
			if _, err := e.Consume(ctx, "alice", "api", 1); err != nil {
				t.Fatal(err)
			}
		}
		e.Close()
		st := e.Stats()
		if st.HTTPUnits == 0 || st.ConsumedLocalUnits+st.HTTPUnits != 300 || st.RefusedUnits != 0 {
			t.Errorf("stats %+v: want the overflow sent to the server, nothing refused", st)
		}
		b.read(func(b *books) {
			if b.consumeUnits != st.HTTPUnits {
				t.Errorf("server consumed %d units over HTTP, stats say %d", b.consumeUnits, st.HTTPUnits)
			}
		})
	})
}

// TestEscrowAdaptiveReservation: a steady rate grows the reservation past its first size,
// and MaxUnits bounds it.
func TestEscrowAdaptiveReservation(t *testing.T) {
	t.Parallel()
	b, e := escrowSetup(t, 100_000_000, "block", EscrowConfig{MaxUnits: 400, MinUnits: 1})
	ctx := context.Background()
	first := int64(-1)
	for i := range 60 {
		for range 50 {
			if _, err := e.Consume(ctx, "alice", "api", 1); err != nil {
				t.Fatal(err)
			}
		}
		if i == 0 {
			b.read(func(b *books) { first = b.reservations["res-1"].units })
		}
		time.Sleep(5 * time.Millisecond)
	}
	var units, settled int64
	b.read(func(b *books) { units, settled = b.reservations["res-1"].units, b.reservations["res-1"].settled })
	e.Close()
	if units <= first {
		t.Errorf("the reservation stayed at %d units (first %d) under steady use", units, first)
	}
	if st := e.Stats(); units-st.ConsumedLocalUnits > 400 && units-settled > 2*400 {
		t.Errorf("reservation of %d units, %d consumed: more than MaxUnits ahead", units, st.ConsumedLocalUnits)
	}
}

// TestEscrowIdleReservationReturned: an allowance without consumes for half its
// reservation's lifetime gives the reservation back (a final commit) instead of
// prolonging it, and the next consume takes a new one; the books stay
// exact across both reservations.
func TestEscrowIdleReservationReturned(t *testing.T) {
	t.Parallel()
	b, e := escrowSetup(t, 1_000_000, "block", EscrowConfig{MaxUnits: 100, ReservationTTL: 2 * time.Second})
	ctx := context.Background()
	for range 30 {
		if _, err := e.Consume(ctx, "alice", "api", 1); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the idle reservation returned", func() bool {
		var active bool
		var reserved int64
		b.read(func(b *books) { active, reserved = b.reservations["res-1"].active, b.reserved })
		return !active && reserved == 0
	})
	c, err := e.Consume(ctx, "alice", "api", 1)
	if err != nil || !c.Local {
		t.Fatalf("consume after the return: %+v, %v", c, err)
	}
	e.Close()
	b.read(func(b *books) {
		if len(b.reservations) != 2 || b.reservations["res-1"].settled+b.reservations["res-2"].settled != 31 || b.charged != 31*perUnitMC || b.reserved != 0 {
			t.Errorf("%d reservations, charged %d, reserved %d; want 2 reservations settling 31 units", len(b.reservations), b.charged, b.reserved)
		}
	})
	if st := e.Stats(); st.SettledUnits != 31 || st.AtRiskUnits != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestEscrowPriceRise: when the rule's price doubles during a reservation, the
// first settle after it (priced at the new rule) shows the reservation covers
// fewer units, and the allowance stops charging what it no longer holds:
// under block the credit is never overspent, and every unit consumed
// locally is settled.
func TestEscrowPriceRise(t *testing.T) {
	t.Parallel()
	b, e := escrowSetup(t, 2000*perUnitMC, "block", EscrowConfig{MaxUnits: 400, MaxWait: 100 * time.Millisecond})
	ctx := context.Background()
	var units int64
	consume := func(n int) {
		for range n {
			c, err := e.Consume(ctx, "alice", "api", 1)
			if err == nil {
				units += c.Units
			} else if !client.IsProblem(err, client.ProblemInsufficientCredits) {
				t.Fatal(err)
			}
		}
	}
	consume(500)
	b.read(func(b *books) { b.price = 2 * perUnitMC })
	for range 40 {
		consume(100)
		time.Sleep(5 * time.Millisecond)
	}
	e.Close()
	st := e.Stats()
	b.read(func(b *books) {
		if b.balance < 0 || b.charged > 2000*perUnitMC || b.reserved != 0 {
			t.Errorf("balance %d, charged %d, reserved %d: overspent", b.balance, b.charged, b.reserved)
		}
		if st.SettledUnits+st.UncollectedUnits != st.ConsumedLocalUnits || st.AtRiskUnits != 0 {
			t.Errorf("stats %+v: settled and uncollected do not add up to what was consumed", st)
		}
	})
	// The settle that first shows the new price draws on a free balance
	// still ample here, so nothing goes uncollected; without the
	// correction the units held at the old price are settled at the new
	// one once the credit is short (200-400 units refused in trials).
	t.Logf("stats %+v, %d units consumed", st, units)
	if st.UncollectedUnits != 0 || units < 1000 {
		t.Errorf("%d units uncollected, %d consumed in all: want the allowance corrected after a settle", st.UncollectedUnits, units)
	}
	if st.RefusedUnits == 0 {
		t.Errorf("stats %+v: the credit at the new price never ran out", st)
	}
}

// TestEscrowGoesToServer: a flat metric, a consume above MaxUnits and
// OverflowHTTP are charged by the server, not locally.
func TestEscrowGoesToServer(t *testing.T) {
	t.Parallel()
	b, e := escrowSetup(t, 1_000_000, "block", EscrowConfig{MaxUnits: 10, Overflow: OverflowHTTP})
	ctx := context.Background()
	for _, tc := range []struct {
		metric string
		units  int64
	}{{"export", 1}, {"api", 11}, {"api", 1}} {
		c, err := e.Consume(ctx, "alice", tc.metric, tc.units)
		if err != nil {
			t.Fatal(err)
		}
		if c.Local || c.Result == nil {
			t.Errorf("%s x%d charged locally: %+v", tc.metric, tc.units, c)
		}
	}
	viaHTTP := int64(13)
	waitFor(t, "the reservation taken in the background", func() bool {
		c, err := e.Consume(ctx, "alice", "api", 1)
		if err == nil && !c.Local {
			viaHTTP++
		}
		return err == nil && c.Local
	})
	e.Close()
	b.read(func(b *books) {
		if b.consumeUnits != viaHTTP || e.Stats().HTTPUnits != viaHTTP {
			t.Errorf("server consumed %d units over HTTP, stats %d, want %d", b.consumeUnits, e.Stats().HTTPUnits, viaHTTP)
		}
	})
}

// BenchmarkConsumeLocal measures a Consume answered from the allowance
// (the reservation sized to MaxUnits so nothing waits; settles run meanwhile
// against an in-process fake creditd).
func BenchmarkConsumeLocal(b *testing.B) {
	bk := newBooks(b, math.MaxInt64/4, "block")
	e := New(client.New(bk.srv.URL, "ck_test_x"), Config{Escrow: EscrowConfig{MaxUnits: 1_000_000, MinUnits: 1_000_000}})
	defer e.Close()
	ctx := context.Background()
	if _, err := e.Consume(ctx, "alice", "api", 1); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := e.Consume(ctx, "alice", "api", 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if st := e.Stats(); st.ConsumedLocalUnits < int64(b.N) {
		b.Errorf("%d of %d consumes local", st.ConsumedLocalUnits, b.N+1)
	}
}

// TestEscrowHoldTTLAlias: a config written before v0.4 (HoldTTL) keeps
// its reservation lifetime; ReservationTTL wins when both are set.
func TestEscrowHoldTTLAlias(t *testing.T) {
	for _, tc := range []struct {
		cfg  EscrowConfig
		want time.Duration
	}{
		{EscrowConfig{HoldTTL: 5 * time.Second}, 5 * time.Second},
		{EscrowConfig{HoldTTL: 5 * time.Second, ReservationTTL: 7 * time.Second}, 7 * time.Second},
		{EscrowConfig{}, DefaultReservationTTL},
	} {
		c := tc.cfg
		c.defaults()
		if c.ReservationTTL != tc.want {
			t.Errorf("%+v: ReservationTTL %v, want %v", tc.cfg, c.ReservationTTL, tc.want)
		}
	}
}
