package api

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestRateLimitHTTP: with 1/s burst 1 the second request in the same second
// is a 429 with Retry-After; every /v1 answer carries RateLimit headers; the
// bucket refills with time; keys of one tenant have their own buckets.
func TestRateLimitHTTP(t *testing.T) {
	t.Parallel()
	h := setup(t)
	var mu sync.Mutex
	now := time.Unix(1_900_000_000, 0)
	h.srv.limiter.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	one := 1
	if _, err := h.tenants.SetRateLimit(t.Context(), h.tenant, engine.RateLimitChange{PerSecond: &one, Burst: &one}); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		advance                 time.Duration
		key                     string
		status                  int
		limit, remaining, reset string
		retryAfter              string
	}{
		{0, h.live, 200, "1", "0", "1", ""},
		{0, h.live, 429, "1", "0", "1", "1"},
		{500 * time.Millisecond, h.live, 429, "1", "0", "1", "1"},
		{500 * time.Millisecond, h.live, 200, "1", "0", "1", ""},
		{0, h.sandbox, 200, "1", "0", "1", ""},
	} {
		mu.Lock()
		now = now.Add(tc.advance)
		mu.Unlock()
		r := h.do("GET", "/v1/tenant", "", "X-API-Key", tc.key)
		wantLimitStep(t, i, r, tc.status, [4]string{tc.limit, tc.remaining, tc.reset, tc.retryAfter})
	}
}

// TestRateLimiterBucket checks the bucket arithmetic directly.
func TestRateLimiterBucket(t *testing.T) {
	t.Parallel()
	l := newRateLimiter()
	now := time.Unix(1_900_000_000, 0)
	l.now = func() time.Time { return now }
	key := uuid.New()
	for i := range 10 {
		if d := l.take(key, 5, 10); !d.allowed || d.remaining != 9-i {
			t.Fatalf("take %d: %+v", i, d)
		}
	}
	d := l.take(key, 5, 10)
	if d.allowed || d.retryAfterSec != 1 || d.resetSeconds != 2 || d.limit != 10 {
		t.Fatalf("over the burst: %+v", d)
	}
	now = now.Add(time.Second) // 5 tokens back
	for i := range 5 {
		if d := l.take(key, 5, 10); !d.allowed {
			t.Fatalf("after refill take %d refused", i)
		}
	}
	if d := l.take(key, 5, 10); d.allowed {
		t.Fatal("sixth take after a 1 s refill allowed")
	}
	if d := l.take(uuid.New(), 0, 0); !d.allowed || d.limit != engine.DefaultRateLimitBurst {
		t.Fatalf("defaults: %+v", d)
	}
}

// TestRateLimiterBounded: however many keys arrive, each shard holds at
// most limiterKeysInShard buckets.
func TestRateLimiterBounded(t *testing.T) {
	t.Parallel()
	l := newRateLimiter()
	now := time.Unix(1_900_000_000, 0)
	l.now = func() time.Time { return now }
	for range limiterShards * limiterKeysInShard * 2 {
		l.take(uuid.New(), 1, 100) // busy buckets: nothing refills
	}
	for i := range l.shards {
		if n := len(l.shards[i].buckets); n > limiterKeysInShard {
			t.Fatalf("shard %d holds %d buckets, bound %d", i, n, limiterKeysInShard)
		}
	}
}

// fakeBudgets is a shared budget store that answers what a test sets and
// records what it was asked.
type fakeBudgets struct {
	mu     sync.Mutex
	answer engine.RateDecision
	err    error
	asked  []budgetCall
}

type budgetCall struct {
	tenant                     uuid.UUID
	perSecond, burst, requests int
	now                        time.Time
}

func (f *fakeBudgets) TakeRate(_ context.Context, tenant, _ uuid.UUID, perSecond, burst, requests int, now time.Time) (engine.RateDecision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, budgetCall{tenant, perSecond, burst, requests, now})
	return f.answer, f.err
}

