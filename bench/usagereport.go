package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/google/uuid"
)

// usageReportGoal is issue 15 item 5's bound on a usage report of a
// customer with 10M ledger rows.
const usageReportGoal = 50 * time.Millisecond

// Shape of the usage-report scenario's seeded ledger: usageReportMetrics
// metrics over the usageReportDays UTC days before today.
const (
	usageReportMetrics = 3
	usageReportDays    = 30
	// usageReportChunk is the rows one seeding INSERT writes (one
	// progress line each).
	usageReportChunk = 1_000_000
)

// UsageReportResult is the usage-report scenario: the latency of
// GET /v1/customers/{id}/usage for a customer whose ledger rows were seeded
// straight into Postgres, with the rollup built from them as migration
// 020's backfill does.
type UsageReportResult struct {
	LedgerRows    int64   `json:"ledger_rows"`
	Metrics       int     `json:"metrics"`
	Days          int     `json:"days"`
	SeedSeconds   float64 `json:"seed_seconds"`
	RollupSeconds float64 `json:"rollup_seconds"`
	RollupRows    int64   `json:"rollup_rows"`
	// Reports are the timed queries, one entry per granularity.
	Reports []UsageReportLatency `json:"reports"`
	Error   string               `json:"error,omitempty"`
	// History are the timed history pages filtered by type, per ledger
	// size (historyfilter.go); HistoryError why they are missing.
	History      []HistoryFilterLatency `json:"history_filter,omitempty"`
	HistoryError string                 `json:"history_error,omitempty"`
}

// UsageReportLatency is one granularity's timed queries (each an HTTP
// round trip on loopback, answer read in full).
type UsageReportLatency struct {
	Granularity string  `json:"granularity"`
	Queries     int     `json:"queries"`
	Buckets     int     `json:"buckets_per_answer"`
	Bytes       int     `json:"bytes_per_answer"`
	P50Ms       float64 `json:"p50_ms"`
	P99Ms       float64 `json:"p99_ms"`
	MaxMs       float64 `json:"max_ms"`
}

// usageReport runs the usage-report scenario against the running creditd
// and its database: a fresh tenant and an allow customer through the API,
// rows ledger rows over usageReportDays days seeded with generate_series
// (consumptions of usageReportMetrics metrics paid entirely as overage, so
// the account's books still balance at 0), the rollup summed from them,
// then queries timed at hour and day granularity over the 30 days.
func (b *Bench) usageReport(ctx context.Context, rows int64, queries int) {
	out := &UsageReportResult{LedgerRows: rows, Metrics: usageReportMetrics, Days: usageReportDays}
	b.res.UsageReport = out
	fail := func(err error) { out.Error = err.Error(); logf("usage-report: %v", err) }
	api, c, pool, err := b.seedTarget(ctx, "usage", "usage-report")
	if err != nil {
		fail(err)
		return
	}
	defer pool.Close()

	end := time.Now().UTC().Truncate(24 * time.Hour)
	start := end.AddDate(0, 0, -usageReportDays)
	stepUS := end.Sub(start).Microseconds() / rows
	// Ids in order (a run prefix and the row number): the primary key
	// grows at its right edge as the persister's time-ordered ops make it
	// grow in the main, not by random page splits over 10M keys.
	prefix := strings.ReplaceAll(uuid.NewString()[:23], "-", "")
	logf("usage-report: seeding %d ledger rows over %d days into Postgres", rows, usageReportDays)
	t0 := time.Now()
	for from := int64(0); from < rows; from += usageReportChunk {
		to := min(from+usageReportChunk, rows) - 1
		if _, err := pool.Exec(ctx, `INSERT INTO ledger_entries
			(id, op_id, tenant_id, customer_id, environment, delta, type, billable_metric_key, cost_units,
			 overage_mc, created_at)
			SELECT u, u, $1, $2, 'live', 0, 'consumption', 'report_' || (g % $6), 1 + g % 5, 10 * (1 + g % 5),
				$3::timestamptz + make_interval(secs => g * $4::bigint / 1e6)
			FROM (SELECT g, ($5 || lpad(to_hex(g), 12, '0'))::uuid AS u
				FROM generate_series($7::bigint, $8::bigint) AS g) s`,
			c.TenantID, c.ID, start, stepUS, prefix, usageReportMetrics, from, to); err != nil {
			fail(fmt.Errorf("seed ledger: %w", err))
			return
		}
		if ctx.Err() != nil {
			fail(ctx.Err())
			return
		}
		logf("usage-report: %d/%d ledger rows", to+1, rows)
	}
	out.SeedSeconds = time.Since(t0).Seconds()
	// The rollup as migration 020's backfill builds it, for this customer.
	t0 = time.Now()
	rollupRows, err := rollUpCustomer(ctx, pool, c.ID)
	if err != nil {
		fail(err)
		return
	}
	out.RollupSeconds, out.RollupRows = time.Since(t0).Seconds(), rollupRows
	if _, err := pool.Exec(ctx, "ANALYZE ledger_entries, usage_hourly"); err != nil {
		fail(err)
		return
	}
	logf("usage-report: seeded in %.1f s, rollup of %d rows in %.1f s", out.SeedSeconds, out.RollupRows, out.RollupSeconds)

	for _, g := range []string{"hour", "day"} {
		q := url.Values{"granularity": {g}, "from": {start.Format(time.RFC3339)}, "to": {end.Format(time.RFC3339)}}
		path := "/v1/customers/usage-report/usage?" + q.Encode()
		lat := UsageReportLatency{Granularity: g}
		var took []time.Duration
		for i := -5; i < queries && ctx.Err() == nil; i++ { // 5 warm-up calls
			t := time.Now()
			ans, err := api.Expect(200, "GET", path, nil)
			d := time.Since(t)
			if err != nil {
				fail(err)
				return
			}
			if i < 0 {
				var rep struct {
					Data []struct {
						Buckets []struct{} `json:"buckets"`
					} `json:"data"`
				}
				if err := ans.Decode(&rep); err != nil {
					fail(err)
					return
				}
				lat.Buckets, lat.Bytes = 0, len(ans.Raw)
				for _, s := range rep.Data {
					lat.Buckets += len(s.Buckets)
				}
				continue
			}
			took = append(took, d)
		}
		if len(took) == 0 {
			fail(ctx.Err())
			return
		}
		lat.Queries = len(took)
		lat.P50Ms, lat.P99Ms, lat.MaxMs = percentileMs(took, 50), percentileMs(took, 99), percentileMs(took, 100)
		out.Reports = append(out.Reports, lat)
		logf("usage-report: %s: %d queries, %d buckets (%d B) per answer, p50 %.1f ms, p99 %.1f ms, max %.1f ms",
			g, lat.Queries, lat.Buckets, lat.Bytes, lat.P50Ms, lat.P99Ms, lat.MaxMs)
	}
	if out.History, err = b.historyFilter(ctx, api, pool, c.TenantID, queries); err != nil {
		out.HistoryError = err.Error()
		logf("usage-report: history filter: %v", err)
	}
}

