// CachedPlanView: the PlanView the hot path reads, a decorator over the
// uncached one (PlanFacts), and the two store decorators whose writes make
// it forget, so the invalidation is wired by construction rather than by
// callbacks set afterwards (docs/decisions.md "Caches are decorators").

package engine

import (
	"context"
	"slices"
	"time"

	"github.com/google/uuid"
)

// planFactsTTL bounds how long a customer's facts are kept without a
// Postgres read while no write moves the tenant's plan or subscription
// stamps (Stamps: a change made anywhere in the fleet is seen by the next
// request; the TTL bounds staleness only while the stamps cannot be read).
const planFactsTTL = 2 * time.Second

// planFactsStaleLimit bounds how long past its TTL a customer's facts are
// served while one background read refreshes them; an override's expiry
// is never served stale (its entry expires at that instant with no grace).
const planFactsStaleLimit = 10 * time.Second

// maxCachedFacts bounds the cache's memory; a full cache starts over.
const maxCachedFacts = 100_000

// CachedPlanView caches another PlanView's facts per customer for
// planFactsTTL (or until the soonest override expiry in them), served
// stale while one background read refreshes them.
type CachedPlanView struct {
	next   PlanView
	clock  Clock
	cache  *swrCache[uuid.UUID, *SubscriptionFacts]
	stamps *Stamps
	// down tells a failed read of an unreachable Postgres from an answer
	// (nil: SourceDown's default).
	down SourceDown
}

var _ PlanView = (*CachedPlanView)(nil)

// NewCachedPlanView caches next.
func NewCachedPlanView(next PlanView, clock Clock) *CachedPlanView {
	return &CachedPlanView{next: next, clock: clock, cache: newSWRCache[uuid.UUID, *SubscriptionFacts](maxCachedFacts)}
}

// WithSourceDown makes p tell an unreachable source by down (internal/app:
// persist.Unavailable): facts whose read fails so are served from their
// last good copy, within lastGoodLimit and never past an override's expiry.
func (p *CachedPlanView) WithSourceDown(down SourceDown) *CachedPlanView {
	p.down = down
	return p
}

// WithStamps makes p check its entries against the fleet's plan and
// subscription stamps; its forgetting stores then move the subscription
// stamp on every write. nil (the default) is a node alone.
func (p *CachedPlanView) WithStamps(st *Stamps) *CachedPlanView {
	p.stamps = st
	return p
}

// ForCustomer returns the facts of c's live subscription, nil when it has
// none.
func (p *CachedPlanView) ForCustomer(ctx context.Context, c Customer) (*SubscriptionFacts, error) {
	f, st := p.cache.get(c.ID, time.Now(), planFactsStaleLimit, p.stamps.Seen(c.TenantID, maskPlanFacts))
	if st != cacheMiss && f != nil && !f.expiresAt.IsZero() && !p.clock.Now().Before(f.expiresAt) {
		// An override in these facts has expired: they are never served
		// again, not even as the last good copy; read through.
		if st == cacheRefresh {
			p.cache.refreshFailed(c.ID, false)
		}
		st = cacheMiss
	}
	switch st {
	case cacheFresh:
		return f, nil
	case cacheRefresh:
		p.cache.refreshInBackground(c.ID, p.down, func(ctx context.Context) error {
			_, err := p.refresh(ctx, c)
			return err
		})
		return f, nil
	}
	fresh, err := p.refresh(ctx, c)
	if st != cacheMiss && p.down.says(err) {
		if st == cacheExpired {
			p.cache.markDown(c.ID, time.Now())
		}
		return f, nil // Postgres unreachable: the last good copy (invariant 16)
	}
	return fresh, err
}

// refresh reads the customer's facts and caches them for planFactsTTL, or
// until the soonest override expiry when that comes first.
func (p *CachedPlanView) refresh(ctx context.Context, c Customer) (*SubscriptionFacts, error) {
	wall := time.Now()
	gen, stamp := p.cache.generation(), p.stamps.Seen(c.TenantID, maskPlanFacts)
	f, err := p.next.ForCustomer(ctx, c)
	if err != nil {
		return nil, err
	}
	ttl := p.stamps.TTL(planFactsTTL)
	exp := wall.Add(ttl)
	if f != nil && !f.expiresAt.IsZero() {
		if d := f.expiresAt.Sub(p.clock.Now()); d < ttl {
			exp = wall.Add(max(d, 0))
		}
	}
	p.cache.put(c.ID, f, exp, gen, stamp)
	return f, nil
}

// Forget drops the cached facts of a customer (its subscription changed in
// this process).
func (p *CachedPlanView) Forget(customer uuid.UUID) { p.cache.delete(customer) }

