package engine

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// Subscriptions puts customers on plan variants and moves them through
// their states (docs/spec/addendum.md §6): trialing, active, past_due, paused, canceled,
// expired. Every change of a subscription happens under its row lock (the
// store's UpdateSubscription or RunDue), and every credit grant a change owes
// is recorded in the row as a pending firing first, then fired by advance
// with an idempotency key derived from the subscription, the grant and the
// firing: a firing interrupted by a crash is retried by the scheduler and
// replays instead of granting twice.
type Subscriptions struct {
	store     SubscriptionStore
	plans     *Plans
	customers *Customers
	credits   *Credits
	blocks    BlockStore
	rollover  RolloverStore
	clock     Clock
	log       zerolog.Logger
}

// NewSubscriptions returns the subscription service; a cached PlanView
// forgets what a write changes when store is its ForgettingSubscriptions.
func NewSubscriptions(store SubscriptionStore, plans *Plans, customers *Customers, credits *Credits, blocks BlockStore,
	rollover RolloverStore, clock Clock, log zerolog.Logger) *Subscriptions {
	return &Subscriptions{store: store, plans: plans, customers: customers, credits: credits, blocks: blocks,
		rollover: rollover, clock: clock, log: log}
}

// ---- commands ----

// CreateSubscription is a checked request to put a customer on a variant:
// api builds it from the body of POST /v1/subscriptions. Both ids are as
// sent, not empty; the service resolves them (a 404 each).
type CreateSubscription struct {
	CustomerID    string // own or external id
	PlanVariantID string
	Metadata      Metadata // canonical; nil: none
}

// CancelSubscription is the checked body of POST
// /v1/subscriptions/{id}/cancel.
type CancelSubscription struct {
	AtPeriodEnd bool
}

// UpgradeSubscription is the checked body of POST
// /v1/subscriptions/{id}/upgrade: the variant id as sent, not empty.
type UpgradeSubscription struct {
	PlanVariantID string
}

// UsageReport is the body of GET /v1/subscriptions/{id}/usage.
type UsageReport struct {
	SubscriptionID uuid.UUID     `json:"subscription_id"`
	CustomerID     uuid.UUID     `json:"customer_id"`
	PeriodStart    time.Time     `json:"period_start"`
	PeriodEnd      *time.Time    `json:"period_end"`
	Data           []MetricUsage `json:"data"`
	TotalCredits   int64         `json:"total_credits"`
}

// ---- create and reads ----

// Create puts a customer on a variant: trialing when the variant has
// trial_days (its trial grants fire), else active (on_activation, one_time
// and the first recurring grants fire). Errors: 404 unknown customer or
// variant, 409 the customer already has a live one.
func (s *Subscriptions) Create(ctx context.Context, scope Scope, in CreateSubscription) (Subscription, error) {
	c, err := s.customers.Resolve(ctx, scope, CustomerRef{Value: in.CustomerID}, false)
	if err != nil {
		return Subscription{}, err
	}
	v, err := s.variant(ctx, scope, in.PlanVariantID)
	if err != nil {
		return Subscription{}, err
	}
	now := s.clock.Now()
	r := SubscriptionRecord{Subscription: Subscription{
		ID: uuid.Must(uuid.NewV7()), TenantID: scope.TenantID, Environment: scope.Environment, CustomerID: c.ID,
		PlanID: v.PlanID, PlanVariantID: v.ID, BillingMode: v.BillingMode, Metadata: orEmpty(in.Metadata),
		CreatedAt: now, UpdatedAt: now,
	}}
	if v.TrialDays > 0 {
		end := now.AddDate(0, 0, v.TrialDays)
		r.Status, r.CurrentPeriodStart, r.CurrentPeriodEnd, r.TrialEndsAt = SubscriptionTrialing, now, &end, &end
		r.RenewalDueAt = renewalDueAt(v.PlanVariant, r.CurrentPeriodStart, r.CurrentPeriodEnd)
		for _, g := range v.Grants {
			st := GrantState{PlanGrantID: g.ID, Anchor: now, BlockIDs: []uuid.UUID{}}
			if g.GrantType == GrantTrial {
				st.NextFireAt = &now
			}
			r.Grants = append(r.Grants, st)
		}
	} else {
		activate(&r, v, now, now, true)
	}
	r.NextActionAt = &now
	s.emit(ctx, &r, &c, EventSubscriptionCreated, "created", now)
	if err := s.store.CreateSubscription(ctx, r); err != nil {
		return Subscription{}, err
	}
	r.Events = nil
	// Fire what the creation owes now; should this process die first, the
	// scheduler finds the subscription due and fires it.
	out, err := s.store.UpdateSubscription(ctx, scope, r.ID, func(rec *SubscriptionRecord) error {
		return s.advance(ctx, rec, s.clock.Now())
	})
	if err != nil {
		s.log.Warn().Err(err).Str("subscription", r.ID.String()).Msg("subscription created; its grants are left to the scheduler")
		return r.Subscription, nil
	}
	return out.Subscription, nil
}

