package engine

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// swrCache is the request path's cache (stale while revalidate): a read
// is a map look-up under one shard's read lock, which only a put or a
// delete of that shard holds, for a map assignment, never across a read of
// the source (a sync.Map hashed its struct keys through their interface,
// a tenth of a check's CPU in creditd); an entry past its expiry is
// still served, for at most staleLimit, to the callers that come while one
// of them refreshes it in the background, so a hot key never waits on
// Postgres. Changes made in this process bump the generation, so a refresh
// that read the old row before the change cannot store it after. Each entry
// keeps the change stamp (Stamps.Seen) it was read under; a get under
// another stamp misses, so a change made on another node is read through by
// the next request here (issue 25).
//
// An entry is kept lastGoodLimit past its expiry as the last good copy
// (issue 26 item 3, invariant 16): while a read of the source fails because
// Postgres is unreachable (SourceDown), the caller serves that copy instead
// of failing, and tries the source again at most once per lastGoodRetry. A
// failed read never evicts.
type swrCache[K comparable, V any] struct {
	seed   maphash.Seed
	shards [swrShards]swrShard[K, V]
	n      atomic.Int64
	gen    atomic.Uint64
	max    int64
}

// swrShards spreads a cache's keys over this many maps, so readers on
// many cores do not all count into one lock word.
const swrShards = 32

type swrShard[K comparable, V any] struct {
	mu sync.RWMutex
	m  map[K]*swrEntry[V]
}

// shard is k's shard (maphash.Comparable hashes k as a map of K would).
func (c *swrCache[K, V]) shard(k K) *swrShard[K, V] {
	return &c.shards[maphash.Comparable(c.seed, k)%swrShards]
}

// load is k's entry.
func (c *swrCache[K, V]) load(k K) (*swrEntry[V], bool) {
	sh := c.shard(k)
	sh.mu.RLock()
	e, ok := sh.m[k]
	sh.mu.RUnlock()
	return e, ok
}

// swap stores e as k's entry; loaded tells whether k had one.
func (c *swrCache[K, V]) swap(k K, e *swrEntry[V]) (loaded bool) {
	sh := c.shard(k)
	sh.mu.Lock()
	if sh.m == nil {
		sh.m = make(map[K]*swrEntry[V])
	}
	_, loaded = sh.m[k]
	sh.m[k] = e
	sh.mu.Unlock()
	return loaded
}

// remove drops k's entry; loaded tells whether it had one.
func (c *swrCache[K, V]) remove(k K) (loaded bool) {
	sh := c.shard(k)
	sh.mu.Lock()
	_, loaded = sh.m[k]
	delete(sh.m, k)
	sh.mu.Unlock()
	return loaded
}

// each calls f for every entry until f returns false, one shard's entries
// at a time from a copy (f may remove).
func (c *swrCache[K, V]) each(f func(K, *swrEntry[V]) bool) {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.RLock()
		keys := make([]K, 0, len(sh.m))
		entries := make([]*swrEntry[V], 0, len(sh.m))
		for k, e := range sh.m {
			keys, entries = append(keys, k), append(entries, e)
		}
		sh.mu.RUnlock()
		for j, k := range keys {
			if !f(k, entries[j]) {
				return
			}
		}
	}
}

// drop empties every shard.
func (c *swrCache[K, V]) drop() {
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.mu.Unlock()
	}
}

type swrEntry[V any] struct {
	v          V
	expires    int64  // unix nanoseconds
	stamp      uint64 // Stamps.Seen when v was read
	refreshing atomic.Bool
	// retryAt (unix nanoseconds) is set when a read of the source failed
	// because it was down: until then the last good copy is served without
	// asking it again. 0: no such failure since v was read.
	retryAt atomic.Int64
}

// cacheState is what get found.
type cacheState uint8

const (
	cacheMiss    cacheState = iota // absent or older than the last-good limit: read through
	cacheFresh                     // serve
	cacheRefresh                   // serve, and the caller refreshes it in the background
	// cacheChanged: present, but read under another change stamp (a write
	// on some node changed it): read through, and serve the value returned
	// only if that read fails because the source is down (invariant 16).
	cacheChanged
	// cacheExpired: past the stale limit but within lastGoodLimit of its
	// expiry, and no read has found the source down since: read through,
	// and serve the value returned only if that read fails because the
	// source is down (then markDown).
	cacheExpired
)

const (
	// lastGoodLimit bounds how long past its expiry a cache entry is served
	// as the last good copy while Postgres cannot be read (issue 26 item 3;
	// docs/limits.md, docs/decisions.md "The last good copy"): long enough
	// to ride out a restart or a failover of Postgres, short enough that a
	// change nobody could tell this node about (its stamps unreadable too)
	// does not linger.
	lastGoodLimit = 15 * time.Minute
	// lastGoodRetry spaces the reads of a key's source while it is down,
	// so a hot key costs Postgres one connection attempt a second, not one
	// per request.
	lastGoodRetry = time.Second
)

// LastGoodLimit is lastGoodLimit, for the tests and docs outside engine.
const LastGoodLimit = lastGoodLimit

