package api

import (
	"context"
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

// rateLimiter is an in-process token bucket per API key (docs/spec/addendum.md §10). It
// limits one process only, so it serves where one process is the point: the
// admin API's bucket per client address, and the fallback of the per-key
// limit while the shared budgets (Config.RateBudgets) cannot be reached.
// The tenant's rate and burst are read on every request from the auth
// cache, which the tenant's change stamps keep current (engine.Stamps), so
// an operator change applies from the next request on every node.
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

// keyLimits is a key's rate and burst, the defaults where unset (0).
func keyLimits(perSecond, burst int) (int, int) {
	if perSecond <= 0 {
		perSecond = engine.DefaultRateLimitPerSecond
	}
	if burst <= 0 {
		burst = engine.DefaultRateLimitBurst
	}
	return perSecond, burst
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
	perSecond, burst = keyLimits(perSecond, burst)
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
// Redis (gcra.lua) when the server has one, taken in leases (takeShared:
// one EVALSHA per lease, not per request); while that store fails, the
// request is limited by this process's own bucket instead (fail open to a
// per-node limit: docs/decisions.md "Rate limits across the fleet").
func (s *Server) rateLimit(c *call) bool {
	perSecond, burst := keyLimits(c.tenant.RateLimitPerSecond, c.tenant.RateLimitBurst)
	if d := &c.door; d.rateDone && d.rateLimits == [2]int{perSecond, burst} {
		// The door decided it (door.go) under the limits authentication
		// read too; under others it is decided again below.
		if d.rateErr == nil {
			return c.applyLimit(d.rate, errRateLimited)
		}
		s.warnBudgets(d.rateErr)
		return c.applyLimit(s.limiter.take(c.scope.KeyID, perSecond, burst), errRateLimited)
	}
	if s.budgets != nil {
		now, local := s.rateClocks()
		d, err := takeShared(c.reqContext(), s.budgets, s.refusals, s.leases, c.tenant.ID, c.scope.KeyID, perSecond, burst, now, local)
		if err == nil {
			return c.applyLimit(d, errRateLimited)
		}
		s.warnBudgets(err)
	}
	return c.applyLimit(s.limiter.take(c.scope.KeyID, perSecond, burst), errRateLimited)
}

// rateClocks are a take's clocks: now the shared budgets' (zero: the
// budget store's own, which every node shares), local this node's; a test's
// budgetClock sets both.
func (s *Server) rateClocks() (now, local time.Time) {
	if s.budgetClock != nil {
		t := s.budgetClock()
		return t, t
	}
	return time.Time{}, time.Now()
}

// takeShared decides one request of key against the shared budgets: from
// this node's lease, else from a remembered refusal window, else with one
// take of the budgets (a new lease when this request owns the key's next
// take; a request that finds another one taking it waits for that answer,
// at most leaseWaits times, rather than costing a round trip of its own).
// now is the budgets' clock (zero: theirs), local this node's. An error is
// the budgets' or ctx's (the caller falls back to its own bucket).
func takeShared(ctx context.Context, budgets engine.RateBudgets, r *refusals, l *leases, tenant, key uuid.UUID, perSecond, burst int, now, local time.Time) (decision, error) {
	p, err := planShared(ctx, r, l, key, perSecond, burst, local, true)
	if err != nil || p.decided {
		return p.d, err
	}
	rd, err := budgets.TakeRate(ctx, tenant, key, perSecond, burst, p.want, now)
	return finishShared(r, l, key, perSecond, local, p, rd, err)
}

// ratePlan is what takeShared knows before it asks the budgets: the
// decision itself (decided: a lease or a refusal window served it), else
// the requests to ask for and whether this request owns the key's next
// lease (then finishShared must settle it, whatever happens).
type ratePlan struct {
	decided bool
	d       decision
	want    int
	owner   bool
}

// planShared is takeShared up to the budgets' take; with wait it waits
// for another request's take of the key's next lease (at most leaseWaits
// times), without it asks for a request of its own at once (a request's
// door, which cannot wait: its take goes out with its other commands).
func planShared(ctx context.Context, r *refusals, l *leases, key uuid.UUID, perSecond, burst int, local time.Time, wait bool) (ratePlan, error) {
	for waits := 0; ; waits++ {
		if d, ok := l.spend(key, local, perSecond, burst); ok {
			return ratePlan{decided: true, d: d}, nil
		}
		if d, ok := r.check(key, local, perSecond, burst); ok {
			return ratePlan{decided: true, d: d}, nil
		}
		want, owner, taking := l.claim(key, local, perSecond, burst, wait && waits < leaseWaits)
		if taking == nil {
			return ratePlan{want: want, owner: owner}, nil
		}
		select {
		case <-taking:
		case <-ctx.Done():
			return ratePlan{}, ctx.Err()
		}
	}
}

// finishShared is takeShared once the budgets answered rd (or failed with
// err) to plan's take.
func finishShared(r *refusals, l *leases, key uuid.UUID, perSecond int, local time.Time, plan ratePlan, rd engine.RateDecision, err error) (decision, error) {
	want := plan.want
	if plan.owner {
		l.settle(key, local, perSecond, want, rd, err)
	}
	if err != nil {
		return decision{}, err
	}
	switch {
	case !rd.Allowed:
		// local was read before the call, so the window ends no later than
		// the budget's own for one request. A lease of n waits for n: n-1
		// intervals more (at most one lease's life), in which the budget
		// only fills, so nothing is lost (the burst holds two leases).
		if want > 1 {
			rd.RetryAfter += min(time.Duration(want-1)*interval(perSecond), leaseLife(want, perSecond))
		}
		r.remember(key, local, perSecond, rd)
	case want > 1 && rd.Granted < want:
		// The budget is spent but for these: once they are served, wait
		// until a whole lease is back rather than asking for crumbs (the
		// budget fills meanwhile, so nothing is lost).
		r.remember(key, local, perSecond, engine.RateDecision{Limit: rd.Limit, Reset: rd.Reset,
			RetryAfter: min(time.Duration(want)*interval(perSecond), leaseLife(want, perSecond))})
	}
	return leaseDecision(rd, rd.Granted-1, 0, perSecond), nil
}

// leaseDecision is the header figures of a budget's answer rd when unserved
// of its granted requests are still held by this node, elapsed after the
// answer, in whole seconds rounded up as the in-process bucket gives them.
// The held requests count as remaining (they are the key's), as does the
// refill since the answer, and the budget is full again that much sooner
// than the script said; other nodes' takes since then are not seen (at
// most one lease's life, 10 ms).
func leaseDecision(rd engine.RateDecision, unserved int, elapsed time.Duration, perSecond int) decision {
	unserved = max(unserved, 0)
	return decision{
		allowed:       rd.Allowed,
		limit:         rd.Limit,
		remaining:     min(rd.Remaining+unserved+int(elapsed/interval(perSecond)), max(rd.Limit, 0)),
		resetSeconds:  ceilSeconds(max(rd.Reset-elapsed-time.Duration(unserved)*interval(perSecond), 0)),
		retryAfterSec: ceilSeconds(rd.RetryAfter),
	}
}

// interval is the time one request of a perSecond budget represents.
func interval(perSecond int) time.Duration {
	return time.Second / time.Duration(perSecond)
}

// Leases: a node takes a key's budget n requests at a time (one EVALSHA)
// and serves them from memory, so a busy key costs Redis about
// leaseCallsPerSecond calls per node, not one per request.
const (
	// leaseCallsPerSecond sets the largest lease: rate/100 requests, the
	// budget of 10 ms, so a node at full speed asks 100 times a second.
	leaseCallsPerSecond = 100
	// leaseMinLife is the shortest time leased requests may be served; a
	// lease lives the time its requests represent at the rate, or this.
	leaseMinLife = 10 * time.Millisecond
	// leaseWaits is how many takes of other requests one request waits
	// for before it asks for a request of its own.
	leaseWaits = 2
)

// leaseCap is the most requests a node leases at once of a key limited to
// perSecond up to burst: rate/100, at most half the burst (so two nodes'
// leases fit in it), at least 1. A key under 200/s (or burst under 4) is
// never leased: each request takes 1, exactly as without leases.
func leaseCap(perSecond, burst int) int {
	return max(1, min(perSecond/leaseCallsPerSecond, burst/2))
}

// leaseLife is how long a lease of n requests may be served: the time they
// represent at perSecond, at least leaseMinLife. After it the unserved
// ones are dropped, so a node never saves a lease to spend it in a burst
// later: the fleet can only under-use its budget.
func leaseLife(n, perSecond int) time.Duration {
	return max(time.Duration(n)*interval(perSecond), leaseMinLife)
}

// leases holds this node's leases per API key, bounded like the buckets.
type leases struct {
	shards [limiterShards]leaseShard
}

type leaseShard struct {
	mu    sync.Mutex
	byKey map[uuid.UUID]lease
}

// lease is what a node holds of one key's budget. Its size follows the
// node's demand: it doubles while the requests outrun it (all served
// before it ended) and shrinks to what was served in its life otherwise,
// so a node whose share of the traffic is small takes little and wastes
// little of the fleet's budget.
type lease struct {
	left    int   // requests still to serve
	granted int   // requests the last take granted
	served  int   // of those, served (the first included)
	size    int   // requests the last take asked for
	expires int64 // unix ns of the node's clock: left is void from then
	// taking, while a take of this key's next lease is in flight, is
	// closed when its answer is settled.
	taking chan struct{}
	// The budget's answer to the last take and when it came (headers).
	answer engine.RateDecision
	at     int64
	// perSecond and burst are the limits the last take was made under: a
	// lease is spent only under the same ones, so limits changed anywhere
	// in the fleet govern this node's next request (invariant 15), not the
	// rest of a lease taken before.
	perSecond, burst int
}

func newLeases() *leases {
	l := &leases{}
	for i := range l.shards {
		l.shards[i].byKey = make(map[uuid.UUID]lease)
	}
	return l
}

// spend serves key's request at now from the node's lease, if it holds one.
func (l *leases) spend(key uuid.UUID, now time.Time, perSecond, burst int) (decision, bool) {
	if leaseCap(perSecond, burst) == 1 {
		return decision{}, false
	}
	t := now.UnixNano()
	sh := &l.shards[key[15]%limiterShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ls, found := sh.byKey[key]
	if !found || ls.left <= 0 || t >= ls.expires || ls.perSecond != perSecond || ls.burst != burst {
		return decision{}, false
	}
	ls.left--
	ls.served++
	sh.byKey[key] = ls
	return leaseDecision(ls.answer, ls.left, time.Duration(t-ls.at), perSecond), true
}

// claim is what to ask the budgets for when the lease is spent. When
// another request is taking the key's next lease and wait allows, taking
// is closed once that is settled (look again then). Else want is the
// requests to ask for: the next lease's size when owner (the caller must
// then settle), or 1 when the key is never leased or another request is
// taking its next lease.
func (l *leases) claim(key uuid.UUID, now time.Time, perSecond, burst int, wait bool) (want int, owner bool, taking <-chan struct{}) {
	most := leaseCap(perSecond, burst)
	if most == 1 {
		return 1, false, nil
	}
	t := now.UnixNano()
	sh := &l.shards[key[15]%limiterShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ls, found := sh.byKey[key]
	if found && ls.taking != nil {
		if wait {
			return 0, false, ls.taking
		}
		return 1, false, nil
	}
	size := 1
	if found {
		if t < ls.expires {
			size = max(ls.size, 2*ls.granted) // all served before the end
		} else {
			size = ls.served
		}
	} else if len(sh.byKey) >= limiterKeysInShard {
		sh.evict(t)
	}
	ls.size = min(max(size, 1), most)
	ls.taking = make(chan struct{})
	sh.byKey[key] = ls
	return ls.size, true, nil
}

// settle records the budgets' answer rd (or failure err) to the take of
// want requests that claim gave the caller at now: a new lease of what was
// granted beyond the caller's own request.
func (l *leases) settle(key uuid.UUID, now time.Time, perSecond, want int, rd engine.RateDecision, err error) {
	t := now.UnixNano()
	sh := &l.shards[key[15]%limiterShards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if prev, ok := sh.byKey[key]; ok && prev.taking != nil {
		close(prev.taking)
	}
	ls := lease{size: want, served: want, granted: want, expires: t}
	if err == nil && rd.Granted > 0 {
		ls = lease{
			left: rd.Granted - 1, granted: rd.Granted, served: 1, size: want,
			expires: t + int64(leaseLife(rd.Granted, perSecond)),
			answer:  rd, at: t, perSecond: perSecond, burst: rd.Limit,
		}
	}
	// Refused or failed: nothing held, and the next take asks for as many
	// again (served = want), once the refusal window is over.
	sh.byKey[key] = ls
}

// evict drops the leases that are over (none in flight) and, if that frees
// less than an eighth of the shard, any others not in flight: a dropped
// lease only costs its unserved requests and a take.
func (sh *leaseShard) evict(t int64) {
	idle := func(ls lease) bool { return ls.taking == nil }
	trimShard(sh.byKey, func(ls lease) bool { return idle(ls) && t >= ls.expires }, idle)
}

// trimShard makes room in a full shard m: it drops the entries that are
// over and, if that frees less than an eighth of the shard, any others
// that may go, so the next inserts find room without another scan.
func trimShard[V any](m map[uuid.UUID]V, over, mayGo func(V) bool) {
	for k, v := range m {
		if over(v) {
			delete(m, k)
		}
	}
	for k, v := range m {
		if len(m) < limiterKeysInShard-limiterKeysInShard/8 {
			break
		}
		if mayGo(v) {
			delete(m, k)
		}
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
	// perSecond and burst are the limits the refusal was given under: a
	// window of other limits is not this request's (see lease).
	perSecond, burst int
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
func (r *refusals) check(key uuid.UUID, now time.Time, perSecond, burst int) (decision, bool) {
	sh := &r.shards[key[15]%limiterShards]
	t := now.UnixNano()
	sh.mu.Lock()
	w, ok := sh.byKey[key]
	if ok && (t >= w.until || w.perSecond != perSecond || w.burst != burst) {
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
func (r *refusals) remember(key uuid.UUID, now time.Time, perSecond int, rd engine.RateDecision) {
	if rd.RetryAfter <= 0 {
		return
	}
	sh := &r.shards[key[15]%limiterShards]
	t := now.UnixNano()
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.byKey[key]; !ok && len(sh.byKey) >= limiterKeysInShard {
		// Forgetting a window only costs a round trip to Redis: any may go.
		trimShard(sh.byKey, func(w refusal) bool { return t >= w.until }, func(refusal) bool { return true })
	}
	w := refusal{until: t + int64(rd.RetryAfter), full: t + int64(rd.Reset), perSecond: perSecond, burst: rd.Limit}
	if old, ok := sh.byKey[key]; ok && old.until > w.until && old.perSecond == perSecond && old.burst == rd.Limit {
		return // a longer window of a lease's take stands
	}
	sh.byKey[key] = w
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
