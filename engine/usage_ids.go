// Usage event ids across customers: the claims of the tenant index
// (UsageIDs) a usage batch takes before its consumes and gives back after.

package engine

import (
	"context"
	"errors"
	"time"
)

// usageReuse is the error text of an event whose event_id was used for
// another event: another content, or another customer (the customer is
// part of the event).
const usageReuse = "event_id was already used for a different event"

// usageStep is one event of a batch on its way through Usage.
type usageStep struct {
	cmd ConsumeCommand
	// err stops the event before its consume: its result is usageFailure
	// of it (unless Postgres says its id was applied: a duplicate).
	err error
	// claimed: the index holds the id for cmd's customer on this send's
	// behalf; released after the consumes unless charged.
	claimed bool
	// ask: only Postgres can say whether the id was applied.
	ask bool
	// unseen: the index had no claim of the id and its filter never saw
	// it committed, at claimedAt: the customer's filter need not be
	// consulted either.
	unseen    bool
	claimedAt time.Time
	// charged: the consume charged, or may have (usageMayHaveCharged).
	charged bool
}

// claimUsageIDs consults the tenant index of event ids for the batch in
// one round trip: the id of each event with a consume is claimed for its
// customer, the id of each event without one (invalid, or its customer
// could not be resolved) only looked at. It sets each step's outcome:
// another customer holds the id: the event fails as a reuse, nothing
// charged; the claim could not be taken: it fails with the retryable
// unavailable text; the id is neither held nor ever seen by the filter:
// unseen; held by nobody but maybe seen, or looked at and held by anyone:
// ask Postgres. Without an index every event with an id asks Postgres, as
// the batch's look-up always did.
func (s *Entitlements) claimUsageIDs(ctx context.Context, scope Scope, events []UsageEvent, steps []usageStep) {
	claims := make([]UsageClaim, 0, len(events))
	at := make([]int, 0, len(events))
	for i, ev := range events {
		// An id Postgres cannot hold is refused per event, never looked up.
		clean := ev.EventID != "" && cleanText(ev.EventID, false)
		switch {
		case s.usageIDs == nil:
			steps[i].ask = clean
		case steps[i].err == nil:
			claims = append(claims, UsageClaim{EventID: ev.EventID, Customer: steps[i].cmd.Customer.CustomerID})
			at = append(at, i)
		case clean:
			claims = append(claims, UsageClaim{EventID: ev.EventID, LookOnly: true})
			at = append(at, i)
		}
	}
	if len(claims) == 0 {
		return
	}
	claimedAt := time.Now()
	holds, errs := s.usageIDs.UsageIDsClaim(ctx, scope.TenantID, scope.Environment, claims)
	for j, i := range at {
		st, h, err := &steps[i], holds[j], errs[j]
		switch {
		case claims[j].LookOnly:
			st.ask = err != nil || h.Other || h.Seen
		case err != nil:
			if _, ok := AsError(err); !ok {
				// Nothing is known of the claim and nothing ran.
				err = ErrUnavailable
			}
			st.err = err
		case h.Other:
			st.err = Conflict(usageReuse)
		default:
			st.claimed = true
			st.ask = h.Fresh && h.Seen
			st.unseen, st.claimedAt = h.Fresh && !h.Seen, claimedAt
		}
	}
}

// releaseUsageIDs gives back, in one round trip, the claims of the steps
// whose consume certainly did not charge, best effort: a claim left behind
// refuses its id to other customers until it lapses
// (idempotency.UsageClaimRetention), and never lets an id charge twice.
func (s *Entitlements) releaseUsageIDs(ctx context.Context, scope Scope, events []UsageEvent, steps []usageStep) {
	var give []UsageClaim
	for i := range steps {
		if st := &steps[i]; st.claimed && !st.charged {
			give = append(give, UsageClaim{EventID: events[i].EventID, Customer: st.cmd.Customer.CustomerID})
		}
	}
	if len(give) > 0 {
		_ = s.usageIDs.UsageIDsRelease(context.WithoutCancel(ctx), scope.TenantID, scope.Environment, give)
	}
}

// usageMayHaveCharged reports whether a consume answered res, err may
// have charged: it did (neither replayed nor refused), or its outcome is
// unknown (the store could not answer, or answered after applying, as
// ErrNotReplicated says, or failed unexpectedly). Its claim is kept.
func usageMayHaveCharged(res MutationResult, err error) bool {
	if err == nil {
		return !res.Replayed
	}
	if errors.Is(err, ErrAppliedUnknown) {
		return false // nothing ran
	}
	e, ok := AsError(err)
	return !ok || e.Kind == KindUnavailable || e.Kind == KindInternal
}
