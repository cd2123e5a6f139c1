package engine

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestCompareAccount: every field a failover can roll back makes a
// difference of its own kind, in a fixed order; a store without the
// customer is no difference; and Postgres is always held to its ledger
// (invariant 1), whatever the store reservations.
func TestCompareAccount(t *testing.T) {
	b1, b2 := uuid.New(), uuid.New()
	exp := int64(5000)
	blocks := []MutationBlock{{ID: b1, Original: 100, Remaining: 60, Priority: 1, StartsMS: 1, CreatedMS: 1, ExpiresMS: &exp},
		{ID: b2, Original: 50, Remaining: 50, StartsMS: 2, CreatedMS: 2}}
	lease := StoredLease{Metric: "seats", MutationLease: MutationLease{ID: uuid.New(), Amount: 2, Status: LeaseActive, ExpiresMS: 9000}}
	pg := AccountState{CustomerID: uuid.New(), AccountID: "a", Version: 7, Reserved: 10, LifetimeEarned: 150, Blocks: blocks,
		Gauges: map[string]int64{"seats": 3, "jobs": 0}, Leases: []StoredLease{lease}}
	same := StoredAccount{Present: true, AccountID: "a", Version: 7, Reserved: 10, LifetimeEarned: 150,
		Blocks: []MutationBlock{blocks[1], blocks[0]}, Gauges: map[string]int64{"seats": 3}, Leases: []StoredLease{lease}}
	with := func(f func(s *StoredAccount)) StoredAccount {
		s := same
		s.Blocks = append([]MutationBlock(nil), same.Blocks...)
		s.Gauges = map[string]int64{"seats": 3}
		s.Leases = append([]StoredLease(nil), same.Leases...)
		f(&s)
		return s
	}
	later := int64(6000)
	for _, tc := range []struct {
		name   string
		stored StoredAccount
		ledger int64
		want   string
	}{
		{"equal, blocks in another order", same, 110, "[]"},
		{"not in the store", StoredAccount{}, 110, "[]"},
		{"not in the store, postgres off its ledger", StoredAccount{}, 111, "[ledger]"},
		{"older version", with(func(s *StoredAccount) { s.Version = 6 }), 110, "[version]"},
		{"rolled back", with(func(s *StoredAccount) { s.Version, s.Blocks[1].Remaining, s.LifetimeEarned = 6, 100, 100 }), 110,
			"[version blocks lifetime_earned]"},
		{"block amount", with(func(s *StoredAccount) { s.Blocks[0].Remaining = 49 }), 110, "[blocks]"},
		{"block missing", with(func(s *StoredAccount) { s.Blocks = s.Blocks[:1] }), 110, "[blocks]"},
		{"emptied block kept", with(func(s *StoredAccount) { s.Blocks = append(s.Blocks, MutationBlock{ID: uuid.New()}) }), 110, "[]"},
		{"block expiry", with(func(s *StoredAccount) { s.Blocks[1].ExpiresMS = &later }), 110, "[blocks]"},
		{"block without expiry", with(func(s *StoredAccount) { s.Blocks[1].ExpiresMS = nil }), 110, "[blocks]"},
		{"reserved", with(func(s *StoredAccount) { s.Reserved = 0 }), 110, "[reserved]"},
		{"account id", with(func(s *StoredAccount) { s.AccountID = "" }), 110, "[account_id]"},
		// Issue 31 item 5: gauges and leases, which repair restores, are
		// compared too (a gauge at 0 and an absent one agree).
		{"gauge counter", with(func(s *StoredAccount) { s.Gauges["seats"] = 2 }), 110, "[gauges]"},
		{"gauge only in the store", with(func(s *StoredAccount) { s.Gauges["jobs"] = 1 }), 110, "[gauges]"},
		{"gauge at zero in the store only", with(func(s *StoredAccount) { s.Gauges["idle"] = 0 }), 110, "[]"},
		{"lease missing", with(func(s *StoredAccount) { s.Leases = nil }), 110, "[leases]"},
		{"lease expiry", with(func(s *StoredAccount) { s.Leases[0].ExpiresMS = 9500 }), 110, "[leases]"},
		{"lease amount and counter", with(func(s *StoredAccount) { s.Leases[0].Amount, s.Gauges["seats"] = 1, 2 }), 110, "[gauges leases]"},
		{"postgres off its ledger", same, 109, "[ledger]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, ok := CompareAccount(pg, tc.stored, tc.ledger)
			if got := fmt.Sprint(d.Kinds); got != tc.want || ok != (tc.want == "[]") {
				t.Fatalf("kinds %s (agree %v), want %s", got, ok, tc.want)
			}
		})
	}
}

