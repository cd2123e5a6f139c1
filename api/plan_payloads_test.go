package api

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestCataloguePayloads: each bad member of a plan, variant, plan grant or
// entitlement body is a 422 naming it with its detail, the first wrong one
// first; a good body becomes the command.
func TestCataloguePayloads(t *testing.T) {
	str := func(s string) *string { return &s }
	tests := []struct {
		name   string
		check  func() error
		field  string
		detail string
	}{
		{"plan ok", func() error {
			cmd, err := (&CreatePlanPayload{Name: str("Pro")}).ToCommand()
			if err == nil && (cmd.Name != "Pro" || cmd.IsDefault) {
				t.Errorf("plan ok: %+v", cmd)
			}
			return err
		}, "", ""},
		{"plan name missing", func() error { _, err := (&CreatePlanPayload{}).ToCommand(); return err }, "name", "name is required"},
		{"plan name before metadata", func() error {
			_, err := (&CreatePlanPayload{Metadata: engine.Metadata{"": []byte(`"x"`)}}).ToCommand()
			return err
		}, "name", "name is required"},
		{"plan name blank", func() error { _, err := (&CreatePlanPayload{Name: str("  ")}).ToCommand(); return err }, "name", "name must not be empty"},
		{"plan name 200", func() error {
			_, err := (&CreatePlanPayload{Name: str(strings.Repeat("é", 200))}).ToCommand()
			return err
		}, "", ""},
		{"plan name 201", func() error {
			_, err := (&CreatePlanPayload{Name: str(strings.Repeat("n", 201))}).ToCommand()
			return err
		}, "name", "name is longer than 200 characters"},
		{"patch empty", func() error {
			cmd, err := (&UpdatePlanPayload{}).ToCommand()
			if err == nil && (cmd.Name != nil || cmd.Status != nil || cmd.IsDefault != nil || cmd.Metadata != nil) {
				t.Errorf("patch empty: %+v", cmd)
			}
			return err
		}, "", ""},
		{"patch blank name", func() error { _, err := (&UpdatePlanPayload{Name: str("")}).ToCommand(); return err }, "name", "name must not be empty"},
		{"patch bad status", func() error { _, err := (&UpdatePlanPayload{Status: str("archived")}).ToCommand(); return err }, "status", "status must be active or retired"},
		{"patch name before status", func() error {
			_, err := (&UpdatePlanPayload{Name: str(" "), Status: str("archived")}).ToCommand()
			return err
		}, "name", "name must not be empty"},
		{"patch retired", func() error {
			cmd, err := (&UpdatePlanPayload{Status: str("retired")}).ToCommand()
			if err == nil && (cmd.Status == nil || *cmd.Status != engine.PlanRetired) {
				t.Errorf("patch retired: %+v", cmd)
			}
			return err
		}, "", ""},
		{"variant ok", func() error {
			_, err := (&CreateVariantPayload{BillingCycle: ptrOf("monthly")}).ToCommand()
			return err
		}, "", ""},
		{"variant every cycle", func() error {
			_, err := (&CreateVariantPayload{BillingCycle: ptrOf("one_time"), TrialDays: ptrOf(0), BillingMode: ptrOf("postpaid"), RenewalDueDays: ptrOf(0), GracePeriodDays: ptrOf(engine.MaxVariantDays)}).ToCommand()
			return err
		}, "", ""},
		{"variant cycle missing", func() error { _, err := (&CreateVariantPayload{}).ToCommand(); return err }, "billing_cycle", ""},
		{"variant cycle bad", func() error { _, err := (&CreateVariantPayload{BillingCycle: ptrOf("hourly")}).ToCommand(); return err }, "billing_cycle", ""},
		{"variant trial negative", func() error {
			_, err := (&CreateVariantPayload{BillingCycle: ptrOf("daily"), TrialDays: ptrOf(-1)}).ToCommand()
			return err
		}, "trial_days", ""},
		{"variant mode bad", func() error {
			_, err := (&CreateVariantPayload{BillingCycle: ptrOf("daily"), BillingMode: ptrOf("free")}).ToCommand()
			return err
		}, "billing_mode", ""},
		{"variant renewal negative", func() error {
			_, err := (&CreateVariantPayload{BillingCycle: ptrOf("daily"), RenewalDueDays: ptrOf(-1)}).ToCommand()
			return err
		}, "renewal_due_days", ""},
		{"variant grace too long", func() error {
			_, err := (&CreateVariantPayload{BillingCycle: ptrOf("daily"), GracePeriodDays: ptrOf(engine.MaxVariantDays + 1)}).ToCommand()
			return err
		}, "grace_period_days", ""},
		{"variant patch bad status", func() error { _, err := (&UpdateVariantPayload{Status: ptrOf("gone")}).ToCommand(); return err }, "status", ""},
		{"variant patch trial negative", func() error { _, err := (&UpdateVariantPayload{TrialDays: ptrOf(-2)}).ToCommand(); return err }, "trial_days", ""},
		{"entitlement ok", func() error {
			_, err := (&entitlementPayload{BillableMetricKey: ptrOf("seats"), Value: json.RawMessage(`{"cap":1}`)}).toCommand()
			return err
		}, "", ""},
		{"entitlement key missing", func() error { _, err := (&entitlementPayload{Value: json.RawMessage(`{}`)}).toCommand(); return err }, "billable_metric_key", ""},
		{"entitlement value missing", func() error {
			_, err := (&entitlementPayload{BillableMetricKey: ptrOf("seats")}).toCommand()
			return err
		}, "value", ""},
		{"entitlement value null", func() error {
			_, err := (&entitlementPayload{BillableMetricKey: ptrOf("seats"), Value: json.RawMessage(`null`)}).toCommand()
			return err
		}, "value", ""},
	}
	for _, tc := range tests {
		wantCheck(t, tc.name, tc.check(), engine.KindValidation, tc.field, tc.detail)
	}
}

