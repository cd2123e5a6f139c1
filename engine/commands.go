// Commands: what the account scripts are asked to do (consume, reserve, commit,
// release, gauge), as Go values the lua package turns into script arguments.

package engine

import (
	"time"

	"github.com/google/uuid"
)

// RuleTerms is what a script needs to price: a rule's pricing fields.
type RuleTerms struct {
	CostType   CostType    `json:"cost_type"`
	BaseCost   int64       `json:"base_cost"`
	UnitCost   int64       `json:"unit_cost"`
	TierConfig *TierConfig `json:"tier_config"`
}

// TermsOf is r's pricing fields.
func TermsOf(r MeteringRule) RuleTerms {
	return RuleTerms{CostType: r.CostType, BaseCost: r.BaseCost, UnitCost: r.UnitCost, TierConfig: r.TierConfig}
}

// CommandHeader is what every money command carries: which operation, on
// which customer, under which idempotency key and request hash, at which
// instant. The scripts take it as their first arguments (lua's headArgv).
type CommandHeader struct {
	// OpID names the operation in the outbox and in Postgres.
	OpID     uuid.UUID
	Customer CustomerKey
	// IdempotencyKey is the caller's key; "" for none.
	IdempotencyKey string
	// RequestHash fingerprints the request the key was first used with, so
	// a replay with another body is ErrIdempotencyMismatch.
	RequestHash string
	// Now is the operation's instant (the service's Clock, milliseconds).
	Now time.Time
}

// headerOf is the header of a new operation (a fresh, time-ordered op id)
// on c under idem at now.
func headerOf(c CustomerKey, idem Idempotency, now time.Time) CommandHeader {
	return CommandHeader{OpID: uuid.Must(uuid.NewV7()), Customer: c, IdempotencyKey: idem.Key, RequestHash: idem.RequestHash, Now: now}
}

// ConsumeCommand prices units of a metric and charges them in one script.
// Under block a short effective balance refuses with ErrInsufficientCredits
// and charges nothing (the script still records the refusal in the outbox,
// for credit.exhausted); under allow and notify the charge takes what the
// effective balance has and records the rest as overage.
type ConsumeCommand struct {
	CommandHeader
	Metric string
	Units  int64
	Terms  RuleTerms
	// Items, when set, replace Metric, Units and Terms: a multi-metric
	// consume charging every item or none in one script.
	Items         []ConsumeLine
	Policy        OveragePolicy
	EntryMetadata Metadata
	Context       MutationContext
	// Pool, when set, lets a charge (single- or multi-metric) draw on the
	// customer's parent once its own credit is short (docs/rules.md
	// "Shared pools").
	Pool *PoolDraw
	// AppliedCheckedAt is when (wall clock) the caller looked
	// IdempotencyKey up in Postgres and found nothing; zero when it did not,
	// and the store looks it up itself (engine.AppliedOps).
	AppliedCheckedAt time.Time
}

// ConsumeLine is one metric of a multi-metric consume: its units and the
// terms of its active rule.
type ConsumeLine struct {
	Metric string
	Units  int64
	Terms  RuleTerms
}

// ReserveCommand holds the estimated cost of a job.
type ReserveCommand struct {
	CommandHeader
	ReservationID  uuid.UUID
	Metric         string
	EstimatedUnits int64
	Terms          RuleTerms
	// Items, when set, replace Metric, EstimatedUnits and Terms: a reservation of
	// the summed estimated cost of several metrics, all or none.
	Items     []ReserveLine
	ExpiresAt time.Time
	Metadata  Metadata
	Context   MutationContext
}

// CommitCommand settles a reservation at the actual units, priced with the rule
// current at commit. From expires_at until the sweep expires the reservation, a
// commit is a 409 reservation-expired.
type CommitCommand struct {
	CommandHeader
	ReservationID uuid.UUID
	ActualUnits   int64
	Terms         RuleTerms
	// Items, when set, replace ActualUnits and Terms: the commit of a
	// multi-metric reservation, one line per metric of the reservation in its order.
	Items    []CommitLine
	Metadata Metadata
	Context  MutationContext
	// Partial charges ActualUnits (>= 1) and keeps the reservation active with
	// what it still holds less their cost (issue 27); single metric only.
	Partial bool
}

// ExtendCommand tops an active single-metric reservation up by AdditionalUnits
// priced at Terms (as a reservation of that many units would be) and/or
// moves its expiry to ExpiresAt (zero: unchanged; never earlier).
type ExtendCommand struct {
	CommandHeader
	ReservationID   uuid.UUID
	AdditionalUnits int64
	Terms           RuleTerms
	ExpiresAt       time.Time
	Context         MutationContext
}

