package main

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/creditd/creditd/persist"
)

// The ledger-scale scenario (issue 30, "Done when"): the ledger grows from
// one monthly partition to ledgerScaleMonths, and the reads the API makes
// of it must not notice. It runs only when named: seeding 50M rows takes
// minutes and some 15 GB of disk.
const (
	ledgerScaleMonths = 6
	// ledgerScaleSlack is the goal: each read's p50 with every month
	// filled within 10 % of its p50 with one month filled.
	ledgerScaleSlack = 0.10
	// ledgerScaleDropGoal bounds a retention drop (DETACH + DROP of a
	// month of 8M rows): milliseconds of catalogue work and file unlinks,
	// where a DELETE of its rows takes minutes and leaves them to vacuum.
	ledgerScaleDropGoal = time.Second
	// ledgerScaleFill is how many customers the bulk of the rows belong
	// to (ids only: the ledger has no foreign key to customers).
	ledgerScaleFill = 10_000
	// ledgerScaleProbeRows are a probe customer's entries per month, the
	// oldest ledgerScaleProbeAdjustments of them adjustments (the rare type
	// the filtered history page looks for: more than a page, so the page
	// is this month's in both phases).
	ledgerScaleProbeRows        = 3_000
	ledgerScaleProbeAdjustments = 30
	ledgerScaleChunk            = 1_000_000
	// ledgerScaleWarmup rounds of reads go untimed before each turn of a
	// phase: the first rounds after an ATTACH or DETACH plan their
	// statements again and pay for cold caches.
	ledgerScaleWarmup = 10
	// ledgerScaleRounds is how many turns each phase takes (timePhases).
	ledgerScaleRounds = 10
)

// LedgerScaleResult is the ledger-scale scenario's report.
type LedgerScaleResult struct {
	Rows   int64 `json:"rows"`
	Months int   `json:"months"`
	// OneMonthRows and AllMonthsRows are the ledger's rows when each
	// phase's reads were timed.
	OneMonthRows  int64             `json:"one_month_rows"`
	AllMonthsRows int64             `json:"all_months_rows"`
	SeedSeconds   float64           `json:"seed_seconds"`
	LedgerBytes   int64             `json:"ledger_bytes"` // all partitions and indexes, every month filled
	Reads         []LedgerScaleRead `json:"reads"`
	Drop          *LedgerScaleDrop  `json:"drop,omitempty"`
	Error         string            `json:"error,omitempty"`
}

// LedgerScaleRead is one read timed with one month filled and again with
// every month filled.
type LedgerScaleRead struct {
	Name      string  `json:"name"`
	Path      string  `json:"path"`
	Queries   int     `json:"queries"`
	OneP50Ms  float64 `json:"one_month_p50_ms"`
	OneP99Ms  float64 `json:"one_month_p99_ms"`
	AllP50Ms  float64 `json:"all_months_p50_ms"`
	AllP99Ms  float64 `json:"all_months_p99_ms"`
	Ratio     float64 `json:"ratio"` // AllP50Ms / OneP50Ms
	Partition string  `json:"partitions_scanned,omitempty"`
}

// LedgerScaleDrop is the retention drop of the oldest month.
type LedgerScaleDrop struct {
	Partition string  `json:"partition"`
	Rows      int64   `json:"rows"`
	Bytes     int64   `json:"bytes"`
	DetachMs  float64 `json:"detach_ms"`
	DropMs    float64 `json:"drop_ms"`
}

// ledgerScaleRead is a timed GET of the scenario.
type ledgerScaleRead struct{ name, path string }