// TestRateLimitSharedBudgets: with shared budgets the server answers with
// their decision (headers in whole seconds, rounded up) and passes the
// tenant's rate; within a refusal's Retry-After it refuses in process
// without asking them (nothing can be allowed before then on any node);
// when they fail it falls back to its own bucket, so a Redis outage
// neither refuses every request nor lifts the limit.
func TestRateLimitSharedBudgets(t *testing.T) {
	t.Parallel()
	budgets := &fakeBudgets{}
	h := setup(t, func(c *Config) { c.RateBudgets = budgets })
	var mu sync.Mutex
	clock := time.Unix(1_900_000_000, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	h.srv.budgetClock, h.srv.limiter.now = now, now
	one, three := 1, 3
	if _, err := h.tenants.SetRateLimit(t.Context(), h.tenant, engine.RateLimitChange{PerSecond: &three, Burst: &one}); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("redis: connection refused")
	allowed := engine.RateDecision{Allowed: true, Granted: 1, Limit: 1, Remaining: 0, Reset: 333333 * time.Microsecond}
	for i, tc := range []struct {
		advance                 time.Duration
		answer                  engine.RateDecision
		err                     error
		asked                   bool
		status                  int
		limit, remaining, reset string
		retryAfter              string
	}{
		{0, allowed, nil, true, 200, "1", "0", "1", ""},
		{0, engine.RateDecision{Limit: 1, Reset: 1500 * time.Millisecond, RetryAfter: 1200 * time.Millisecond}, nil, true, 429, "1", "0", "2", "2"},
		// Within the refusal's 1.2 s: refused here, the budgets not asked.
		{500 * time.Millisecond, allowed, nil, false, 429, "1", "0", "1", "1"},
		{800 * time.Millisecond, engine.RateDecision{Limit: 1, Reset: time.Millisecond, RetryAfter: time.Microsecond}, nil, true, 429, "1", "0", "1", "1"},
		// Budgets down: this process's bucket (3/s burst 1) decides.
		{time.Second, engine.RateDecision{}, failed, true, 200, "1", "0", "1", ""},
		{0, engine.RateDecision{}, failed, true, 429, "1", "0", "1", "1"},
	} {
		mu.Lock()
		clock = clock.Add(tc.advance)
		mu.Unlock()
		budgets.mu.Lock()
		budgets.answer, budgets.err = tc.answer, tc.err
		before := len(budgets.asked)
		budgets.mu.Unlock()
		r := h.do("GET", "/v1/tenant", "", "X-API-Key", h.live)
		wantLimitStep(t, i, r, tc.status, [4]string{tc.limit, tc.remaining, tc.reset, tc.retryAfter})
		budgets.mu.Lock()
		asked := len(budgets.asked) > before
		budgets.mu.Unlock()
		if asked != tc.asked {
			t.Fatalf("step %d: budgets asked %v, want %v", i, asked, tc.asked)
		}
	}
	budgets.mu.Lock()
	defer budgets.mu.Unlock()
	if want := (budgetCall{h.tenant, 3, 1, 1, time.Unix(1_900_000_000, 0)}); budgets.asked[0] != want {
		t.Fatalf("budgets asked %+v, want %+v", budgets.asked[0], want)
	}
}

// TestRefusalsBounded: however many keys are refused, each shard remembers
// at most limiterKeysInShard windows, and a full shard makes room for a new
// one; a window refuses until its Retry-After and no longer.
func TestRefusalsBounded(t *testing.T) {
	t.Parallel()
	r := newRefusals()
	now := time.Unix(1_900_000_000, 0)
	refused := engine.RateDecision{Limit: 1, RetryAfter: time.Second, Reset: time.Second}
	for range limiterShards * limiterKeysInShard * 2 {
		r.remember(uuid.New(), now, 1, refused)
	}
	for i := range r.shards {
		if n := len(r.shards[i].byKey); n > limiterKeysInShard {
			t.Fatalf("shard %d holds %d windows, bound %d", i, n, limiterKeysInShard)
		}
	}
	later := now.Add(2 * time.Second) // every window is over
	key := uuid.New()
	r.remember(key, later, 1, refused)
	if d, ok := r.check(key, later, 1, 1); !ok || d.retryAfterSec != 1 {
		t.Fatalf("a full shard did not make room: %+v %v", d, ok)
	}
	if _, ok := r.check(key, later, 2, 1); ok {
		t.Fatal("a window given under 1/s refuses under 2/s (limits changed since)")
	}
	r.remember(key, later, 1, refused)
	if _, ok := r.check(key, later, 1, 3); ok {
		t.Fatal("a window given under burst 1 refuses under burst 3 (limits changed since)")
	}
	r.remember(key, later, 1, refused)
	if _, ok := r.check(key, later.Add(time.Second), 1, 1); ok {
		t.Fatal("a window past its Retry-After still refuses")
	}
}

// gcraBudgets is gcra.lua in Go on the caller's clock: one budget shared by
// the simulated nodes of a test, counting its takes.
type gcraBudgets struct {
	mu    sync.Mutex
	tat   map[uuid.UUID]float64 // microseconds
	takes int
}

func (g *gcraBudgets) TakeRate(_ context.Context, _, key uuid.UUID, perSecond, burst, requests int, now time.Time) (engine.RateDecision, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.takes++
	if g.tat == nil {
		g.tat = make(map[uuid.UUID]float64)
	}
	us := float64(now.UnixMicro())
	interval := 1e6 / float64(perSecond)
	capacity := interval * float64(burst)
	tat := max(g.tat[key], us)
	fits := int(math.Floor((us + capacity - tat + 0.5) / interval))
	if fits < 1 {
		return engine.RateDecision{Limit: burst, RetryAfter: time.Duration(tat+interval-capacity-us) * time.Microsecond, Reset: time.Duration(tat-us) * time.Microsecond}, nil
	}
	granted := min(requests, fits)
	g.tat[key] = math.Round(tat + float64(granted)*interval)
	return engine.RateDecision{Allowed: true, Granted: granted, Limit: burst,
		Remaining: max(0, int(math.Floor((us+capacity-g.tat[key]+0.5)/interval))),
		Reset:     time.Duration(g.tat[key]-us) * time.Microsecond}, nil
}

// TestLeaseSize: a node leases at most rate/100 requests (the budget of
// 10 ms), at most half the burst, and never leases a key under 200/s: the
// default limit's keys lease 10, a 10/s key takes one request at a time.
func TestLeaseSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		perSecond, burst, most int
		life                   time.Duration
	}{
		{10, 20, 1, 100 * time.Millisecond},
		{100, 10, 1, leaseMinLife},
		{199, 1000, 1, leaseMinLife},
		{engine.DefaultRateLimitPerSecond, engine.DefaultRateLimitBurst, 10, 10 * time.Millisecond},
		{5000, 3, 1, leaseMinLife},
		{100_000, 200_000, 1000, 10 * time.Millisecond},
		{100_000, 100, 50, leaseMinLife},
		{1_000_000, 1_000_000, 10_000, 10 * time.Millisecond},
	} {
		most := leaseCap(tc.perSecond, tc.burst)
		if life := leaseLife(most, tc.perSecond); most != tc.most || life != tc.life {
			t.Fatalf("%d/s burst %d: lease of %d living %s, want %d living %s", tc.perSecond, tc.burst, most, life, tc.most, tc.life)
		}
	}
}

