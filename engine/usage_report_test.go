package engine

import (
	"errors"
	"testing"
	"time"
)

// TestParseUsageInput states the usage reports' door: bad input is a 400
// naming its field, never a read.
func TestParseUsageInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		in         UsageBucketsInput
		field      string
		g          UsageGranularity
		from, to   string
		wantMetric string
	}{
		{"day by default", UsageBucketsInput{From: "2026-01-01T00:00:00Z", To: "2026-02-01T00:00:00Z"}, "", UsageGranularityDay, "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", ""},
		{"hour, offset instants", UsageBucketsInput{From: "2026-01-01T02:00:00+02:00", To: "2026-01-01T05:00:00Z", Granularity: "hour", BillableMetricKey: "api_call"}, "", UsageGranularityHour, "2026-01-01T00:00:00Z", "2026-01-01T05:00:00Z", "api_call"},
		{"744 hours", UsageBucketsInput{From: "2026-01-01T00:00:00Z", To: "2026-02-01T00:00:00Z", Granularity: "hour"}, "", UsageGranularityHour, "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", ""},
		{"120 months", UsageBucketsInput{From: "2020-01-01T00:00:00Z", To: "2030-01-01T00:00:00Z", Granularity: "month"}, "", UsageGranularityMonth, "2020-01-01T00:00:00Z", "2030-01-01T00:00:00Z", ""},
		{"bad granularity", UsageBucketsInput{From: "2026-01-01T00:00:00Z", To: "2026-01-02T00:00:00Z", Granularity: "week"}, "granularity", "", "", "", ""},
		{"missing from", UsageBucketsInput{To: "2026-01-02T00:00:00Z"}, "from", "", "", "", ""},
		{"missing to", UsageBucketsInput{From: "2026-01-01T00:00:00Z"}, "to", "", "", "", ""},
		{"bad from", UsageBucketsInput{From: "yesterday", To: "2026-01-02T00:00:00Z"}, "from", "", "", "", ""},
		{"to before from", UsageBucketsInput{From: "2026-01-02T00:00:00Z", To: "2026-01-01T00:00:00Z"}, "to", "", "", "", ""},
		{"empty range", UsageBucketsInput{From: "2026-01-02T00:00:00Z", To: "2026-01-02T00:00:00Z"}, "to", "", "", "", ""},
		{"from off the day", UsageBucketsInput{From: "2026-01-01T01:00:00Z", To: "2026-01-03T00:00:00Z"}, "from", "", "", "", ""},
		{"to off the hour", UsageBucketsInput{From: "2026-01-01T00:00:00Z", To: "2026-01-01T03:30:00Z", Granularity: "hour"}, "to", "", "", "", ""},
		{"to off the month", UsageBucketsInput{From: "2026-01-01T00:00:00Z", To: "2026-03-02T00:00:00Z", Granularity: "month"}, "to", "", "", "", ""},
		{"745 hours", UsageBucketsInput{From: "2026-01-01T00:00:00Z", To: "2026-02-01T01:00:00Z", Granularity: "hour"}, "to", "", "", "", ""},
		{"367 days", UsageBucketsInput{From: "2026-01-01T00:00:00Z", To: "2027-01-03T00:00:00Z"}, "to", "", "", "", ""},
		{"121 months", UsageBucketsInput{From: "2020-01-01T00:00:00Z", To: "2030-02-01T00:00:00Z", Granularity: "month"}, "to", "", "", "", ""},
		{"bad metric key", UsageBucketsInput{From: "2026-01-01T00:00:00Z", To: "2026-01-02T00:00:00Z", BillableMetricKey: "a b\x00"}, "billable_metric_key", "", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q, err := parseUsageInput(Scope{}, tc.in)
			if tc.field != "" {
				var e *Error
				if !errors.As(err, &e) || e.Kind != KindBadRequest || e.Field != tc.field {
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

// TestUsageSeries groups rollup rows per metric with bucket ends and
// saturating totals.
func TestUsageSeries(t *testing.T) {
	t.Parallel()
	jan := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	feb := time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	got := usageSeries([]UsageRow{
		{BillableMetricKey: "a", Start: jan, Units: 1<<63 - 1, Cost: 2, Count: 1},
		{BillableMetricKey: "a", Start: feb, Units: 5, Cost: 3, Count: 2},
		{BillableMetricKey: "b", Start: feb, Units: 7, Cost: 0, Count: 1},
	}, UsageGranularityMonth)
	if len(got) != 2 || got[0].Units != 1<<63-1 || got[0].Cost != 5 || got[0].Count != 3 || len(got[0].Buckets) != 2 ||
		!got[0].Buckets[0].End.Equal(feb) || !got[0].Buckets[1].End.Equal(time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)) ||
		got[1].BillableMetricKey != "b" || got[1].Units != 7 {
		t.Fatalf("series %+v", got)
	}
	if empty := usageSeries(nil, UsageGranularityDay); empty == nil || len(empty) != 0 {
		t.Fatalf("no rows: %#v, want an empty list", empty)
	}
}
