package api

import (
	"math"
	"net"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// Rate limiter bounds: 64 shards of at most 1024 keys keep memory under a
// few MB whatever the number of keys; a bucket that has refilled is dropped
// first, since a fresh bucket behaves the same.
const (
	limiterShards      = 64
	limiterKeysInShard = 1024
)

var (
	headerLimit      = []byte("RateLimit-Limit")
	headerRemaining  = []byte("RateLimit-Remaining")
	headerReset      = []byte("RateLimit-Reset")
	headerRetryAfter = []byte("Retry-After")
)

// errRateLimited is the 429 problem.
var errRateLimited = &engine.Error{Kind: engine.KindRateLimited, Detail: "too many requests for this API key; retry after the Retry-After seconds"}

// rateLimiter is an in-process token bucket per API key (addendum 10). It
// limits one process only, so it serves where one process is the point: the
// admin API's bucket per client address, and the fallback of the per-key
// limit while the shared budgets (Config.RateBudgets) cannot be reached.
// The tenant's rate and burst are read on every request, so an operator
// change applies within the auth cache's 2 s.
type rateLimiter struct {
	shards [limiterShards]limiterShard
	now    func() time.Time
}

type limiterShard struct {
	mu      sync.Mutex
	buckets map[uuid.UUID]bucket
}

// bucket holds the tokens left at last and the figures to refill it.
type bucket struct {
	tokens float64
	last   int64 // unix nanoseconds
	rate   float64
	burst  float64
}

func newRateLimiter() *rateLimiter {
	l := &rateLimiter{now: time.Now}
	for i := range l.shards {
		l.shards[i].buckets = make(map[uuid.UUID]bucket)
	}
	return l
}

// decision is one take from a bucket and what the headers say about it.
type decision struct {
	allowed       bool
	limit         int
	remaining     int
	resetSeconds  int // until the bucket is full again
	retryAfterSec int // until one token is back (only when refused)
}

// take spends one token of key's bucket, refilled at perSecond up to burst.
func (l *rateLimiter) take(key uuid.UUID, perSecond, burst int) decision {
	if perSecond <= 0 {
		perSecond = engine.DefaultRateLimitPerSecond
	}
	if burst <= 0 {
		burst = engine.DefaultRateLimitBurst
	}
	rate, capacity := float64(perSecond), float64(burst)
	now := l.now().UnixNano()
	sh := &l.shards[key[15]%limiterShards]
	sh.mu.Lock()
	b, ok := sh.buckets[key]
	if !ok {
		if len(sh.buckets) >= limiterKeysInShard {
			sh.evict(now)
		}
		b = bucket{tokens: capacity, last: now}
	} else if elapsed := now - b.last; elapsed > 0 {
		b.tokens = math.Min(capacity, b.tokens+float64(elapsed)/1e9*rate)
		b.last = now
	}
	b.tokens = math.Min(b.tokens, capacity) // a lowered burst applies at once
	b.rate, b.burst = rate, capacity
	d := decision{limit: burst}
	if b.tokens >= 1 {
		b.tokens--
		d.allowed = true
	} else {
		d.retryAfterSec = int(math.Ceil((1 - b.tokens) / rate))
	}
	sh.buckets[key] = b
	sh.mu.Unlock()
	d.remaining = int(b.tokens)
	d.resetSeconds = int(math.Ceil((capacity - b.tokens) / rate))
	return d
}

// evict drops the buckets that have refilled by now (a fresh bucket acts
// the same) and, if that frees less than an eighth of the shard, the ones
// idle longest, so the next inserts find room without another scan.
func (sh *limiterShard) evict(now int64) {
	for k, b := range sh.buckets {
		if b.tokens+float64(now-b.last)/1e9*b.rate >= b.burst {
			delete(sh.buckets, k)
		}
	}
	const keep = limiterKeysInShard - limiterKeysInShard/8
	if len(sh.buckets) <= keep {
		return
	}
	type idle struct {
		key  uuid.UUID
		last int64
	}
	all := make([]idle, 0, len(sh.buckets))
	for k, b := range sh.buckets {
		all = append(all, idle{k, b.last})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].last < all[j].last })
	for _, e := range all[:len(all)-keep] {
		delete(sh.buckets, e.key)
	}
}

