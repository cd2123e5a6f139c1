package engine

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/google/uuid"
)

// PlanFacts is the PlanView of checks, consumes and reservations: the customer's
// live subscription, its variant's entitlements overlaid by live overrides
// (docs/spec/addendum.md §5 order), read afresh on every call. The hot path reads it
// through a CachedPlanView.
type PlanFacts struct {
	subs      SubscriptionReader
	plans     PlanLookup
	overrides OverrideReader
	clock     Clock
}

var _ PlanView = (*PlanFacts)(nil)

// NewPlanFacts returns the PlanView; overrides may be nil (no overrides).
func NewPlanFacts(subs SubscriptionReader, plans PlanLookup, overrides OverrideReader, clock Clock) *PlanFacts {
	return &PlanFacts{subs: subs, plans: plans, overrides: overrides, clock: clock}
}

// ForCustomer returns the facts of c's live subscription, nil when it has
// none; their expiresAt is the soonest expiry of an override in them.
func (p *PlanFacts) ForCustomer(ctx context.Context, c Customer) (*SubscriptionFacts, error) {
	sub, err := p.subs.LiveSubscription(ctx, CustomerKeyOf(c))
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	scope := Scope{TenantID: sub.TenantID, Environment: sub.Environment}
	v, err := p.plans.VariantDetail(ctx, scope, sub.PlanVariantID)
	if err != nil {
		return nil, variantNotFound(err)
	}
	f := &SubscriptionFacts{Status: string(sub.Status), PlanName: p.planName(ctx, scope, sub.PlanID),
		AllowUsage: !(sub.Status == SubscriptionPastDue && !v.AllowUsageWhileOverdue),
		Values:     map[string]json.RawMessage{}, subscription: sub.ID}
	for _, e := range v.Entitlements {
		f.Values[e.BillableMetricKey] = e.Value
	}
	if p.overrides != nil {
		os, err := p.overrides.LiveOverrides(ctx, sub.TenantID, sub.ID, p.clock.Now())
		if err != nil {
			return nil, err
		}
		for _, o := range os {
			f.Values[o.BillableMetricKey] = o.Value
			if o.ExpiresAt != nil && (f.expiresAt.IsZero() || o.ExpiresAt.Before(f.expiresAt)) {
				f.expiresAt = *o.ExpiresAt
			}
		}
	}
	return f, nil
}

// planName is the plan's name ("" when unreadable).
func (p *PlanFacts) planName(ctx context.Context, scope Scope, id uuid.UUID) string {
	name, err := p.plans.PlanName(ctx, scope, id)
	if err != nil {
		return ""
	}
	return name
}
