package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// reservationRecordsEnv, set to a count (e.g. 2000), makes
// TestReservationRecords run that many reserve+commit pairs: it takes
// some 30 s on a 2-core box, so it runs only when asked
// (docs/decisions.md "Reservations keep no operations row (issue 26)").
const reservationRecordsEnv = "CREDITD_RESERVATION_RECORDS"

// reservationRecordsWorkers and reservationRecordsCustomers shape the load:
// a few clients at once over many customers, as the bench's reserve
// scenario, so the persister's groups hold a few pairs each.
const (
	reservationRecordsWorkers   = 8
	reservationRecordsCustomers = 200
)

// pgTableFigures is what Postgres holds and has written, by table.
type pgTableFigures struct {
	bytes map[string]int64 // pg_total_relation_size: heap, indexes, TOAST
	rows  map[string]int64 // n_tup_ins + n_tup_upd
}

// pgFigures reads every user relation's size (after a CHECKPOINT, so
// the sizes are the files') and rows written, by table; a partition
// counts under its own name.
func pgFigures(t *testing.T, pool *pgxpool.Pool) pgTableFigures {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CHECKPOINT`); err != nil {
		t.Logf("checkpoint: %v", err)
	}
	if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT s.relname, pg_total_relation_size(s.relid), s.n_tup_ins + s.n_tup_upd
		FROM pg_stat_user_tables s`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	f := pgTableFigures{bytes: map[string]int64{}, rows: map[string]int64{}}
	for rows.Next() {
		var name string
		var size, written int64
		if err := rows.Scan(&name, &size, &written); err != nil {
			t.Fatal(err)
		}
		f.bytes[name], f.rows[name] = size, written
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return f
}

// settledFigures is pgFigures once the other backends' counts are in:
// a backend sends its counts at most once a second, and an idle one only
// after some 10 s, so it reads again until table (its partitions
// included) counts at least want rows written since the database was
// made and two reads 2 s apart agree, for at most a minute.
func settledFigures(t *testing.T, pool *pgxpool.Pool, table string, want int64) pgTableFigures {
	t.Helper()
	written := func(f pgTableFigures) (n int64) {
		for name, w := range f.rows {
			if name == table || strings.HasPrefix(name, table+"_") {
				n += w
			}
		}
		return n
	}
	last := pgFigures(t, pool)
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		time.Sleep(2 * time.Second)
		f := pgFigures(t, pool)
		if written(f) >= want && maps.Equal(f.rows, last.rows) {
			return f
		}
		last = f
	}
	t.Fatalf("%s: %d rows written counted after a minute, want %d", table, written(last), want)
	return last
}

// TestReservationRecords measures what Postgres keeps and writes per
// reserve+commit through the whole stack (HTTP, engine, Lua, persister)
// on a fresh database: the growth of every user relation (indexes and
// TOAST included, after CHECKPOINT) and the rows inserted and updated,
// per pair, in total and by table. Run with CREDITD_RESERVATION_RECORDS=2000.
// It fails only if a call fails; the figures are for the log
// (docs/decisions.md).
func TestReservationRecords(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv(reservationRecordsEnv))
	if n <= 0 {
		t.Skip("set " + reservationRecordsEnv + "=N to measure N reserve+commit pairs")
	}
	s := NewStack(t, SingleNode())
	tn := s.NewTenant(uniq("resrec"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	customers := make([]string, reservationRecordsCustomers)
	for i := range customers {
		customers[i], _ = a.newCustomer()
		a.grant(customers[i], map[string]any{"credits": 10_000_000})
	}
	s.Drain()
	// The database is fresh: its ledger holds the grants' entries only.
	before := settledFigures(t, s.Pool, "ledger_entries", int64(len(customers)))

	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 5 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}
	next := make(chan int)
	for range reservationRecordsWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c := customers[i%len(customers)]
				r, err := TryCall(s.HTTP, s.URL, "POST", "/v1/reservations", map[string]any{"customer_id": c,
					"billable_metric_key": metric, "estimated_units": 10, "ttl_seconds": 600},
					"X-API-Key", tn.Live, "Idempotency-Key", idemKey())
				if err != nil || r.Status != 201 {
					fail("reserve %d: %v %d %s", i, err, r.Status, r.Raw)
					continue
				}
				id, _ := r.Body["id"].(string)
				r, err = TryCall(s.HTTP, s.URL, "POST", "/v1/reservations/"+id+"/commit", map[string]any{"actual_units": 8},
					"X-API-Key", tn.Live, "Idempotency-Key", idemKey())
				if err != nil || r.Status != 200 {
					fail("commit %d: %v %d %s", i, err, r.Status, r.Raw)
				}
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("calls failed: %v", failures)
	}
	s.Drain()
	after := settledFigures(t, s.Pool, "ledger_entries", int64(len(customers)+2*n))

	var grown, written int64
	type table struct {
		name        string
		bytes, rows float64
	}
	var tables []table
	for name, size := range after.bytes {
		g, w := size-before.bytes[name], after.rows[name]-before.rows[name]
		grown, written = grown+g, written+w
		if g != 0 || w != 0 {
			tables = append(tables, table{name: name, bytes: float64(g) / float64(n), rows: float64(w) / float64(n)})
		}
	}
	sort.Slice(tables, func(i, j int) bool { return tables[i].bytes > tables[j].bytes })
	t.Logf("%d reserve+commit pairs: Postgres grew %.0f B and wrote %.2f rows (inserted + updated) per pair",
		n, float64(grown)/float64(n), float64(written)/float64(n))
	for _, tb := range tables {
		t.Logf("  %-36s %7.0f B %6.2f rows", tb.name, tb.bytes, tb.rows)
	}
}