// ledgerScale seeds rows ledger rows straight into Postgres, one month at
// a time, newest first: the current month (up to now),
// then the ledgerScaleMonths-1 before it. It times the reads of a probe
// customer's ledger (history page, history filtered by a rare type,
// overage and usage of this month), queries each, round-robin so drift
// falls on every read alike, with the newest month alone attached and
// with every month attached, in alternating turns (timePhases); then it
// detaches and drops the oldest month.
func (b *Bench) ledgerScale(ctx context.Context, rows int64, queries int) {
	out := &LedgerScaleResult{Rows: rows, Months: ledgerScaleMonths}
	b.res.LedgerScale = out
	fail := func(err error) { out.Error = err.Error(); logf("ledger-scale: %v", err) }
	api, probe, pool, err := b.seedTarget(ctx, "ledger-scale", "ledger-probe")
	if err != nil {
		fail(err)
		return
	}
	defer pool.Close()

	// The current month's rows end now and its reads end at tomorrow's
	// midnight UTC (a day report's bounds start days): on a month's first
	// day, midnight would leave the month no instant of its own.
	now := time.Now().UTC().Truncate(time.Second)
	current := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	if !now.After(current) {
		now = current.Add(time.Second)
	}
	tomorrow := now.Truncate(24*time.Hour).AddDate(0, 0, 1)
	var months []time.Time // newest first
	for i := 0; i < ledgerScaleMonths; i++ {
		months = append(months, current.AddDate(0, -i, 0))
	}
	if err := monthsBefore(ctx, pool); err != nil {
		fail(err)
		return
	}
	reads := ledgerScaleReads(current, tomorrow)
	perMonth := rows / ledgerScaleMonths
	t0 := time.Now()
	for i, m := range months {
		end := m.AddDate(0, 1, 0)
		if i == 0 {
			end = now
		}
		if err := loadMonth(ctx, pool, probe.TenantID, probe.ID, m, end, perMonth); err != nil {
			fail(fmt.Errorf("seed %s: %w", m.Format("2006-01"), err))
			return
		}
	}
	out.OneMonthRows, out.AllMonthsRows, out.SeedSeconds = perMonth, perMonth*ledgerScaleMonths, time.Since(t0).Seconds()
	if _, err := rollUpCustomer(ctx, pool, probe.ID); err != nil {
		fail(err)
		return
	}
	// The timed reads find the database at rest: the rows' pages
	// written out rather than flushed under them.
	for _, stmt := range []string{"ANALYZE usage_hourly", "CHECKPOINT"} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			fail(err)
			return
		}
	}
	one, all, err := timePhases(ctx, api, pool, reads, months[1:], queries)
	if err != nil {
		fail(err)
		return
	}
	for j, r := range reads {
		x := LedgerScaleRead{Name: r.name, Path: r.path, Queries: len(one[j])}
		x.OneP50Ms, x.OneP99Ms = percentileMs(one[j], 50), percentileMs(one[j], 99)
		x.AllP50Ms, x.AllP99Ms = percentileMs(all[j], 50), percentileMs(all[j], 99)
		if x.OneP50Ms > 0 {
			x.Ratio = x.AllP50Ms / x.OneP50Ms
		}
		out.Reads = append(out.Reads, x)
	}
	for j, r := range reads {
		out.Reads[j].Partition, err = ledgerScalePlan(ctx, pool, r.name, probe.ID, probe.TenantID, current, tomorrow)
		if err != nil {
			fail(err)
			return
		}
	}
	if err := pool.QueryRow(ctx, `SELECT COALESCE(SUM(pg_total_relation_size(inhrelid)), 0)::bigint
		FROM pg_inherits WHERE inhparent = 'ledger_entries'::regclass`).Scan(&out.LedgerBytes); err != nil {
		fail(err)
		return
	}
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		fail(err)
		return
	}
	if out.Drop, err = dropOldestMonth(ctx, pool, months[len(months)-1]); err != nil {
		fail(err)
		return
	}
	// The API still answers once a month is gone.
	if _, err := api.Expect(200, "GET", reads[0].path, nil); err != nil {
		fail(fmt.Errorf("history after the drop: %w", err))
	}
}

// seededCustomer is the one customer a seeding scenario reads through the
// API.
type seededCustomer struct {
	ID       string `json:"id"`
	TenantID string `json:"tenant_id"`
}

