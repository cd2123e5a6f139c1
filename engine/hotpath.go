package engine

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// MutationContext is request context Go hands to a script, which splices it
// verbatim into the Mutation (field "ctx"), so the persister can derive the
// events a mutation owes without another look-up.
type MutationContext struct {
	ExternalID  string        `json:"ext"`
	ThresholdMC int64         `json:"th"`
	Policy      OveragePolicy `json:"policy,omitempty"`
	// Event names the credit.granted emitter when it is not a plain grant.
	Emitter string `json:"emitter,omitempty"`
}

// MutationUsage is what a consume or a reservation commit priced and charged.
type MutationUsage struct {
	Metric  string `json:"metric"`
	Units   int64  `json:"units"`
	Cost    int64  `json:"cost"`
	Charged int64  `json:"charged"`
	Overage int64  `json:"overage"`
	// Refused is true when a block customer was refused (nothing charged).
	Refused bool `json:"refused,omitempty"`
	// ReservationID is set when a commit produced the usage.
	ReservationID *uuid.UUID `json:"reservation,omitempty"`
	// Items is what each metric of a multi-metric consume priced; Metric
	// is then "" and Units the items' total.
	Items []UsageItem `json:"items,omitempty"`
}

// UsageItem is one metric's part of a multi-metric consume. Its names are
// the API's: the script writes one text for the usage and for the ledger
// entry's metadata, which history shows.
type UsageItem struct {
	Metric string `json:"billable_metric_key"`
	Units  int64  `json:"units"`
	Cost   int64  `json:"cost"`
}

// ReservationStatus is a hold's state.
type ReservationStatus string

// Reservation states of interface.md "Reservation".
const (
	ReservationActive    ReservationStatus = "active"
	ReservationCommitted ReservationStatus = "committed"
	ReservationReleased  ReservationStatus = "released"
	ReservationExpired   ReservationStatus = "expired"
)

// Valid reports whether s is a known status.
func (s ReservationStatus) Valid() bool {
	switch s {
	case ReservationActive, ReservationCommitted, ReservationReleased, ReservationExpired:
		return true
	}
	return false
}

// MutationReservation is the full state of a reservation after a mutation.
type MutationReservation struct {
	ID             uuid.UUID         `json:"id"`
	Metric         string            `json:"metric"`
	EstimatedUnits int64             `json:"est_units"`
	EstimatedCost  int64             `json:"est_cost"`
	ActualUnits    *int64            `json:"act_units,omitempty"`
	ActualCost     *int64            `json:"act_cost,omitempty"`
	Released       int64             `json:"released"`
	Status         ReservationStatus `json:"status"`
	ExpiresMS      int64             `json:"expires"`
	CreatedMS      int64             `json:"created"`
	CommittedMS    *int64            `json:"committed,omitempty"`
	ReleasedMS     *int64            `json:"released_at,omitempty"`
	Metadata       json.RawMessage   `json:"meta,omitempty"`
	// Items lists each metric of a multi-metric hold (Metric is then "",
	// EstimatedUnits and EstimatedCost the items' totals, and at commit
	// ActualUnits and ActualCost too); nil for a single-metric hold and in
	// a release, which does not carry them (Postgres keeps the stored list).
	Items []ReservationItem `json:"items,omitempty"`
}

// ReservationItem is one metric of a multi-metric hold: its estimate and,
// once committed, its actual units and their cost (null until then).
type ReservationItem struct {
	BillableMetricKey string `json:"billable_metric_key"`
	EstimatedUnits    int64  `json:"estimated_units"`
	EstimatedCost     int64  `json:"estimated_cost"`
	ActualUnits       *int64 `json:"actual_units"`
	ActualCost        *int64 `json:"actual_cost"`
}

// MutationGauge is a gauge counter after a mutation.
type MutationGauge struct {
	Metric  string `json:"metric"`
	Current int64  `json:"current"`
	// Leases are the leases of the gauge this mutation opened, renewed or
	// ended (leases.go); empty for a plain move.
	Leases []MutationLease `json:"leases,omitempty"`
}

// Reservation is the API view of a hold.
type Reservation struct {
	ID                uuid.UUID         `json:"id"`
	TenantID          uuid.UUID         `json:"tenant_id"`
	CustomerID        uuid.UUID         `json:"customer_id"`
	Environment       Environment       `json:"environment"`
	BillableMetricKey string            `json:"billable_metric_key"`
	EstimatedUnits    int64             `json:"estimated_units"`
	EstimatedCost     int64             `json:"estimated_cost"`
	ActualUnits       *int64            `json:"actual_units"`
	ActualCost        *int64            `json:"actual_cost"`
	Status            ReservationStatus `json:"status"`
	ReferenceID       uuid.UUID         `json:"reference_id"`
	ExpiresAt         time.Time         `json:"expires_at"`
	Metadata          Metadata          `json:"metadata"`
	CreatedAt         time.Time         `json:"created_at"`
	CommittedAt       *time.Time        `json:"committed_at"`
	ReleasedAt        *time.Time        `json:"released_at"`
	// Items lists each metric of a multi-metric hold (BillableMetricKey is
	// then ""); absent for a single-metric hold.
	Items []ReservationItem `json:"items,omitempty"`
}

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

