package lua

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

func extendCmd(c engine.CustomerKey, id uuid.UUID, units int64, terms engine.RuleTerms, expires, now time.Time) engine.ExtendCommand {
	return engine.ExtendCommand{CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: now}, ReservationID: id,
		AdditionalUnits: units, Terms: terms, ExpiresAt: expires}
}

func partialCmd(c engine.CustomerKey, id uuid.UUID, units int64, terms engine.RuleTerms, now time.Time) engine.CommitCommand {
	cc := commitCmd(c, id, units, terms, now)
	cc.Partial = true
	return cc
}

// ledgerSum is the sum of the deltas of every entry c's outbox holds: with
// the grants funded wrote, the balance the ledger says c has (invariant 1).
func (b bundle) ledgerSum(t *testing.T, c engine.CustomerKey) int64 {
	t.Helper()
	var sum int64
	for _, m := range b.outbox(t, c) {
		if m.CustomerID != c.CustomerID {
			continue
		}
		for _, e := range m.Entries {
			sum += e.Delta
		}
	}
	return sum
}

// TestPartialCommitThenCommit: a partial commit charges its units like a
// commit (one consumption entry, usage with the reservation, kind commit)
// and keeps the reservation active with what it still holds less their cost; a
// part costing more than the reservation takes the rest from the free balance;
// the final commit's units are its own part, the reservation's actual units the
// total, and the books balance after each step (invariant 1). A replay
// answers the first result (invariant 4).
func TestPartialCommitThenCommit(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		rc := reserveCmd(c, 5, perUnitTerms(10), 30*time.Minute, t0)
		b.reserve(t, rc)

		pc := partialCmd(c, rc.ReservationID, 2, perUnitTerms(10), t0.Add(time.Minute))
		pc.IdempotencyKey, pc.RequestHash = "part-1", "rh"
		res, err := b.store.Commit(ctx, pc)
		if err != nil {
			t.Fatalf("partial commit: %v", err)
		}
		m, r := res.Mutation, res.Mutation.Reservation
		if m.Kind != engine.MutationCommit || r.Status != engine.ReservationActive || *r.ActualUnits != 2 || *r.ActualCost != 20 ||
			r.Released != 20 || r.EstimatedCost != 50 || r.CommittedMS != nil {
			t.Errorf("partial commit res %+v", r)
		}
		if m.Account.Balance != 80 || m.Account.Reserved != 30 {
			t.Errorf("partial commit account %+v", m.Account)
		}
		if u := m.Usage; u == nil || u.Units != 2 || u.Cost != 20 || u.Charged != 20 || u.ReservationID == nil || *u.ReservationID != rc.ReservationID {
			t.Errorf("partial commit usage %+v", m.Usage)
		}
		if len(m.Entries) != 1 || m.Entries[0].Type != engine.EntryConsumption || m.Entries[0].Delta != -20 || *m.Entries[0].Units != 2 {
			t.Errorf("partial commit entries %+v", m.Entries)
		}
		if rr, err := b.store.Commit(ctx, pc); err != nil || !rr.Replayed || rr.Mutation.OpID != pc.OpID || rr.Mutation.Account.Balance != 80 {
			t.Errorf("partial commit replay: %v %+v", err, rr)
		}
		if a := b.snapshot(t, c, t0.Add(time.Minute)); a.Balance != 80 || a.ReservedBalance != 30 || a.EffectiveBalance != 50 {
			t.Errorf("after partial commit %+v", a)
		}
		// Still due at its expiry: the sweep returns what is left.
		if due, _ := b.store.DueReservations(ctx, Partition(c.CustomerID), rc.ExpiresAt, 10); len(due) != 1 {
			t.Errorf("due after partial commit: %v", due)
		}

		// 4 units cost 40, more than the 30 held: the reservation is used up and 10
		// comes from the free balance; it stays active.
		res, err = b.store.Commit(ctx, partialCmd(c, rc.ReservationID, 4, perUnitTerms(10), t0.Add(2*time.Minute)))
		if err != nil {
			t.Fatalf("second partial commit: %v", err)
		}
		m, r = res.Mutation, res.Mutation.Reservation
		if r.Status != engine.ReservationActive || *r.ActualUnits != 6 || *r.ActualCost != 60 || r.Released != 50 ||
			m.Account.Balance != 40 || m.Account.Reserved != 0 {
			t.Errorf("second partial commit res %+v account %+v", r, m.Account)
		}

		res, err = b.store.Commit(ctx, commitCmd(c, rc.ReservationID, 1, perUnitTerms(10), t0.Add(3*time.Minute)))
		if err != nil {
			t.Fatalf("final commit: %v", err)
		}
		m, r = res.Mutation, res.Mutation.Reservation
		if r.Status != engine.ReservationCommitted || *r.ActualUnits != 7 || *r.ActualCost != 70 || r.Released != 0 ||
			m.Account.Balance != 30 || m.Account.Reserved != 0 || m.Usage.Units != 1 || m.Usage.Cost != 10 {
			t.Errorf("final commit res %+v account %+v usage %+v", r, m.Account, m.Usage)
		}
		if sum := b.ledgerSum(t, c); sum != m.Account.Balance {
			t.Errorf("ledger sum %d, balance %d", sum, m.Account.Balance)
		}
		if _, err := b.store.Commit(ctx, partialCmd(c, rc.ReservationID, 1, perUnitTerms(10), t0.Add(4*time.Minute))); !errors.Is(err, engine.ErrReservationNotActive) {
			t.Errorf("partial commit of a committed reservation: %v", err)
		}
	})
}