// seedTarget readies a scenario whose ledger is seeded straight into
// Postgres: a tenant of its own (name), an allow customer ext in it
// created through the API, and a pool on the run's database without a
// statement timeout (the caller closes it).
func (b *Bench) seedTarget(ctx context.Context, name, ext string) (*API, seededCustomer, *pgxpool.Pool, error) {
	var c seededCustomer
	api, err := newTenant(b.addr, b.runID+"-"+name)
	if err != nil {
		return nil, c, nil, err
	}
	a, err := api.Expect(201, "POST", "/v1/customers", map[string]any{"external_id": ext, "overage_policy": "allow"},
		"Idempotency-Key", b.runID+"-"+ext)
	if err != nil {
		return nil, c, nil, err
	}
	if err := a.Decode(&c); err != nil {
		return nil, c, nil, err
	}
	pool, err := b.unboundedPool(ctx)
	return api, c, pool, err
}

// unboundedPool is a pool on the run's database without a statement
// timeout: seeding a million rows takes longer than creditd's default.
func (b *Bench) unboundedPool(ctx context.Context) (*pgxpool.Pool, error) {
	sep := "?"
	if strings.Contains(b.dbURL, "?") {
		sep = "&"
	}
	return persist.Open(ctx, b.dbURL+sep+"statement_timeout=0")
}