func newSWRCache[K comparable, V any](max int64) *swrCache[K, V] {
	return &swrCache[K, V]{seed: maphash.MakeSeed(), max: max}
}

// get looks k up at now under change stamp stamp: an entry read under
// another stamp is cacheChanged (read through).
func (c *swrCache[K, V]) get(k K, now time.Time, staleLimit time.Duration, stamp uint64) (V, cacheState) {
	var zero V
	e, ok := c.load(k)
	if !ok {
		return zero, cacheMiss
	}
	n := now.UnixNano()
	retryAt := e.retryAt.Load()
	switch {
	case n >= e.expires+int64(lastGoodLimit):
		return zero, cacheMiss
	case e.stamp != stamp:
		return e.v, cacheChanged
	case n < e.expires:
		return e.v, cacheFresh
	case retryAt == 0 && n >= e.expires+int64(staleLimit):
		return e.v, cacheExpired
	case retryAt != 0 && n < retryAt:
		return e.v, cacheFresh // the source is down: the last good copy
	case e.refreshing.CompareAndSwap(false, true):
		return e.v, cacheRefresh
	}
	return e.v, cacheFresh
}

// peek is k's value when get at now would serve it (fresh, or within
// staleLimit past its expiry), whatever its stamp, without get's side
// effects (no refresh is claimed): a look ahead that get then confirms.
func (c *swrCache[K, V]) peek(k K, now time.Time, staleLimit time.Duration) (V, bool) {
	var zero V
	e, ok := c.load(k)
	if !ok {
		return zero, false
	}
	if now.UnixNano() >= e.expires+int64(staleLimit) {
		return zero, false
	}
	return e.v, true
}

// generation is taken before reading the source of truth and handed to put.
func (c *swrCache[K, V]) generation() uint64 { return c.gen.Load() }

// put stores v, read under change stamp stamp, until expires unless the
// cache was invalidated since gen. A full cache starts over (the bound is
// memory, not precision).
func (c *swrCache[K, V]) put(k K, v V, expires time.Time, gen, stamp uint64) {
	if c.gen.Load() != gen {
		return
	}
	if c.n.Load() >= c.max {
		c.drop()
		c.n.Store(0)
	}
	if loaded := c.swap(k, &swrEntry[V]{v: v, expires: expires.UnixNano(), stamp: stamp}); !loaded {
		c.n.Add(1)
	}
}

// refreshFailed lets the next caller try the refresh again: at once, or,
// when the source was down (down), not before lastGoodRetry has passed,
// the entry meanwhile served as the last good copy.
func (c *swrCache[K, V]) refreshFailed(k K, down bool) {
	if down {
		c.markDown(k, time.Now())
		return
	}
	if e, ok := c.load(k); ok {
		e.refreshing.Store(false)
	}
}

// markDown notes that a read of k's source found it down at now: the entry
// is served as the last good copy (within lastGoodLimit), the source asked
// again in the background at most once per lastGoodRetry.
func (c *swrCache[K, V]) markDown(k K, now time.Time) {
	if e, ok := c.load(k); ok {
		e.retryAt.Store(now.Add(lastGoodRetry).UnixNano())
		e.refreshing.Store(false)
	}
}

// refreshTimeout bounds one background refresh.
const refreshTimeout = 5 * time.Second

// refreshInBackground runs load, the read-through of k that get answered
// cacheRefresh for, in a goroutine of its own; when it fails, the next
// caller past the expiry tries again (past lastGoodRetry when down says
// the source was down).
func (c *swrCache[K, V]) refreshInBackground(k K, down SourceDown, load func(context.Context) error) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
		defer cancel()
		if err := load(ctx); err != nil {
			c.refreshFailed(k, down.says(err))
		}
	}()
}

// delete drops k and invalidates refreshes in flight.
func (c *swrCache[K, V]) delete(k K) {
	c.gen.Add(1)
	if c.remove(k) {
		c.n.Add(-1)
	}
}

// deleteWhere drops every entry drop picks and invalidates refreshes in
// flight.
func (c *swrCache[K, V]) deleteWhere(drop func(K, V) bool) {
	c.gen.Add(1)
	c.each(func(k K, e *swrEntry[V]) bool {
		if drop(k, e.v) && c.remove(k) {
			c.n.Add(-1)
		}
		return true
	})
}

// clear drops everything.
func (c *swrCache[K, V]) clear() {
	c.gen.Add(1)
	c.drop()
	c.n.Store(0)
}

// SourceDown tells whether a read's error says only that the system of
// record could not answer now (internal/app passes persist.Unavailable),
// as opposed to an answer about the data; the caches then serve their last
// good copy (lastGoodLimit). nil counts every error but a not-found, a
// cancelled request and a domain error other than ErrRecordUnavailable.
type SourceDown func(error) bool

// says tells whether err is the source being down.
func (f SourceDown) says(err error) bool {
	switch {
	case err == nil || isNotFound(err) || errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, ErrRecordUnavailable):
		return true
	case f != nil:
		return f(err)
	}
	_, domain := AsError(err)
	return !domain
}
