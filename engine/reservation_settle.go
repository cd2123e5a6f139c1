// Settling a reservation: commit (single metric or items, with the merged metadata)
// and release, each one account script run from the reservation index when Redis
// holds the reservation.

package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// CommitReservation is a checked commit: ActualUnits for a single-metric
// reservation, or Items (non-nil) for a multi-metric one.
type CommitReservation struct {
	// UnitsMissing: neither actual_units nor items was given; the reservation
	// tells which of them the 422 names, so nothing else was checked.
	UnitsMissing bool
	ActualUnits  int64
	// Metadata is canonical (nil when none was given).
	Metadata Metadata
	Items    []CommitItem
	// Partial settles ActualUnits (>= 1) and keeps the reservation open
	// (the body's "final": false; single-metric reservations only).
	Partial bool
}

// CommitItem is one checked metric's actual units in the commit of a
// multi-metric reservation.
type CommitItem struct {
	Metric      string
	ActualUnits int64
}

// ReservationTransaction is the transaction member of commit and release bodies.
type ReservationTransaction struct {
	ID                uuid.UUID  `json:"id"`
	CustomerID        *uuid.UUID `json:"customer_id,omitempty"`
	Delta             int64      `json:"delta"`
	Type              EntryType  `json:"type"`
	BillableMetricKey *string    `json:"billable_metric_key,omitempty"`
	CostUnits         *int64     `json:"cost_units,omitempty"`
	ReferenceID       *uuid.UUID `json:"reference_id,omitempty"`
	CreatedAt         time.Time  `json:"created_at"`
}

// CommitResult is the 200 body of a commit.
type CommitResult struct {
	ReservationID  uuid.UUID              `json:"reservation_id"`
	Status         ReservationStatus      `json:"status"`
	EstimatedUnits int64                  `json:"estimated_units"`
	ActualUnits    int64                  `json:"actual_units"`
	EstimatedCost  int64                  `json:"estimated_cost"`
	ActualCost     int64                  `json:"actual_cost"`
	Released       int64                  `json:"released"`
	Transaction    ReservationTransaction `json:"transaction"`
	Account        ReservationAccount     `json:"account"`
	// Items lists each metric of a multi-metric reservation with its estimate and
	// its actual units and cost; the top-level figures are their totals.
	Items []ReservationItem `json:"items,omitempty"`
	// SettledUnits, SettledCost and RemainingCost are the reservation's
	// (Reservation) after this commit: a partial commit's ActualUnits and
	// ActualCost are its own part, these the totals so far.
	SettledUnits  int64 `json:"settled_units"`
	SettledCost   int64 `json:"settled_cost"`
	RemainingCost int64 `json:"remaining_cost"`
}

// ErrPartialMulti refuses a partial commit or an extend of a multi-metric
// reservation: its items' estimates live in Postgres, not in the reservation the script
// settles (issue 27 covers single-metric reservations first).
var ErrPartialMulti = &Error{Kind: KindConflict, Field: "items",
	Detail: "the reservation holds several metrics: partial commits and extends settle single-metric reservations only; commit or release it whole"}

