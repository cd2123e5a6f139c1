package engine

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
)

// planFactsTTL bounds how stale another process's view of a customer's
// subscription can be; this process forgets its own changes at once.
const planFactsTTL = 2 * time.Second

// PlanFacts is the PlanView of checks, consumes and holds: the customer's
// live subscription, its variant's entitlements overlaid by live overrides
// (addendum 5 order), cached per customer.
type PlanFacts struct {
	subs      SubscriptionReader
	plans     *Plans
	overrides OverrideReader
	clock     Clock

	cache *swrCache[uuid.UUID, *SubscriptionFacts]
	mu    sync.Mutex
	names map[uuid.UUID]cachedName
}

// planFactsStaleLimit bounds how long past its TTL a customer's facts are
// served while one background read refreshes them; an override's expiry
// is never served stale (its entry expires at that instant with no grace).
const planFactsStaleLimit = 10 * time.Second

type cachedName struct {
	name    string
	expires time.Time
}

var _ PlanView = (*PlanFacts)(nil)

// NewPlanFacts returns the PlanView; overrides may be nil (no overrides).
func NewPlanFacts(subs SubscriptionReader, plans *Plans, overrides OverrideReader, clock Clock) *PlanFacts {
	return &PlanFacts{subs: subs, plans: plans, overrides: overrides, clock: clock, cache: newSWRCache[uuid.UUID, *SubscriptionFacts](100_000),
		names: map[uuid.UUID]cachedName{}}
}

// Forget drops the cached facts of a customer (its subscription or an
// override changed in this process).
func (p *PlanFacts) Forget(customer uuid.UUID) {
	p.cache.delete(customer)
}

// ForgetSubscription drops the cached facts of the subscription's customer;
// it fits Overrides.OnOverrideChange.
func (p *PlanFacts) ForgetSubscription(_, customer uuid.UUID) { p.Forget(customer) }

// ForCustomer returns the facts of c's live subscription, nil when it has
// none.
func (p *PlanFacts) ForCustomer(ctx context.Context, c Customer) (*SubscriptionFacts, error) {
	f, st := p.cache.get(c.ID, time.Now(), planFactsStaleLimit)
	switch st {
	case cacheFresh:
		return f, nil
	case cacheRefresh:
		if f == nil || f.expiresAt.IsZero() || p.clock.Now().Before(f.expiresAt) {
			p.cache.refreshInBackground(c.ID, func(ctx context.Context) error {
				_, err := p.refresh(ctx, c)
				return err
			})
			return f, nil
		}
		// An override in these facts has expired: read through.
	}
	return p.refresh(ctx, c)
}

// refresh reads the customer's facts and caches them for planFactsTTL, or
// until the soonest override expiry when that comes first.
func (p *PlanFacts) refresh(ctx context.Context, c Customer) (*SubscriptionFacts, error) {
	wall := time.Now()
	gen := p.cache.generation()
	f, until, err := p.load(ctx, c)
	if err != nil {
		return nil, err
	}
	exp := wall.Add(planFactsTTL)
	if until != nil {
		if d := until.Sub(p.clock.Now()); d < planFactsTTL {
			exp = wall.Add(max(d, 0))
		}
		f.expiresAt = *until
	}
	p.cache.put(c.ID, f, exp, gen)
	return f, nil
}

// load reads the facts; until is the soonest override expiry, if any.
func (p *PlanFacts) load(ctx context.Context, c Customer) (*SubscriptionFacts, *time.Time, error) {
	sub, err := p.subs.LiveSubscription(ctx, c.ID)
	if errors.Is(err, ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	scope := Scope{TenantID: sub.TenantID, Environment: sub.Environment}
	v, err := p.plans.CachedVariant(ctx, scope, sub.PlanVariantID)
	if err != nil {
		return nil, nil, err
	}
	name := p.planName(ctx, scope, sub.PlanID)
	f := &SubscriptionFacts{Status: string(sub.Status), PlanName: name,
		AllowUsage: !(sub.Status == SubscriptionPastDue && !v.AllowUsageWhileOverdue),
		Values:     map[string]json.RawMessage{}}
	for _, e := range v.Entitlements {
		f.Values[e.BillableMetricKey] = e.Value
	}
	var until *time.Time
	if p.overrides != nil {
		os, err := p.overrides.LiveOverrides(ctx, sub.ID, p.clock.Now())
		if err != nil {
			return nil, nil, err
		}
		for _, o := range os {
			f.Values[o.BillableMetricKey] = o.Value
			if o.ExpiresAt != nil && (until == nil || o.ExpiresAt.Before(*until)) {
				t := *o.ExpiresAt
				until = &t
			}
		}
	}
	return f, until, nil
}

// planName is the plan's name, cached like the facts ("" when unreadable).
func (p *PlanFacts) planName(ctx context.Context, scope Scope, id uuid.UUID) string {
	wall := time.Now()
	p.mu.Lock()
	n, hit := p.names[id]
	p.mu.Unlock()
	if hit && wall.Before(n.expires) {
		return n.name
	}
	pl, err := p.plans.GetPlan(ctx, scope, id)
	if err != nil {
		return ""
	}
	p.mu.Lock()
	if len(p.names) > 100_000 {
		p.names = map[uuid.UUID]cachedName{}
	}
	p.names[id] = cachedName{name: pl.Name, expires: wall.Add(planFactsTTL)}
	p.mu.Unlock()
	return pl.Name
}
