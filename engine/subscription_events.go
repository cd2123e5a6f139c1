// The subscription.* events: their kinds, their data and how a transition
// records one.

package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Subscription event kinds (docs/spec/addendum.md §8).
const (
	EventSubscriptionCreated    EventType = "subscription.created"
	EventSubscriptionRenewed    EventType = "subscription.renewed"
	EventSubscriptionRenewalDue EventType = "subscription.renewal_due"
	EventSubscriptionPastDue    EventType = "subscription.past_due"
	EventSubscriptionExpired    EventType = "subscription.expired"
	EventSubscriptionCanceled   EventType = "subscription.canceled"
)

// SubscriptionEventData is the data of every subscription.* event; the
// first four members are the ones docs/spec/addendum.md §8 lists for subscription.renewed.
type SubscriptionEventData struct {
	SubscriptionID uuid.UUID          `json:"subscription_id"`
	PlanVariantID  uuid.UUID          `json:"plan_variant_id"`
	PeriodStart    time.Time          `json:"period_start"`
	PeriodEnd      *time.Time         `json:"period_end"`
	PlanID         uuid.UUID          `json:"plan_id"`
	Status         SubscriptionStatus `json:"status"`
	TrialEndsAt    *time.Time         `json:"trial_ends_at"`
	RenewalDueAt   *time.Time         `json:"renewal_due_at"`
	GraceEndsAt    *time.Time         `json:"grace_ends_at"`
	CanceledAt     *time.Time         `json:"canceled_at"`
}

// emit adds a subscription event to r.Events, which the store writes in
// the transaction that writes r; its id derives from the subscription and
// tag, so a retried transition inserts nothing twice.
func (s *Subscriptions) emit(ctx context.Context, r *SubscriptionRecord, c *Customer, t EventType, tag string, at time.Time) {
	var ext *string
	if c == nil {
		if cc, err := s.customers.Resolve(ctx, scopeOf(r), CustomerRef{Value: r.CustomerID.String()}, false); err == nil {
			c = &cc
		}
	}
	if c != nil && c.ExternalID != "" {
		e := c.ExternalID
		ext = &e
	}
	customer := r.CustomerID
	id := uuid.NewSHA1(subscriptionNamespace, []byte("event:"+r.ID.String()+":"+tag))
	data := SubscriptionEventData{SubscriptionID: r.ID, PlanVariantID: r.PlanVariantID, PlanID: r.PlanID,
		PeriodStart: r.CurrentPeriodStart, PeriodEnd: r.CurrentPeriodEnd, Status: r.Status, TrialEndsAt: r.TrialEndsAt,
		RenewalDueAt: r.RenewalDueAt, GraceEndsAt: r.GraceEndsAt, CanceledAt: r.CanceledAt}
	// The clock may stand behind a catch-up firing's instant; events are
	// stamped with the instant they describe.
	r.Events = append(r.Events, NewEvent(id, t, r.TenantID, r.Environment, &customer, ext, at, "", data))
}
