// The tenant's subscription verbs: renew, cancel, pause, resume, upgrade,
// each a change run under the subscription's row lock.

package engine

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

var errPostpaidRenew = &Error{Kind: KindConflict, Field: "billing_mode",
	Detail: "a postpaid subscription renews by itself; only prepaid subscriptions are renewed by the tenant"}

// Renew moves a prepaid period one cycle on, starting where the previous
// ended (the tenant charged the customer): from trialing it activates (the
// activation grants fire), from past_due it returns to active; rollover is
// applied and recurring grants fire. Errors: 404, 409 (canceled, expired,
// paused, postpaid, or a one_time variant already active).
func (s *Subscriptions) Renew(ctx context.Context, scope Scope, rawID string) (Subscription, error) {
	return s.change(ctx, scope, rawID, func(r *SubscriptionRecord, v VariantDetail, now time.Time) error {
		switch r.Status {
		case SubscriptionTrialing, SubscriptionActive, SubscriptionPastDue:
		default:
			return Conflict("a " + string(r.Status) + " subscription cannot be renewed")
		}
		if r.BillingMode == BillingPostpaid {
			return errPostpaidRenew
		}
		start := r.CurrentPeriodStart
		if r.CurrentPeriodEnd != nil {
			start = *r.CurrentPeriodEnd
		}
		if r.Status == SubscriptionTrialing {
			// The trial ends now: activation grants fire, the first paid
			// period starts where the trial ends.
			activate(r, v, start, now, true)
			s.emit(ctx, r, nil, EventSubscriptionRenewed, "renewed:"+msText(start), now)
			return nil
		}
		if r.CurrentPeriodEnd == nil {
			return Conflict("a one_time subscription never renews")
		}
		end := PeriodEndAfter(v.BillingCycle, anchorOf(r), start)
		r.Status, r.CurrentPeriodStart, r.CurrentPeriodEnd, r.GraceEndsAt = SubscriptionActive, start, end, nil
		r.RenewalDueAt, r.RenewalWarned = renewalDueAt(v.PlanVariant, start, end), false
		grants := grantsByID(v)
		for i := range r.Grants {
			st := &r.Grants[i]
			g, ok := grants[st.PlanGrantID]
			if !ok || g.GrantType != GrantRecurring {
				continue
			}
			if g.RolloverPercentage > 0 {
				pct := g.RolloverPercentage
				if g.MaxRolloverCycles != nil && st.RolloverCycles >= *g.MaxRolloverCycles {
					pct, st.RolloverCycles = 0, 0
				} else {
					st.RolloverCycles++
				}
				st.Rollover = &PendingRollover{Percent: pct, Key: "rollover:" + msText(start)}
			}
			if PeriodBound(g, v.BillingCycle) {
				st.NextFireAt, st.NextKey = &now, "period:"+msText(start)
			}
		}
		s.emit(ctx, r, nil, EventSubscriptionRenewed, "renewed:"+msText(start), now)
		return nil
	})
}

// Cancel ends a live subscription now, or (at_period_end) when its period
// ends. Errors: 404, 409 (already canceled or expired).
func (s *Subscriptions) Cancel(ctx context.Context, scope Scope, rawID string, in CancelSubscription) (Subscription, error) {
	atEnd := in.AtPeriodEnd
	return s.change(ctx, scope, rawID, func(r *SubscriptionRecord, v VariantDetail, now time.Time) error {
		if !r.Status.Live() {
			return Conflict("a " + string(r.Status) + " subscription cannot be canceled")
		}
		if atEnd && r.CurrentPeriodEnd != nil && r.CurrentPeriodEnd.After(now) &&
			(r.Status == SubscriptionActive || r.Status == SubscriptionTrialing) {
			r.CancelAtPeriodEnd = true
			return nil
		}
		s.cancelNow(ctx, r, now)
		return nil
	})
}

// Pause stops an active subscription's schedule. Errors: 404, 409.
func (s *Subscriptions) Pause(ctx context.Context, scope Scope, rawID string) (Subscription, error) {
	return s.change(ctx, scope, rawID, func(r *SubscriptionRecord, v VariantDetail, now time.Time) error {
		if r.Status != SubscriptionActive {
			return Conflict("only an active subscription can be paused")
		}
		r.Status = SubscriptionPaused
		return nil
	})
}

// Resume restarts a paused subscription with a fresh period (recurring
// grants fire), or clears a pending cancel. Errors: 404, 409.
func (s *Subscriptions) Resume(ctx context.Context, scope Scope, rawID string) (Subscription, error) {
	return s.change(ctx, scope, rawID, func(r *SubscriptionRecord, v VariantDetail, now time.Time) error {
		switch {
		case r.Status == SubscriptionPaused:
			r.CancelAtPeriodEnd = false
			freshPeriod(r, v, now, false)
			return nil
		case r.Status.Live() && r.CancelAtPeriodEnd:
			r.CancelAtPeriodEnd = false
			return nil
		}
		return Conflict("only a paused subscription, or one canceling at period end, can be resumed")
	})
}

// Upgrade switches a live subscription to another variant now: a fresh
// period starts and the new variant's on_activation and recurring grants
// fire. Errors: 404, 409 (not live).
func (s *Subscriptions) Upgrade(ctx context.Context, scope Scope, rawID string, in UpgradeSubscription) (Subscription, error) {
	nv, err := s.variant(ctx, scope, in.PlanVariantID)
	if err != nil {
		return Subscription{}, err
	}
	return s.change(ctx, scope, rawID, func(r *SubscriptionRecord, _ VariantDetail, now time.Time) error {
		if !r.Status.Live() {
			return Conflict("a " + string(r.Status) + " subscription cannot be upgraded")
		}
		r.PlanID, r.PlanVariantID, r.BillingMode = nv.PlanID, nv.ID, nv.BillingMode
		r.Grants = nil
		freshPeriod(r, nv, now, true)
		return nil
	})
}

// change runs fn on the locked subscription, then fires what it owes.
func (s *Subscriptions) change(ctx context.Context, scope Scope, rawID string,
	fn func(r *SubscriptionRecord, v VariantDetail, now time.Time) error) (Subscription, error) {
	id, err := uuid.Parse(rawID)
	if err != nil {
		return Subscription{}, NotFound("subscription not found")
	}
	r, err := s.store.UpdateSubscription(ctx, scope, id, func(r *SubscriptionRecord) error {
		now := s.clock.Now()
		// Catch up first, so the transition starts from the state the
		// schedule says the subscription is in now.
		if err := s.advance(ctx, r, now); err != nil {
			return err
		}
		v, err := s.plans.CachedVariant(ctx, scopeOf(r), r.PlanVariantID)
		if err != nil {
			return err
		}
		if err := fn(r, v, now); err != nil {
			return err
		}
		r.UpdatedAt = now
		return s.advance(ctx, r, now)
	})
	if errors.Is(err, ErrNotFound) {
		return Subscription{}, NotFound("subscription not found")
	}
	if err != nil {
		return Subscription{}, err
	}
	return r.Subscription, nil
}

// cancelNow ends the subscription at now.
func (s *Subscriptions) cancelNow(ctx context.Context, r *SubscriptionRecord, at time.Time) {
	r.Status, r.CanceledAt, r.CancelAtPeriodEnd = SubscriptionCanceled, &at, false
	s.emit(ctx, r, nil, EventSubscriptionCanceled, "canceled", at)
}
