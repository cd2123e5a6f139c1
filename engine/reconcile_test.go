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
// (invariant 1), whatever the store holds.
func TestCompareAccount(t *testing.T) {
	b1, b2 := uuid.New(), uuid.New()
	exp := int64(5000)
	blocks := []MutationBlock{{ID: b1, Original: 100, Remaining: 60, Priority: 1, StartsMS: 1, CreatedMS: 1, ExpiresMS: &exp},
		{ID: b2, Original: 50, Remaining: 50, StartsMS: 2, CreatedMS: 2}}
	pg := AccountState{CustomerID: uuid.New(), AccountID: "a", Version: 7, Reserved: 10, LifetimeEarned: 150, Blocks: blocks}
	same := StoredAccount{Present: true, AccountID: "a", Version: 7, Reserved: 10, LifetimeEarned: 150,
		Blocks: []MutationBlock{blocks[1], blocks[0]}}
	with := func(f func(s *StoredAccount)) StoredAccount {
		s := same
		s.Blocks = append([]MutationBlock(nil), same.Blocks...)
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
// acknowledged ones) and a Postgres off its own ledger; only what it
// reloaded counts as fixed, and the pass pages through every account.
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
	}{
		{"in step", 5, 60, 60, false, 0, 0},
		{"store behind", 4, 100, 60, true, 0, 1},
		{"same version, other state", 5, 59, 60, true, 1, 1},
		{"store ahead", 6, 50, 60, false, 0, 0},
		{"postgres off its ledger", 4, 100, 61, false, 0, 0},
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
			rep, err := Reconcile(context.Background(), f, f, ReconcileOptions{Fix: true, PageSize: 3})
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
			if rep.Checked != 8 || rep.Found != wantFound || rep.Fixed != wantFixed || f.fences != tc.wantFences ||
				f.reloads != tc.wantLoads {
				t.Fatalf("report %+v, %d fences, %d reloads; want %d found, %d fixed, %d fences, %d reloads",
					rep, f.fences, f.reloads, wantFound, wantFixed, tc.wantFences, tc.wantLoads)
			}
		})
	}
}
