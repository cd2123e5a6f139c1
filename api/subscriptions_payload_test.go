package api

import (
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestSubscriptionPayloads: each bad member of a subscription body is a 422
// naming it with its detail, the first wrong one first; a good body becomes
// the command.
func TestSubscriptionPayloads(t *testing.T) {
	str := func(s string) *string { return &s }
	yes := true
	tests := []struct {
		name   string
		check  func() error
		field  string
		detail string
	}{
		{"create ok", func() error {
			cmd, err := (&createSubscriptionPayload{CustomerID: str("c1"), PlanVariantID: str("v1")}).toCommand()
			if err == nil && (cmd.CustomerID != "c1" || cmd.PlanVariantID != "v1" || cmd.Metadata != nil) {
				t.Errorf("create ok: %+v", cmd)
			}
			return err
		}, "", ""},
		{"create customer missing", func() error { _, err := (&createSubscriptionPayload{}).toCommand(); return err }, "customer_id", "customer_id is required"},
		{"create customer empty", func() error {
			_, err := (&createSubscriptionPayload{CustomerID: str(""), PlanVariantID: str("v1")}).toCommand()
			return err
		}, "customer_id", "customer_id is required"},
		{"create variant missing", func() error { _, err := (&createSubscriptionPayload{CustomerID: str("c1")}).toCommand(); return err }, "plan_variant_id", "plan_variant_id is required"},
		{"create variant before metadata", func() error {
			_, err := (&createSubscriptionPayload{CustomerID: str("c1"), Metadata: engine.Metadata{"": []byte(`"x"`)}}).toCommand()
			return err
		}, "plan_variant_id", "plan_variant_id is required"},
		{"upgrade variant missing", func() error { _, err := (&upgradePayload{}).toCommand(); return err }, "plan_variant_id", "plan_variant_id is required"},
		{"upgrade variant empty", func() error { _, err := (&upgradePayload{PlanVariantID: str("")}).toCommand(); return err }, "plan_variant_id", "plan_variant_id is required"},
		{"upgrade ok", func() error {
			cmd, err := (&upgradePayload{PlanVariantID: str("v2")}).toCommand()
			if err == nil && cmd.PlanVariantID != "v2" {
				t.Errorf("upgrade ok: %+v", cmd)
			}
			return err
		}, "", ""},
		{"cancel", func() error {
			if (&cancelPayload{}).toCommand().AtPeriodEnd || !(&cancelPayload{AtPeriodEnd: &yes}).toCommand().AtPeriodEnd {
				t.Error("cancel: at_period_end not carried")
			}
			return nil
		}, "", ""},
	}
	for _, tc := range tests {
		wantCheck(t, tc.name, tc.check(), engine.KindValidation, tc.field, tc.detail)
	}
}
