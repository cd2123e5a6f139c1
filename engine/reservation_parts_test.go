package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestReservationSettle: the view's settlement figures from a stored reservation
// (lua/prelude/reservations.lua "Reservation encoding"): while active, actual units and
// cost are the settled part and hidden, released is what partial commits
// took; once committed they are the totals and shown; a release after
// partial commits keeps the settled part and hides actual units.
func TestReservationSettle(t *testing.T) {
	t.Parallel()
	p := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		name                   string
		status                 ReservationStatus
		actUnits, actCost      *int64
		released               int64
		units, cost, remaining int64
		showsActual            bool
	}{
		{"fresh", ReservationActive, nil, nil, 0, 0, 0, 500, false},
		{"partially committed", ReservationActive, p(4), p(40), 40, 4, 40, 460, false},
		{"part past the reservation", ReservationActive, p(60), p(600), 500, 60, 600, 0, false},
		{"committed", ReservationCommitted, p(7), p(70), 460, 7, 70, 0, true},
		{"committed with 0 units", ReservationCommitted, p(0), p(0), 500, 0, 0, 0, true},
		{"released after a part", ReservationReleased, p(4), p(40), 460, 4, 40, 0, false},
		{"expired", ReservationExpired, nil, nil, 500, 0, 0, 0, false},
	} {
		r := Reservation{Status: tc.status, EstimatedCost: 500, ActualUnits: tc.actUnits, ActualCost: tc.actCost}
		r.Settle(tc.released)
		if r.SettledUnits != tc.units || r.SettledCost != tc.cost || r.RemainingCost != tc.remaining {
			t.Errorf("%s: settled %d/%d remaining %d, want %d/%d %d", tc.name, r.SettledUnits, r.SettledCost, r.RemainingCost,
				tc.units, tc.cost, tc.remaining)
		}
		if (r.ActualUnits != nil) != tc.showsActual || (r.ActualCost != nil) != tc.showsActual {
			t.Errorf("%s: actual units %v cost %v, shown want %v", tc.name, r.ActualUnits, r.ActualCost, tc.showsActual)
		}
	}
}

// TestCommitResultParts: a commit's actual units and cost are its own part
// (its usage), the settled figures the reservation's totals, and a partial commit
// returns nothing (released 0) though the stored reservation counts what it took.
func TestCommitResultParts(t *testing.T) {
	t.Parallel()
	p := func(v int64) *int64 { return &v }
	id := uuid.New()
	partial := Mutation{Usage: &MutationUsage{Units: 2, Cost: 20}, Reservation: &MutationReservation{ID: id,
		EstimatedCost: 50, ActualUnits: p(6), ActualCost: p(60), Released: 50, Status: ReservationActive}}
	out := commitResult(id, partial)
	if out.ActualUnits != 2 || out.ActualCost != 20 || out.Released != 0 || out.SettledUnits != 6 || out.SettledCost != 60 ||
		out.RemainingCost != 0 || out.Status != ReservationActive {
		t.Errorf("partial commit result %+v", out)
	}
	final := Mutation{Usage: &MutationUsage{Units: 1, Cost: 10}, Reservation: &MutationReservation{ID: id,
		EstimatedCost: 50, ActualUnits: p(7), ActualCost: p(70), Released: 0, Status: ReservationCommitted}}
	out = commitResult(id, final)
	if out.ActualUnits != 1 || out.ActualCost != 10 || out.SettledUnits != 7 || out.Status != ReservationCommitted {
		t.Errorf("final commit result %+v", out)
	}
	zero := Mutation{Reservation: &MutationReservation{ID: id, EstimatedCost: 50, ActualUnits: p(0), ActualCost: p(0),
		Released: 50, Status: ReservationCommitted}}
	if out = commitResult(id, zero); out.ActualUnits != 0 || out.Released != 50 {
		t.Errorf("commit of 0 units result %+v", out)
	}
}

