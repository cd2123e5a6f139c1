package api

import (
	"encoding/json"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestPricingPayloads: each bad member of a new metric or rule is a 422
// naming it, the first wrong one first; a good body becomes the command.
func TestPricingPayloads(t *testing.T) {
	str := func(s string) *string { return &s }
	i64 := func(v int64) *int64 { return &v }
	tests := []struct {
		name  string
		check func() error
		field string
	}{
		{"metric key missing", func() error { _, err := (&metricPayload{Type: str("nope")}).toCreate(); return err }, "key"},
		{"metric key shape", func() error { _, err := (&metricPayload{Key: str("a b")}).toCreate(); return err }, "key"},
		{"metric type", func() error { _, err := (&metricPayload{Key: str("api"), Type: str("nope")}).toCreate(); return err }, "type"},
		{"metric default", func() error {
			_, err := (&metricPayload{Key: str("api"), Type: str("gauge"), DefaultValue: json.RawMessage(`{"cap":-1}`)}).toCreate()
			return err
		}, "default_value.cap"},
		{"metric name", func() error {
			_, err := (&metricPayload{Key: str("api"), Type: str("metered"), Name: str(" ")}).toCreate()
			return err
		}, "name"},
		{"metric good", func() error {
			m, err := (&metricPayload{Key: str("api"), Type: str("boolean")}).toCreate()
			if err == nil && (m.Name != "api" || string(m.DefaultValue) != `{"enabled":false}`) {
				t.Errorf("metric good: %+v", m)
			}
			return err
		}, ""},
		{"rule key missing", func() error { _, err := (&rulePayload{CostType: str("flat")}).toCommand(); return err }, "billable_metric_key"},
		{"rule cost type missing", func() error { _, err := (&rulePayload{BillableMetricKey: str("api")}).toCommand(); return err }, "cost_type"},
		{"rule flat without base", func() error {
			_, err := (&rulePayload{BillableMetricKey: str("api"), CostType: str("flat")}).toCommand()
			return err
		}, "base_cost"},
		{"rule good", func() error {
			r, err := (&rulePayload{BillableMetricKey: str("api"), CostType: str("flat"), BaseCost: i64(3)}).toCommand()
			if err == nil && (r.BaseCost != 3 || r.CostType != engine.CostFlat || r.TierConfig != nil) {
				t.Errorf("rule good: %+v", r)
			}
			return err
		}, ""},
	}
	for _, tt := range tests {
		wantCheck(t, tt.name, tt.check(), engine.KindValidation, tt.field, "")
	}
}