func ptrOf[T any](v T) *T { return &v }

// TestPlanGrantPayload: each bad member of a plan grant body is a 422
// naming it, the first wrong one first.
func TestPlanGrantPayload(t *testing.T) {
	ok := func() PlanGrantPayload {
		return PlanGrantPayload{Credits: ptrOf[int64](1000), GrantInterval: ptrOf("monthly"), GrantType: ptrOf("recurring")}
	}
	tests := []struct {
		name  string
		edit  func(*PlanGrantPayload)
		field string
	}{
		{"minimal", func(*PlanGrantPayload) {}, ""},
		{"every field", func(in *PlanGrantPayload) {
			in.Source, in.ExpiresAfterSeconds, in.AccumulationCap = ptrOf("promotional"), ptrOf[int64](1), ptrOf[int64](1)
			in.RolloverPercentage, in.MaxRolloverCycles = ptrOf(100), ptrOf(0)
		}, ""},
		{"credits missing", func(in *PlanGrantPayload) { in.Credits = nil }, "credits"},
		{"credits 0", func(in *PlanGrantPayload) { in.Credits = ptrOf[int64](0) }, "credits"},
		{"credits negative", func(in *PlanGrantPayload) { in.Credits = ptrOf[int64](-5) }, "credits"},
		{"interval missing", func(in *PlanGrantPayload) { in.GrantInterval = nil }, "grant_interval"},
		{"interval empty", func(in *PlanGrantPayload) { in.GrantInterval = ptrOf("") }, "grant_interval"},
		{"interval too short", func(in *PlanGrantPayload) { in.GrantInterval = ptrOf("PT4M59S") }, "grant_interval"},
		{"interval PT5M", func(in *PlanGrantPayload) { in.GrantInterval = ptrOf("PT5M") }, ""},
		{"type missing", func(in *PlanGrantPayload) { in.GrantType = nil }, "grant_type"},
		{"type unknown", func(in *PlanGrantPayload) { in.GrantType = ptrOf("forever") }, "grant_type"},
		{"recurring on_activation", func(in *PlanGrantPayload) { in.GrantInterval = ptrOf("on_activation") }, "grant_type"},
		{"one_time on_activation", func(in *PlanGrantPayload) {
			in.GrantInterval, in.GrantType = ptrOf("on_activation"), ptrOf("one_time")
		}, ""},
		{"trial on_activation", func(in *PlanGrantPayload) {
			in.GrantInterval, in.GrantType = ptrOf("on_activation"), ptrOf("trial")
		}, ""},
		{"source plan_grant", func(in *PlanGrantPayload) { in.Source = ptrOf("plan_grant") }, ""},
		{"source topup", func(in *PlanGrantPayload) { in.Source = ptrOf("topup") }, "source"},
		{"source unknown", func(in *PlanGrantPayload) { in.Source = ptrOf("gift") }, "source"},
		{"expires 0", func(in *PlanGrantPayload) { in.ExpiresAfterSeconds = ptrOf[int64](0) }, "expires_after_seconds"},
		{"expires too long", func(in *PlanGrantPayload) { in.ExpiresAfterSeconds = ptrOf[int64](engine.MaxGrantSeconds + 1) }, "expires_after_seconds"},
		{"cap 0", func(in *PlanGrantPayload) { in.AccumulationCap = ptrOf[int64](0) }, "accumulation_cap"},
		{"rollover -1", func(in *PlanGrantPayload) { in.RolloverPercentage = ptrOf(-1) }, "rollover_percentage"},
		{"rollover 101", func(in *PlanGrantPayload) { in.RolloverPercentage = ptrOf(101) }, "rollover_percentage"},
		{"rollover 0", func(in *PlanGrantPayload) { in.RolloverPercentage = ptrOf(0) }, ""},
		{"cycles -1", func(in *PlanGrantPayload) { in.MaxRolloverCycles = ptrOf(-1) }, "max_rollover_cycles"},
	}
	for _, tc := range tests {
		in := ok()
		tc.edit(&in)
		_, err := in.ToCommand()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v, want ok", tc.name, err)
			}
			continue
		}
		if e, ok := engine.AsError(err); !ok || e.Kind != engine.KindValidation || e.Field != tc.field {
			t.Errorf("%s: %v, want 422 naming %s", tc.name, err, tc.field)
		}
	}
}