// extendHot is reservationHot with an extend script that records its command.
type extendHot struct {
	*reservationHot
	got []ExtendCommand
}

func (h *extendHot) Extend(_ context.Context, cmd ExtendCommand) (MutationResult, error) {
	h.got = append(h.got, cmd)
	return h.settle(cmd.Customer, cmd.ReservationID, cmd.OpID, ReservationActive)
}

// TestExtendAndPartialRouting: a prolongation of a reservation the Redis index
// describes runs one extend script with the new expiry and no units, and
// reads nothing from Postgres; an extend or a partial commit of a
// multi-metric reservation, and an extend of a reservation Postgres shows finalized,
// are refused before any script runs.
func TestExtendAndPartialRouting(t *testing.T) {
	cases := []struct {
		name      string
		described bool
		items     bool
		pgStatus  ReservationStatus
		partial   bool
		wantErr   error
		wantRuns  int
	}{
		{name: "prolong from Redis", described: true, wantRuns: 1},
		{name: "extend a multi-metric reservation", described: true, items: true, wantErr: ErrPartialMulti},
		{name: "partial commit of a multi-metric reservation", described: true, items: true, partial: true, wantErr: ErrPartialMulti},
		{name: "extend a reservation Postgres shows committed", pgStatus: ReservationCommitted, wantErr: ErrReservationNotActive},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := &memDirectory{}
			now := time.Unix(1_000_000, 0)
			clock := fixedClock{now}
			customers := NewCustomers(dir, clock)
			key := CustomerKey{TenantID: uuid.New(), Environment: EnvironmentLive, CustomerID: uuid.New()}
			if err := dir.CreateCustomer(ctx, Customer{ID: key.CustomerID, TenantID: key.TenantID, Environment: key.Environment}); err != nil {
				t.Fatal(err)
			}
			id := uuid.New()
			pg := &postgresReservations{key: key, reservation: Reservation{ID: id, TenantID: key.TenantID, CustomerID: key.CustomerID,
				Environment: key.Environment, BillableMetricKey: "m", Status: tc.pgStatus}}
			credits := NewCredits(customers, versionBlocks{}, pg, clock, nil)
			ref := ReservationRef{Customer: key, Metric: "m"}
			if tc.items {
				ref = ReservationRef{Customer: key, Items: []ReservationItem{{BillableMetricKey: "m", EstimatedUnits: 1}, {BillableMetricKey: "n", EstimatedUnits: 1}}}
			}
			hot := &extendHot{reservationHot: &reservationHot{ref: ref, described: tc.described}}
			svc := NewReservations(ReservationsDeps{Entitlements: NewEntitlements(EntitlementsDeps{Customers: customers, Credits: credits, Hot: hot, Clock: clock}),
				Credits: credits, Customers: customers, Hot: hot, Reservations: pg, Clock: clock})
			scope, tenant := Scope{TenantID: key.TenantID, Environment: key.Environment}, Tenant{ID: key.TenantID}
			var err error
			if tc.partial {
				_, err = svc.Commit(ctx, scope, tenant, id, Idempotency{}, CommitReservation{ActualUnits: 1, Partial: true})
			} else {
				_, err = svc.Extend(ctx, scope, tenant, id, Idempotency{}, ExtendReservation{TTLSeconds: 60})
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if runs := int(hot.runs.Load()); runs != tc.wantRuns {
				t.Errorf("scripts run %d, want %d", runs, tc.wantRuns)
			}
			if tc.wantRuns > 0 {
				cmd := hot.got[0]
				if cmd.AdditionalUnits != 0 || !cmd.ExpiresAt.Equal(now.Add(time.Minute)) || cmd.ReservationID != id {
					t.Errorf("extend command %+v", cmd)
				}
				if reads := pg.reads.Load(); reads != 0 {
					t.Errorf("Postgres reads %d, want none", reads)
				}
			}
		})
	}
}
