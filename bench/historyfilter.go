package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// historyFilterSizes are the ledger sizes of the history-filter customers:
// a filtered page must cost the same at each (issue 31 item 6), which the
// report shows side by side. 100,000 makes a walk of the ledger stand out
// of loopback noise (a few ms at 10,000 entries, some 20 at 100,000).
var historyFilterSizes = []int64{1_000, 10_000, 100_000}

// historyFilterRare is how many of a history-filter customer's entries,
// its oldest, are adjustments: a filter on them finds its page only at
// the far end of the ledger, the walk migration 024's index removes.
const historyFilterRare = 50

// historyFilterPage is the page size of the timed history reads.
const historyFilterPage = 25

// historyFilterTypes are the filters timed: a type that fills the
// ledger, a rare one at its old end, one with no entries.
var historyFilterTypes = []string{"consumption", "adjustment", "expiry"}

// HistoryFilterLatency is one ledger size's timed history pages of one
// type filter (each an HTTP round trip on loopback, answer read in full).
type HistoryFilterLatency struct {
	Entries  int64   `json:"entries"`
	Type     string  `json:"type"`
	Matching int64   `json:"matching"`
	Queries  int     `json:"queries"`
	P50Ms    float64 `json:"p50_ms"`
	P99Ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
}

// historyFilter times GET /v1/customers/{id}/credits/history?type=... for
// one customer per size of historyFilterSizes, its ledger seeded straight
// into Postgres (consumptions, the oldest historyFilterRare adjustments;
// every entry of delta 0, so the customer's books stay at 0), queries
// timed pages per type after 5 warm-up calls.
func (b *Bench) historyFilter(ctx context.Context, api *API, pool *pgxpool.Pool, tenantID string, queries int) ([]HistoryFilterLatency, error) {
	var out []HistoryFilterLatency
	start := time.Now().UTC().Add(-48 * time.Hour).Truncate(time.Millisecond)
	for _, n := range historyFilterSizes {
		ext := fmt.Sprintf("history-%d", n)
		a, err := api.Expect(201, "POST", "/v1/customers", map[string]any{"external_id": ext},
			"Idempotency-Key", b.runID+"-"+ext)
		if err != nil {
			return nil, err
		}
		var c struct {
			ID string `json:"id"`
		}
		if err := a.Decode(&c); err != nil {
			return nil, err
		}
		if _, err := pool.Exec(ctx, `INSERT INTO ledger_entries
			(id, op_id, tenant_id, customer_id, environment, delta, type, created_at)
			SELECT gen_random_uuid(), gen_random_uuid(), $1, $2, 'live', 0,
				CASE WHEN g <= $4 THEN 'adjustment' ELSE 'consumption' END,
				$3::timestamptz + make_interval(secs => g)
			FROM generate_series(1, $5::bigint) AS g`, tenantID, c.ID, start, historyFilterRare, n); err != nil {
			return nil, fmt.Errorf("seed history of %d: %w", n, err)
		}
	}
	if _, err := pool.Exec(ctx, "ANALYZE ledger_entries"); err != nil {
		return nil, err
	}
	for _, n := range historyFilterSizes {
		for _, typ := range historyFilterTypes {
			q := url.Values{"type": {typ}, "limit": {fmt.Sprint(historyFilterPage)}}
			path := fmt.Sprintf("/v1/customers/history-%d/credits/history?%s", n, q.Encode())
			lat := HistoryFilterLatency{Entries: n, Type: typ, Matching: historyFilterMatching(n, typ)}
			var took []time.Duration
			for i := -5; i < queries && ctx.Err() == nil; i++ {
				t := time.Now()
				if _, err := api.Expect(200, "GET", path, nil); err != nil {
					return nil, err
				}
				if i >= 0 {
					took = append(took, time.Since(t))
				}
			}
			if len(took) == 0 {
				return nil, ctx.Err()
			}
			lat.Queries = len(took)
			lat.P50Ms, lat.P99Ms, lat.MaxMs = percentileMs(took, 50), percentileMs(took, 99), percentileMs(took, 100)
			out = append(out, lat)
			logf("usage-report: history of %d entries, type=%s (%d match): p50 %.2f ms, p99 %.2f ms",
				n, typ, lat.Matching, lat.P50Ms, lat.P99Ms)
		}
	}
	return out, nil
}

// historyFilterMatching is how many entries of a customer with n seeded
// entries match typ.
func historyFilterMatching(n int64, typ string) int64 {
	switch typ {
	case "consumption":
		return n - historyFilterRare
	case "adjustment":
		return historyFilterRare
	}
	return 0
}

// historyFlat says, per type filter, whether the p50 at the largest size
// stays within twice the p50 at the smallest plus 1 ms (loopback noise on
// a shared box), i.e. whether the filtered page's cost does not grow with
// the ledger; ok is false when any does.
func historyFlat(lines []HistoryFilterLatency) (summary string, ok bool) {
	type span struct{ small, large HistoryFilterLatency }
	byType := map[string]*span{}
	var order []string
	for _, l := range lines {
		s := byType[l.Type]
		if s == nil {
			s = &span{small: l, large: l}
			byType[l.Type] = s
			order = append(order, l.Type)
		}
		if l.Entries < s.small.Entries {
			s.small = l
		}
		if l.Entries > s.large.Entries {
			s.large = l
		}
	}
	ok = len(order) > 0
	var parts []string
	for _, typ := range order {
		s := byType[typ]
		flat := s.large.P50Ms <= 2*s.small.P50Ms+1
		ok = ok && flat
		word := "flat"
		if !flat {
			word = "grows"
		}
		parts = append(parts, fmt.Sprintf("type=%s p50 %.2f ms at %d entries, %.2f ms at %d (%s)",
			typ, s.small.P50Ms, s.small.Entries, s.large.P50Ms, s.large.Entries, word))
	}
	return strings.Join(parts, "; "), ok
}

// historyFilterMarkdown is the report's part for the filtered history.
func historyFilterMarkdown(w func(string, ...any), lines []HistoryFilterLatency, errText string) {
	w("\n### History filtered by type (issue 31 item 6)\n\n")
	if errText != "" {
		w("Error: %s\n", errText)
		return
	}
	summary, ok := historyFlat(lines)
	w("One customer per ledger size, its entries seeded into Postgres (consumptions, the oldest %d adjustments); "+
		"`GET /v1/customers/{id}/credits/history?type=...&limit=%d` timed end to end over loopback. "+
		"Flat (p50 at the larger size within 2x + 1 ms of the smaller): **%v**. %s.\n\n",
		historyFilterRare, historyFilterPage, ok, summary)
	w("| entries | type | matching | queries | p50 ms | p99 ms | max ms |\n|---|---|---|---|---|---|---|\n")
	for _, l := range lines {
		w("| %d | %s | %d | %d | %.2f | %.2f | %.2f |\n", l.Entries, l.Type, l.Matching, l.Queries, l.P50Ms, l.P99Ms, l.MaxMs)
	}
}