// fakeReconcile is a ReconcileSource and ReconcileStore over maps, counting
// reloads and fences.
type fakeReconcile struct {
	pg      map[uuid.UUID]AccountState
	ledger  map[uuid.UUID]int64
	store   map[uuid.UUID]StoredAccount
	fences  int
	reloads int
}

func (f *fakeReconcile) AccountStates(_ context.Context, after uuid.UUID, limit int, _ time.Time) ([]AccountState, error) {
	var out []AccountState
	for _, st := range f.pg {
		if st.CustomerID.String() > after.String() {
			out = append(out, st)
		}
	}
	sortStates(out)
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func sortStates(s []AccountState) {
	sort.Slice(s, func(i, j int) bool { return s[i].CustomerID.String() < s[j].CustomerID.String() })
}

func (f *fakeReconcile) AccountState(_ context.Context, c CustomerKey, _ time.Time) (AccountState, bool, error) {
	st, ok := f.pg[c.CustomerID]
	return st, ok, nil
}

func (f *fakeReconcile) LedgerSums(_ context.Context, ids []uuid.UUID) (map[uuid.UUID]int64, error) {
	out := map[uuid.UUID]int64{}
	for _, id := range ids {
		out[id] = f.ledger[id]
	}
	return out, nil
}

func (f *fakeReconcile) FenceFork(_ context.Context, c CustomerKey, storeVersion int64) (int64, bool, error) {
	f.fences++
	st := f.pg[c.CustomerID]
	st.Version = max(st.Version, storeVersion) + 1001
	f.pg[c.CustomerID] = st
	return st.Version - 1, true, nil
}

func (f *fakeReconcile) StoredAccounts(_ context.Context, ids []uuid.UUID) ([]StoredAccount, error) {
	out := make([]StoredAccount, len(ids))
	for i, id := range ids {
		out[i] = f.store[id]
	}
	return out, nil
}

func (f *fakeReconcile) Reload(_ context.Context, st AccountState, expect int64) (bool, error) {
	cur, ok := f.store[st.CustomerID]
	if (ok && cur.Present && cur.Version != expect) || (!cur.Present && expect != -1) {
		return false, nil
	}
	f.reloads++
	f.store[st.CustomerID] = StoredAccount{Present: true, AccountID: st.AccountID, Version: st.Version,
		Reserved: st.Reserved, LifetimeEarned: st.LifetimeEarned, Blocks: st.Blocks}
	return true, nil
}

// TestReconcileFixDecisions: --fix reloads a store that fell behind, fences
// then reloads one at Postgres' version with other state, and leaves alone
// a store ahead of Postgres (its ops are on their way: a reload could drop
// acknowledged ones) unless the outbox is drained (then it fences above the
// store's version and reloads), and a Postgres off its own ledger; only
// what it reloaded counts as fixed, the rest count as equal, and the pass
// pages through every account.
func TestReconcileFixDecisions(t *testing.T) {
	blk := func(rem int64) []MutationBlock {
		return []MutationBlock{{ID: uuid.MustParse("00000000-0000-0000-0000-0000000000b1"), Original: 100, Remaining: rem}}
	}
	for _, tc := range []struct {
		name                  string
		storeVersion          int64
		storeRemaining        int64
		ledger                int64
		wantFixed             bool
		wantFences, wantLoads int
		// drained is the outbox check's answer (nil: no check).
		drained *bool
	}{
		{"in step", 5, 60, 60, false, 0, 0, nil},
		{"store behind", 4, 100, 60, true, 0, 1, nil},
		{"same version, other state", 5, 59, 60, true, 1, 1, nil},
		{"store ahead", 6, 50, 60, false, 0, 0, nil},
		{"store ahead, outbox not empty", 6, 50, 60, false, 0, 0, new(false)},
		{"store ahead, outbox drained", 6, 50, 60, true, 1, 1, new(true)},
		{"postgres off its ledger", 4, 100, 61, false, 0, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeReconcile{pg: map[uuid.UUID]AccountState{}, ledger: map[uuid.UUID]int64{}, store: map[uuid.UUID]StoredAccount{}}
			// Clean neighbours on several pages.
			for i := 0; i < 7; i++ {
				id := uuid.New()
				f.pg[id] = AccountState{CustomerID: id, Version: 3, Blocks: blk(60)}
				f.ledger[id] = 60
				f.store[id] = StoredAccount{Present: true, Version: 3, Blocks: blk(60)}
			}
			id := uuid.New()
			f.pg[id] = AccountState{CustomerID: id, Version: 5, Blocks: blk(60)}
			f.ledger[id] = tc.ledger
			f.store[id] = StoredAccount{Present: true, Version: tc.storeVersion, Blocks: blk(tc.storeRemaining)}
			opts := ReconcileOptions{Fix: true, PageSize: 3}
			if tc.drained != nil {
				opts.Drained = func(context.Context) (bool, error) { return *tc.drained, nil }
			}
			rep, err := Reconcile(context.Background(), f, f, opts)
			if err != nil {
				t.Fatal(err)
			}
			wantFound := int64(1)
			if tc.name == "in step" {
				wantFound = 0
			}
			wantFixed := int64(0)
			if tc.wantFixed {
				wantFixed = 1
			}
			if rep.Checked != 8 || rep.Equal != 8-wantFound || rep.Found != wantFound || rep.Fixed != wantFixed || f.fences != tc.wantFences ||
				f.reloads != tc.wantLoads {
				t.Fatalf("report %+v, %d fences, %d reloads; want %d found, %d fixed, %d fences, %d reloads",
					rep, f.fences, f.reloads, wantFound, wantFixed, tc.wantFences, tc.wantLoads)
			}
		})
	}
}

