package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// swrCache is the request path's lock-free cache (stale while revalidate):
// reads are a sync.Map load, never a mutex; an entry past its expiry is
// still served, for at most staleLimit, to the callers that come while one
// of them refreshes it in the background, so a hot key never waits on
// Postgres. Changes made in this process bump the generation, so a refresh
// that read the old row before the change cannot store it after. Each entry
// keeps the change stamp (Stamps.Seen) it was read under; a get under
// another stamp misses, so a change made on another node is read through by
// the next request here (issue 25).
type swrCache[K comparable, V any] struct {
	m   sync.Map // K -> *swrEntry[V]
	n   atomic.Int64
	gen atomic.Uint64
	max int64
}

type swrEntry[V any] struct {
	v          V
	expires    int64  // unix nanoseconds
	stamp      uint64 // Stamps.Seen when v was read
	refreshing atomic.Bool
}

// cacheState is what get found.
type cacheState uint8

const (
	cacheMiss    cacheState = iota // absent or too stale: read through
	cacheFresh                     // serve
	cacheRefresh                   // serve, and the caller refreshes it in the background
	// cacheChanged: present, but read under another change stamp (a write
	// on some node changed it): read through, and serve the value returned
	// only if that read fails on something else than the row's absence
	// (Postgres unreachable: invariant 16), as the TTLs allowed before.
	cacheChanged
)

func newSWRCache[K comparable, V any](max int64) *swrCache[K, V] {
	return &swrCache[K, V]{max: max}
}

// get looks k up at now under change stamp stamp: an entry read under
// another stamp is cacheChanged (read through).
func (c *swrCache[K, V]) get(k K, now time.Time, staleLimit time.Duration, stamp uint64) (V, cacheState) {
	var zero V
	x, ok := c.m.Load(k)
	if !ok {
		return zero, cacheMiss
	}
	e := x.(*swrEntry[V])
	n := now.UnixNano()
	switch {
	case n >= e.expires+int64(staleLimit):
		return zero, cacheMiss
	case e.stamp != stamp:
		return e.v, cacheChanged
	case n < e.expires:
		return e.v, cacheFresh
	case e.refreshing.CompareAndSwap(false, true):
		return e.v, cacheRefresh
	}
	return e.v, cacheFresh
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
		c.m.Clear()
		c.n.Store(0)
	}
	if _, loaded := c.m.Swap(k, &swrEntry[V]{v: v, expires: expires.UnixNano(), stamp: stamp}); !loaded {
		c.n.Add(1)
	}
}

// refreshFailed lets the next caller try the refresh again.
func (c *swrCache[K, V]) refreshFailed(k K) {
	if x, ok := c.m.Load(k); ok {
		x.(*swrEntry[V]).refreshing.Store(false)
	}
}

// refreshTimeout bounds one background refresh.
const refreshTimeout = 5 * time.Second

// refreshInBackground runs load, the read-through of k that get answered
// cacheRefresh for, in a goroutine of its own; when it fails, the next
// caller past the expiry tries again.
func (c *swrCache[K, V]) refreshInBackground(k K, load func(context.Context) error) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
		defer cancel()
		if err := load(ctx); err != nil {
			c.refreshFailed(k)
		}
	}()
}

// delete drops k and invalidates refreshes in flight.
func (c *swrCache[K, V]) delete(k K) {
	c.gen.Add(1)
	if _, loaded := c.m.LoadAndDelete(k); loaded {
		c.n.Add(-1)
	}
}

// deleteWhere drops every entry drop picks and invalidates refreshes in
// flight.
func (c *swrCache[K, V]) deleteWhere(drop func(K, V) bool) {
	c.gen.Add(1)
	c.m.Range(func(k, x any) bool {
		if drop(k.(K), x.(*swrEntry[V]).v) {
			if _, loaded := c.m.LoadAndDelete(k); loaded {
				c.n.Add(-1)
			}
		}
		return true
	})
}

// clear drops everything.
func (c *swrCache[K, V]) clear() {
	c.gen.Add(1)
	c.m.Clear()
	c.n.Store(0)
}
