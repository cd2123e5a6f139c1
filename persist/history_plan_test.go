package persist

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// planNode is the part of an EXPLAIN (FORMAT JSON) node the plan test reads.
type planNode struct {
	NodeType      string     `json:"Node Type"`
	IndexName     string     `json:"Index Name"`
	RelationName  string     `json:"Relation Name"`
	ActualRows    int64      `json:"Actual Rows"`
	ActualLoops   int64      `json:"Actual Loops"`
	FilterRemoved int64      `json:"Rows Removed by Filter"`
	Plans         []planNode `json:"Plans"`
}

// walk calls f on n and every node under it.
func (n planNode) walk(f func(planNode)) {
	f(n)
	for _, c := range n.Plans {
		c.walk(f)
	}
}

// explain runs sql with args under EXPLAIN ANALYZE and returns its plan
// tree: the custom plan of those values, or with generic the plan a
// prepared statement settles on (pgx prepares History's statement, and
// Postgres switches a statement it runs often to its generic plan when
// that looks no dearer).
func explain(t *testing.T, b *bundle, sql string, args []any, generic bool) planNode {
	t.Helper()
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The session's plan_cache_mode and prepared statement must not go
	// back to the pool.
	defer func() { _ = conn.Hijack().Close(b.ctx) }()
	var raw string
	if !generic {
		err = conn.QueryRow(b.ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args...).Scan(&raw)
	} else {
		lits := make([]string, len(args))
		for i, a := range args {
			lits[i] = fmt.Sprintf("'%v'", a)
			if ts, ok := a.(time.Time); ok {
				lits[i] = "'" + ts.Format(time.RFC3339Nano) + "'"
			}
			if v := reflect.ValueOf(a); !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
				lits[i] = "NULL"
			}
		}
		for _, s := range []string{"SET plan_cache_mode = force_generic_plan", "PREPARE history_page AS " + sql} {
			if _, err := conn.Exec(b.ctx, s, pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
		err = conn.QueryRow(b.ctx, "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE history_page("+strings.Join(lits, ", ")+")",
			pgx.QueryExecModeSimpleProtocol).Scan(&raw)
	}
	if err != nil {
		t.Fatalf("explain %s: %v", sql, err)
	}
	var out []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal([]byte(raw), &out); err != nil || len(out) != 1 {
		t.Fatalf("explain output %s: %v", raw, err)
	}
	return out[0].Plan
}

// TestHistoryTypeFilterPlan (issue 31 item 6): a history page filtered by
// type reads at most a page's worth of rows (limit+1 of the type, and as
// many skipped) from an index in the page's order, or, where the planner
// knows the type's entries to be that few, all of them through the type
// index and a sort; never a Seq Scan: it does not walk the customer's ledger:
// custom and generic plans alike, the first page and a cursor's, a type
// that fills most of the ledger, a rare one and one with no entries. The
// planner takes ledger_entries_history_type_idx (migration 024) where
// the history index would walk (the generic plan, a type with no entries)
// and may take the history index for a type that fills its newest end, or
// a type's own partial index (top-ups); consumption, which the type index
// leaves out, reads the history index's newest end. The unfiltered page
// keeps the history index.
func TestHistoryTypeFilterPlan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	// One customer with 10,000 entries (50 old top-ups, then consumptions),
	// beside 40 customers of 250 each: the customer is most of the table,
	// which tempts the planner to scan it whole.
	target := uuid.New()
	start := time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Millisecond)
	// In the current month, as a live ledger's newest entries are: on a
	// month's first day a day ago is the month before, whose entries the
	// newest month's page never reads (its empty partitions then plan a
	// sort of nothing).
	if month, _ := utcMonth(time.Now(), 0); start.Before(month) {
		start = month
	}
	seed := func(customer uuid.UUID, n int, grants int) {
		t.Helper()
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO ledger_entries
			(id, op_id, tenant_id, customer_id, environment, delta, type, created_at)
			SELECT gen_random_uuid(), gen_random_uuid(), $1, $2, 'live', 0,
				CASE WHEN g <= $4 THEN 'topup' ELSE 'consumption' END,
				$3::timestamptz + make_interval(secs => g)
			FROM generate_series(1, $5::int) AS g`, live.TenantID, customer, start, grants, n); err != nil {
			t.Fatal(err)
		}
	}
	seed(target, 10_000, 50)
	for i := 0; i < 40; i++ {
		seed(uuid.New(), 250, 5)
	}
	if _, err := b.pool.Exec(b.ctx, "ANALYZE ledger_entries"); err != nil {
		t.Fatal(err)
	}
	cursor := pageKey{at: start.Add(5000 * time.Second), id: uuid.Max, op: uuid.Max, withOp: true}
	// The ledger is partitioned by month (migration 033): a plan names the
	// partitions' indexes, and scans the empty months, which reads nothing.
	parts := readPartitions(t, b.ctx, b.pool)

	typed := func(s string) *engine.EntryType { e := engine.EntryType(s); return &e }
	for _, typ := range []string{"consumption", "topup", "expiry"} {
		for _, hasAfter := range []bool{false, true} {
			for _, shape := range []string{"every month", "newest month first"} {
				for _, generic := range []bool{false, true} {
					q := engine.HistoryQuery{TenantID: live.TenantID, CustomerID: target, Type: typed(typ), Limit: 25}
					sql, args := historySQL(q, cursor, hasAfter)
					if shape == "newest month first" {
						if hasAfter {
							continue // a cursor page is one statement over every month
						}
						// The statement History runs first (reader.go).
						since, _ := historyMonth(q, time.Now())
						sql, args = historyWindowSQL(q, cursor, hasAfter, &since, nil, q.Limit+1)
					}
					plan := explain(t, b, sql, args, generic)
					const maxRead = 2 * 26
					var read int64
					var typeIdx, typeBitmap bool
					var sorted []string
					plan.walk(func(n planNode) {
						switch n.NodeType {
						case "Index Scan", "Index Only Scan":
							read += (n.ActualRows + n.FilterRemoved) * max(n.ActualLoops, 1)
							typeIdx = typeIdx || parts.index(n.IndexName) == "ledger_entries_history_type_idx"
							// The type index holds the type's entries only:
							// a sort after it sorts no more than those.
							typeBitmap = typeBitmap || parts.index(n.IndexName) == "ledger_entries_history_type_idx"
						case "Bitmap Index Scan":
							// Only the type's own entries, sorted after: what
							// the planner takes when it knows them to be few.
							read += n.ActualRows * max(n.ActualLoops, 1)
							typeBitmap = typeBitmap || parts.index(n.IndexName) == "ledger_entries_history_type_idx"
							typeIdx = typeIdx || typeBitmap
						case "Seq Scan":
							if parts.emptyScan(n) {
								return
							}
							t.Errorf("%s: type=%s cursor=%v generic=%v: a %s node: %+v", shape, typ, hasAfter, generic, n.NodeType, plan)
						case "Bitmap Heap Scan", "Sort":
							sorted = append(sorted, n.NodeType)
						case "Incremental Sort":
							// Over the index's created_at order, it sorts only
							// the entries of one instant by op_id (History's
							// order): the rows read bound it below.
						}
					})
					if len(sorted) > 0 && !typeBitmap {
						t.Errorf("%s: type=%s cursor=%v generic=%v: %v nodes over other than the type's entries: %+v", shape, typ, hasAfter, generic, sorted, plan)
					}
					if read > maxRead {
						t.Errorf("%s: type=%s cursor=%v generic=%v: %d rows read for a page of 25, want at most %d: %+v",
							shape, typ, hasAfter, generic, read, maxRead, plan)
					}
					// Where no other index reads one page (a type
					// without entries; any type but consumption as a
					// parameter), the new one must be the plan's.
					if (generic || typ == "expiry") && typ != "consumption" && !typeIdx {
						t.Errorf("%s: type=%s cursor=%v generic=%v: no Index Scan of ledger_entries_history_type_idx: %+v",
							shape, typ, hasAfter, generic, plan)
					}
				}
			}
		}
	}

	// The filtered page answers the newest entries of the type.
	page, err := b.store.History(b.ctx, engine.HistoryQuery{TenantID: live.TenantID, CustomerID: target, Type: typed("topup"), Limit: 25})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 25 || page.Data[0].Type != engine.EntryTopup ||
		!page.Data[0].CreatedAt.Equal(start.Add(50*time.Second)) || page.NextCursor == "" {
		t.Fatalf("topup page: %d entries, first %+v", len(page.Data), page.Data[0])
	}

	sql, args := historySQL(engine.HistoryQuery{TenantID: live.TenantID, CustomerID: target, Limit: 25}, pageKey{}, false)
	var unfiltered bool
	explain(t, b, sql, args, false).walk(func(n planNode) {
		unfiltered = unfiltered || parts.index(n.IndexName) == "ledger_entries_history_idx"
	})
	if !unfiltered {
		t.Errorf("the unfiltered page does not read ledger_entries_history_idx")
	}
}