// TestLeaseServing walks one node's lease on a fake clock: it grows while
// the requests outrun it, serves from memory in between, drops what it did
// not serve when its life is over and shrinks to what was served, and a
// refusal is remembered for the time a whole lease takes to come back.
func TestLeaseServing(t *testing.T) {
	t.Parallel()
	const perSecond, burst = 1000, 100 // leases of up to 10, 10 ms
	g := &gcraBudgets{}
	r, l := newRefusals(), newLeases()
	tenant, key := uuid.New(), uuid.New()
	now := time.Unix(1_900_000_000, 0)
	ms := time.Millisecond
	type step struct {
		advance    time.Duration
		requests   int // sent at once
		allowed    int
		takes      int // of the budgets, in all
		lastRemain int
	}
	for i, st := range []step{
		{0, 1, 1, 1, 99},       // a lease of 1
		{0, 1, 1, 2, 98},       // outran it: a lease of 2
		{0, 2, 2, 3, 96},       // 1 served from memory, then a lease of 4
		{ms, 3, 3, 3, 94},      // served from memory (1 refilled meanwhile)
		{ms, 1, 1, 4, 94},      // outran: a lease of 8, 7 held
		{ms, 2, 2, 4, 93},      // served from memory, 5 held
		{11 * ms, 1, 1, 5, 98}, // the 5 expired: a lease of 3 (served), 2 held
		{20 * ms, 1, 1, 6, 99}, // the 2 expired: a lease of 1
		// A flood: the 99 left in leases of 2, 4, 8, 10 x 8 (the last one
		// granted 5), then refused in memory for the 10 ms a lease takes.
		{0, 200, 99, 18, 0},
		{5 * ms, 10, 0, 18, 0},
		{5 * ms, 10, 10, 20, 0},  // 10 back: a lease of 5, then 5 of 10 granted
		{9 * ms, 5, 0, 20, 0},    // refused in memory until 10 are back
		{500 * ms, 1, 1, 21, 99}, // full again: a lease of 5 (what was served)
	} {
		now = now.Add(st.advance)
		takes0 := g.takes
		allowed, last := 0, decision{}
		for range st.requests {
			d, err := takeShared(context.Background(), g, r, l, tenant, key, perSecond, burst, now, now)
			if err != nil {
				t.Fatal(err)
			}
			if d.allowed {
				allowed++
			}
			last = d
		}
		if allowed != st.allowed || g.takes != st.takes || last.remaining != st.lastRemain {
			t.Fatalf("step %d: %d allowed, %d takes in all (%d new), remaining %d; want %d, %d, %d", i, allowed, g.takes, g.takes-takes0, last.remaining, st.allowed, st.takes, st.lastRemain)
		}
	}
}

