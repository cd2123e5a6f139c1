// Usage event ids across customers: the claims of the tenant index
// (UsageIDs) a usage batch takes before its consumes and gives back after.

package engine

import (
	"context"
	"errors"
	"time"

	"github.com/creditd/creditd/engine/idempotency"
)

// usageReuse is the error text of an event whose event_id was used for
// another event: another content, or another customer (the customer is
// part of the event).
const usageReuse = "event_id was already used for a different event"

// claimUsageIDs claims the event id of each of cmds (the consumes about to
// run, cmds[j] of event events[at[j]]) for its customer in the tenant
// index, in one round trip, and returns the events that go on with their
// claims (aligned with the commands). An event whose id another customer
// holds gets its result in out now: failed as a reuse, nothing charged. An
// event whose claim could not be taken fails with the retryable
// unavailable text, nothing charged. The claims are taken while the
// batch's Postgres look-up at checkedAt (zero: none) stands
// (idempotency.AppliedLookupFresh), so a first charge committed after the
// look-up missed it still has its claim (idempotency.UsageClaimGrace).
// Without an index it returns at and cmds as they are, and no claims.
func (s *Entitlements) claimUsageIDs(ctx context.Context, scope Scope, events []UsageEvent, out []UsageEventResult,
	at []int, cmds []ConsumeCommand, checkedAt time.Time) ([]int, []ConsumeCommand, []UsageClaim) {
	if s.usageIDs == nil || len(cmds) == 0 {
		return at, cmds, nil
	}
	claims := make([]UsageClaim, len(cmds))
	for j, c := range cmds {
		claims[j] = UsageClaim{EventID: events[at[j]].EventID, Customer: c.Customer.CustomerID}
	}
	if !checkedAt.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, checkedAt.Add(idempotency.AppliedLookupFresh))
		defer cancel()
	}
	holds, errs := s.usageIDs.UsageIDsClaim(ctx, scope.TenantID, scope.Environment, claims)
	// Filtered in place: the write index never passes the read index.
	keptAt, kept, keptClaims := at[:0], cmds[:0], claims[:0]
	for j := range cmds {
		i, err := at[j], errs[j]
		switch {
		case err != nil:
			if _, ok := AsError(err); !ok {
				// Nothing is known of the claim and nothing ran.
				err = ErrUnavailable
			}
			out[i] = usageFailure(events[i], err)
		case holds[j].Other:
			out[i] = usageFailure(events[i], Conflict(usageReuse))
		default:
			keptAt, kept, keptClaims = append(keptAt, i), append(kept, cmds[j]), append(keptClaims, claims[j])
		}
	}
	return keptAt, kept, keptClaims
}

// releaseUsageIDs gives back the claims whose consume certainly did not
// charge (keep[j] false), in one round trip, best effort: a claim left
// behind refuses its id to other customers until it lapses
// (idempotency.UsageClaimRetention), and never lets an id charge twice.
func (s *Entitlements) releaseUsageIDs(ctx context.Context, scope Scope, claims []UsageClaim, keep []bool) {
	if len(claims) == 0 {
		return
	}
	give := make([]UsageClaim, 0, len(claims))
	for j, c := range claims {
		if !keep[j] {
			give = append(give, c)
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