// forgetSubscription drops the cached facts of the subscription (one of its
// overrides changed in this process). Override writes are rare, so a scan
// is cheaper than an index kept on every read.
func (p *CachedPlanView) forgetSubscription(id uuid.UUID) {
	p.cache.deleteWhere(func(_ uuid.UUID, f *SubscriptionFacts) bool { return f != nil && f.subscription == id })
}

// ForgettingSubscriptions decorates store so that every subscription it
// writes is forgotten by p once written, and by every node sharing p's
// stamps before its next request.
func (p *CachedPlanView) ForgettingSubscriptions(store SubscriptionStore) SubscriptionStore {
	return &forgettingSubscriptions{SubscriptionStore: store, view: p}
}

// ForgettingOverrides decorates store so that the facts of every
// subscription whose overrides it writes are forgotten by p once written,
// and by every node sharing p's stamps before its next request.
func (p *CachedPlanView) ForgettingOverrides(store OverrideStore) OverrideStore {
	return &forgettingOverrides{OverrideStore: store, view: p}
}

// forgettingSubscriptions is a SubscriptionStore whose writes make a
// CachedPlanView forget the customer; reads pass through.
type forgettingSubscriptions struct {
	SubscriptionStore
	view *CachedPlanView
}

func (s *forgettingSubscriptions) CreateSubscription(ctx context.Context, r SubscriptionRecord) error {
	err := s.SubscriptionStore.CreateSubscription(ctx, r)
	if err == nil {
		s.view.Forget(r.CustomerID)
		s.view.stamps.Bump(ctx, r.TenantID, StampSubscriptions)
	}
	return err
}

func (s *forgettingSubscriptions) UpdateSubscription(ctx context.Context, scope Scope, id uuid.UUID, change func(*SubscriptionRecord) error) (SubscriptionRecord, error) {
	r, err := s.SubscriptionStore.UpdateSubscription(ctx, scope, id, change)
	if err == nil {
		s.view.Forget(r.CustomerID)
		s.view.stamps.Bump(ctx, scope.TenantID, StampSubscriptions)
	}
	return r, err
}

// RunDue forgets each changed customer as its change succeeds (as the
// service did before) and once more after the transactions have ended, so
// no refresh that read a row before its commit outlives it; then it moves
// the subscription stamp of each tenant it changed, once.
func (s *forgettingSubscriptions) RunDue(ctx context.Context, now time.Time, limit int, change func(ctx context.Context, r *SubscriptionRecord) error) (int, error) {
	var changed []uuid.UUID
	var tenants []uuid.UUID
	n, err := s.SubscriptionStore.RunDue(ctx, now, limit, func(ctx context.Context, r *SubscriptionRecord) error {
		if err := change(ctx, r); err != nil {
			return err
		}
		s.view.Forget(r.CustomerID)
		changed = append(changed, r.CustomerID)
		if !slices.Contains(tenants, r.TenantID) {
			tenants = append(tenants, r.TenantID)
		}
		return nil
	})
	for _, id := range changed {
		s.view.Forget(id)
	}
	for _, t := range tenants {
		s.view.stamps.Bump(ctx, t, StampSubscriptions)
	}
	return n, err
}

// forgettingOverrides is an OverrideStore whose writes make a
// CachedPlanView forget the subscription's facts; reads pass through.
type forgettingOverrides struct {
	OverrideStore
	view *CachedPlanView
}

func (s *forgettingOverrides) CreateOverride(ctx context.Context, env Environment, o Override, now time.Time) error {
	err := s.OverrideStore.CreateOverride(ctx, env, o, now)
	if err == nil {
		s.view.forgetSubscription(o.SubscriptionID)
		s.view.stamps.Bump(ctx, o.TenantID, StampSubscriptions)
	}
	return err
}

func (s *forgettingOverrides) UpdateOverride(ctx context.Context, scope Scope, subscription uuid.UUID, key string, now time.Time, change func(*Override) error) (Override, error) {
	o, err := s.OverrideStore.UpdateOverride(ctx, scope, subscription, key, now, change)
	if err == nil {
		s.view.forgetSubscription(subscription)
		s.view.stamps.Bump(ctx, scope.TenantID, StampSubscriptions)
	}
	return o, err
}

func (s *forgettingOverrides) DeleteOverride(ctx context.Context, scope Scope, subscription uuid.UUID, key string, now time.Time) error {
	err := s.OverrideStore.DeleteOverride(ctx, scope, subscription, key, now)
	if err == nil {
		s.view.forgetSubscription(subscription)
		s.view.stamps.Bump(ctx, scope.TenantID, StampSubscriptions)
	}
	return err
}
