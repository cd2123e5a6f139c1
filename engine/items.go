package engine

import (
	"encoding/json"
	"fmt"
)

// ItemUnits is the units member of one kind of multi-metric item: its name,
// the least value it takes and the error below it (a consume's units <= 0
// is a 400, docs/spec/interface.md Errors; a hold's estimated_units and a commit's
// actual_units are 422 constraint violations).
type ItemUnits struct {
	name  string
	min   int64
	below func(field, detail string) *Error
}

// The units members of the multi-metric items.
var (
	ConsumeItemUnits = ItemUnits{name: "units", min: 1, below: BadRequest}
	ReserveItemUnits = ItemUnits{name: "estimated_units", min: 1, below: Invalid}
	CommitItemUnits  = ItemUnits{name: "actual_units", min: 0, below: Invalid}
)

// CheckItem validates items[i] of a multi-metric request: a metric given
// and one line, units given and at least u.min, and a metric no earlier
// item named (seen, which it extends). It returns the metric and units.
func CheckItem(i int, metric *string, units *int64, u ItemUnits, seen map[string]bool) (string, int64, error) {
	field := fmt.Sprintf("items[%d].", i)
	if metric == nil || *metric == "" {
		return "", 0, Invalid(field+"billable_metric_key", field+"billable_metric_key is required")
	}
	if units == nil {
		return "", 0, Invalid(field+u.name, field+u.name+" is required")
	}
	if *units < u.min {
		return "", 0, u.below(field+u.name, fmt.Sprintf("%s%s must be >= %d", field, u.name, u.min))
	}
	if err := CheckLine(field+"billable_metric_key", *metric); err != nil {
		return "", 0, err
	}
	if seen[*metric] {
		return "", 0, BadRequest(field+"billable_metric_key", "the metric appears in an earlier item; give its "+u.name+" once")
	}
	seen[*metric] = true
	return *metric, *units, nil
}

// ItemShare is what one item of a multi-metric consumption entry paid, in
// millicredits: CreditsMC from the balance and OverageMC beyond it (they
// add up to the item's cost).
type ItemShare struct {
	Metric    string
	Units     int64
	CreditsMC int64
	OverageMC int64
}

// ItemShares splits the one consumption entry of a multi-metric consume or
// commit (no metric of its own, its items in metadata.items) per item, so a
// report that sums by metric counts each item under its own metric. The
// entry records one charge for the call; it pays the items in the order
// the call listed them, so the overage falls on the last ones
// (docs/decisions.md "Multi-metric usage in reports"; persist's
// itemSharesSQL applies the same rule in SQL). Any other entry, or items
// that cannot be read, gives nil.
func ItemShares(e LedgerEntry) []ItemShare {
	if e.Type != EntryConsumption || e.BillableMetricKey != nil {
		return nil
	}
	raw, ok := e.Metadata["items"]
	if !ok {
		return nil
	}
	var items []UsageItem
	if json.Unmarshal(raw, &items) != nil {
		return nil
	}
	left := max(-e.Delta, 0) // the charge the balance paid
	out := make([]ItemShare, 0, len(items))
	for _, it := range items {
		paid := min(left, max(it.Cost, 0))
		left -= paid
		out = append(out, ItemShare{Metric: it.Metric, Units: it.Units, CreditsMC: paid, OverageMC: it.Cost - paid})
	}
	return out
}