// Get reads one subscription. Errors: 404 (unknown, malformed, other scope).
func (s *Subscriptions) Get(ctx context.Context, scope Scope, rawID string) (Subscription, error) {
	id, err := uuid.Parse(rawID)
	if err != nil {
		return Subscription{}, NotFound("subscription not found")
	}
	sub, err := s.store.GetSubscription(ctx, scope, id)
	if errors.Is(err, ErrNotFound) {
		return Subscription{}, NotFound("subscription not found")
	}
	return sub, err
}

// List pages a customer's subscriptions newest first. Errors: 404 customer.
func (s *Subscriptions) List(ctx context.Context, scope Scope, ref CustomerRef, cursor string, limit int) (Page[Subscription], error) {
	c, err := s.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return Page[Subscription]{}, err
	}
	return s.store.ListSubscriptions(ctx, scope, c.ID, cursor, limit)
}

// Usage reports the consumption per metric of the subscription's customer
// in one period: the current one, or the one starting at periodStart (RFC
// 3339). Errors: 404, 400 periodStart unreadable.
func (s *Subscriptions) Usage(ctx context.Context, scope Scope, rawID, periodStart string) (UsageReport, error) {
	sub, err := s.Get(ctx, scope, rawID)
	if err != nil {
		return UsageReport{}, err
	}
	start, end := sub.CurrentPeriodStart, sub.CurrentPeriodEnd
	if periodStart != "" {
		t, err := ParseInstant("period_start", periodStart, KindBadRequest)
		if err != nil {
			return UsageReport{}, err
		}
		start = t.UTC().Truncate(time.Millisecond)
		if !start.Equal(sub.CurrentPeriodStart) {
			v, err := s.plans.CachedVariant(ctx, scope, sub.PlanVariantID)
			if err != nil {
				return UsageReport{}, err
			}
			e := AddCycles(v.BillingCycle, start, 1)
			end = &e
			if v.BillingCycle == CycleOneTime {
				end = nil
			}
		}
	}
	to := s.clock.Now().Add(time.Millisecond)
	if end != nil && end.Before(to) {
		to = *end
	}
	key := CustomerKey{TenantID: sub.TenantID, Environment: sub.Environment, CustomerID: sub.CustomerID}
	s.credits.awaitPersisted(ctx, key)
	lines := []MetricUsage{}
	if to.After(start) {
		if lines, err = s.store.PeriodUsage(ctx, key, start, to); err != nil {
			return UsageReport{}, err
		}
	}
	rep := UsageReport{SubscriptionID: sub.ID, CustomerID: sub.CustomerID, PeriodStart: start, PeriodEnd: end, Data: lines}
	for _, l := range lines {
		if sum, ok := AddChecked(rep.TotalCredits, l.Credits); ok {
			rep.TotalCredits = sum
		}
	}
	return rep, nil
}

func (s *Subscriptions) variant(ctx context.Context, scope Scope, raw string) (VariantDetail, error) {
	id, err := uuid.Parse(raw)
	if err != nil {
		return VariantDetail{}, &Error{Kind: KindNotFound, Field: "plan_variant_id", Detail: "plan variant not found"}
	}
	v, err := s.plans.Variant(ctx, scope, id)
	if e, ok := AsError(err); ok && e.Kind == KindNotFound {
		return VariantDetail{}, &Error{Kind: KindNotFound, Field: "plan_variant_id", Detail: "plan variant not found"}
	}
	return v, err
}