// ConsumeCommand prices units of a metric and charges them in one script.
// Under block a short effective balance refuses with ErrInsufficientCredits
// and charges nothing (the script still records the refusal in the outbox,
// for credit.exhausted); under allow and notify the charge takes what the
// effective balance has and records the rest as overage.
type ConsumeCommand struct {
	OpID           uuid.UUID
	Customer       CustomerKey
	IdempotencyKey string
	RequestHash    string
	Now            time.Time
	Metric         string
	Units          int64
	Terms          RuleTerms
	// Items, when set, replace Metric, Units and Terms: a multi-metric
	// consume charging every item or none in one script.
	Items         []ConsumeLine
	Policy        OveragePolicy
	EntryMetadata Metadata
	Context       MutationContext
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
	OpID           uuid.UUID
	Customer       CustomerKey
	IdempotencyKey string
	RequestHash    string
	Now            time.Time
	ReservationID  uuid.UUID
	Metric         string
	EstimatedUnits int64
	Terms          RuleTerms
	// Items, when set, replace Metric, EstimatedUnits and Terms: a hold of
	// the summed estimated cost of several metrics, all or none.
	Items     []ReserveLine
	ExpiresAt time.Time
	Metadata  Metadata
	Context   MutationContext
}

// CommitCommand settles a hold at the actual units, priced with the rule
// current at commit. From expires_at until the sweep expires the hold, a
// commit is a 409 reservation-expired.
type CommitCommand struct {
	OpID           uuid.UUID
	Customer       CustomerKey
	IdempotencyKey string
	RequestHash    string
	Now            time.Time
	ReservationID  uuid.UUID
	ActualUnits    int64
	Terms          RuleTerms
	// Items, when set, replace ActualUnits and Terms: the commit of a
	// multi-metric hold, one line per metric of the hold in its order.
	Items    []CommitLine
	Metadata Metadata
	Context  MutationContext
}

// ReleaseCommand returns a hold (a manual release, or the sweep's expiry).
type ReleaseCommand struct {
	OpID           uuid.UUID
	Customer       CustomerKey
	IdempotencyKey string
	RequestHash    string
	Now            time.Time
	ReservationID  uuid.UUID
	// Expire marks the hold expired (the sweep) instead of released, and
	// only when its expires_at has passed.
	Expire  bool
	Context MutationContext
}

// ReserveLine is one metric of a multi-metric hold: its estimated units and
// the terms of its active rule.
type ReserveLine struct {
	Metric         string
	EstimatedUnits int64
	Terms          RuleTerms
}

// CommitLine is one metric of a multi-metric commit: the hold's estimate
// of it (as Postgres stored it at the reserve; the script checks the
// totals against the hold), the actual units and the terms current at
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
	OpID           uuid.UUID
	Customer       CustomerKey
	IdempotencyKey string
	RequestHash    string
	Now            time.Time
	Metric         string
	Delta          int64
	Cap            int64
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
	// ErrReservationNotFound: no such hold for the customer.
	ErrReservationNotFound = &Error{Kind: KindNotFound, Detail: "reservation not found"}
	// ErrReservationNotActive: the hold was committed, released or expired.
	ErrReservationNotActive = &Error{Kind: KindConflict, Detail: "the reservation is not active"}
	// ErrReservationExpired: commit after expires_at, before the sweep.
	ErrReservationExpired = &Error{Kind: KindReservationExpired, Detail: "the reservation expired"}
	// ErrGaugeBelowZero: a decrement larger than the count.
	ErrGaugeBelowZero = &Error{Kind: KindConflict, Field: "amount", Detail: "the decrement is larger than the current count"}
)

// GaugeCapError is the 409 of an increment past the cap under block; its
// members go into the problem body (interface.md Errors).
func GaugeCapError(current, cap, shortfall int64) *Error {
	return &Error{Kind: KindConflict, Detail: "the increment would pass the gauge cap",
		Extra: map[string]any{"current": current, "cap": cap, "shortfall": shortfall}}
}

// HoldRef is what the hot store's reservation index records of a hold at
// its reserve: enough to price its commit without Postgres.
type HoldRef struct {
	Customer CustomerKey
	// Described is false for a record that names the customer alone (one
	// written before the index carried the hold's metric or items).
	Described bool
	// Metric is a single-metric hold's metric ("" for a multi-metric one).
	Metric string
	// Items are a multi-metric hold's metrics with their estimates, in the
	// hold's order (actual units and cost nil).
	Items []ReservationItem
}

// DueReservation is a hold the sweep must expire.
type DueReservation struct {
	Customer      CustomerKey
	ReservationID uuid.UUID
}