// Commit settles a reservation at the actual units, priced at the rule current now.
// Not environment scoped, but tenant scoped. Errors: 404, 409 (conflict,
// reservation-expired, insufficient-credits), 422.
func (s *Reservations) Commit(ctx context.Context, scope Scope, tenant Tenant, id uuid.UUID, idem Idempotency, in CommitReservation) (CommitResult, error) {
	if in.Items != nil {
		if in.Partial {
			return CommitResult{}, Invalid("final", "a partial commit (final: false) settles a single-metric reservation: give actual_units, not items")
		}
		return s.commitMulti(ctx, scope, tenant, id, idem, in)
	}
	if in.Partial && in.UnitsMissing {
		return CommitResult{}, Invalid("actual_units", "actual_units is required")
	}
	if in.UnitsMissing {
		// A multi-metric reservation needs items, as a single one actual_units;
		// whatever the look-up finds, the request is a 422.
		if _, reservation, err := s.find(ctx, scope, id, false); err == nil && len(reservation.Items) > 0 {
			return CommitResult{}, Invalid("items", "the reservation holds several metrics: items (each metric's actual_units) is required")
		}
		return CommitResult{}, Invalid("actual_units", "actual_units is required")
	}
	extra := in.Metadata
	c, reservation, err := s.find(ctx, scope, id, len(extra) > 0)
	if err != nil {
		return CommitResult{}, err
	}
	out, err := s.commitSingle(ctx, tenant, id, idem, in, extra, c, reservation)
	if !s.hotMiss(reservation, err) {
		return out, err
	}
	if c, reservation, err = s.locate(ctx, scope, id); err != nil {
		return CommitResult{}, err
	}
	return s.commitSingle(ctx, tenant, id, idem, in, extra, c, reservation)
}

// commitSingle is Commit of the single-metric reservation found (find or locate).
func (s *Reservations) commitSingle(ctx context.Context, tenant Tenant, id uuid.UUID, idem Idempotency, in CommitReservation, extra Metadata, c Customer, reservation Reservation) (CommitResult, error) {
	if len(reservation.Items) > 0 {
		if in.Partial {
			return CommitResult{}, ErrPartialMulti
		}
		return CommitResult{}, BadRequest("actual_units", "the reservation holds several metrics: give items (each metric's actual_units) instead of actual_units")
	}
	reservationScope := Scope{TenantID: c.TenantID, Environment: c.Environment}
	var terms RuleTerms
	if in.ActualUnits > 0 {
		rule, found, err := s.metering.ActiveRule(ctx, reservationScope, reservation.BillableMetricKey)
		if err != nil {
			return CommitResult{}, err
		}
		if !found {
			return CommitResult{}, DocumentedInternal("the metric has no active metering rule")
		}
		if _, err := Price(rule, in.ActualUnits); err != nil {
			return CommitResult{}, priceError(err, "actual_units")
		}
		terms = TermsOf(rule)
	}
	meta, err := mergedReservationMetadata(reservation.Metadata, extra)
	if err != nil {
		return CommitResult{}, err
	}
	cmd := CommitCommand{
		CommandHeader: headerOf(CustomerKeyOf(c), idem, s.clock.Now()), ReservationID: id, ActualUnits: in.ActualUnits,
		Terms: terms, Metadata: meta, Context: contextOf(c, tenant), Partial: in.Partial}
	res, err := s.run(ctx, reservation, cmd.Customer, func() (MutationResult, error) { return s.hot.Commit(ctx, cmd) })
	if err != nil {
		return CommitResult{}, priceError(settled(err, reservation), "actual_units")
	}
	return commitResult(id, res.Mutation), nil
}

// commitResult is the 200 body of the commit of reservation id that m settled
// (Items is empty, so absent, for a single-metric reservation). A single-metric
// commit's actual units and cost are its own part (the usage it charged):
// after partial commits the reservation's totals are the settled figures.
func commitResult(id uuid.UUID, m Mutation) CommitResult {
	r := reservationOf(m)
	out := CommitResult{ReservationID: id, Status: r.Status, EstimatedUnits: r.EstimatedUnits, EstimatedCost: r.EstimatedCost,
		Released: m.Reservation.Released, Account: reservationAccount(m), Transaction: reservationTransaction(m), Items: r.Items,
		SettledUnits: r.SettledUnits, SettledCost: r.SettledCost, RemainingCost: r.RemainingCost}
	switch {
	case len(r.Items) > 0:
		out.ActualUnits, out.ActualCost = r.SettledUnits, r.SettledCost
	case m.Usage != nil:
		out.ActualUnits, out.ActualCost = m.Usage.Units, m.Usage.Cost
	}
	if r.Status == ReservationActive {
		// A partial commit returns nothing: the reservation's released amount is
		// what partial commits took from it.
		out.Released = 0
	}
	return out
}

