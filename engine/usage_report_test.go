package engine

import (
	"testing"
	"time"
)

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
