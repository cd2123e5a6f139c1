// The subscription state machine: period arithmetic, the next piece of
// scheduled work (nextStep) and advance, which runs it under the row lock.

package engine

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

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
// maxStepsPerAdvance bounds the work one advance does; the rest stays due
// and the next scheduler pass continues.
const maxStepsPerAdvance = 5000

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
