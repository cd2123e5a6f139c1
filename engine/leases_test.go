package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// fakeLeases answers each lease id with the error set for it and records
// the commands it ran.
type fakeLeases struct {
	errs  map[uuid.UUID]error
	calls []LeaseCommand
	due   []DueLease
}

func (f *fakeLeases) Lease(_ context.Context, cmd LeaseCommand) (MutationResult, error) {
	f.calls = append(f.calls, cmd)
	return MutationResult{}, f.errs[cmd.LeaseID]
}

func (f *fakeLeases) DueLeases(context.Context, time.Time, int) ([]DueLease, error) {
	return f.due, nil
}

func (f *fakeLeases) LeaseOf(context.Context, CustomerKey, uuid.UUID) (StoredLease, bool, error) {
	return StoredLease{}, false, nil
}

type fixedNow time.Time

func (c fixedNow) Now() time.Time { return time.Time(c) }

// TestLeaseSweeperOncePerGauge: one expire per gauge (the script lapses
// every due lease of it), refusals of leases no longer due are skipped
// quietly, and only written lapses count.
func TestLeaseSweeperOncePerGauge(t *testing.T) {
	c := CustomerKey{TenantID: uuid.New(), CustomerID: uuid.New(), Environment: EnvironmentLive}
	a, b, renewed, gone, broken := uuid.New(), uuid.New(), uuid.New(), uuid.New(), uuid.New()
	f := &fakeLeases{
		errs: map[uuid.UUID]error{renewed: ErrLeaseNotDue, gone: ErrLeaseNotFound, broken: errors.New("redis down")},
		due: []DueLease{{c, "seats", a}, {c, "seats", b}, {c, "jobs", renewed}, {c, "jobs", gone},
			{c, "gpus", broken}},
	}
	now := time.UnixMilli(1767225600000)
	s := &LeaseSweeper{Hot: f, Index: f, Clock: fixedNow(now), Log: zerolog.Nop()}
	if n := s.SweepOnce(context.Background()); n != 1 {
		t.Errorf("swept %d gauges, want 1", n)
	}
	var ids []uuid.UUID
	for _, cmd := range f.calls {
		if cmd.Action != LeaseExpire || !cmd.Now.Equal(now) || cmd.IdempotencyKey != "" {
			t.Errorf("command %+v", cmd)
		}
		ids = append(ids, cmd.LeaseID)
	}
	want := []uuid.UUID{a, renewed, gone, broken}
	if len(ids) != len(want) {
		t.Fatalf("expired %v, want %v", ids, want)
	}
	for i := range want {
		if ids[i] != want[i] {
			t.Errorf("call %d: lease %s, want %s", i, ids[i], want[i])
		}
	}
}

// TestLeaseSecondsBounds: 1..86400, anything else a 422 naming the field.
func TestLeaseSecondsBounds(t *testing.T) {
	for _, tc := range []struct {
		v  int64
		ok bool
	}{{0, false}, {1, true}, {86400, true}, {86401, false}, {-5, false}} {
		err := CheckLeaseSeconds(tc.v)
		if e, isErr := AsError(err); tc.ok != (err == nil) || (!tc.ok && (!isErr || e.Kind != KindValidation || e.Field != "lease_seconds")) {
			t.Errorf("lease_seconds %d: %v", tc.v, err)
		}
	}
}
