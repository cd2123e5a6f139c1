package engine

import "fmt"

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