// TestLeaseFleet: three simulated nodes share one budget for a simulated
// minute on a fake clock. Whatever the demand, the fleet never allows more
// than R x t + burst (leases only under-use the budget); a flood still gets
// nearly all of it, a demand of half the rate is never refused, and Redis
// sees a small fraction of one take per request.
func TestLeaseFleet(t *testing.T) {
	t.Parallel()
	const (
		perSecond, burst = 10_000, 1000
		span             = time.Minute
	)
	for _, tc := range []struct {
		name     string
		every    [3]time.Duration // one request per node every
		minShare float64          // of R x t + burst, allowed at least
		refused  bool
	}{
		{"flood", [3]time.Duration{20 * time.Microsecond, 30 * time.Microsecond, 50 * time.Microsecond}, 0.95, true},
		{"half the rate, uneven", [3]time.Duration{200 * time.Microsecond, 400 * time.Microsecond, 800 * time.Microsecond}, 0, false},
	} {
		g := &gcraBudgets{}
		tenant, key := uuid.New(), uuid.New()
		type node struct {
			r    *refusals
			l    *leases
			next time.Time
		}
		start := time.Unix(1_900_000_000, 0)
		var nodes [3]node
		for i := range nodes {
			nodes[i] = node{newRefusals(), newLeases(), start.Add(time.Duration(i) * 7 * time.Microsecond)}
		}
		sent, allowed := 0, 0
		for {
			k := 0
			for i := range nodes {
				if nodes[i].next.Before(nodes[k].next) {
					k = i
				}
			}
			n := &nodes[k]
			now := n.next
			if !now.Before(start.Add(span)) {
				break
			}
			d, err := takeShared(context.Background(), g, n.r, n.l, tenant, key, perSecond, burst, now, now)
			if err != nil {
				t.Fatal(err)
			}
			sent++
			if d.allowed {
				allowed++
			}
			n.next = now.Add(tc.every[k])
		}
		most := perSecond*int(span/time.Second) + burst
		t.Logf("%s: %d sent, %d allowed (most %d), %d takes = %.4f per request", tc.name, sent, allowed, most, g.takes, float64(g.takes)/float64(sent))
		if allowed > most {
			t.Fatalf("%s: the fleet allowed %d in %s, more than %d", tc.name, allowed, span, most)
		}
		if allowed < int(tc.minShare*float64(most)) {
			t.Fatalf("%s: the fleet allowed %d, under %.0f%% of %d", tc.name, allowed, 100*tc.minShare, most)
		}
		if !tc.refused && allowed != sent {
			t.Fatalf("%s: %d of %d refused under the limit", tc.name, sent-allowed, sent)
		}
		if max := 3 * leaseCallsPerSecond * 2 * int(span/time.Second); g.takes > max {
			t.Fatalf("%s: %d takes of the budget, want at most %d", tc.name, g.takes, max)
		}
	}
}

