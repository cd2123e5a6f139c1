package api

import (
	"context"
	"errors"
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
	if _, err := h.tenants.SetRateLimit(t.Context(), h.tenant, engine.RateLimitInput{PerSecond: &one, Burst: &one}); err != nil {
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
		if tc.status == 429 {
			wantProblem(t, r, 429, "rate-limited", "")
		} else if r.status != tc.status {
			t.Fatalf("step %d: status %d, want %d: %s", i, r.status, tc.status, r.body)
		}
		got := [4]string{r.get("RateLimit-Limit"), r.get("RateLimit-Remaining"), r.get("RateLimit-Reset"), r.get("Retry-After")}
		if want := [4]string{tc.limit, tc.remaining, tc.reset, tc.retryAfter}; got != want {
			t.Fatalf("step %d: headers %v, want %v", i, got, want)
		}
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
	tenant           uuid.UUID
	perSecond, burst int
	now              time.Time
}

func (f *fakeBudgets) TakeRate(_ context.Context, tenant, _ uuid.UUID, perSecond, burst int, now time.Time) (engine.RateDecision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, budgetCall{tenant, perSecond, burst, now})
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
	if _, err := h.tenants.SetRateLimit(t.Context(), h.tenant, engine.RateLimitInput{PerSecond: &three, Burst: &one}); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("redis: connection refused")
	allowed := engine.RateDecision{Allowed: true, Limit: 1, Remaining: 0, Reset: 333333 * time.Microsecond}
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
		if tc.status == 429 {
			wantProblem(t, r, 429, "rate-limited", "")
		} else if r.status != tc.status {
			t.Fatalf("step %d: status %d, want %d: %s", i, r.status, tc.status, r.body)
		}
		got := [4]string{r.get("RateLimit-Limit"), r.get("RateLimit-Remaining"), r.get("RateLimit-Reset"), r.get("Retry-After")}
		if want := [4]string{tc.limit, tc.remaining, tc.reset, tc.retryAfter}; got != want {
			t.Fatalf("step %d: headers %v, want %v", i, got, want)
		}
		budgets.mu.Lock()
		asked := len(budgets.asked) > before
		budgets.mu.Unlock()
		if asked != tc.asked {
			t.Fatalf("step %d: budgets asked %v, want %v", i, asked, tc.asked)
		}
	}
	budgets.mu.Lock()
	defer budgets.mu.Unlock()
	if want := (budgetCall{h.tenant, 3, 1, time.Unix(1_900_000_000, 0)}); budgets.asked[0] != want {
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
		r.remember(uuid.New(), now, refused)
	}
	for i := range r.shards {
		if n := len(r.shards[i].byKey); n > limiterKeysInShard {
			t.Fatalf("shard %d holds %d windows, bound %d", i, n, limiterKeysInShard)
		}
	}
	later := now.Add(2 * time.Second) // every window is over
	key := uuid.New()
	r.remember(key, later, refused)
	if d, ok := r.check(key, later, 1); !ok || d.retryAfterSec != 1 {
		t.Fatalf("a full shard did not make room: %+v %v", d, ok)
	}
	if _, ok := r.check(key, later.Add(time.Second), 1); ok {
		t.Fatal("a window past its Retry-After still refuses")
	}
}