// TestFieldDifferences: each figure that differs is listed once with both
// values; balance and pending are judged at the instant given (a block not
// started yet is pending, an expired one neither), and a block one side
// lacks is "absent" there.
func TestFieldDifferences(t *testing.T) {
	b1, b2 := uuid.MustParse("00000000-0000-0000-0000-0000000000b1"), uuid.MustParse("00000000-0000-0000-0000-0000000000b2")
	past, later := int64(500), int64(5000)
	pg := AccountState{Version: 3, Reserved: 5, LifetimeEarned: 200, AccountID: "a", Blocks: []MutationBlock{
		{ID: b1, Original: 100, Remaining: 60, StartsMS: 0, CreatedMS: 0},
		{ID: b2, Original: 100, Remaining: 100, StartsMS: 2000, CreatedMS: 0, ExpiresMS: &later}}}
	stored := func(f func(s *StoredAccount)) StoredAccount {
		s := StoredAccount{Present: true, Version: 3, Reserved: 5, LifetimeEarned: 200, AccountID: "a",
			Blocks: append([]MutationBlock(nil), pg.Blocks...)}
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name   string
		stored StoredAccount
		ledger int64
		want   string
	}{
		{"equal", stored(func(*StoredAccount) {}), 160, "[]"},
		{"not in the store", StoredAccount{}, 160, "[]"},
		{"amount", stored(func(s *StoredAccount) { s.Blocks[0].Remaining = 61 }), 160,
			"[{balance 61 60} {block " + b1.String() + " remaining 61 60}]"},
		{"pending amount", stored(func(s *StoredAccount) { s.Blocks[1].Remaining = 90 }), 160,
			"[{pending 90 100} {block " + b2.String() + " remaining 90 100}]"},
		{"block missing", stored(func(s *StoredAccount) { s.Blocks = s.Blocks[:1] }), 160,
			"[{pending 0 100} {block " + b2.String() + " absent remaining 100}]"},
		{"expired in the store", stored(func(s *StoredAccount) { s.Blocks[0].ExpiresMS = &past }), 160,
			"[{balance 0 60} {block " + b1.String() + " expires_ms 500 none}]"},
		{"version and reserved", stored(func(s *StoredAccount) { s.Version, s.Reserved = 4, 0 }), 160,
			"[{version 4 3} {reserved 0 5}]"},
		{"postgres off its ledger", stored(func(*StoredAccount) {}), 150, "[{ledger_sum - 150 (its blocks hold 160)}]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fmt.Sprint(FieldDifferences(pg, tc.stored, tc.ledger, 1000)); got != tc.want {
				t.Fatalf("fields %s, want %s", got, tc.want)
			}
		})
	}
}

