package engine

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestItemShares pins the split of a multi-metric entry's one charge over
// its items (docs/decisions.md "Multi-metric usage in reports"): the charge
// pays the items in the listed order, the overage falls on the last ones,
// and each item's credits and overage add up to its cost.
func TestItemShares(t *testing.T) {
	t.Parallel()
	items := json.RawMessage(`[{"billable_metric_key":"a","units":3,"cost":30},{"billable_metric_key":"b","units":4,"cost":40}]`)
	metric := "a"
	tests := []struct {
		name  string
		entry LedgerEntry
		want  []ItemShare
	}{
		{"charge covers all", LedgerEntry{Type: EntryConsumption, Delta: -70, Metadata: Metadata{"items": items}},
			[]ItemShare{{"a", 3, 30, 0}, {"b", 4, 40, 0}}},
		{"overage on the last item", LedgerEntry{Type: EntryConsumption, Delta: -50, Metadata: Metadata{"items": items}},
			[]ItemShare{{"a", 3, 30, 0}, {"b", 4, 20, 20}}},
		{"overage reaches the first item", LedgerEntry{Type: EntryConsumption, Delta: -10, Metadata: Metadata{"items": items}},
			[]ItemShare{{"a", 3, 10, 20}, {"b", 4, 0, 40}}},
		{"nothing charged", LedgerEntry{Type: EntryConsumption, Delta: 0, Metadata: Metadata{"items": items}},
			[]ItemShare{{"a", 3, 0, 30}, {"b", 4, 0, 40}}},
		{"single-metric entry", LedgerEntry{Type: EntryConsumption, Delta: -70, BillableMetricKey: &metric, Metadata: Metadata{"items": items}}, nil},
		{"not a consumption", LedgerEntry{Type: EntryAdjustment, Delta: -70, Metadata: Metadata{"items": items}}, nil},
		{"no items", LedgerEntry{Type: EntryConsumption, Delta: -70}, nil},
		{"unreadable items", LedgerEntry{Type: EntryConsumption, Delta: -70, Metadata: Metadata{"items": json.RawMessage(`"x"`)}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ItemShares(tt.entry); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ItemShares = %+v, want %+v", got, tt.want)
			}
		})
	}
}
