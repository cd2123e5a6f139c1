// Usage: batches of usage events, each charged as a consume whose idempotency
// key is the event id (forever, not 24 h), with per-event outcomes.

package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// RecordUsage is a usage batch (POST /v1/usage, docs/spec/addendum.md §7)
// whose list api/ checked (given, at most MaxUsageEvents events).
type RecordUsage struct {
	Events []UsageEvent
}

// UsageEvent is one metered use in a batch, charged as a consume whose
// idempotency key is its event id.
type UsageEvent struct {
	EventID string // "" when missing (then Invalid says so)
	Consume ConsumeCredits
	// RequestHash fingerprints the event's content as sent (api/ owns
	// request fingerprints): the same event_id with another content is a
	// conflict, with the same content a duplicate.
	RequestHash string
	// Invalid is the first problem api/ found in the event's members: the
	// event fails alone with it (one bad event never fails the others),
	// unless its event_id was applied already.
	Invalid error
}

// UsageEventResult is one event's outcome.
type UsageEventResult struct {
	EventID       string     `json:"event_id"`
	Status        string     `json:"status"`
	TransactionID *uuid.UUID `json:"transaction_id"`
	Charged       int64      `json:"charged"`
	OverageMC     int64      `json:"overage_mc"`
	Error         *string    `json:"error"`
	// Cause is the unexpected failure behind an UsageInternalError, for the
	// log only: its text may name tables, addresses or SQL states. The API
	// logs it and adds the request id to Error.
	Cause error `json:"-"`
}

// UsageInternalError is the error of an event that failed for a reason that
// is not the caller's (no known engine error); what happened is only logged.
const UsageInternalError = "internal: an unexpected error occurred"

// Usage event statuses.
const (
	UsageCharged   = "charged"
	UsageDuplicate = "duplicate"
	UsageRefused   = "refused"
	UsageFailed    = "failed"
)

// MaxUsageEvents bounds one usage batch (docs/spec/addendum.md §7).
const MaxUsageEvents = 1000

// Usage charges a batch of events, each as a consume whose idempotency key
// is its event_id, so a re-sent event is charged once; one bad event never
// fails the others. An event_id is unique per tenant and environment,
// across customers (docs/spec/addendum.md §7): the tenant index of event
// ids (UsageIDs, usage_ids.go) claims each id for its event's customer
// before the consumes run, and Postgres is asked only about the ids the
// index cannot clear (docs/decisions.md "A tenant index of usage event
// ids").
func (s *Entitlements) Usage(ctx context.Context, scope Scope, tenant Tenant, in RecordUsage) ([]UsageEventResult, error) {
	out := make([]UsageEventResult, len(in.Events))
	steps := make([]usageStep, len(in.Events))
	for i, ev := range in.Events {
		steps[i].cmd, steps[i].err = s.usageCommand(ctx, scope, tenant, ev)
	}
	s.claimUsageIDs(ctx, scope, in.Events, steps)
	checkedAt := time.Now()
	applied, err := s.appliedUsage(ctx, scope, in.Events, steps)
	switch {
	case err == nil:
	case s.appliedDown.says(err) && s.usageIDs == nil:
		// Postgres is down and there is no index: each event's script
		// consults its customer's seen filter instead (lua ConsumeBatch),
		// so the batch is charged without Postgres; what the filter cannot
		// tell meanwhile is an event_id re-sent for another customer.
		applied, checkedAt = nil, time.Time{}
	case s.appliedDown.says(err):
		// Only the events the index could not clear need Postgres: they
		// fail alone, retryable, and the others are charged.
		for i := range steps {
			if steps[i].ask && steps[i].err == nil {
				steps[i].err = ErrAppliedUnknown
			}
		}
		applied = nil
	default:
		s.releaseUsageIDs(ctx, scope, in.Events, steps)
		return nil, err
	}
	if s.applied == nil {
		checkedAt = time.Time{}
	}
	at := make([]int, 0, len(in.Events))
	cmds := make([]ConsumeCommand, 0, len(in.Events))
	for i, ev := range in.Events {
		st := &steps[i]
		checked := time.Time{}
		switch {
		case st.ask:
			m, ok := applied[usageKey(ev.EventID)]
			if ok && m.Environment == scope.Environment {
				out[i] = duplicateOf(ev.EventID, m, ev.RequestHash)
				continue
			}
			// Not found: the look-up stands for the script. Found for the
			// other environment only (one row per key is returned): the
			// store looks this customer's key up itself.
			if !ok {
				checked = checkedAt
			}
		case st.unseen:
			// The index never saw the id: neither has the customer's filter.
			checked = st.claimedAt
		}
		if st.err != nil {
			out[i] = usageFailure(ev, s.recordDown(st.err))
			continue
		}
		st.cmd.AppliedCheckedAt = checked
		at, cmds = append(at, i), append(cmds, st.cmd)
	}
	// One pipelined round trip per chunk instead of one per event; the
	// store runs a customer's events in the batch's order.
	for lo := 0; lo < len(cmds); lo += usagePipeline {
		hi := min(lo+usagePipeline, len(cmds))
		results, errs := s.hot.ConsumeBatch(ctx, cmds[lo:hi])
		for j := lo; j < hi; j++ {
			res, err := results[j-lo], errs[j-lo]
			if errors.Is(err, ErrStateMissing) || errors.Is(err, ErrPoolStateMissing) {
				// Not in Redis (the customer's state or its parent's): load
				// it and run the event alone (its customer's later events of
				// the chunk come here too, in order).
				res, err = s.charge(ctx, cmds[j])
			}
			out[at[j]] = usageOutcome(in.Events[at[j]], cmds[j], res, s.recordDown(err))
			steps[at[j]].charged = usageMayHaveCharged(res, err)
		}
	}
	s.releaseUsageIDs(ctx, scope, in.Events, steps)
	return out, nil
}

