// Pricing: the billable metric and metering rule types, Price (what units cost
// under a rule) and rule validation. Pure functions; the Lua price() in
// lua/prelude/pricing.lua is their twin, checked by lua/price_test.go.

package engine

import (
	"encoding/json"
	"math"
	"time"

	"github.com/google/uuid"
)

// MetricType is the entitlement type of a billable metric.
type MetricType string

// Metric types of docs/spec/interface.md "Entitlement checks".
const (
	MetricMetered MetricType = "metered"
	MetricBoolean MetricType = "boolean"
	MetricGauge   MetricType = "gauge"
	MetricStatic  MetricType = "static"
)

// Valid reports whether t is one of the four types.
func (t MetricType) Valid() bool {
	return t == MetricMetered || t == MetricBoolean || t == MetricGauge || t == MetricStatic
}

// BillableMetric is something a tenant meters or entitles (docs/spec/addendum.md §4).
// Metrics are per tenant and environment.
type BillableMetric struct {
	ID           uuid.UUID       `json:"id"`
	TenantID     uuid.UUID       `json:"tenant_id"`
	Environment  Environment     `json:"environment"`
	Key          string          `json:"key"`
	Name         string          `json:"name"`
	Type         MetricType      `json:"type"`
	DefaultValue json.RawMessage `json:"default_value"`
	Metadata     Metadata        `json:"metadata"`
	CreatedAt    time.Time       `json:"created_at"`
	UpdatedAt    time.Time       `json:"updated_at"`
}

// CostType is how a metering rule prices a use.
type CostType string

// Cost types of docs/spec/interface.md "Metering rule".
const (
	CostFlat    CostType = "flat"
	CostPerUnit CostType = "per_unit"
	CostTiered  CostType = "tiered"
)

// TierMode says how tiers combine.
type TierMode string

// Tier modes (docs/spec/addendum.md §12).
const (
	TierGraduated TierMode = "graduated"
	TierVolume    TierMode = "volume"
)

// Tier is one price band; UpTo is inclusive and nil only on the last tier.
type Tier struct {
	UpTo     *int64 `json:"up_to"`
	UnitCost int64  `json:"unit_cost"`
	FlatCost int64  `json:"flat_cost"`
}

// TierConfig is a tiered rule's bands.
type TierConfig struct {
	Mode  TierMode `json:"mode"`
	Tiers []Tier   `json:"tiers"`
}

// MeteringRule prices one billable metric. Rules are per tenant and
// environment; one is active per metric (EffectiveUntil nil).
type MeteringRule struct {
	ID                uuid.UUID   `json:"id"`
	TenantID          uuid.UUID   `json:"tenant_id"`
	Environment       Environment `json:"environment"`
	BillableMetricKey string      `json:"billable_metric_key"`
	CostType          CostType    `json:"cost_type"`
	BaseCost          int64       `json:"base_cost"`
	UnitCost          int64       `json:"unit_cost"`
	TierConfig        *TierConfig `json:"tier_config"`
	EffectiveFrom     time.Time   `json:"effective_from"`
	EffectiveUntil    *time.Time  `json:"effective_until"`
	Metadata          Metadata    `json:"metadata"`
	CreatedAt         time.Time   `json:"created_at"`
	UpdatedAt         time.Time   `json:"updated_at"`
}

// Price is the cost in millicredits of units under rule r: flat charges
// BaseCost once per call; per_unit UnitCost x units; tiered per its mode
// (docs/spec/addendum.md §12: graduated prices each tier's slice and adds the flat_cost of
// every tier reached; volume prices every unit at the one tier the total
// falls in, plus that tier's flat_cost). Units must be >= 1. It returns
// ErrOverflow when the cost does not fit in int64. The Lua scripts implement
// the same function; a test runs both on the same cases.
func Price(r MeteringRule, units int64) (int64, error) {
	if units < 1 {
		return 0, BadRequest("units", "units must be >= 1")
	}
	switch r.CostType {
	case CostFlat:
		return r.BaseCost, nil
	case CostPerUnit:
		return mulChecked(r.UnitCost, units)
	case CostTiered:
		if r.TierConfig == nil || len(r.TierConfig.Tiers) == 0 {
			return 0, &Error{Kind: KindInternal, Detail: "tiered rule without tiers"}
		}
		if r.TierConfig.Mode == TierVolume {
			return priceVolume(r.TierConfig.Tiers, units)
		}
		return priceGraduated(r.TierConfig.Tiers, units)
	}
	return 0, &Error{Kind: KindInternal, Detail: "unknown cost type"}
}