// BenchmarkLeaseTake is one request's rate decision at 100k/s on one node
// (the budgets in memory): what the shared limit costs a request served
// from a lease, amortising the lease's takes.
func BenchmarkLeaseTake(b *testing.B) {
	g := &gcraBudgets{}
	r, l := newRefusals(), newLeases()
	tenant, key := uuid.New(), uuid.New()
	now := time.Unix(1_900_000_000, 0)
	for b.Loop() {
		now = now.Add(10 * time.Microsecond)
		if d, err := takeShared(context.Background(), g, r, l, tenant, key, 100_000, 200_000, now, now); err != nil || !d.allowed {
			b.Fatal(d, err)
		}
	}
	b.ReportMetric(float64(g.takes)/float64(b.N), "takes/op")
}

// wantLimitStep checks step i's answer r: its status (a 429 as the
// rate-limited problem) and its RateLimit-Limit, -Remaining, -Reset and
// Retry-After headers, in that order.
func wantLimitStep(t *testing.T, i int, r response, status int, want [4]string) {
	t.Helper()
	if status == 429 {
		wantProblem(t, r, 429, "rate-limited", "")
	} else if r.status != status {
		t.Fatalf("step %d: status %d, want %d: %s", i, r.status, status, r.body)
	}
	got := [4]string{r.get("RateLimit-Limit"), r.get("RateLimit-Remaining"), r.get("RateLimit-Reset"), r.get("Retry-After")}
	if got != want {
		t.Fatalf("step %d: headers %v, want %v", i, got, want)
	}
}

// TestLeaseSpentOnlyUnderItsLimits: a lease taken under one key's limits is
// not spent once the tenant's limits changed (another node's PATCH), so the
// change governs this node's next request (invariant 15); under the same
// limits it is.
func TestLeaseSpentOnlyUnderItsLimits(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_900_000_000, 0)
	for _, tc := range []struct {
		name             string
		perSecond, burst int
		spent            bool
	}{
		{"same limits", 2000, 2000, true},
		{"rate lowered", 1000, 2000, false},
		{"burst lowered", 2000, 1000, false},
		{"rate raised", 4000, 2000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLeases()
			key := uuid.New()
			want, owner, _ := l.claim(key, now, 2000, 2000, false)
			if !owner {
				t.Fatalf("claim = %d, not the owner", want)
			}
			// The budget granted 4: 3 left to serve from memory.
			l.settle(key, now, 2000, want, engine.RateDecision{Allowed: true, Granted: 4, Limit: 2000, Remaining: 1000}, nil)
			if _, ok := l.spend(key, now, tc.perSecond, tc.burst); ok != tc.spent {
				t.Fatalf("spend under %d/s burst %d = %v, want %v", tc.perSecond, tc.burst, ok, tc.spent)
			}
		})
	}
}