// ReleaseCommand returns a reservation (a manual release, or the sweep's expiry).
type ReleaseCommand struct {
	CommandHeader
	ReservationID uuid.UUID
	// Expire marks the reservation expired (the sweep) instead of released, and
	// only when its expires_at has passed.
	Expire  bool
	Context MutationContext
}

// ReserveLine is one metric of a multi-metric reservation: its estimated units and
// the terms of its active rule.
type ReserveLine struct {
	Metric         string
	EstimatedUnits int64
	Terms          RuleTerms
}

// CommitLine is one metric of a multi-metric commit: the reservation's estimate
// of it (as Postgres stored it at the reserve; the script checks the
// totals against the reservation), the actual units and the terms current at
// commit (zero when ActualUnits is 0).
type CommitLine struct {
	Metric         string
	EstimatedUnits int64
	EstimatedCost  int64
	ActualUnits    int64
	Terms          RuleTerms
}

// GaugeCommand moves a gauge counter by Delta (positive: increment).
type GaugeCommand struct {
	CommandHeader
	Metric string
	Delta  int64
	Cap    int64
	// Allow lets an increment pass the cap (policy allow).
	Allow bool
	// LeaseID, when set, takes a lease on the incremented slots for
	// LeaseSeconds: they return by themselves when it ends (leases.go).
	LeaseID      uuid.UUID
	LeaseSeconds int64
	Context      MutationContext
}

// Errors of the hot-path scripts.
var (
	// ErrReservationNotFound: no such reservation for the customer.
	ErrReservationNotFound = &Error{Kind: KindNotFound, Detail: "reservation not found"}
	// ErrReservationNotActive: the reservation was committed, released or expired.
	ErrReservationNotActive = &Error{Kind: KindConflict, Detail: "the reservation is not active"}
	// ErrReservationExpired: commit after expires_at, before the sweep.
	ErrReservationExpired = &Error{Kind: KindReservationExpired, Detail: "the reservation expired"}
	// ErrReservationShorter: an extend whose new expiry comes before the
	// reservation's current one (an extend never shortens a reservation).
	ErrReservationShorter = &Error{Kind: KindValidation, Field: "ttl_seconds",
		Detail: "ttl_seconds from now would end the reservation before its current expires_at; an extend never shortens it"}
	// ErrGaugeBelowZero: a decrement larger than the count.
	ErrGaugeBelowZero = &Error{Kind: KindConflict, Field: "amount", Detail: "the decrement is larger than the current count"}
)

// GaugeCapError is the 409 of an increment past the cap under block; its
// members go into the problem body (docs/spec/interface.md Errors).
func GaugeCapError(current, cap, shortfall int64) *Error {
	return &Error{Kind: KindConflict, Detail: "the increment would pass the gauge cap",
		Extra: map[string]any{"current": current, "cap": cap, "shortfall": shortfall}}
}

// GrantCommand adds one block and its ledger entry to a customer's account.
type GrantCommand struct {
	CommandHeader
	AccountID     uuid.UUID // used only when this grant creates the account
	EntryType     EntryType
	Reason        *string
	EntryMetadata Metadata
	// Block carries ID, OriginalAmount, Priority, Source, Metadata and, when
	// known up front, ExpiresAt; StartsAt and RemainingAmount are set by the store.
	Block Block
	// DurationSeconds is the block's lifetime from its start; used with StackAfter.
	DurationSeconds int64
	StackAfter      *StackAfter
	// Context is spliced into the Mutation for the events it owes.
	Context *MutationContext
	// AccumulationCap, when set, grants at most cap - balance (nothing at or
	// above it; the result is then a zero Mutation), atomically with the
	// balance read (plan grants' accumulation_cap).
	AccumulationCap *int64
}

// StackAfter starts a block when the latest-expiring block matching
// MetadataMatch ends.
type StackAfter struct {
	MetadataMatch Metadata `json:"metadata_match"`
	Fallback      string   `json:"fallback"`
}

// Stack-after fallbacks.
const (
	FallbackNow    = "now"
	FallbackReject = "reject"
)

// DebitCommand drains Amount from a customer's started blocks in spend order,
// one ledger entry per block it touches; it changes nothing when the
// effective balance is short.
type DebitCommand struct {
	CommandHeader
	Amount        int64
	EntryType     EntryType
	Source        *Source
	Reason        *string
	EntryMetadata Metadata
	// Context is spliced into the Mutation for the events it owes.
	Context *MutationContext
}

// MutationResult is what a money-moving script returns.
type MutationResult struct {
	Mutation Mutation
	// Replayed is true when the idempotency key had already been applied to
	// this customer and Mutation is the original one.
	Replayed bool
	// Pool is, for a dry run of a charge its parent would share, the
	// parent's Mutation the charge would write (its pool_draw entry says
	// which of the parent's blocks pay); nil otherwise.
	Pool *Mutation
}