func priceVolume(tiers []Tier, units int64) (int64, error) {
	t := tiers[len(tiers)-1]
	for _, cand := range tiers {
		if cand.UpTo == nil || units <= *cand.UpTo {
			t = cand
			break
		}
	}
	c, err := mulChecked(t.UnitCost, units)
	if err != nil {
		return 0, err
	}
	return addOrOverflow(c, t.FlatCost)
}

func priceGraduated(tiers []Tier, units int64) (int64, error) {
	var total, below int64
	for _, t := range tiers {
		if units <= below {
			break
		}
		top := units
		if t.UpTo != nil && *t.UpTo < units {
			top = *t.UpTo
		}
		slice := top - below
		if slice <= 0 {
			continue
		}
		c, err := mulChecked(t.UnitCost, slice)
		if err != nil {
			return 0, err
		}
		if total, err = addOrOverflow(total, c); err != nil {
			return 0, err
		}
		if total, err = addOrOverflow(total, t.FlatCost); err != nil {
			return 0, err
		}
		below = top
	}
	return total, nil
}

func mulChecked(a, b int64) (int64, error) {
	if a == 0 || b == 0 {
		return 0, nil
	}
	if a < 0 || b < 0 || a > math.MaxInt64/b {
		return 0, ErrOverflow
	}
	return a * b, nil
}

func addOrOverflow(a, b int64) (int64, error) {
	s, ok := AddChecked(a, b)
	if !ok {
		return 0, ErrOverflow
	}
	return s, nil
}

// MaxTiers bounds the tiers of one rule (invariant 13): every consume,
// check and reservation prices through all of them inside its script, and
// 100 keeps that well under the 1 ms per script call (bench "worst").
const MaxTiers = 100

// ValidateRule checks a rule's pricing fields, naming the wrong field
// (docs/spec/interface.md Metering rules; docs/spec/addendum.md §12 for tiers).
func ValidateRule(r MeteringRule) error {
	switch r.CostType {
	case CostFlat, CostPerUnit, CostTiered:
	case "":
		return Invalid("cost_type", "cost_type is required")
	default:
		return Invalid("cost_type", "cost_type must be flat, per_unit or tiered")
	}
	if r.BaseCost < 0 {
		return Invalid("base_cost", "base_cost must be >= 0")
	}
	if r.UnitCost < 0 {
		return Invalid("unit_cost", "unit_cost must be >= 0")
	}
	if r.CostType == CostPerUnit && r.UnitCost <= 0 {
		return Invalid("unit_cost", "unit_cost is required and must be > 0 for per_unit")
	}
	if r.CostType != CostTiered {
		return nil
	}
	tc := r.TierConfig
	if tc == nil {
		return Invalid("tier_config", "tier_config is required for tiered")
	}
	if tc.Mode != TierGraduated && tc.Mode != TierVolume {
		return Invalid("tier_config.mode", "tier_config.mode must be graduated or volume")
	}
	if len(tc.Tiers) == 0 {
		return Invalid("tier_config.tiers", "tier_config.tiers must not be empty")
	}
	if len(tc.Tiers) > MaxTiers {
		return Invalid("tier_config.tiers", "tier_config.tiers may hold at most 100 tiers")
	}
	var prev int64
	for i, t := range tc.Tiers {
		last := i == len(tc.Tiers)-1
		switch {
		case last && t.UpTo != nil:
			return Invalid("tier_config.tiers.up_to", "the last tier's up_to must be null")
		case !last && t.UpTo == nil:
			return Invalid("tier_config.tiers.up_to", "only the last tier's up_to may be null")
		case !last && *t.UpTo <= prev:
			return Invalid("tier_config.tiers.up_to", "up_to must be >= 1 and increase from tier to tier")
		}
		if t.UnitCost < 0 {
			return Invalid("tier_config.tiers.unit_cost", "unit_cost must be >= 0")
		}
		if t.FlatCost < 0 {
			return Invalid("tier_config.tiers.flat_cost", "flat_cost must be >= 0")
		}
		if !last {
			prev = *t.UpTo
		}
	}
	return nil
}
