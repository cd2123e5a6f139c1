// Extending a reservation: a top-up (more units held, refused like a create when
// the effective balance cannot cover them) and/or a later expiry, one
// account script run (issue 27).

package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// ExtendReservation is a checked extend: AdditionalUnits (0: none) and/or
// TTLSeconds (0: the expiry stays), at least one of them.
type ExtendReservation struct {
	// AdditionalUnits are priced as a reservation of that many units would
	// be, at the rule active now, and added to the reservation's estimate.
	AdditionalUnits int64
	// TTLSeconds sets expires_at to now + TTLSeconds, 1 to
	// MaxReservationTTLSeconds, never before the current expires_at.
	TTLSeconds int64
}

// ExtendResult is the 200 body of an extend: the reservation after it and
// the account.
type ExtendResult struct {
	Reservation
	Account ReservationAccount `json:"account"`
}

// Extend tops an active single-metric reservation up and/or prolongs it. Not
// environment scoped, but tenant scoped, as commit. Errors: 404; 409
// (conflict: not active or a multi-metric reservation; reservation-expired;
// insufficient-credits for a top-up the effective balance cannot cover,
// whatever the customer's overage policy, as a create); 422 (ttl_seconds
// that would shorten the reservation, a cost overflow, a metric without an active
// rule).
func (s *Reservations) Extend(ctx context.Context, scope Scope, tenant Tenant, id uuid.UUID, idem Idempotency, in ExtendReservation) (ExtendResult, error) {
	c, reservation, err := s.find(ctx, scope, id, false)
	if err != nil {
		return ExtendResult{}, err
	}
	out, err := s.extend(ctx, tenant, id, idem, in, c, reservation)
	if !s.hotMiss(reservation, err) {
		return out, err
	}
	if c, reservation, err = s.locate(ctx, scope, id); err != nil {
		return ExtendResult{}, err
	}
	return s.extend(ctx, tenant, id, idem, in, c, reservation)
}

// extend is Extend of the reservation found (find or locate).
func (s *Reservations) extend(ctx context.Context, tenant Tenant, id uuid.UUID, idem Idempotency, in ExtendReservation, c Customer, reservation Reservation) (ExtendResult, error) {
	if len(reservation.Items) > 0 {
		return ExtendResult{}, ErrPartialMulti
	}
	if reservation.Status != "" && reservation.Status != ReservationActive {
		return ExtendResult{}, ErrReservationNotActive
	}
	now := s.clock.Now()
	cmd := ExtendCommand{CommandHeader: headerOf(CustomerKeyOf(c), idem, now), ReservationID: id,
		AdditionalUnits: in.AdditionalUnits, Context: contextOf(c, tenant)}
	if in.AdditionalUnits > 0 {
		reservationScope := Scope{TenantID: c.TenantID, Environment: c.Environment}
		rule, found, err := s.metering.ActiveRule(ctx, reservationScope, reservation.BillableMetricKey)
		if err != nil {
			return ExtendResult{}, err
		}
		if !found {
			return ExtendResult{}, Invalid("additional_units", "the reservation's metric has no active metering rule to price them")
		}
		if _, err := Price(rule, in.AdditionalUnits); err != nil {
			return ExtendResult{}, priceError(err, "additional_units")
		}
		if err := s.ent.usageAllowed(ctx, c, rule.BillableMetricKey); err != nil {
			return ExtendResult{}, err
		}
		cmd.Terms = TermsOf(rule)
	}
	if in.TTLSeconds > 0 {
		cmd.ExpiresAt = now.Add(time.Duration(in.TTLSeconds) * time.Second)
	}
	res, err := s.run(ctx, reservation, cmd.Customer, func() (MutationResult, error) { return s.hot.Extend(ctx, cmd) })
	if err != nil {
		return ExtendResult{}, priceError(settled(err, reservation), "additional_units")
	}
	return ExtendResult{Reservation: reservationOf(res.Mutation), Account: reservationAccount(res.Mutation)}, nil
}
