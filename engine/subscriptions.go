package engine

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// Subscriptions puts customers on plan variants and moves them through
// their states (addendum 6): trialing, active, past_due, paused, canceled,
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
	events    EventInserter
	clock     Clock
	log       zerolog.Logger
}

// Subscription event kinds (addendum 8).
const (
	EventSubscriptionCreated    EventType = "subscription.created"
	EventSubscriptionRenewed    EventType = "subscription.renewed"
	EventSubscriptionRenewalDue EventType = "subscription.renewal_due"
	EventSubscriptionPastDue    EventType = "subscription.past_due"
	EventSubscriptionExpired    EventType = "subscription.expired"
	EventSubscriptionCanceled   EventType = "subscription.canceled"
)

// SubscriptionEventData is the data of every subscription.* event; the
// first four members are the ones addendum 8 lists for subscription.renewed.
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

// EmitterSubscription marks credit.granted events of plan grants.
const EmitterSubscription = "subscription"

// maxStepsPerAdvance bounds the work one advance does; the rest stays due
// and the next scheduler pass continues.
const maxStepsPerAdvance = 5000

// NewSubscriptions returns the subscription service; a cached PlanView
// forgets what a write changes when store is its ForgettingSubscriptions.
func NewSubscriptions(store SubscriptionStore, plans *Plans, customers *Customers, credits *Credits, blocks BlockStore,
	rollover RolloverStore, events EventInserter, clock Clock, log zerolog.Logger) *Subscriptions {
	return &Subscriptions{store: store, plans: plans, customers: customers, credits: credits, blocks: blocks,
		rollover: rollover, events: events, clock: clock, log: log}
}

// ---- inputs ----

// CreateSubscriptionInput is the body of POST /v1/subscriptions.
type CreateSubscriptionInput struct {
	CustomerID    *string  `json:"customer_id"`
	PlanVariantID *string  `json:"plan_variant_id"`
	Metadata      Metadata `json:"metadata"`
}

// CancelInput is the body of POST /v1/subscriptions/{id}/cancel.
type CancelInput struct {
	AtPeriodEnd *bool `json:"at_period_end"`
}