// rateBudgetWarnEvery spaces the warnings of an unreachable budget store:
// one line per interval, not one per request.
const rateBudgetWarnEvery = 10 * time.Second

// rateLimit applies the caller's key budget and sets the RateLimit headers;
// false means the 429 has been written. The budget is the fleet's one in
// Redis (gcra.lua, one EVALSHA) when the server has one; while that store
// fails, the request is limited by this process's own bucket instead (fail
// open to a per-node limit: docs/decisions.md "Rate limits across the
// fleet").
func (s *Server) rateLimit(c *call) bool {
	perSecond, burst := c.tenant.RateLimitPerSecond, c.tenant.RateLimitBurst
	if perSecond <= 0 {
		perSecond = engine.DefaultRateLimitPerSecond
	}
	if burst <= 0 {
		burst = engine.DefaultRateLimitBurst
	}
	if s.budgets != nil {
		var now time.Time // zero: the budget store's clock, shared by all nodes
		local := time.Now()
		if s.budgetClock != nil {
			now = s.budgetClock()
			local = now
		}
		if d, ok := s.refusals.check(c.scope.KeyID, local, burst); ok {
			return c.applyLimit(d, errRateLimited)
		}
		rd, err := s.budgets.TakeRate(c.reqContext(), c.tenant.ID, c.scope.KeyID, perSecond, burst, now)
		if err == nil {
			if !rd.Allowed {
				// local was read before the call, so the window ends no later
				// than the budget's own: it never refuses what Redis would allow.
				s.refusals.remember(c.scope.KeyID, local, rd)
			}
			return c.applyLimit(decisionOf(rd), errRateLimited)
		}
		s.warnBudgets(err)
	}
	return c.applyLimit(s.limiter.take(c.scope.KeyID, perSecond, burst), errRateLimited)
}

// decisionOf is the header figures of a shared budget's answer, in whole
// seconds rounded up, as the in-process bucket gives them.
func decisionOf(rd engine.RateDecision) decision {
	return decision{
		allowed:       rd.Allowed,
		limit:         rd.Limit,
		remaining:     rd.Remaining,
		resetSeconds:  ceilSeconds(rd.Reset),
		retryAfterSec: ceilSeconds(rd.RetryAfter),
	}
}

// ceilSeconds is d in whole seconds, rounded up (the headers' unit).
func ceilSeconds(d time.Duration) int {
	return int((d + time.Second - 1) / time.Second)
}

// refusals remembers, per API key, until when the shared budget refuses
// every request, so a flood is refused in process instead of costing a
// Redis round trip each. It is exact: only an allowed request moves a GCRA
// budget (forward), so a request that budget refused with Retry-After r is
// refused on every node until r has passed. A changed rate applies once
// the window (at most one request's interval, 1 s at 1/s) is over. Bounded
// like the buckets: at most limiterKeysInShard keys per shard; a full shard
// drops the windows that are over, then any, down to seven eighths.
type refusals struct {
	shards [limiterShards]refusalShard
}

type refusalShard struct {
	mu    sync.Mutex
	byKey map[uuid.UUID]refusal
}

// refusal is one refused key's window: refused until until, full again at
// full (unix nanoseconds of the node's clock).
type refusal struct {
	until, full int64
}

func newRefusals() *refusals {
	r := &refusals{}
	for i := range r.shards {
		r.shards[i].byKey = make(map[uuid.UUID]refusal)
	}
	return r
}