// TestPartialCommitThenRelease: a release after a partial commit returns
// only what the reservation still holds; the settled part stays charged.
func TestPartialCommitThenRelease(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		rc := reserveCmd(c, 5, perUnitTerms(10), 30*time.Minute, t0)
		b.reserve(t, rc)
		if _, err := b.store.Commit(ctx, partialCmd(c, rc.ReservationID, 2, perUnitTerms(10), t0)); err != nil {
			t.Fatal(err)
		}
		res, err := b.store.Release(ctx, releaseCmd(c, rc.ReservationID, false, t0.Add(time.Minute)))
		if err != nil {
			t.Fatal(err)
		}
		m, r := res.Mutation, res.Mutation.Reservation
		if r.Status != engine.ReservationReleased || r.Released != 30 || *r.ActualUnits != 2 || m.Account.Balance != 80 || m.Account.Reserved != 0 {
			t.Errorf("release after partial commit res %+v account %+v", r, m.Account)
		}
		if a := b.snapshot(t, c, t0.Add(time.Minute)); a.EffectiveBalance != 80 || a.ReservedBalance != 0 {
			t.Errorf("after release %+v", a)
		}
		if sum := b.ledgerSum(t, c); sum != 80 {
			t.Errorf("ledger sum %d, want 80", sum)
		}
	})
}

// TestPartialCommitRefusals: under block a part past the reservation plus the
// free balance is refused and changes nothing but the outbox; a partial
// commit of 0 units is the script's BADARG (the API's 422 is engine's,
// guards_test.go) and changes nothing.
func TestPartialCommitRefusals(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		rc := reserveCmd(c, 3, perUnitTerms(10), 30*time.Minute, t0)
		b.reserve(t, rc)
		before := b.reservationDump(t, c)
		pc := partialCmd(c, rc.ReservationID, 11, perUnitTerms(10), t0)
		pc.Context.Policy = engine.OveragePolicyBlock
		if _, err := b.store.Commit(ctx, pc); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Errorf("partial commit past reservation and free balance: %v", err)
		}
		if _, err := b.store.Commit(ctx, partialCmd(c, rc.ReservationID, 0, perUnitTerms(10), t0)); !isBadArg(err) {
			t.Errorf("partial commit of 0 units: %v, want BADARG", err)
		}
		if after := b.reservationDump(t, c); withoutOutbox(after) != withoutOutbox(before) {
			t.Errorf("refusals changed state:\n%s\n->\n%s", before, after)
		}
	})
}