// UpgradeInput is the body of POST /v1/subscriptions/{id}/upgrade.
type UpgradeInput struct {
	PlanVariantID *string `json:"plan_variant_id"`
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
// and the first recurring grants fire). Errors: 422 missing fields, 404
// unknown customer or variant, 409 the customer already has a live one.
func (s *Subscriptions) Create(ctx context.Context, scope Scope, in CreateSubscriptionInput) (Subscription, error) {
	if in.CustomerID == nil || *in.CustomerID == "" {
		return Subscription{}, Invalid("customer_id", "customer_id is required")
	}
	if in.PlanVariantID == nil || *in.PlanVariantID == "" {
		return Subscription{}, Invalid("plan_variant_id", "plan_variant_id is required")
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return Subscription{}, err
	}
	c, err := s.customers.Resolve(ctx, scope, CustomerRef{Value: *in.CustomerID}, false)
	if err != nil {
		return Subscription{}, err
	}
	v, err := s.variant(ctx, scope, *in.PlanVariantID)
	if err != nil {
		return Subscription{}, err
	}
	now := s.clock.Now()
	r := SubscriptionRecord{Subscription: Subscription{
		ID: uuid.Must(uuid.NewV7()), TenantID: scope.TenantID, Environment: scope.Environment, CustomerID: c.ID,
		PlanID: v.PlanID, PlanVariantID: v.ID, BillingMode: v.BillingMode, Metadata: orEmpty(meta),
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
	if err := s.store.CreateSubscription(ctx, r); err != nil {
		return Subscription{}, err
	}
	s.emit(ctx, &r, &c, EventSubscriptionCreated, "created", now)
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
	s.credits.awaitPersisted(ctx, CustomerKey{TenantID: sub.TenantID, Environment: sub.Environment, CustomerID: sub.CustomerID})
	lines := []MetricUsage{}
	if to.After(start) {
		if lines, err = s.store.PeriodUsage(ctx, sub.CustomerID, start, to); err != nil {
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

// ---- transitions ----

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
func (s *Subscriptions) Cancel(ctx context.Context, scope Scope, rawID string, in CancelInput) (Subscription, error) {
	atEnd := in.AtPeriodEnd != nil && *in.AtPeriodEnd
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
// fire. Errors: 422 missing variant, 404, 409 (not live).
func (s *Subscriptions) Upgrade(ctx context.Context, scope Scope, rawID string, in UpgradeInput) (Subscription, error) {
	if in.PlanVariantID == nil || *in.PlanVariantID == "" {
		return Subscription{}, Invalid("plan_variant_id", "plan_variant_id is required")
	}
	nv, err := s.variant(ctx, scope, *in.PlanVariantID)
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

// cancelNow ends the subscription at now.
func (s *Subscriptions) cancelNow(ctx context.Context, r *SubscriptionRecord, at time.Time) {
	r.Status, r.CanceledAt, r.CancelAtPeriodEnd = SubscriptionCanceled, &at, false
	s.emit(ctx, r, nil, EventSubscriptionCanceled, "canceled", at)
}

// ---- state helpers ----

func scopeOf(r *SubscriptionRecord) Scope {
	return Scope{TenantID: r.TenantID, Environment: r.Environment}
}

func msText(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// anchorOf is the instant the current run of periods is counted from.
func anchorOf(r *SubscriptionRecord) time.Time {
	if r.ActivatedAt != nil {
		return *r.ActivatedAt
	}
	return r.CurrentPeriodStart
}

func grantsByID(v VariantDetail) map[uuid.UUID]PlanGrant {
	out := make(map[uuid.UUID]PlanGrant, len(v.Grants))
	for _, g := range v.Grants {
		out[g.ID] = g
	}
	return out
}

// renewalDueAt is renewal_due_days before end (never before start);
// prepaid only.
func renewalDueAt(v PlanVariant, start time.Time, end *time.Time) *time.Time {
	if v.BillingMode != BillingPrepaid || end == nil {
		return nil
	}
	t := end.AddDate(0, 0, -v.RenewalDueDays)
	if t.Before(start) {
		t = start
	}
	return &t
}

// activate makes r active with a first period starting at start: the
// on_activation and one_time grants (when withOneTime) and the first
// recurring grants are due at now.
func activate(r *SubscriptionRecord, v VariantDetail, start, now time.Time, withOneTime bool) {
	r.Status, r.GraceEndsAt, r.RenewalWarned = SubscriptionActive, nil, false
	r.ActivatedAt = &start
	r.CurrentPeriodStart = start
	r.CurrentPeriodEnd = PeriodEndAfter(v.BillingCycle, start, start)
	r.RenewalDueAt = renewalDueAt(v.PlanVariant, start, r.CurrentPeriodEnd)
	prev := map[uuid.UUID]GrantState{}
	for _, st := range r.Grants {
		prev[st.PlanGrantID] = st
	}
	r.Grants = r.Grants[:0]
	for _, g := range v.Grants {
		st, ok := prev[g.ID]
		if !ok {
			st = GrantState{PlanGrantID: g.ID, BlockIDs: []uuid.UUID{}}
		}
		st.NextFireAt, st.NextKey, st.Rollover = nil, "", nil
		switch g.GrantType {
		case GrantOneTime:
			if withOneTime || g.Interval().Keyword == IntervalOnActivation {
				st.NextFireAt, st.NextKey = &now, "activation:"+msText(start)
			}
		case GrantRecurring:
			st.Anchor, st.Fired, st.BlockIDs = now, 0, []uuid.UUID{}
			st.NextFireAt = &now
			if PeriodBound(g, v.BillingCycle) {
				st.NextKey = "period:" + msText(start)
			}
		}
		r.Grants = append(r.Grants, st)
	}
}

// freshPeriod restarts r's periods at now (resume, upgrade): recurring
// grants fire again from now, and on upgrade the on_activation grants too.
func freshPeriod(r *SubscriptionRecord, v VariantDetail, now time.Time, upgrade bool) {
	activate(r, v, now, now, false)
	if !upgrade {
		// Resume fires recurring grants only.
		for i := range r.Grants {
			st := &r.Grants[i]
			if strings.HasPrefix(st.NextKey, "activation:") {
				st.NextFireAt, st.NextKey = nil, ""
			}
		}
	}
}

// ---- the schedule ----

// step kinds in the order they run when due at the same instant.
const (
	stepRollover = iota
	stepRenewalDue
	stepTrialEnd
	stepPeriodEnd
	stepGraceEnd
	stepGrant
)

type step struct {
	kind  int
	at    time.Time
	grant int // index into r.Grants for stepRollover and stepGrant
}

// nextStep is the earliest pending piece of work of r, ok false when none.
func nextStep(r *SubscriptionRecord) (step, bool) {
	var best step
	found := false
	consider := func(kind int, at *time.Time, grant int) {
		if at == nil {
			return
		}
		if !found || at.Before(best.at) || (at.Equal(best.at) && kind < best.kind) {
			best, found = step{kind: kind, at: *at, grant: grant}, true
		}
	}
	if !r.Status.Live() {
		return step{}, false
	}
	for i := range r.Grants {
		st := &r.Grants[i]
		if st.Rollover != nil {
			at := r.UpdatedAt
			consider(stepRollover, &at, i)
		}
	}
	switch r.Status {
	case SubscriptionTrialing:
		if r.BillingMode == BillingPrepaid && !r.RenewalWarned {
			consider(stepRenewalDue, r.RenewalDueAt, -1)
		}
		if r.BillingMode == BillingPostpaid {
			consider(stepTrialEnd, r.TrialEndsAt, -1)
		} else {
			consider(stepPeriodEnd, r.CurrentPeriodEnd, -1)
		}
	case SubscriptionActive:
		if r.BillingMode == BillingPrepaid && !r.RenewalWarned {
			consider(stepRenewalDue, r.RenewalDueAt, -1)
		}
		consider(stepPeriodEnd, r.CurrentPeriodEnd, -1)
	case SubscriptionPastDue:
		consider(stepGraceEnd, r.GraceEndsAt, -1)
	case SubscriptionPaused:
		return best, found
	}
	for i := range r.Grants {
		consider(stepGrant, r.Grants[i].NextFireAt, i)
	}
	return best, found
}

// advance does every piece of r's pending work due at or before now, in
// time order, and sets NextActionAt. It runs under r's row lock.
func (s *Subscriptions) advance(ctx context.Context, r *SubscriptionRecord, now time.Time) error {
	v, err := s.plans.CachedVariant(ctx, scopeOf(r), r.PlanVariantID)
	if err != nil {
		return err
	}
	grants := grantsByID(v)
	var cust *Customer
	customer := func() Customer {
		if cust == nil {
			c, err := s.customers.Resolve(ctx, scopeOf(r), CustomerRef{Value: r.CustomerID.String()}, false)
			if err != nil {
				c = Customer{ID: r.CustomerID, TenantID: r.TenantID, Environment: r.Environment}
			}
			cust = &c
		}
		return *cust
	}
	changed := false
	for i := 0; i < maxStepsPerAdvance; i++ {
		st, ok := nextStep(r)
		if !ok || st.at.After(now) {
			break
		}
		changed = true
		switch st.kind {
		case stepRollover:
			if err := s.runRollover(ctx, r, grants, &r.Grants[st.grant], customer(), now); err != nil {
				return err
			}
		case stepRenewalDue:
			r.RenewalWarned = true
			s.emit(ctx, r, cust, EventSubscriptionRenewalDue, "renewal_due:"+msText(*r.CurrentPeriodEnd), st.at)
		case stepTrialEnd:
			activate(r, v, st.at, st.at, true)
		case stepPeriodEnd:
			end := st.at
			switch {
			case r.CancelAtPeriodEnd:
				s.cancelNow(ctx, r, end)
			case r.BillingMode == BillingPostpaid:
				next := PeriodEndAfter(v.BillingCycle, anchorOf(r), end)
				r.CurrentPeriodStart, r.CurrentPeriodEnd = end, next
				for j := range r.Grants {
					g, ok := grants[r.Grants[j].PlanGrantID]
					if ok && g.GrantType == GrantRecurring && PeriodBound(g, v.BillingCycle) {
						at := end
						r.Grants[j].NextFireAt, r.Grants[j].NextKey = &at, "period:"+msText(end)
					}
				}
				s.emit(ctx, r, cust, EventSubscriptionRenewed, "renewed:"+msText(end), end)
			default:
				grace := end.AddDate(0, 0, v.GracePeriodDays)
				r.Status, r.GraceEndsAt = SubscriptionPastDue, &grace
				s.emit(ctx, r, cust, EventSubscriptionPastDue, "past_due:"+msText(end), end)
			}
		case stepGraceEnd:
			r.Status = SubscriptionExpired
			s.emit(ctx, r, cust, EventSubscriptionExpired, "expired:"+msText(st.at), st.at)
		case stepGrant:
			gs := &r.Grants[st.grant]
			g, ok := grants[gs.PlanGrantID]
			if !ok {
				gs.NextFireAt = nil
				continue
			}
			if err := s.fire(ctx, r, g, v.BillingCycle, gs, st.at, customer(), now); err != nil {
				return err
			}
		}
	}
	if changed {
		r.UpdatedAt = maxTime(r.UpdatedAt, now)
	}
	if st, ok := nextStep(r); ok {
		at := st.at
		r.NextActionAt = &at
	} else {
		r.NextActionAt = nil
	}
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// firingKey names one firing of grant g on r: the base of its operation id,
// block id and idempotency key, the same in every process and every retry.
func firingKey(r *SubscriptionRecord, g PlanGrant, tag string) string {
	return "subscription:" + r.ID.String() + ":grant:" + g.ID.String() + ":" + tag
}

// subscriptionNamespace seeds the name-based ids of firings and events.
var subscriptionNamespace = uuid.MustParse("8b1f4c0e-5d2a-4e77-9c3b-2f6a1d0e9b47")

// fire grants one firing of g due at `at` (now is the clock), then moves
// the grant's schedule on. A recurring grant fires only while the
// subscription is active (trial grants while trialing); a firing that comes
// due in another state is skipped.
func (s *Subscriptions) fire(ctx context.Context, r *SubscriptionRecord, g PlanGrant, cycle BillingCycle, st *GrantState,
	at time.Time, c Customer, now time.Time) error {
	clockBound := g.GrantType == GrantRecurring && !PeriodBound(g, cycle)
	tag := st.NextKey
	if clockBound {
		tag = "clock:" + msText(st.Anchor) + ":" + strconv.FormatInt(st.Fired, 10)
	}
	allowed := r.Status == SubscriptionActive
	if g.GrantType == GrantTrial {
		allowed = r.Status == SubscriptionTrialing
	}
	if allowed {
		key := firingKey(r, g, tag)
		meta := Metadata{"subscription_id": rawJSON(r.ID), "plan_grant_id": rawJSON(g.ID)}
		cmd := GrantCommand{
			OpID: uuid.NewSHA1(subscriptionNamespace, []byte(key)), Customer: CustomerKey{TenantID: r.TenantID,
				Environment: r.Environment, CustomerID: r.CustomerID},
			AccountID: uuid.Must(uuid.NewV7()), IdempotencyKey: key, RequestHash: key, Now: now,
			EntryType: EntryPlanGrant, EntryMetadata: meta,
			Block: Block{ID: uuid.NewSHA1(subscriptionNamespace, []byte(key+":block")), CustomerID: r.CustomerID,
				OriginalAmount: g.Credits, Priority: 0, Source: g.Source, Metadata: meta},
			Context:         &MutationContext{ExternalID: c.ExternalID, Emitter: EmitterSubscription},
			AccumulationCap: g.AccumulationCap,
		}
		if cmd.Block.Source == "" {
			cmd.Block.Source = SourcePlanGrant
		}
		if g.ExpiresAfterSeconds != nil {
			exp := at.Add(time.Duration(*g.ExpiresAfterSeconds) * time.Second)
			cmd.Block.ExpiresAt = &exp
		}
		res, err := withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) { return s.blocks.Grant(ctx, cmd) })
		if err != nil {
			return err
		}
		for _, e := range res.Mutation.Entries {
			if e.Role == RoleMain && e.BlockID != nil {
				st.BlockIDs = append(st.BlockIDs, *e.BlockID)
			}
		}
		fired := at
		st.LastFiredAt = &fired
	}
	if !clockBound {
		st.NextFireAt, st.NextKey = nil, ""
		return nil
	}
	iv := g.Interval()
	if allowed {
		st.Fired++
	} else {
		// Skip every firing the subscription cannot take up to now.
		st.Fired = max(st.Fired+1, iv.FiringsThrough(st.Anchor, now))
	}
	next := iv.FireAt(st.Anchor, st.Fired)
	st.NextFireAt = &next
	return nil
}

// runRollover expires the grant's previous-cycle blocks and carries the
// pending percentage of their unused credit into a new block.
func (s *Subscriptions) runRollover(ctx context.Context, r *SubscriptionRecord, grants map[uuid.UUID]PlanGrant, st *GrantState,
	c Customer, now time.Time) error {
	p := st.Rollover
	st.Rollover = nil
	g, ok := grants[st.PlanGrantID]
	if !ok || len(st.BlockIDs) == 0 || s.rollover == nil {
		st.BlockIDs = []uuid.UUID{}
		return nil
	}
	key := firingKey(r, g, p.Key)
	meta := Metadata{"subscription_id": rawJSON(r.ID), "plan_grant_id": rawJSON(g.ID), "rollover": json.RawMessage("true")}
	cmd := RolloverCommand{
		OpID: uuid.NewSHA1(subscriptionNamespace, []byte(key)), Customer: CustomerKey{TenantID: r.TenantID,
			Environment: r.Environment, CustomerID: r.CustomerID},
		IdempotencyKey: key, Now: now, Blocks: st.BlockIDs, Percentage: p.Percent,
		Block: Block{ID: uuid.NewSHA1(subscriptionNamespace, []byte(key+":block")), CustomerID: r.CustomerID,
			Source: g.Source, Metadata: meta},
		EntryType: EntryPlanGrant, EntryMetadata: meta,
		Context: &MutationContext{ExternalID: c.ExternalID, Emitter: EmitterSubscription},
	}
	if cmd.Block.Source == "" {
		cmd.Block.Source = SourcePlanGrant
	}
	if g.ExpiresAfterSeconds != nil {
		exp := now.Add(time.Duration(*g.ExpiresAfterSeconds) * time.Second)
		cmd.Block.ExpiresAt = &exp
	}
	res, err := withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) { return s.rollover.Rollover(ctx, cmd) })
	if err != nil {
		return err
	}
	st.BlockIDs = []uuid.UUID{}
	for _, e := range res.Mutation.Entries {
		if e.Role == RoleMain && e.BlockID != nil {
			st.BlockIDs = append(st.BlockIDs, *e.BlockID)
		}
	}
	return nil
}

// emit records a subscription event; its id derives from the subscription
// and tag, so a retried transition inserts nothing twice. A failure is
// logged: the transition itself stands.
func (s *Subscriptions) emit(ctx context.Context, r *SubscriptionRecord, c *Customer, t EventType, tag string, at time.Time) {
	if s.events == nil {
		return
	}
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
	e := NewEvent(id, t, r.TenantID, r.Environment, &customer, ext, at, "", data)
	if err := s.events.InsertEvent(ctx, e); err != nil {
		s.log.Error().Err(err).Str("subscription", r.ID.String()).Str("event_type", string(t)).Msg("subscription event not recorded")
	}
}
