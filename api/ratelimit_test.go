package api

import (
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