// TestExtendTopsUpAndProlongs: an extend raises the reservation and the reserved
// balance by the additional units' cost, refuses (changing nothing but the
// outbox) when the effective balance cannot cover it, moves the expiry and
// the sweep's schedule later, never earlier, and answers a replay with its
// first result.
func TestExtendTopsUpAndProlongs(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		p := Partition(c.CustomerID)
		rc := reserveCmd(c, 3, perUnitTerms(10), 30*time.Minute, t0)
		b.reserve(t, rc)

		ec := extendCmd(c, rc.ReservationID, 7, perUnitTerms(10), time.Time{}, t0.Add(time.Minute))
		ec.IdempotencyKey, ec.RequestHash = "ext-1", "rh"
		res, err := b.store.Extend(ctx, ec)
		if err != nil {
			t.Fatalf("extend: %v", err)
		}
		m, r := res.Mutation, res.Mutation.Reservation
		if m.Kind != engine.MutationReserve || r.Status != engine.ReservationActive || r.EstimatedUnits != 10 || r.EstimatedCost != 100 ||
			r.ExpiresMS != rc.ExpiresAt.UnixMilli() || m.Account.Reserved != 100 || m.Account.Balance != 100 {
			t.Errorf("extend res %+v account %+v", r, m.Account)
		}
		if len(m.Entries) != 1 || m.Entries[0].Type != engine.EntryReservation || m.Entries[0].Delta != 0 || *m.Entries[0].Ref != rc.ReservationID {
			t.Errorf("extend entries %+v", m.Entries)
		}
		if rr, err := b.store.Extend(ctx, ec); err != nil || !rr.Replayed || rr.Mutation.OpID != ec.OpID {
			t.Errorf("extend replay: %v %+v", err, rr)
		}

		before := b.reservationDump(t, c)
		short := extendCmd(c, rc.ReservationID, 1, perUnitTerms(10), time.Time{}, t0.Add(time.Minute))
		short.Context.Policy = engine.OveragePolicyBlock
		if _, err := b.store.Extend(ctx, short); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Errorf("extend past the effective balance: %v", err)
		}
		if _, err := b.store.Extend(ctx, extendCmd(c, rc.ReservationID, 0, perUnitTerms(10), rc.ExpiresAt.Add(-time.Second), t0.Add(time.Minute))); !errors.Is(err, engine.ErrReservationShorter) {
			t.Errorf("extend to an earlier expiry: %v", err)
		}
		if after := b.reservationDump(t, c); withoutOutbox(after) != withoutOutbox(before) {
			t.Errorf("refusals changed state:\n%s\n->\n%s", before, after)
		}

		later := rc.ExpiresAt.Add(time.Hour)
		res, err = b.store.Extend(ctx, extendCmd(c, rc.ReservationID, 0, engine.RuleTerms{}, later, t0.Add(2*time.Minute)))
		if err != nil {
			t.Fatalf("prolong: %v", err)
		}
		if r := res.Mutation.Reservation; r.ExpiresMS != later.UnixMilli() || r.EstimatedCost != 100 || res.Mutation.Account.Reserved != 100 {
			t.Errorf("prolong res %+v", r)
		}
		if due, _ := b.store.DueReservations(ctx, p, rc.ExpiresAt, 10); len(due) != 0 {
			t.Errorf("due at the old expiry: %v", due)
		}
		if due, _ := b.store.DueReservations(ctx, p, later, 10); len(due) != 1 {
			t.Errorf("due at the new expiry: %v", due)
		}
		// A commit at the old expiry still settles: the reservation is not expired.
		res, err = b.store.Commit(ctx, commitCmd(c, rc.ReservationID, 9, perUnitTerms(10), rc.ExpiresAt.Add(time.Minute)))
		if err != nil {
			t.Fatalf("commit after the old expiry: %v", err)
		}
		if a := res.Mutation.Account; a.Balance != 10 || a.Reserved != 0 {
			t.Errorf("commit after extend account %+v", a)
		}
		if _, err := b.store.Extend(ctx, extendCmd(c, rc.ReservationID, 1, perUnitTerms(1), time.Time{}, t0.Add(3*time.Minute))); !errors.Is(err, engine.ErrReservationNotActive) {
			t.Errorf("extend of a committed reservation: %v", err)
		}
	})
}

// TestExtendAfterExpiry: a reservation past its expires_at (not yet swept)
// cannot be extended, as it cannot be committed.
func TestExtendAfterExpiry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		c, _ := b.funded(t)
		rc := reserveCmd(c, 1, perUnitTerms(10), time.Minute, t0)
		b.reserve(t, rc)
		_, err := b.store.Extend(context.Background(), extendCmd(c, rc.ReservationID, 1, perUnitTerms(10), time.Time{}, rc.ExpiresAt))
		if !errors.Is(err, engine.ErrReservationExpired) {
			t.Errorf("extend at expires_at: %v", err)
		}
	})
}

// TestLoadRestoresPartiallyCommittedReservation: a reservation loaded from Postgres as a
// partial commit left it (act units and cost settled, released the part
// taken) holds only the rest: its final commit returns that rest and
// totals every part (invariant 5).
func TestLoadRestoresPartiallyCommittedReservation(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		c := newCustomer()
		id := uuid.New()
		st := engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
			AccountID: "acct", Version: 9, Reserved: 30, LifetimeEarned: 100, UpdatedAtMS: t0.UnixMilli() - 1,
			Blocks: []engine.MutationBlock{{ID: uuid.New(), Original: 100, Remaining: 80, Source: engine.SourceManual,
				StartsMS: t0.UnixMilli() - 10, CreatedMS: t0.UnixMilli() - 10}},
			Reservations: []engine.MutationReservation{{ID: id, Metric: "gpu", EstimatedUnits: 5, EstimatedCost: 50,
				ActualUnits: ptr[int64](2), ActualCost: ptr[int64](20), Released: 20, Status: engine.ReservationActive,
				ExpiresMS: t0.Add(time.Hour).UnixMilli(), CreatedMS: t0.UnixMilli() - 5}},
		}
		b.load(t, st)
		if a := b.snapshot(t, c, t0); a.Balance != 80 || a.ReservedBalance != 30 || a.EffectiveBalance != 50 {
			t.Errorf("loaded account %+v", a)
		}
		res, err := b.store.Commit(context.Background(), commitCmd(c, id, 1, perUnitTerms(10), t0))
		if err != nil {
			t.Fatal(err)
		}
		m, r := res.Mutation, res.Mutation.Reservation
		if r.Released != 30 || *r.ActualUnits != 3 || *r.ActualCost != 30 || m.Account.Reserved != 0 || m.Account.Balance != 70 {
			t.Errorf("final commit after load res %+v account %+v", r, m.Account)
		}
	})
}
