package engine

import "testing"

// TestRuleTiersBounded: a tiered rule takes at most MaxTiers tiers; one
// more is a 422 naming tier_config.tiers (invariant 13: every charge prices
// through all of them).
func TestRuleTiersBounded(t *testing.T) {
	rule := func(n int) MeteringRule {
		tiers := make([]Tier, n)
		for i := range tiers {
			if i < n-1 {
				up := int64(i + 1)
				tiers[i].UpTo = &up
			}
			tiers[i].UnitCost = 1
		}
		return MeteringRule{CostType: CostTiered, TierConfig: &TierConfig{Mode: TierGraduated, Tiers: tiers}}
	}
	for _, tc := range []struct {
		tiers int
		ok    bool
	}{{1, true}, {MaxTiers, true}, {MaxTiers + 1, false}, {10 * MaxTiers, false}} {
		err := ValidateRule(rule(tc.tiers))
		if tc.ok && err != nil {
			t.Errorf("%d tiers: %v", tc.tiers, err)
		}
		if !tc.ok {
			if e, ok := AsError(err); !ok || e.Kind != KindValidation || e.Field != "tier_config.tiers" {
				t.Errorf("%d tiers: err %v, want a 422 naming tier_config.tiers", tc.tiers, err)
			}
		}
	}
	// The most tiers a rule may have still prices exactly.
	if c, err := Price(rule(MaxTiers), MaxTiers+50); err != nil || c != MaxTiers+50 {
		t.Errorf("price through %d tiers = %d, %v", MaxTiers, c, err)
	}
}
