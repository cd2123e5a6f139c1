package engine

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

// reservationHot is a MeteringStore whose reservation index describes one reservation (or,
// when !described, names its customer alone) and whose commit and release
// scripts answer with err (the first errRuns times), or a Mutation of the
// command.
type reservationHot struct {
	MeteringStore
	ref       ReservationRef
	described bool
	err       error
	errRuns   int32
	runs      atomic.Int32
}

func (h *reservationHot) ReservationRef(context.Context, uuid.UUID) (ReservationRef, bool, error) {
	ref := h.ref
	ref.Described = h.described
	return ref, true, nil
}

func (h *reservationHot) ReservationMetadata(context.Context, CustomerKey, uuid.UUID) (Metadata, bool, error) {
	return Metadata{"a": []byte(`1`)}, true, nil
}

func (h *reservationHot) settle(c CustomerKey, id uuid.UUID, op uuid.UUID, status ReservationStatus) (MutationResult, error) {
	if h.runs.Add(1) <= h.errRuns {
		return MutationResult{}, h.err
	}
	return MutationResult{Mutation: Mutation{OpID: op, TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
		Reservation: &MutationReservation{ID: id, Status: status, EstimatedUnits: 3, EstimatedCost: 30, Released: 30}}}, nil
}

func (h *reservationHot) Commit(_ context.Context, cmd CommitCommand) (MutationResult, error) {
	return h.settle(cmd.Customer, cmd.ReservationID, cmd.OpID, ReservationCommitted)
}

func (h *reservationHot) Release(_ context.Context, cmd ReleaseCommand) (MutationResult, error) {
	return h.settle(cmd.Customer, cmd.ReservationID, cmd.OpID, ReservationReleased)
}

// postgresReservations stands for Postgres: it counts every read of a reservation and of
// the persisted account version (the read-your-writes wait).
type postgresReservations struct {
	LedgerReader
	key         CustomerKey
	reservation Reservation
	reads       atomic.Int32
}

func (p *postgresReservations) GetReservation(context.Context, uuid.UUID, uuid.UUID) (Reservation, error) {
	p.reads.Add(1)
	return p.reservation, nil
}

func (p *postgresReservations) ListReservations(context.Context, CustomerKey, string, string, int) (Page[Reservation], error) {
	p.reads.Add(1)
	return Page[Reservation]{}, nil
}

func (p *postgresReservations) ReservationCustomer(context.Context, uuid.UUID, uuid.UUID) (CustomerKey, error) {
	p.reads.Add(1)
	return p.key, nil
}

// versionBlocks is the block store of these tests: an account at version 1
// (a settle from Redis reads no snapshot; one from Postgres may).
type versionBlocks struct{ BlockStore }

func (versionBlocks) Snapshot(context.Context, CustomerKey, time.Time) (Account, error) {
	return Account{Version: 1}, nil
}

// TestReservationsSettleFromRedis: a commit or release of a reservation the Redis index
// describes reads nothing from Postgres and waits for nothing; one the
// index names only by customer, or one Redis no longer holds (NOTFOUND,
// NOSTATE), goes to Postgres as before, and a reservation Postgres shows
// finalized is then the 409.
func TestReservationsSettleFromRedis(t *testing.T) {
	zero := int64(0)
	cases := []struct {
		name      string
		described bool
		hotErr    error
		errRuns   int32
		pgStatus  ReservationStatus
		release   bool
		wantErr   error
		wantPG    bool
	}{
		{name: "commit from Redis", described: true},
		{name: "release from Redis", described: true, release: true},
		{name: "older index record", pgStatus: ReservationActive, wantPG: true},
		{name: "Redis dropped the settled reservation", described: true, hotErr: ErrReservationNotFound, errRuns: 2,
			pgStatus: ReservationCommitted, wantErr: ErrReservationNotActive, wantPG: true},
		{name: "state not loaded", described: true, hotErr: ErrStateMissing, errRuns: 1, release: true,
			pgStatus: ReservationActive, wantPG: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := &memDirectory{}
			clock := fixedClock{time.Unix(1_000_000, 0)}
			customers := NewCustomers(dir, clock)
			key := CustomerKey{TenantID: uuid.New(), Environment: EnvironmentLive, CustomerID: uuid.New()}
			if err := dir.CreateCustomer(ctx, Customer{ID: key.CustomerID, TenantID: key.TenantID, Environment: key.Environment}); err != nil {
				t.Fatal(err)
			}
			id := uuid.New()
			pg := &postgresReservations{key: key, reservation: Reservation{ID: id, TenantID: key.TenantID, CustomerID: key.CustomerID,
				Environment: key.Environment, BillableMetricKey: "m", Status: tc.pgStatus}}
			credits := NewCredits(customers, versionBlocks{}, pg, clock, nil)
			hot := &reservationHot{ref: ReservationRef{Customer: key, Metric: "m"}, described: tc.described, err: tc.hotErr, errRuns: tc.errRuns}
			svc := NewReservations(ReservationsDeps{Entitlements: NewEntitlements(EntitlementsDeps{Customers: customers, Credits: credits, Hot: hot, Clock: clock}),
				Credits: credits, Customers: customers, Hot: hot, Reservations: pg, Clock: clock})
			scope := Scope{TenantID: key.TenantID, Environment: key.Environment}
			var status ReservationStatus
			var err error
			if tc.release {
				var r ReleaseResult
				r, err = svc.Release(ctx, scope, Tenant{ID: key.TenantID}, id, Idempotency{})
				status = r.Status
			} else {
				var r CommitResult
				r, err = svc.Commit(ctx, scope, Tenant{ID: key.TenantID}, id, Idempotency{}, CommitReservation{ActualUnits: zero})
				status = r.Status
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if err == nil && status == "" {
				t.Errorf("no status in the answer")
			}
			if reads := pg.reads.Load(); (reads > 0) != tc.wantPG {
				t.Errorf("Postgres reads %d, want any: %v", reads, tc.wantPG)
			}
		})
	}
}
