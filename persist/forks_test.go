package persist

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestForkCheck protects invariant 1 in Postgres across a failover (issue
// 11, credit_fork_check): on an account stored at version 3 from op S
// (outbox entry at ms 1000), Apply refuses with SQLSTATE 23F01, writing
// nothing, an op of a second history (same version from another op; a
// lower version appended later; a version under a fence) and accepts a
// replay, a late delivery of an older op (its entries stored, the state
// left as it is), an op whose entry is unknown, a refusal record and the
// next version.
func TestForkCheck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, tc := range []struct {
		name string
		// fence sets the account's fence at this version first (0: none).
		fence int64
		// make builds the Mutation applied after the stored three.
		make    func(a *account, stored engine.Mutation) engine.Mutation
		refused bool
		// wantVersion is the account version after the Apply.
		wantVersion int64
	}{
		{name: "replay of the stored op", make: func(_ *account, s engine.Mutation) engine.Mutation { return s },
			wantVersion: 3},
		{name: "next version", make: func(a *account, _ engine.Mutation) engine.Mutation {
			m := a.grant("next", 5, nil)
			m.OutboxMS = 2000
			return m
		}, wantVersion: 4},
		{name: "same version, other op", refused: true, wantVersion: 3, make: func(a *account, _ engine.Mutation) engine.Mutation {
			a.version = 2
			m := a.grant("forked", 5, nil)
			m.OutboxMS = 2000
			return m
		}},
		{name: "lower version appended later", refused: true, wantVersion: 3, make: func(a *account, _ engine.Mutation) engine.Mutation {
			a.version = 1
			m := a.grant("forked-low", 5, nil)
			m.OutboxMS = 2000
			return m
		}},
		{name: "lower version appended earlier (late delivery)", wantVersion: 3, make: func(a *account, _ engine.Mutation) engine.Mutation {
			a.version = 1
			m := a.grant("late", 5, nil)
			m.OutboxMS = 999
			return m
		}},
		{name: "lower version, entry unknown (replayed by hand)", wantVersion: 3, make: func(a *account, _ engine.Mutation) engine.Mutation {
			a.version = 1
			return a.grant("by-hand", 5, nil)
		}},
		{name: "refusal record at the stored version", wantVersion: 3, make: func(a *account, _ engine.Mutation) engine.Mutation {
			a.version = 2
			m := a.mutation(engine.MutationConsume, "", nil)
			m.Usage = &engine.MutationUsage{Metric: "m", Units: 1, Cost: 1, Refused: true}
			m.OutboxMS = 2000
			return m
		}},
		{name: "under a fence", fence: 1003, refused: true, wantVersion: 1004, make: func(a *account, _ engine.Mutation) engine.Mutation {
			a.version = 4
			m := a.grant("fenced", 5, nil)
			m.OutboxMS = 2000
			return m
		}},
		{name: "replay under a fence", fence: 1003, wantVersion: 1004, make: func(_ *account, s engine.Mutation) engine.Mutation {
			return s
		}},
		{name: "past a fence", fence: 1003, wantVersion: 1005, make: func(a *account, _ engine.Mutation) engine.Mutation {
			a.version = 1004
			m := a.grant("past", 5, nil)
			m.OutboxMS = 2000
			return m
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAccount(live, now)
			ms := []engine.Mutation{a.grant("g1", 100, nil), a.grant("g2", 10, nil), a.grant("g3", 1, nil)}
			for i := range ms {
				ms[i].OutboxMS = int64(998 + i)
			}
			if err := b.store.Apply(b.ctx, ms); err != nil {
				t.Fatal(err)
			}
			stored := ms[2]
			if tc.fence > 0 {
				if _, ok, err := b.store.FenceFork(b.ctx, a.key, tc.fence-forkFenceMargin); err != nil || !ok {
					t.Fatalf("fence: %v %v", ok, err)
				}
			}
			var before int64
			if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM ledger_entries WHERE customer_id = $1`, a.key.CustomerID).Scan(&before); err != nil {
				t.Fatal(err)
			}
			m := tc.make(a, stored)
			err := b.store.Apply(b.ctx, []engine.Mutation{m})
			if got := sqlState(err) == forkRefused; got != tc.refused || (!tc.refused && err != nil) {
				t.Fatalf("Apply: %v; want refused %v", err, tc.refused)
			}
			var after int64
			if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM ledger_entries WHERE customer_id = $1`, a.key.CustomerID).Scan(&after); err != nil {
				t.Fatal(err)
			}
			if tc.refused && after != before {
				t.Fatalf("a refused op wrote %d ledger entries", after-before)
			}
			if v, _ := b.accountRow(t, a.key.CustomerID); v != tc.wantVersion {
				t.Fatalf("account version %d, want %d", v, tc.wantVersion)
			}
		})
	}
}

