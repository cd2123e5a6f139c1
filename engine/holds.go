// Holds: the reservation resource (its states, the stored hold and the index\nrecord that lets a commit settle from Redis alone).
package engine

import (
	"time"

	"github.com/google/uuid"
)

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
