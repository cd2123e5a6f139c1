package persist

import (
	"strings"
	"testing"
	"time"

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
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The session's settings and prepared statement must not go back to
	// the pool.
	defer func() { _ = conn.Hijack().Close(b.ctx) }()
	// A ledger of lean consumes big enough that a scan costs more than
	// the probes; replica mode skips the foreign keys for these rows.
	for _, q := range []string{
		`SET session_replication_role = replica`,
		`INSERT INTO ledger_entries (id, op_id, tenant_id, customer_id, environment, delta, type, idempotency_key, created_at, op_head)
			SELECT gen_random_uuid(), gen_random_uuid(), '` + live.TenantID.String() + `', gen_random_uuid(), 'live', -1, 'consumption',
				'usage:plan-' || g, now() - g * interval '1 second', '0|1|1|0|0|1|h'
			FROM generate_series(1, 60000) AS g`,
		`SET session_replication_role = DEFAULT`,
		`ANALYZE ledger_entries`,
		`SET plan_cache_mode = force_generic_plan`,
		`PREPARE applied_heads(uuid, text[]) AS ` + appliedHeadsSQL,
	} {
		if _, err := conn.Exec(b.ctx, q); err != nil {
			t.Fatalf("%.60s: %v", q, err)
		}
	}
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
	if p := plan.String(); strings.Contains(p, "Seq Scan on ledger_entries") || !strings.Contains(p, "ledger_entries_op_key_idx") {
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