// fakeSample is a ReconcileSampleSource over a fakeReconcile: the sample
// is every account.
type fakeSample struct{ *fakeReconcile }

func (f fakeSample) SampleStates(ctx context.Context, n int) ([]AccountState, error) {
	return f.AccountStates(ctx, uuid.Nil, n, time.Time{})
}

func (f fakeSample) ReconcileStates(ctx context.Context, _ ReconcileScope, after uuid.UUID, limit int) ([]AccountState, error) {
	return f.AccountStates(ctx, after, limit, time.Time{})
}

// TestReconcileSampler: a sample counts the customers it compared and the
// mismatches; a customer Redis lacks is skipped, one Redis holds ahead of
// Postgres is skipped while the outbox holds entries (a write in flight)
// and counted as a mismatch once it is empty; nothing is ever reloaded.
func TestReconcileSampler(t *testing.T) {
	blk := []MutationBlock{{ID: uuid.New(), Original: 100, Remaining: 60}}
	for _, tc := range []struct {
		name                                   string
		drained                                bool
		wantChecked, wantMismatches, wantSkips int64
	}{
		{"outbox not empty", false, 2, 1, 2},
		{"outbox drained", true, 3, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeReconcile{pg: map[uuid.UUID]AccountState{}, ledger: map[uuid.UUID]int64{}, store: map[uuid.UUID]StoredAccount{}}
			add := func(pgVersion int64, s StoredAccount) {
				id := uuid.New()
				f.pg[id] = AccountState{CustomerID: id, Version: pgVersion, Blocks: blk}
				f.store[id] = s
			}
			add(3, StoredAccount{Present: true, Version: 3, Blocks: blk})                                                           // equal
			add(3, StoredAccount{Present: true, Version: 3, Blocks: []MutationBlock{{ID: blk[0].ID, Original: 100, Remaining: 1}}}) // amount
			add(3, StoredAccount{Present: true, Version: 4, Blocks: blk})                                                           // ahead
			add(3, StoredAccount{})                                                                                                 // not loaded
			s := &ReconcileSampler{Source: fakeSample{f}, Store: f, Size: 10,
				Drained: func(context.Context) (bool, error) { return tc.drained, nil }}
			diffs, err := s.SampleOnce(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			st := s.Stats()
			if st.Checked != tc.wantChecked || st.Mismatches != tc.wantMismatches || st.Skipped != tc.wantSkips ||
				st.LastMismatches != tc.wantMismatches || int64(len(diffs)) != tc.wantMismatches || f.reloads != 0 || f.fences != 0 {
				t.Fatalf("stats %+v, %d diffs, %d reloads; want checked %d, mismatches %d, skipped %d, no reload",
					st, len(diffs), f.reloads, tc.wantChecked, tc.wantMismatches, tc.wantSkips)
			}
		})
	}
}