// mergedReservationMetadata is extra merged key by key into a reservation's stored
// metadata, checked again: the merge may pass a limit neither half did.
func mergedReservationMetadata(stored, extra Metadata) (Metadata, error) {
	meta := make(Metadata, len(stored)+len(extra))
	for k, v := range stored {
		meta[k] = v
	}
	for k, v := range extra {
		meta[k] = v
	}
	return meta.Canonical("metadata")
}

// commitMulti settles a multi-metric reservation at each of its metrics' actual
// units (in.Items, every metric of the reservation once), each priced at its rule
// current now, in one script: all or none. Errors as Commit; an item's
// error names it.
func (s *Reservations) commitMulti(ctx context.Context, scope Scope, tenant Tenant, id uuid.UUID, idem Idempotency, in CommitReservation) (CommitResult, error) {
	actual := make(map[string]int64, len(in.Items))
	at := make(map[string]int, len(in.Items))
	for i, it := range in.Items {
		actual[it.Metric], at[it.Metric] = it.ActualUnits, i
	}
	extra := in.Metadata
	c, reservation, err := s.find(ctx, scope, id, len(extra) > 0)
	if err != nil {
		return CommitResult{}, err
	}
	out, err := s.commitItems(ctx, tenant, id, idem, in, extra, actual, at, c, reservation)
	if !s.hotMiss(reservation, err) {
		return out, err
	}
	if c, reservation, err = s.locate(ctx, scope, id); err != nil {
		return CommitResult{}, err
	}
	return s.commitItems(ctx, tenant, id, idem, in, extra, actual, at, c, reservation)
}

// commitItems is commitMulti of the reservation found (find or locate), with
// in.Items checked: actual and at are each metric's actual units and its
// index in in.Items.
func (s *Reservations) commitItems(ctx context.Context, tenant Tenant, id uuid.UUID, idem Idempotency, in CommitReservation, extra Metadata,
	actual map[string]int64, at map[string]int, c Customer, reservation Reservation) (CommitResult, error) {
	if len(reservation.Items) == 0 {
		return CommitResult{}, BadRequest("items", "the reservation holds one metric: give actual_units instead of items")
	}
	held := make(map[string]bool, len(reservation.Items))
	for _, h := range reservation.Items {
		held[h.BillableMetricKey] = true
	}
	for i, it := range in.Items {
		if !held[it.Metric] {
			field := fmt.Sprintf("items[%d].billable_metric_key", i)
			return CommitResult{}, Invalid(field, "the reservation holds no metric "+it.Metric)
		}
	}
	reservationScope := Scope{TenantID: c.TenantID, Environment: c.Environment}
	lines := make([]CommitLine, len(reservation.Items))
	var cost int64
	for i, h := range reservation.Items {
		units, ok := actual[h.BillableMetricKey]
		if !ok {
			return CommitResult{}, Invalid("items", "items must give the actual_units of every metric of the reservation; "+h.BillableMetricKey+" is missing")
		}
		lines[i] = CommitLine{Metric: h.BillableMetricKey, EstimatedUnits: h.EstimatedUnits, EstimatedCost: h.EstimatedCost,
			ActualUnits: units}
		if units == 0 {
			continue
		}
		field := fmt.Sprintf("items[%d].actual_units", at[h.BillableMetricKey])
		rule, found, err := s.metering.ActiveRule(ctx, reservationScope, h.BillableMetricKey)
		if err != nil {
			return CommitResult{}, err
		}
		if !found {
			return CommitResult{}, DocumentedInternal("the metric " + h.BillableMetricKey + " has no active metering rule")
		}
		p, err := Price(rule, units)
		if err != nil {
			return CommitResult{}, priceError(err, field)
		}
		if cost, ok = addInt64(cost, p); !ok {
			return CommitResult{}, Invalid("items", "the items' total cost would overflow a 64-bit amount")
		}
		lines[i].Terms = TermsOf(rule)
	}
	meta, err := mergedReservationMetadata(reservation.Metadata, extra)
	if err != nil {
		return CommitResult{}, err
	}
	cmd := CommitCommand{
		CommandHeader: headerOf(CustomerKeyOf(c), idem, s.clock.Now()), ReservationID: id, Items: lines,
		Metadata: meta, Context: contextOf(c, tenant)}
	res, err := s.run(ctx, reservation, cmd.Customer, func() (MutationResult, error) { return s.hot.Commit(ctx, cmd) })
	if err != nil {
		return CommitResult{}, priceError(settled(err, reservation), "items")
	}
	return commitResult(id, res.Mutation), nil
}

