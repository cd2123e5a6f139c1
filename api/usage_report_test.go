package api

import (
	"errors"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// TestUsageParams states the usage reports' door: bad input is a 400
// naming its field, never a read.
func TestUsageParams(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		in         usageParams
		field      string
		g          engine.UsageGranularity
		from, to   string
		wantMetric string
	}{
		{"day by default", usageParams{From: "2026-01-01T00:00:00Z", To: "2026-02-01T00:00:00Z"}, "", engine.UsageGranularityDay, "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", ""},
		{"hour, offset instants", usageParams{From: "2026-01-01T02:00:00+02:00", To: "2026-01-01T05:00:00Z", Granularity: "hour", BillableMetricKey: "api_call"}, "", engine.UsageGranularityHour, "2026-01-01T00:00:00Z", "2026-01-01T05:00:00Z", "api_call"},
		{"744 hours", usageParams{From: "2026-01-01T00:00:00Z", To: "2026-02-01T00:00:00Z", Granularity: "hour"}, "", engine.UsageGranularityHour, "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", ""},
		{"120 months", usageParams{From: "2020-01-01T00:00:00Z", To: "2030-01-01T00:00:00Z", Granularity: "month"}, "", engine.UsageGranularityMonth, "2020-01-01T00:00:00Z", "2030-01-01T00:00:00Z", ""},
		{"bad granularity", usageParams{From: "2026-01-01T00:00:00Z", To: "2026-01-02T00:00:00Z", Granularity: "week"}, "granularity", "", "", "", ""},
		{"missing from", usageParams{To: "2026-01-02T00:00:00Z"}, "from", "", "", "", ""},
		{"missing to", usageParams{From: "2026-01-01T00:00:00Z"}, "to", "", "", "", ""},
		{"bad from", usageParams{From: "yesterday", To: "2026-01-02T00:00:00Z"}, "from", "", "", "", ""},
		{"to before from", usageParams{From: "2026-01-02T00:00:00Z", To: "2026-01-01T00:00:00Z"}, "to", "", "", "", ""},
		{"empty range", usageParams{From: "2026-01-02T00:00:00Z", To: "2026-01-02T00:00:00Z"}, "to", "", "", "", ""},
		{"from off the day", usageParams{From: "2026-01-01T01:00:00Z", To: "2026-01-03T00:00:00Z"}, "from", "", "", "", ""},
		{"to off the hour", usageParams{From: "2026-01-01T00:00:00Z", To: "2026-01-01T03:30:00Z", Granularity: "hour"}, "to", "", "", "", ""},
		{"to off the month", usageParams{From: "2026-01-01T00:00:00Z", To: "2026-03-02T00:00:00Z", Granularity: "month"}, "to", "", "", "", ""},
		{"745 hours", usageParams{From: "2026-01-01T00:00:00Z", To: "2026-02-01T01:00:00Z", Granularity: "hour"}, "to", "", "", "", ""},
		{"367 days", usageParams{From: "2026-01-01T00:00:00Z", To: "2027-01-03T00:00:00Z"}, "to", "", "", "", ""},
		{"121 months", usageParams{From: "2020-01-01T00:00:00Z", To: "2030-02-01T00:00:00Z", Granularity: "month"}, "to", "", "", "", ""},
		{"bad metric key", usageParams{From: "2026-01-01T00:00:00Z", To: "2026-01-02T00:00:00Z", BillableMetricKey: "a b\x00"}, "billable_metric_key", "", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q, err := tc.in.toQuery()
			if tc.field != "" {
				var e *engine.Error
				if !errors.As(err, &e) || e.Kind != engine.KindBadRequest || e.Field != tc.field {
					t.Fatalf("error %v, want a 400 naming %s", err, tc.field)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			from, _ := time.Parse(time.RFC3339, tc.from)
			to, _ := time.Parse(time.RFC3339, tc.to)
			if q.Granularity != tc.g || !q.From.Equal(from) || !q.To.Equal(to) {
				t.Fatalf("query %+v, want %s [%s, %s)", q, tc.g, tc.from, tc.to)
			}
			if got := ""; q.BillableMetricKey != nil {
				got = *q.BillableMetricKey
				if got != tc.wantMetric {
					t.Fatalf("metric %q, want %q", got, tc.wantMetric)
				}
			} else if tc.wantMetric != "" {
				t.Fatalf("no metric, want %q", tc.wantMetric)
			}
		})
	}
}