// monthsBefore readies the fresh database's ledger for months before
// this one: migration 033's contract gave every instant before this month
// to ledger_entries_legacy (the table as it was, empty here), so the past
// months could not have partitions of their own. A ledger partitioned
// since half a year has its legacy partition ending before them: here it
// is empty, so it goes, and the months get their own.
func monthsBefore(ctx context.Context, pool *pgxpool.Pool) error {
	var rows int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM ledger_entries_legacy LIMIT 1) l`).Scan(&rows); err != nil {
		return fmt.Errorf("legacy partition: %w", err)
	}
	if rows > 0 {
		return fmt.Errorf("ledger_entries_legacy holds rows: the scenario needs a fresh database")
	}
	for _, stmt := range []string{"ALTER TABLE ledger_entries DETACH PARTITION ledger_entries_legacy", "DROP TABLE ledger_entries_legacy"} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

// ledgerScaleReads are the scenario's timed reads of the probe customer,
// each bounded to this month as a caller asking about now would be.
func ledgerScaleReads(current, to time.Time) []ledgerScaleRead {
	month := url.Values{"from": {current.Format(time.RFC3339)}, "to": {to.Format(time.RFC3339)}}
	usage := url.Values{"granularity": {"day"}, "from": {current.Format(time.RFC3339)}, "to": {to.Format(time.RFC3339)}}
	return []ledgerScaleRead{
		{"history", "/v1/customers/ledger-probe/credits/history?limit=25"},
		{"history type=adjustment", "/v1/customers/ledger-probe/credits/history?type=adjustment&limit=25"},
		{"overage this month", "/v1/customers/ledger-probe/overage?" + month.Encode()},
		{"usage this month by day", "/v1/customers/ledger-probe/usage?" + usage.Encode()},
	}
}

// loadMonth makes the ledger's partition of the month from..to hold n
// rows (seedLedgerMonth), loaded into a table of its own and then
// attached: Postgres builds the month's indexes once, sorted, at the
// ATTACH, instead of row by row, so 50M rows load in minutes rather than
// half an hour; the reads that follow see one partition a month with the
// ledger's indexes, as EnsurePartitions' months have. The month's empty
// partition (the migrations' or EnsurePartitions') makes way first; the
// table is vacuumed and analyzed as autovacuum would have done to a month
// that old.
func loadMonth(ctx context.Context, pool *pgxpool.Pool, tenantID, probeID string, from, to time.Time, n int64) error {
	name := "ledger_entries_p" + from.Format("200601")
	ident := pgx.Identifier{name}.Sanitize()
	var exists, empty bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		if err := pool.QueryRow(ctx, `SELECT NOT EXISTS (SELECT 1 FROM `+ident+`)`).Scan(&empty); err != nil {
			return err
		}
		if !empty {
			return fmt.Errorf("%s holds rows: the scenario needs a fresh database", name)
		}
		for _, stmt := range []string{"ALTER TABLE ledger_entries DETACH PARTITION " + ident, "DROP TABLE " + ident} {
			if _, err := pool.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("%s: %w", stmt, err)
			}
		}
	}
	hi := from.AddDate(0, 1, 0)
	if _, err := pool.Exec(ctx, "CREATE TABLE "+ident+" (LIKE ledger_entries INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"); err != nil {
		return err
	}
	if err := seedLedgerMonth(ctx, pool, ident, tenantID, probeID, from, to, n); err != nil {
		return err
	}
	t := time.Now()
	// The CHECK spares the ATTACH its scan of the rows, this one and
	// timePhases' (it stays: pruning does not read a partition's CHECKs).
	for _, stmt := range []string{
		fmt.Sprintf("ALTER TABLE %s ADD CONSTRAINT month_range CHECK (created_at >= '%s' AND created_at < '%s')",
			ident, from.Format(time.RFC3339), hi.Format(time.RFC3339)),
		fmt.Sprintf("ALTER TABLE ledger_entries ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')",
			ident, from.Format(time.RFC3339), hi.Format(time.RFC3339)),
		"VACUUM (ANALYZE) " + ident,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	logf("ledger-scale: %s attached with its indexes and vacuumed in %.1f s", name, time.Since(t).Seconds())
	return nil
}

// seedLedgerMonth writes n ledger rows dated in [from, to) into table: the bulk
// belongs to ledgerScaleFill customers, ledgerScaleProbeRows to probe (its
// oldest ledgerScaleProbeAdjustments adjustments, the rest consumptions of
// three metrics paid as overage; delta 0 throughout, so the probe's books
// stay at 0). Ids rise with the row number under a prefix of the month's
// own, as the persister's time-ordered ops make them rise.
func seedLedgerMonth(ctx context.Context, pool *pgxpool.Pool, table, tenantID, probeID string, from, to time.Time, n int64) error {
	prefix := strings.ReplaceAll(uuid.NewString()[:23], "-", "")
	fill := strings.ReplaceAll(uuid.NewString()[:23], "-", "")
	stepUS := to.Sub(from).Microseconds() / n
	for lo := int64(0); lo < n; lo += ledgerScaleChunk {
		hi := min(lo+ledgerScaleChunk, n) - 1
		if _, err := pool.Exec(ctx, `INSERT INTO `+table+`
			(id, op_id, tenant_id, customer_id, environment, delta, type, billable_metric_key, cost_units,
			 overage_mc, created_at)
			SELECT u, u, $1, ($2 || lpad(to_hex(g % $3), 12, '0'))::uuid, 'live', -(1 + g % 5), 'consumption',
				'fill_' || (g % 3), 1 + g % 5, 0, $4::timestamptz + make_interval(secs => g * $5::bigint / 1e6)
			FROM (SELECT g, ($6 || lpad(to_hex(g), 12, '0'))::uuid AS u
				FROM generate_series($7::bigint, $8::bigint) AS g) s`,
			tenantID, fill, ledgerScaleFill, from, stepUS, prefix, lo, hi); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		logf("ledger-scale: %s: %d/%d rows", from.Format("2006-01"), hi+1, n)
	}
	probeStepUS := to.Sub(from).Microseconds() / ledgerScaleProbeRows
	_, err := pool.Exec(ctx, `INSERT INTO `+table+`
		(id, op_id, tenant_id, customer_id, environment, delta, type, billable_metric_key, cost_units,
		 overage_mc, created_at)
		SELECT u, u, $1, $2, 'live', 0,
			CASE WHEN g < $3 THEN 'adjustment' ELSE 'consumption' END,
			CASE WHEN g < $3 THEN NULL ELSE 'report_' || (g % 3) END,
			CASE WHEN g < $3 THEN NULL ELSE 1 + g % 5 END,
			CASE WHEN g < $3 THEN 0 ELSE 10 * (1 + g % 5) END,
			$4::timestamptz + make_interval(secs => g * $5::bigint / 1e6)
		FROM (SELECT g, gen_random_uuid() AS u FROM generate_series(0, $6::bigint - 1) AS g) s`,
		tenantID, probeID, ledgerScaleProbeAdjustments, from, probeStepUS, ledgerScaleProbeRows)
	return err
}

// rollUpCustomer (re)builds customer's hourly usage rollup from its ledger
// rows as migration 020's backfill does, and says how many rollup rows it
// wrote.
func rollUpCustomer(ctx context.Context, pool *pgxpool.Pool, customerID string) (int64, error) {
	tag, err := pool.Exec(ctx, `INSERT INTO usage_hourly
		(customer_id, hour_start, billable_metric_key, tenant_id, environment, units, cost, count)
		SELECT customer_id, date_trunc('hour', created_at, 'UTC'), billable_metric_key, tenant_id, environment,
			LEAST(SUM(cost_units), 9223372036854775807)::bigint,
			LEAST(SUM(overage_mc::numeric - delta), 9223372036854775807)::bigint, COUNT(*)
		FROM ledger_entries WHERE customer_id = $1 AND type = 'consumption' AND billable_metric_key IS NOT NULL
		GROUP BY 1, 2, 3, 4, 5
		ON CONFLICT (customer_id, hour_start, billable_metric_key, tenant_id) DO UPDATE SET
			units = EXCLUDED.units, cost = EXCLUDED.cost, count = EXCLUDED.count`, customerID)
	if err != nil {
		return 0, fmt.Errorf("build rollup: %w", err)
	}
	return tag.RowsAffected(), nil
}

// timePhases times queries rounds of reads in each phase: with only the
// newest month attached (the older months detached, tables of their own)
// and with every month attached. The phases alternate, ledgerScaleRounds
// times, in turns (one then all, all then one), so whatever drifts on the
// machine over the minutes of the run (a checkpoint, another process, the
// page cache) falls on both alike: timed one phase after the other, a
// phase's p50 moved by up to 2x from run to run (docs/decisions.md "The
// ledger at 50M rows in six months"). It leaves every month attached.
func timePhases(ctx context.Context, api *API, pool *pgxpool.Pool, reads []ledgerScaleRead, older []time.Time,
	queries int) (one, all [][]time.Duration, err error) {
	one, all = make([][]time.Duration, len(reads)), make([][]time.Duration, len(reads))
	per := max(1, queries/ledgerScaleRounds)
	for round := 0; round < ledgerScaleRounds; round++ {
		order := []bool{true, false}
		if round%2 == 1 {
			order = []bool{false, true}
		}
		for _, alone := range order {
			if err := attachMonths(ctx, pool, older, !alone); err != nil {
				return nil, nil, err
			}
			took, err := timeReads(ctx, api, reads, per)
			if err != nil {
				return nil, nil, err
			}
			into := all
			if alone {
				into = one
			}
			for i := range took {
				into[i] = append(into[i], took[i]...)
			}
		}
	}
	return one, all, attachMonths(ctx, pool, older, true)
}

// attachMonths attaches (or detaches) the ledger partitions of months
// that are not (or are) attached: catalogue work only, as each month's
// month_range CHECK spares the ATTACH its scan (loadMonth).
func attachMonths(ctx context.Context, pool *pgxpool.Pool, months []time.Time, attach bool) error {
	for _, m := range months {
		name := "ledger_entries_p" + m.Format("200601")
		var attached bool
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_inherits
			WHERE inhparent = 'ledger_entries'::regclass AND inhrelid = to_regclass($1))`, name).Scan(&attached); err != nil {
			return err
		}
		if attached == attach {
			continue
		}
		ident := pgx.Identifier{name}.Sanitize()
		stmt := "ALTER TABLE ledger_entries DETACH PARTITION " + ident
		if attach {
			stmt = fmt.Sprintf("ALTER TABLE ledger_entries ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')",
				ident, m.Format(time.RFC3339), m.AddDate(0, 1, 0).Format(time.RFC3339))
		}
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
	}
	return nil
}