// check answers key's request at now from a remembered refusal window;
// ok is false when there is none (ask the shared budget).
func (r *refusals) check(key uuid.UUID, now time.Time, burst int) (decision, bool) {
	sh := &r.shards[key[15]%limiterShards]
	t := now.UnixNano()
	sh.mu.Lock()
	w, ok := sh.byKey[key]
	if ok && t >= w.until {
		delete(sh.byKey, key)
		ok = false
	}
	sh.mu.Unlock()
	if !ok {
		return decision{}, false
	}
	return decision{
		limit:         burst,
		resetSeconds:  ceilSeconds(time.Duration(w.full - t)),
		retryAfterSec: ceilSeconds(time.Duration(w.until - t)),
	}, true
}

// remember keeps the window of a refusal the shared budget gave at now.
func (r *refusals) remember(key uuid.UUID, now time.Time, rd engine.RateDecision) {
	if rd.RetryAfter <= 0 {
		return
	}
	sh := &r.shards[key[15]%limiterShards]
	t := now.UnixNano()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.byKey[key]; !ok && len(sh.byKey) >= limiterKeysInShard {
		for k, w := range sh.byKey {
			if t >= w.until {
				delete(sh.byKey, k)
			}
		}
		// Forgetting a window only costs a round trip to Redis: drop any
		// eighth, so the next inserts find room without another scan.
		for k := range sh.byKey {
			if len(sh.byKey) < limiterKeysInShard-limiterKeysInShard/8 {
				break
			}
			delete(sh.byKey, k)
		}
	}
	sh.byKey[key] = refusal{until: t + int64(rd.RetryAfter), full: t + int64(rd.Reset)}
}

// warnBudgets logs a failure of the shared budgets at most once per
// rateBudgetWarnEvery.
func (s *Server) warnBudgets(err error) {
	now := time.Now().UnixNano()
	last := s.budgetWarned.Load()
	if now-last < int64(rateBudgetWarnEvery) || !s.budgetWarned.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn().Err(err).Msg("shared rate budgets unreachable; limiting per process until they answer")
}

// The admin API's bucket per client address: operators script it, but a
// loop (or a token guesser) must not reach Postgres at line rate.
const (
	adminRatePerSecond = 20
	adminRateBurst     = 100
)

// errAdminRateLimited is the admin API's 429.
var errAdminRateLimited = &engine.Error{Kind: engine.KindRateLimited, Detail: "too many admin requests from this address; retry after the Retry-After seconds"}

// adminRateLimit applies the client address's admin bucket; false means the
// 429 has been written.
func (s *Server) adminRateLimit(c *call) bool {
	d := s.adminLimiter.take(clientBucket(c.ctx.RemoteAddr()), adminRatePerSecond, adminRateBurst)
	return c.applyLimit(d, errAdminRateLimited)
}

// clientBucket is the limiter key of a client address (clientOf: an IPv4
// address or an IPv6 /64), as 16 bytes. The limiter shards on the last
// byte, so the address's upper bytes are folded into it: still one key per
// address, spread over the shards. Non-TCP peers share one bucket.
func clientBucket(addr net.Addr) uuid.UUID {
	client, ok := clientOf(addr)
	if !ok {
		return uuid.Nil
	}
	k := uuid.UUID(client.As16())
	k[15] ^= k[4] ^ k[5] ^ k[6] ^ k[7] ^ k[12] ^ k[13] ^ k[14]
	return k
}

// applyLimit sets the RateLimit headers of d; false means the 429 (refused)
// has been written.
func (c *call) applyLimit(d decision, refused error) bool {
	h := &c.ctx.Response.Header
	var buf [20]byte
	h.SetBytesKV(headerLimit, strconv.AppendInt(buf[:0], int64(d.limit), 10))
	h.SetBytesKV(headerRemaining, strconv.AppendInt(buf[:0], int64(d.remaining), 10))
	h.SetBytesKV(headerReset, strconv.AppendInt(buf[:0], int64(d.resetSeconds), 10))
	if d.allowed {
		return true
	}
	h.SetBytesKV(headerRetryAfter, strconv.AppendInt(buf[:0], int64(max(d.retryAfterSec, 1)), 10))
	c.fail(refused)
	return false
}