// ReleaseResult is the 200 body of a release.
type ReleaseResult struct {
	ReservationID uuid.UUID              `json:"reservation_id"`
	Status        ReservationStatus      `json:"status"`
	EstimatedCost int64                  `json:"estimated_cost"`
	Released      int64                  `json:"released"`
	Transaction   ReservationTransaction `json:"transaction"`
	Account       ReservationAccount     `json:"account"`
}

// Release returns a reservation, even past its expires_at. Errors: 404, 409.
func (s *Reservations) Release(ctx context.Context, scope Scope, tenant Tenant, id uuid.UUID, idem Idempotency) (ReleaseResult, error) {
	c, reservation, err := s.find(ctx, scope, id, false)
	if err != nil {
		return ReleaseResult{}, err
	}
	out, err := s.release(ctx, tenant, id, idem, c, reservation)
	if !s.hotMiss(reservation, err) {
		return out, err
	}
	if c, reservation, err = s.locate(ctx, scope, id); err != nil {
		return ReleaseResult{}, err
	}
	return s.release(ctx, tenant, id, idem, c, reservation)
}

// release is Release of the reservation found (find or locate).
func (s *Reservations) release(ctx context.Context, tenant Tenant, id uuid.UUID, idem Idempotency, c Customer, reservation Reservation) (ReleaseResult, error) {
	cmd := ReleaseCommand{
		CommandHeader: headerOf(CustomerKeyOf(c), idem, s.clock.Now()), ReservationID: id, Context: contextOf(c, tenant)}
	res, err := s.run(ctx, reservation, cmd.Customer, func() (MutationResult, error) { return s.hot.Release(ctx, cmd) })
	if err != nil {
		return ReleaseResult{}, settled(err, reservation)
	}
	m := res.Mutation
	r := reservationOf(m)
	return ReleaseResult{ReservationID: id, Status: r.Status, EstimatedCost: r.EstimatedCost,
		Released: m.Reservation.Released, Transaction: reservationTransaction(m), Account: reservationAccount(m)}, nil
}

// reservationTransaction summarizes a commit's or release's entries: the first
// main entry's id, the total delta.
func reservationTransaction(m Mutation) ReservationTransaction {
	var out ReservationTransaction
	first := true
	for i, e := range m.Entries {
		if e.Role != RoleMain {
			continue
		}
		if first {
			out = ReservationTransaction{ID: EntryID(m.OpID, i), Type: e.Type, ReferenceID: e.Ref, CreatedAt: m.At()}
			if e.Type == EntryConsumption {
				cid := m.CustomerID
				out.CustomerID, out.BillableMetricKey, out.CostUnits = &cid, e.Metric, e.Units
			}
			first = false
		}
		out.Delta += e.Delta
	}
	return out
}

// settled turns the store's "no such reservation" into the 409 a finalized reservation
// gets: Redis keeps finalized reservations only briefly, Postgres keeps them (and
// locate waited for it to catch up).
func settled(err error, reservation Reservation) error {
	if errors.Is(err, ErrReservationNotFound) && reservation.Status != "" && reservation.Status != ReservationActive {
		return ErrReservationNotActive
	}
	return err
}
