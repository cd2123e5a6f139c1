package persist

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/creditd/creditd/engine"
)

// TestAppliedMutations: a usage event's key is found in Postgres after Redis
// forgot it (event ids are idempotent forever), only for its own tenant.
func TestAppliedMutations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	other, _ := b.tenant(t)
	acct := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	g := acct.grant("usage:evt-1", 500, nil)
	if err := b.store.Apply(b.ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Apply(b.ctx, []engine.Mutation{g}); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.AppliedMutations(b.ctx, live.TenantID, []string{"usage:evt-1", "usage:evt-2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["usage:evt-1"].OpID != g.OpID {
		t.Fatalf("got %v, want only usage:evt-1 -> %s", got, g.OpID)
	}
	none, err := b.store.AppliedMutations(b.ctx, other.TenantID, []string{"usage:evt-1"})
	if err != nil || len(none) != 0 {
		t.Fatalf("another tenant sees the key: %v %v", none, err)
	}
}

// TestAppliedHeadsPlan: a usage batch's look-up of lean consumes probes
// ledger_entries_op_key_idx once per key under the generic plan a prepared
// statement ends up with, never scanning the ledger (before: a parallel
// seq scan per batch, 185 ms at 300,000 rows and growing with the ledger;
// the bench's usage calls spent 1.8 ms of Postgres on it at a small one).
func TestAppliedHeadsPlan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	// A ledger of lean consumes big enough that a scan costs more than
	// the probes.
	conn := b.planSession(t,
		leanLedgerRows(live.TenantID, "usage:plan-", "now() - g * interval '1 second'"),
		`ANALYZE ledger_entries`,
		`SET plan_cache_mode = force_generic_plan`,
		`PREPARE applied_heads(uuid, text[]) AS `+appliedHeadsSQL)
	keys := []string{"usage:plan-7", "usage:none-1", "usage:none-2", "usage:none-3", "usage:none-4"}
	// EXPLAIN takes no parameters: the values go in as literals (the
	// plan is the prepared statement's generic one either way).
	rows, err := conn.Query(b.ctx, `EXPLAIN EXECUTE applied_heads('`+live.TenantID.String()+`', ARRAY['`+strings.Join(keys, `','`)+`'])`)
	if err != nil {
		t.Fatal(err)
	}
	var plan strings.Builder
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan.WriteString(line + "\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// The ledger is partitioned by month (migration 033): read the plan
	// with each partition's index under its parent's name, and without the
	// scans of empty months (they read nothing).
	if p := readPartitions(t, b.ctx, conn).text(plan.String()); strings.Contains(p, "Seq Scan on ledger_entries") ||
		!strings.Contains(p, "ledger_entries_op_key_idx") {
		t.Errorf("generic plan of the lean-consume look-up:\n%s\nwant one probe of ledger_entries_op_key_idx per key, no scan", p)
	}
	got, err := b.store.AppliedMutations(b.ctx, live.TenantID, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["usage:plan-7"].IdempotencyKey != "usage:plan-7" {
		t.Errorf("found %d keys (%v), want usage:plan-7 alone", len(got), got)
	}
}

// planSession is a connection of its own for a test that reads plans: it
// runs setup (rows inserted in replica mode, which skips the foreign keys
// of rows made up for the plan) and is closed, not pooled, at the end, so
// its settings and prepared statements stay with it.
func (b *bundle) planSession(t *testing.T, setup ...string) *pgxpool.Conn {
	t.Helper()
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Hijack().Close(b.ctx) })
	for _, q := range setup {
		if strings.HasPrefix(q, "INSERT") {
			q = "SET session_replication_role = replica; " + q + "; SET session_replication_role = DEFAULT"
		}
		if _, err := conn.Exec(b.ctx, q); err != nil {
			t.Fatalf("%.60s: %v", q, err)
		}
	}
	return conn
}

// leanLedgerRows inserts 60,000 lean consumes of tenant, keyed prefix and
// a number g, created at the SQL instant created (of g).
func leanLedgerRows(tenant uuid.UUID, prefix, created string) string {
	return `INSERT INTO ledger_entries (id, op_id, tenant_id, customer_id, environment, delta, type, idempotency_key, created_at, op_head)
		SELECT gen_random_uuid(), gen_random_uuid(), '` + tenant.String() + `', gen_random_uuid(), 'live', -1, 'consumption',
			'` + prefix + `' || g, ` + created + `, '0|1|1|0|0|1|h'
		FROM generate_series(1, 60000) AS g`
}