// usagePipeline is how many of a batch's events go to Redis in one
// pipelined round trip: large enough to spend the round trip's cost once
// over many scripts, small enough that one call does not hold a
// connection's replies for long.
const usagePipeline = 64

// UsageKeyPrefix starts the idempotency key of every usage event's
// consume: "usage:<event id>".
const UsageKeyPrefix = "usage:"

func usageKey(eventID string) string { return UsageKeyPrefix + eventID }

// appliedUsage looks the ids of the events that ask (usageStep.ask) up in
// Postgres in one query; none asking, it asks nothing.
func (s *Entitlements) appliedUsage(ctx context.Context, scope Scope, events []UsageEvent, steps []usageStep) (map[string]Mutation, error) {
	if s.applied == nil {
		return nil, nil
	}
	keys := make([]string, 0, len(events))
	for i, ev := range events {
		if steps[i].ask {
			keys = append(keys, usageKey(ev.EventID))
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return s.applied.AppliedMutations(ctx, scope.TenantID, keys)
}

// duplicateOf answers a re-sent event from its original Mutation; another
// content under the same event_id is a conflict.
func duplicateOf(id string, m Mutation, requestHash string) UsageEventResult {
	if m.RequestHash != requestHash {
		msg := usageReuse
		return UsageEventResult{EventID: id, Status: UsageFailed, Error: &msg}
	}
	r := consumeResult(m)
	return UsageEventResult{EventID: id, Status: UsageDuplicate, TransactionID: r.TransactionID, Charged: r.Charged, OverageMC: r.OverageMC}
}

// usageCommand builds event ev's consume (Usage sets when its id was last
// found unapplied, AppliedCheckedAt).
func (s *Entitlements) usageCommand(ctx context.Context, scope Scope, tenant Tenant, ev UsageEvent) (ConsumeCommand, error) {
	if ev.Invalid != nil {
		return ConsumeCommand{}, ev.Invalid
	}
	return s.consumeCommand(ctx, scope, tenant, Idempotency{Key: usageKey(ev.EventID), RequestHash: ev.RequestHash}, ev.Consume)
}

// recordDown is err, or ErrRecordUnavailable wrapping it when it only
// says that Postgres could not answer (a customer's facts or state not in
// the caches or Redis during an outage): the event then fails with the
// retryable text, as a single consume answers 503, not as internal.
func (s *Entitlements) recordDown(err error) error {
	if _, domain := AsError(err); err == nil || domain || s.appliedDown == nil || !s.appliedDown.says(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrRecordUnavailable, err)
}

// usageOutcome is event ev's result from its consume's.
func usageOutcome(ev UsageEvent, cmd ConsumeCommand, res MutationResult, err error) UsageEventResult {
	r, err := consumeOutcome(cmd, res, err)
	if errors.Is(err, ErrIdempotencyMismatch) {
		err = Conflict(usageReuse)
	}
	if err != nil {
		return usageFailure(ev, err)
	}
	status := UsageCharged
	if r.replayed {
		status = UsageDuplicate
	}
	return UsageEventResult{EventID: ev.EventID, Status: status, TransactionID: r.TransactionID, Charged: r.Charged, OverageMC: r.OverageMC}
}

// usageFailure is event ev's result when err stopped it: refused when
// credit was short or a budget refused it, else failed, with err's public text (or, for an
// unexpected error, UsageInternalError and err kept for the log).
func usageFailure(ev UsageEvent, err error) UsageEventResult {
	id := ev.EventID
	msg, public := ItemErrorText(err)
	if !public {
		msg = UsageInternalError
		return UsageEventResult{EventID: id, Status: UsageFailed, Error: &msg, Cause: err}
	}
	status := UsageFailed
	// A budget's refusal is a refusal too (docs/rules.md "Budgets").
	if errors.Is(err, ErrInsufficientCredits) || errors.Is(err, ErrBudgetExceeded) {
		status = UsageRefused
	}
	return UsageEventResult{EventID: id, Status: status, Error: &msg}
}

// UsageRequestHash is the fingerprint of a usage event whose members, as
// sent, JSON-encode to event (api/ encodes them in one frozen member
// order: a change would make every re-sent event a conflict).
func UsageRequestHash(event []byte) string { return "usage-" + hashHex(event) }

func hashHex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}