// TestRefusalOwnsNoVersion (issue 25): a refusal record carries the
// version of the op before it and never writes the account, so when it
// reaches Postgres first (the order two nodes used to commit them in), the
// acknowledged op at that version is stored, not refused as a fork.
func TestRefusalOwnsNoVersion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	g := a.grant("g", 50, nil)
	g.OutboxMS = 1000
	var block uuid.UUID
	for id := range a.blocks {
		block = id
	}
	c := a.consume("c", block, 50, "m", 0)
	c.OutboxMS = 1001
	refusal := c
	refusal.OpID, refusal.IdempotencyKey, refusal.RequestHash, refusal.Entries, refusal.Blocks = uuid.New(), "", "", nil, nil
	refusal.Usage = &engine.MutationUsage{Metric: "m", Units: 1, Cost: 10, Refused: true}
	refusal.OutboxMS = 1002
	for _, ms := range [][]engine.Mutation{{g}, {refusal}, {c}} {
		if err := b.store.Apply(b.ctx, ms); err != nil {
			t.Fatalf("Apply %s: %v", ms[0].OpID, err)
		}
	}
	if v, bal := b.accountRow(t, a.key.CustomerID); v != 2 || bal != 0 {
		t.Fatalf("account at version %d, balance %d; want 2, 0", v, bal)
	}
	var op uuid.UUID
	if err := b.pool.QueryRow(b.ctx, `SELECT op_id FROM credit_accounts WHERE customer_id = $1`, a.key.CustomerID).Scan(&op); err != nil {
		t.Fatal(err)
	}
	if op != c.OpID {
		t.Fatalf("version 2 owned by op %s, want the consume %s", op, c.OpID)
	}
	if n := b.count(t, "ledger_entries"); n < 2 {
		t.Fatalf("%d ledger entries, want the grant's and the consume's", n)
	}
}

// TestOutboxFence (issue 25, migration 022): a transaction of outbox
// entries that comes with an older lease of their partition than one a
// commit already came with is refused whole (SQLSTATE 55F01, nothing
// written); the same or a newer lease, or none, passes.
func TestOutboxFence(t *testing.T) {
	t.Parallel()
	for _, way := range []struct {
		name    string
		copyMin int
	}{{"copy", 1}, {"insert", copyMinMutations}} {
		t.Run(way.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			outboxFence(t, b, &Store{pool: b.pool, copyMin: way.copyMin})
		})
	}
}

func outboxFence(t *testing.T, b *bundle, store *Store) {
	live, _ := b.tenant(t)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	other := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	leased := func(m engine.Mutation, part int, token int64) engine.Mutation {
		m.OutboxPartition, m.OutboxLease = part, token
		return m
	}
	for _, step := range []struct {
		name  string
		ms    []engine.Mutation
		stale bool
	}{
		{"first lease", []engine.Mutation{leased(a.grant("g1", 5, nil), 2, 100)}, false},
		{"same lease", []engine.Mutation{leased(a.grant("g2", 5, nil), 2, 100)}, false},
		{"older lease", []engine.Mutation{leased(a.grant("g3", 5, nil), 2, 99)}, true},
		{"newer lease", []engine.Mutation{leased(a.grant("g4", 5, nil), 2, 101)}, false},
		{"no lease", []engine.Mutation{a.grant("g5", 5, nil)}, false},
		{"a group with one stale partition", []engine.Mutation{
			leased(other.grant("o1", 5, nil), 7, 1), leased(a.grant("g6", 5, nil), 2, 100)}, true},
		{"a group of two partitions", []engine.Mutation{
			leased(other.grant("o2", 5, nil), 7, 1), leased(a.grant("g7", 5, nil), 2, 101)}, false},
	} {
		before := b.count(t, "ledger_entries")
		err := store.Apply(b.ctx, step.ms)
		if got := sqlState(err) == leaseStale; got != step.stale || (!step.stale && err != nil) {
			t.Fatalf("%s: Apply: %v; want stale %v", step.name, err, step.stale)
		}
		if after := b.count(t, "ledger_entries"); step.stale && after != before {
			t.Fatalf("%s: a refused transaction wrote %d entries", step.name, after-before)
		}
		if refusedData(err) {
			t.Fatalf("%s: a stale lease counts as refused data (it would be dead-lettered)", step.name)
		}
	}
}

// TestForkCheckLooksUpOnlySuspects (migration 038): credit_fork_check
// reads the ledger only for a Mutation the account makes suspect (under a
// fence, or older than the stored version yet appended later). A group of
// next versions on accounts never fenced, the persister's every write,
// costs the ledger nothing; a suspect one whose entry is stored (a late
// copy of an applied op) is looked up and passes, so the count below sees
// a look-up when there is one.
func TestForkCheckLooksUpOnlySuspects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	ms := []engine.Mutation{a.grant("g1", 100, nil), a.grant("g2", 10, nil), a.grant("g3", 1, nil)}
	for i := range ms {
		ms[i].OutboxMS = int64(998 + i)
	}
	if err := b.store.Apply(b.ctx, ms); err != nil {
		t.Fatal(err)
	}
	first := ms[0]
	for _, tc := range []struct {
		name       string
		version    int64
		op, entry  uuid.UUID
		outboxMS   int64
		wantLookUp bool
	}{
		{"next version", 4, uuid.New(), uuid.New(), 2000, false},
		{"older version appended earlier (late delivery)", 1, first.OpID, engine.EntryID(first.OpID, 0), 997, false},
		{"older version appended later, its entry stored", 1, first.OpID, engine.EntryID(first.OpID, 0), 2000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tx, err := b.pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(b.ctx) }()
			// The counters hold this backend's scans not yet reported, of
			// earlier transactions too: the call's are the difference.
			scans := func() int64 {
				var n int64
				if err := tx.QueryRow(b.ctx, `SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0)
					FROM pg_stat_xact_user_tables WHERE relname LIKE 'ledger_entries%'`).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n
			}
			before := scans()
			if _, err := tx.Exec(b.ctx, forkCheckSQL, []uuid.UUID{a.key.CustomerID}, []int64{tc.version},
				[]uuid.UUID{tc.op}, []uuid.UUID{tc.entry}, []int64{tc.outboxMS}); err != nil {
				t.Fatalf("fork check: %v", err)
			}
			if got := scans() - before; (got > 0) != tc.wantLookUp {
				t.Fatalf("the fork check scanned the ledger %d times; want a look-up: %v", got, tc.wantLookUp)
			}
		})
	}
}