// timeReads times queries rounds of reads (after ledgerScaleWarmup rounds), one
// GET of each per round; took[i] are read i's durations.
func timeReads(ctx context.Context, api *API, reads []ledgerScaleRead, queries int) ([][]time.Duration, error) {
	took := make([][]time.Duration, len(reads))
	for round := -ledgerScaleWarmup; round < queries; round++ {
		for i, r := range reads {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			t := time.Now()
			if _, err := api.Expect(200, "GET", r.path, nil); err != nil {
				return nil, fmt.Errorf("%s: %w", r.name, err)
			}
			if round >= 0 {
				took[i] = append(took[i], time.Since(t))
			}
		}
	}
	return took, nil
}

// percentileMs is the p-th percentile of took in milliseconds (sorts
// took).
func percentileMs(took []time.Duration, p int) float64 {
	if len(took) == 0 {
		return 0
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	i := (len(took)*p - 1) / 100
	if p == 50 {
		i = len(took) / 2
	}
	return float64(took[i].Microseconds()) / 1000
}

// ledgerScalePlan names the ledger partitions the statement behind read
// scans with every month filled: EXPLAIN of the same SQL shape the API
// runs (persist/reader.go), so the report shows the pruning, not just its
// effect. The usage read touches the rollup, not the ledger.
func ledgerScalePlan(ctx context.Context, pool *pgxpool.Pool, read, customerID, tenantID string, from, to time.Time) (string, error) {
	var sql string
	args := []any{customerID, tenantID}
	switch read {
	// A first history page reads the newest month first (persist/reader.go
	// History): its first statement, which finds the page here.
	case "history":
		sql = `SELECT id FROM ledger_entries WHERE customer_id = $1 AND tenant_id = $2 AND created_at >= $3
			ORDER BY created_at DESC, id DESC LIMIT 26`
		args = append(args, from)
	case "history type=adjustment":
		sql = `SELECT id FROM ledger_entries WHERE customer_id = $1 AND tenant_id = $2 AND type = 'adjustment'
			AND type <> 'consumption' AND created_at >= $3 ORDER BY created_at DESC, id DESC LIMIT 26`
		args = append(args, from)
	case "overage this month":
		sql = `SELECT billable_metric_key, SUM(overage_mc) FROM ledger_entries
			WHERE customer_id = $1 AND tenant_id = $2 AND overage_mc > 0 AND created_at >= $3 AND created_at < $4
			GROUP BY 1`
		args = append(args, from, to)
	default:
		return "usage_hourly (rollup)", nil
	}
	rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "+sql, args...)
	if err != nil {
		return "", fmt.Errorf("explain %s: %w", read, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return "", fmt.Errorf("explain %s: %w", read, err)
	}
	return scannedPartitions(lines), nil
}

// scannedPartitions lists the ledger partitions an EXPLAIN ANALYZE plan
// read, by their suffix ("p202611", "default"), and how many (a node
// "never executed" read nothing). An unbounded history page is a Merge
// Append of every month's index, each probed once for its newest entries:
// a few buffers a month, whatever the months hold.
func scannedPartitions(plan []string) string {
	var hit []string
	seen := map[string]bool{}
	for _, l := range plan {
		i := strings.Index(l, " on ledger_entries_")
		// A bitmap index scan names an index; its heap scan, the table.
		if i < 0 || strings.Contains(l, "never executed") || strings.Contains(l, "Bitmap Index Scan") {
			continue
		}
		name := strings.TrimPrefix(strings.Fields(l[i+4:])[0], "ledger_entries_")
		if !seen[name] {
			seen[name] = true
			hit = append(hit, name)
		}
	}
	if len(hit) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d: %s", len(hit), strings.Join(hit, ", "))
}

// dropOldestMonth detaches month's ledger partition and drops it, timing
// each: the retention path (after `creditd export` of a closed month) that
// never DELETEs a row.
func dropOldestMonth(ctx context.Context, pool *pgxpool.Pool, month time.Time) (*LedgerScaleDrop, error) {
	d := &LedgerScaleDrop{Partition: "ledger_entries_p" + month.Format("200601")}
	ident := pgx.Identifier{d.Partition}.Sanitize()
	if err := pool.QueryRow(ctx, `SELECT reltuples::bigint, pg_total_relation_size(oid) FROM pg_class WHERE relname = $1`,
		d.Partition).Scan(&d.Rows, &d.Bytes); err != nil {
		return nil, fmt.Errorf("size of %s: %w", d.Partition, err)
	}
	t := time.Now()
	if _, err := pool.Exec(ctx, "ALTER TABLE ledger_entries DETACH PARTITION "+ident); err != nil {
		return nil, fmt.Errorf("detach %s: %w", d.Partition, err)
	}
	d.DetachMs = float64(time.Since(t).Microseconds()) / 1000
	t = time.Now()
	if _, err := pool.Exec(ctx, "DROP TABLE "+ident); err != nil {
		return nil, fmt.Errorf("drop %s: %w", d.Partition, err)
	}
	d.DropMs = float64(time.Since(t).Microseconds()) / 1000
	logf("ledger-scale: %s (%d rows, %d B) detached in %.1f ms, dropped in %.1f ms", d.Partition, d.Rows, d.Bytes, d.DetachMs, d.DropMs)
	return d, nil
}

// ledgerScaleGoalRows are the goal table's rows of the scenario.
func ledgerScaleGoalRows(l *LedgerScaleResult) (reads string, readsMet *bool, drop string, dropMet *bool) {
	if l.Error != "" {
		return "failed: " + l.Error, boolp(false), "failed: " + l.Error, boolp(false)
	}
	ok := len(l.Reads) > 0 && l.AllMonthsRows > 0
	var parts []string
	for _, r := range l.Reads {
		parts = append(parts, fmt.Sprintf("%s %.2fx", r.Name, r.Ratio))
		ok = ok && r.Ratio > 0 && r.Ratio <= 1+ledgerScaleSlack
	}
	reads = fmt.Sprintf("%s (p50, %d rows in %d months against %d in one)", strings.Join(parts, "; "), l.AllMonthsRows, l.Months, l.OneMonthRows)
	if l.Drop == nil {
		return reads, boolp(ok), "not reached", boolp(false)
	}
	total := time.Duration((l.Drop.DetachMs + l.Drop.DropMs) * float64(time.Millisecond))
	drop = fmt.Sprintf("%.1f ms (detach %.1f + drop %.1f) for %d rows, %d MB", float64(total.Microseconds())/1000,
		l.Drop.DetachMs, l.Drop.DropMs, l.Drop.Rows, l.Drop.Bytes>>20)
	return reads, boolp(ok), drop, boolp(total <= ledgerScaleDropGoal)
}

// ledgerScaleMarkdown is the report's section for the scenario.
func ledgerScaleMarkdown(w func(string, ...any), l *LedgerScaleResult) {
	w("\n## Ledger at scale (issue 30)\n\n")
	if l.Error != "" {
		w("Error: %s\n", l.Error)
		if len(l.Reads) == 0 {
			return
		}
	}
	w("%d ledger rows over %d monthly partitions seeded straight into Postgres with generate_series, newest month first "+
		"(%.0f s in all; %d customers' ids, and a probe customer with %d entries a month). The probe's reads, each bounded "+
		"as a caller asking about this month would bound it, timed end to end over loopback, round-robin, "+
		"with only the newest month attached (%d rows; the older months detached, tables of their own) and with every month "+
		"attached (%d rows, %d MB with indexes), the two in %d alternating turns so that drift falls on both alike. "+
		"Goal: every p50 within %.0f %% of its one-month p50.\n\n",
		l.Rows, l.Months, l.SeedSeconds, ledgerScaleFill, ledgerScaleProbeRows, l.OneMonthRows, l.AllMonthsRows, l.LedgerBytes>>20,
		ledgerScaleRounds, ledgerScaleSlack*100)
	w("| read | queries | one month p50 / p99 ms | %d months p50 / p99 ms | ratio of p50s | partitions read (EXPLAIN ANALYZE) |\n|---|---|---|---|---|---|\n", l.Months)
	for _, r := range l.Reads {
		w("| %s | %d | %.2f / %.2f | %.2f / %.2f | %.2fx | %s |\n", r.Name, r.Queries, r.OneP50Ms, r.OneP99Ms, r.AllP50Ms, r.AllP99Ms, r.Ratio, r.Partition)
	}
	if d := l.Drop; d != nil {
		w("\nRetention drop of the oldest month, `%s` (%d rows, %d MB): DETACH PARTITION %.1f ms, DROP TABLE %.1f ms "+
			"(goal: <= %d ms in all; a DELETE of its rows would rewrite every index and leave the space to vacuum).\n",
			d.Partition, d.Rows, d.Bytes>>20, d.DetachMs, d.DropMs, ledgerScaleDropGoal.Milliseconds())
	}
}