// usageReportGoalRow is the goal table's row for the usage report.
func usageReportGoalRow(u *UsageReportResult) (now string, met *bool) {
	if u.Error != "" {
		return "failed: " + u.Error, boolp(false)
	}
	ok := len(u.Reports) > 0
	var parts []string
	for _, r := range u.Reports {
		parts = append(parts, fmt.Sprintf("%s: p50 %.1f ms, p99 %.1f ms (%d buckets)", r.Granularity, r.P50Ms, r.P99Ms, r.Buckets))
		ok = ok && time.Duration(r.P99Ms*float64(time.Millisecond)) <= usageReportGoal
	}
	return fmt.Sprintf("%s; %d ledger rows, %d days, %d metrics", strings.Join(parts, "; "), u.LedgerRows, u.Days, u.Metrics), boolp(ok)
}

// usageReportMarkdown is the report's section for the scenario.
func usageReportMarkdown(w func(string, ...any), u *UsageReportResult) {
	w("\n## Usage report (issue 15 item 5)\n\n")
	if u.Error != "" {
		w("Error: %s\n", u.Error)
		return
	}
	w("One customer with %d ledger rows (%d metrics over %d days) seeded into Postgres with generate_series (%.1f s); "+
		"the hourly rollup summed from them as migration 020's backfill does: %d rows in %.1f s. "+
		"Then `GET /v1/customers/{id}/usage` over the %d days, timed end to end over loopback (goal: <= %d ms):\n\n",
		u.LedgerRows, u.Metrics, u.Days, u.SeedSeconds, u.RollupRows, u.RollupSeconds, u.Days, usageReportGoal.Milliseconds())
	w("| granularity | queries | buckets per answer | bytes per answer | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|---|---|\n")
	for _, r := range u.Reports {
		w("| %s | %d | %d | %d | %.1f | %.1f | %.1f |\n", r.Granularity, r.Queries, r.Buckets, r.Bytes, r.P50Ms, r.P99Ms, r.MaxMs)
	}
	if len(u.History) > 0 || u.HistoryError != "" {
		historyFilterMarkdown(w, u.History, u.HistoryError)
	}
}
