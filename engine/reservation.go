// Reservations: the reservation resource (its states, the stored reservation and the index
// record that lets a commit settle from Redis alone).

package engine

import (
	"time"

	"github.com/google/uuid"
)

// ReservationStatus is a reservation's state.
type ReservationStatus string

// Reservation states of docs/spec/interface.md "Reservation".
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

// Reservation is the API view of a reservation.
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
	// Items lists each metric of a multi-metric reservation (BillableMetricKey is
	// then ""); absent for a single-metric reservation.
	Items []ReservationItem `json:"items,omitempty"`
	// SettledUnits and SettledCost (millicredits, priced as each part was
	// charged) total what the reservation's commits settled: its partial commits
	// and, once committed, the final one (they then equal ActualUnits and
	// ActualCost). Zero before any.
	SettledUnits int64 `json:"settled_units"`
	SettledCost  int64 `json:"settled_cost"`
	// RemainingCost is what the reservation still holds (millicredits): while
	// active, EstimatedCost less what partial commits took from it; 0
	// once finalized.
	RemainingCost int64 `json:"remaining_cost"`
}

// Settle fills the view's settlement figures from the stored reservation, whose
// actual units and cost, while it is active, are what partial commits
// settled so far and whose released amount is then the part of its
// estimated cost they took (lua/prelude/reservations.lua "Reservation encoding"): the
// view shows actual units and cost only once the reservation is committed.
func (r *Reservation) Settle(released int64) {
	r.SettledUnits, r.SettledCost, r.RemainingCost = 0, 0, 0
	if r.ActualUnits != nil {
		r.SettledUnits = *r.ActualUnits
	}
	if r.ActualCost != nil {
		r.SettledCost = *r.ActualCost
	}
	if r.Status == ReservationActive {
		r.RemainingCost = r.EstimatedCost - released
	}
	if r.Status != ReservationCommitted {
		r.ActualUnits, r.ActualCost = nil, nil
	}
}

// ReservationRef is what the hot store's reservation index records of a reservation at
// its reserve: enough to price its commit without Postgres.
type ReservationRef struct {
	Customer CustomerKey
	// Described is false for a record that names the customer alone (one
	// written before the index carried the reservation's metric or items).
	Described bool
	// Metric is a single-metric reservation's metric ("" for a multi-metric one).
	Metric string
	// Items are a multi-metric reservation's metrics with their estimates, in the
	// reservation's order (actual units and cost nil).
	Items []ReservationItem
}

// DueReservation is a reservation the sweep must expire.
type DueReservation struct {
	Customer      CustomerKey
	ReservationID uuid.UUID
}
