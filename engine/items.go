package engine

import (
	"encoding/json"
	"fmt"
)

// ItemUnits is the units member of one kind of multi-metric item: its name,
// the least value it takes and the error below it (a consume's units <= 0
// is a 400, docs/spec/interface.md Errors; a reservation's estimated_units and a commit's
// actual_units are 422 constraint violations).
type ItemUnits struct {
	name  string
	min   int64
	below func(field, detail string) *Error
	// detail, when set, is the refusal's text in place of "<field> must
	// be >= <min>" (the API's documented wording for that member).
	detail string
}

// The units members of the money requests, of their single-metric form and
// of each multi-metric item alike.
var (
	ConsumeItemUnits = ItemUnits{name: "units", min: 1, below: BadRequest}
	ReserveItemUnits = ItemUnits{name: "estimated_units", min: 1, below: Invalid}
	CommitItemUnits  = ItemUnits{name: "actual_units", min: 0, below: Invalid}
	// ExtendUnits is an extend's additional_units (single-metric reservations only).
	ExtendUnits = ItemUnits{name: "additional_units", min: 1, below: Invalid}
	// PartialCommitUnits is a partial commit's actual_units: it charges
	// something and leaves the rest of the reservation open.
	PartialCommitUnits = ItemUnits{name: "actual_units", min: 1, below: Invalid,
		detail: "a partial commit (final: false) needs actual_units >= 1"}
	// GrantAmount is the credits of a grant, a top-up and a plan's grant.
	GrantAmount = ItemUnits{name: "credits", min: 1, below: Invalid}
	// AccumulationCap is a plan grant's accumulation_cap, when given: the
	// grant script's cap.
	AccumulationCap = ItemUnits{name: "accumulation_cap", min: 1, below: Invalid, detail: "accumulation_cap must be >= 1, or null"}
	// GaugeAmount is a gauge increment's or decrement's amount.
	GaugeAmount = ItemUnits{name: "amount", min: 1, below: BadRequest, detail: "amount must be an integer >= 1"}
)

// Check refuses units below u.min with u's error naming prefix+u.name, the
// one place the rule lives: the single-metric form (prefix "") and each
// item (prefix "items[i].") of a consume and a reservation use it, and the
// scripts' BADARG guards are held to it (lua/guards_test.go).
func (u ItemUnits) Check(prefix string, units int64) error {
	if units < u.min {
		if u.detail != "" {
			return u.below(prefix+u.name, u.detail)
		}
		return u.below(prefix+u.name, fmt.Sprintf("%s%s must be >= %d", prefix, u.name, u.min))
	}
	return nil
}

// CheckAdjustDelta refuses an adjust's delta of 0: a positive delta grants
// (grant.lua), a negative one debits its opposite (debit.lua), and each
// script refuses an amount below 1.
func CheckAdjustDelta(delta int64) error {
	if delta == 0 {
		return Invalid("delta", "delta is required and must not be 0")
	}
	return nil
}

// CheckRolloverPercentage refuses a plan grant's rollover_percentage
// outside 0..100, the share of unused credit rollover.lua carries over.
func CheckRolloverPercentage(p int64) error {
	if p < 0 || p > 100 {
		return Invalid("rollover_percentage", "rollover_percentage must be between 0 and 100")
	}
	return nil
}

// CheckItemCount refuses a multi-metric consume, reservation or commit of n items
// outside 1..MaxConsumeItems: the scripts price every item in one call,
// and the multi scripts refuse any other count (lua/guards_test.go).
func CheckItemCount(n int) error {
	if n < 1 || n > MaxConsumeItems {
		return BadRequest("items", fmt.Sprintf("items must hold 1 to %d items", MaxConsumeItems))
	}
	return nil
}

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
	if err := u.Check(field, *units); err != nil {
		return "", 0, err
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
