package engine

import (
	"time"

	"github.com/google/uuid"
)

// SubscriptionRecord is a subscription with the scheduler's bookkeeping,
// stored in one row so one lock guards both.
type SubscriptionRecord struct {
	Subscription
	// ActivatedAt is when the subscription last became active with fresh
	// grants (create without trial, trial end, upgrade); nil while trialing.
	ActivatedAt *time.Time
	// RenewalWarned is true once subscription.renewal_due went out for the
	// current period.
	RenewalWarned bool
	// Grants is the firing state of each plan grant of the current variant.
	Grants []GrantState
	// NextActionAt is the soonest instant the scheduler has work for the
	// subscription; nil when none. The engine computes it.
	NextActionAt *time.Time
	// Events are the subscription events this change reports, in order.
	// They are not part of the row: the store writes them in the
	// transaction that writes the record, so a transition and its events
	// are stored together or not at all.
	Events []Event
}

// GrantState is one plan grant's firing state on one subscription.
type GrantState struct {
	PlanGrantID uuid.UUID `json:"plan_grant_id"`
	// Anchor is the origin of the grant's own clock (daily, weekly, monthly,
	// ISO durations); Fired counts its firings on that clock.
	Anchor      time.Time  `json:"anchor"`
	Fired       int64      `json:"fired"`
	LastFiredAt *time.Time `json:"last_fired_at,omitempty"`
	// NextFireAt is the next firing on the grant's own clock; nil when the
	// grant fires only at period starts, or never again.
	NextFireAt *time.Time `json:"next_fire_at,omitempty"`
	// RolloverCycles counts consecutive renewals that carried credit.
	RolloverCycles int `json:"rollover_cycles"`
	// BlockIDs are the blocks of the current cycle (grant and rollover).
	BlockIDs []uuid.UUID `json:"block_ids"`
	// NextKey names the pending firing of a grant that is not on its own
	// clock (activation, period start), for its idempotency key.
	NextKey string `json:"next_key,omitempty"`
	// Rollover is owed by a prepaid renewal; it runs before the firing.
	Rollover *PendingRollover `json:"rollover,omitempty"`
}

// MetricUsage is one metric's consumption over a period.
type MetricUsage struct {
	BillableMetricKey string `json:"billable_metric_key"`
	// Units is the sum of the consumed units; Credits the credit charged.
	Units     int64 `json:"units"`
	Credits   int64 `json:"credits"`
	OverageMC int64 `json:"overage_mc"`
}

// ErrLiveSubscription is what a store returns when the customer already has
// a live subscription.
var ErrLiveSubscription = &Error{Kind: KindConflict, Field: "customer_id",
	Detail: "the customer already has a live subscription; cancel it or upgrade it instead"}

// MutationRollover is the kind of a rollover Mutation: the previous cycle's
// blocks of a plan grant expire and part of their credit moves to a new
// block. It owes no event (the credit was granted before).
const MutationRollover MutationKind = "rollover"

// RolloverCommand carries Percentage of the unused credit of Blocks into a
// new block (Block: ID, Priority, Source, Metadata, ExpiresAt) and expires
// Blocks, in one atomic step.
type RolloverCommand struct {
	OpID           uuid.UUID
	Customer       CustomerKey
	IdempotencyKey string
	Now            time.Time
	Blocks         []uuid.UUID
	Percentage     int
	Block          Block
	EntryType      EntryType
	EntryMetadata  Metadata
	Context        *MutationContext
}

// PendingRollover is a rollover a prepaid renewal owes a grant: Percent of
// the unused credit of the grant's current blocks (0: they only expire).
type PendingRollover struct {
	Percent int    `json:"percent"`
	Key     string `json:"key"`
}
