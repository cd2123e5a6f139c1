package e2e

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestBoundsAtTheDoor states invariant 13 through the API: a grant or topup
// past engine.MaxLiveBlocks live blocks and a reservation past
// engine.MaxActiveReservations active reservations are 409 problems naming their field,
// a rule of more than engine.MaxTiers tiers is a 422 naming
// tier_config.tiers, and none of them changes the balance.
func TestBoundsAtTheDoor(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("bounds"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	for i := 0; i < engine.MaxLiveBlocks; i++ {
		a.grant(id, map[string]any{"credits": 1000, "metadata": map[string]any{"i": i}})
	}
	metric := "bounds.calls"
	wantStatus(t, a.post("/v1/metering-rules", map[string]any{"billable_metric_key": metric, "cost_type": "per_unit",
		"unit_cost": 1}), 201, "rule")
	for i := 0; i < engine.MaxActiveReservations; i++ {
		wantStatus(t, a.post("/v1/reservations", map[string]any{"customer_id": id, "billable_metric_key": metric,
			"estimated_units": 1}), 201, fmt.Sprint("reservation ", i))
	}
	balance := a.balance(id)

	tiers := make([]map[string]any, engine.MaxTiers+1)
	for i := range tiers {
		tiers[i] = map[string]any{"up_to": i + 1, "unit_cost": 1}
	}
	tiers[len(tiers)-1]["up_to"] = nil
	cust := url.PathEscape(id)
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		status     int
		typ, field string
	}{
		{"grant past the live-block cap", "/v1/customers/" + cust + "/credits/grant",
			map[string]any{"credits": 1, "source": "promotional", "reason": "one more"}, 409, "conflict", "credits"},
		{"topup past the live-block cap", "/v1/customers/" + cust + "/topups",
			map[string]any{"credits": 1, "payment_reference": "pay-1"}, 409, "conflict", "credits"},
		{"reservation past the reservation cap", "/v1/reservations",
			map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 1}, 409, "conflict", "customer_id"},
		{"rule past the tier cap", "/v1/metering-rules",
			map[string]any{"billable_metric_key": "bounds.tiers", "cost_type": "tiered",
				"tier_config": map[string]any{"mode": "graduated", "tiers": tiers}}, 422, "validation-error", "tier_config.tiers"},
	} {
		checkProblem(t, a.post(tc.path, tc.body), tc.status, tc.typ, tc.field, tc.name)
	}
	if got := a.balance(id); got != balance {
		t.Errorf("balance %d after refusals, want %d", got, balance)
	}
}
