package engine

import (
	"encoding/json"
	"testing"
	"time"
)

func TestParseGrantInterval(t *testing.T) {
	tests := []struct {
		in      string
		keyword string
		every   time.Duration
		bad     bool
	}{
		{in: "on_activation", keyword: "on_activation"},
		{in: "billing_period", keyword: "billing_period"},
		{in: "daily", keyword: "daily"},
		{in: "weekly", keyword: "weekly"},
		{in: "monthly", keyword: "monthly"},
		{in: "PT5M", every: 5 * time.Minute},
		{in: "PT300S", every: 5 * time.Minute},
		{in: "PT4M59S", bad: true},
		{in: "PT299S", bad: true},
		{in: "PT4M60S", every: 5 * time.Minute},
		{in: "PT5H", every: 5 * time.Hour},
		{in: "P1D", every: 24 * time.Hour},
		{in: "P1DT12H", every: 36 * time.Hour},
		{in: "P2W", every: 14 * 24 * time.Hour},
		{in: "PT1H30M15S", every: time.Hour + 30*time.Minute + 15*time.Second},
		{in: "P3650D", every: 3650 * 24 * time.Hour},
		{in: "P3651D", bad: true},
		{in: "PT9999999999S", bad: true},
		{in: "P1M", bad: true},
		{in: "P1Y", bad: true},
		{in: "P1Y2M3D", bad: true},
		{in: "P1W2D", bad: true},
		{in: "P", bad: true},
		{in: "PT", bad: true},
		{in: "P1DT", bad: true},
		{in: "PT0S", bad: true},
		{in: "PT1.5H", bad: true},
		{in: "pt5m", bad: true},
		{in: "PT5m", bad: true},
		{in: "-PT5M", bad: true},
		{in: "5m", bad: true},
		{in: "yearly", bad: true},
		{in: "Monthly", bad: true},
		{in: "", bad: true},
	}
	for _, tc := range tests {
		iv, err := ParseGrantInterval(tc.in)
		if tc.bad {
			if e, ok := AsError(err); !ok || e.Kind != KindValidation || e.Field != "grant_interval" {
				t.Errorf("%q: err %v, want 422 naming grant_interval", tc.in, err)
			}
			continue
		}
		if err != nil || iv.Keyword != tc.keyword || iv.Every != tc.every || iv.Custom() != (tc.keyword == "") {
			t.Errorf("%q = %+v, %v; want keyword %q every %s", tc.in, iv, err, tc.keyword, tc.every)
		}
	}
}

func planPtr[T any](v T) *T { return &v }

func TestCreateGrantInputValidate(t *testing.T) {
	ok := func() CreateGrantInput {
		return CreateGrantInput{Credits: planPtr[int64](1000), GrantInterval: planPtr("monthly"), GrantType: planPtr("recurring")}
	}
	tests := []struct {
		name  string
		edit  func(*CreateGrantInput)
		field string
	}{
		{"minimal", func(*CreateGrantInput) {}, ""},
		{"every field", func(in *CreateGrantInput) {
			in.Source, in.ExpiresAfterSeconds, in.AccumulationCap = planPtr("promotional"), planPtr[int64](1), planPtr[int64](1)
			in.RolloverPercentage, in.MaxRolloverCycles = planPtr(100), planPtr(0)
		}, ""},
		{"credits missing", func(in *CreateGrantInput) { in.Credits = nil }, "credits"},
		{"credits 0", func(in *CreateGrantInput) { in.Credits = planPtr[int64](0) }, "credits"},
		{"credits negative", func(in *CreateGrantInput) { in.Credits = planPtr[int64](-5) }, "credits"},
		{"interval missing", func(in *CreateGrantInput) { in.GrantInterval = nil }, "grant_interval"},
		{"interval empty", func(in *CreateGrantInput) { in.GrantInterval = planPtr("") }, "grant_interval"},
		{"interval too short", func(in *CreateGrantInput) { in.GrantInterval = planPtr("PT4M59S") }, "grant_interval"},
		{"interval PT5M", func(in *CreateGrantInput) { in.GrantInterval = planPtr("PT5M") }, ""},
		{"type missing", func(in *CreateGrantInput) { in.GrantType = nil }, "grant_type"},
		{"type unknown", func(in *CreateGrantInput) { in.GrantType = planPtr("forever") }, "grant_type"},
		{"recurring on_activation", func(in *CreateGrantInput) { in.GrantInterval = planPtr("on_activation") }, "grant_type"},
		{"one_time on_activation", func(in *CreateGrantInput) {
			in.GrantInterval, in.GrantType = planPtr("on_activation"), planPtr("one_time")
		}, ""},
		{"trial on_activation", func(in *CreateGrantInput) {
			in.GrantInterval, in.GrantType = planPtr("on_activation"), planPtr("trial")
		}, ""},
		{"source plan_grant", func(in *CreateGrantInput) { in.Source = planPtr("plan_grant") }, ""},
		{"source topup", func(in *CreateGrantInput) { in.Source = planPtr("topup") }, "source"},
		{"source unknown", func(in *CreateGrantInput) { in.Source = planPtr("gift") }, "source"},
		{"expires 0", func(in *CreateGrantInput) { in.ExpiresAfterSeconds = planPtr[int64](0) }, "expires_after_seconds"},
		{"expires too long", func(in *CreateGrantInput) { in.ExpiresAfterSeconds = planPtr[int64](MaxGrantSeconds + 1) }, "expires_after_seconds"},
		{"cap 0", func(in *CreateGrantInput) { in.AccumulationCap = planPtr[int64](0) }, "accumulation_cap"},
		{"rollover -1", func(in *CreateGrantInput) { in.RolloverPercentage = planPtr(-1) }, "rollover_percentage"},
		{"rollover 101", func(in *CreateGrantInput) { in.RolloverPercentage = planPtr(101) }, "rollover_percentage"},
		{"rollover 0", func(in *CreateGrantInput) { in.RolloverPercentage = planPtr(0) }, ""},
		{"cycles -1", func(in *CreateGrantInput) { in.MaxRolloverCycles = planPtr(-1) }, "max_rollover_cycles"},
	}
	for _, tc := range tests {
		in := ok()
		tc.edit(&in)
		err := in.Validate()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v, want ok", tc.name, err)
			}
			continue
		}
		if e, ok := AsError(err); !ok || e.Kind != KindValidation || e.Field != tc.field {
			t.Errorf("%s: %v, want 422 naming %s", tc.name, err, tc.field)
		}
	}
}

func TestPlanAndVariantInputValidate(t *testing.T) {
	tests := []struct {
		name  string
		in    interface{ Validate() error }
		field string
	}{
		{"variant ok", &CreateVariantInput{BillingCycle: planPtr("monthly")}, ""},
		{"variant every cycle", &CreateVariantInput{BillingCycle: planPtr("one_time"), TrialDays: planPtr(0), BillingMode: planPtr("postpaid"),
			RenewalDueDays: planPtr(0), GracePeriodDays: planPtr(MaxVariantDays)}, ""},
		{"variant cycle missing", &CreateVariantInput{}, "billing_cycle"},
		{"variant cycle bad", &CreateVariantInput{BillingCycle: planPtr("hourly")}, "billing_cycle"},
		{"variant trial negative", &CreateVariantInput{BillingCycle: planPtr("daily"), TrialDays: planPtr(-1)}, "trial_days"},
		{"variant mode bad", &CreateVariantInput{BillingCycle: planPtr("daily"), BillingMode: planPtr("free")}, "billing_mode"},
		{"variant renewal negative", &CreateVariantInput{BillingCycle: planPtr("daily"), RenewalDueDays: planPtr(-1)}, "renewal_due_days"},
		{"variant grace too long", &CreateVariantInput{BillingCycle: planPtr("daily"), GracePeriodDays: planPtr(MaxVariantDays + 1)}, "grace_period_days"},
		{"variant patch bad status", &UpdateVariantInput{Status: planPtr("gone")}, "status"},
		{"variant patch trial negative", &UpdateVariantInput{TrialDays: planPtr(-2)}, "trial_days"},
		{"entitlement ok", &EntitlementInput{BillableMetricKey: planPtr("seats"), Value: json.RawMessage(`{"cap":1}`)}, ""},
		{"entitlement key missing", &EntitlementInput{Value: json.RawMessage(`{}`)}, "billable_metric_key"},
		{"entitlement value missing", &EntitlementInput{BillableMetricKey: planPtr("seats")}, "value"},
		{"entitlement value null", &EntitlementInput{BillableMetricKey: planPtr("seats"), Value: json.RawMessage(`null`)}, "value"},
	}
	for _, tc := range tests {
		err := tc.in.Validate()
		if tc.field == "" {
			if err != nil {
				t.Errorf("%s: %v, want ok", tc.name, err)
			}
			continue
		}
		if e, ok := AsError(err); !ok || e.Kind != KindValidation || e.Field != tc.field {
			t.Errorf("%s: %v, want 422 naming %s", tc.name, err, tc.field)
		}
	}
}

func repeat(s string, n int) string {
	out := ""
	for range n {
		out += s
	}
	return out
}

func TestVariantFixedFields(t *testing.T) {
	v := PlanVariant{BillingCycle: CycleMonthly, BillingMode: BillingPrepaid, RenewalDueDays: 3, GracePeriodDays: 3, AllowUsageWhileOverdue: true}
	tests := []struct {
		in    UpdateVariantInput
		field string
	}{
		{UpdateVariantInput{BillingCycle: planPtr("monthly"), BillingMode: planPtr("prepaid"), RenewalDueDays: planPtr(3),
			GracePeriodDays: planPtr(3), AllowUsageWhileOverdue: planPtr(true)}, ""},
		{UpdateVariantInput{BillingCycle: planPtr("yearly")}, "billing_cycle"},
		{UpdateVariantInput{BillingMode: planPtr("postpaid")}, "billing_mode"},
		{UpdateVariantInput{RenewalDueDays: planPtr(4)}, "renewal_due_days"},
		{UpdateVariantInput{GracePeriodDays: planPtr(0)}, "grace_period_days"},
		{UpdateVariantInput{AllowUsageWhileOverdue: planPtr(false)}, "allow_usage_while_overdue"},
	}
	for _, tc := range tests {
		err := tc.in.checkFixed(v)
		if tc.field == "" {
			if err != nil {
				t.Errorf("%+v: %v", tc.in, err)
			}
			continue
		}
		if e, ok := AsError(err); !ok || e.Kind != KindValidation || e.Field != tc.field {
			t.Errorf("%+v: %v, want 422 naming %s", tc.in, err, tc.field)
		}
	}
}

func TestEntitlementValue(t *testing.T) {
	tests := []struct {
		typ   MetricType
		in    string
		want  string
		field string
	}{
		{MetricBoolean, `{"enabled": true}`, `{"enabled":true}`, ""},
		{MetricBoolean, `{"enabled": false, "extra": 1}`, `{"enabled":false}`, ""},
		{MetricBoolean, `{"enabled": "yes"}`, "", "value.enabled"},
		{MetricBoolean, `{"cap": 3}`, "", "value.enabled"},
		{MetricMetered, `{"enabled": false}`, `{"enabled":false}`, ""},
		{MetricMetered, `{}`, "", "value.enabled"},
		{MetricGauge, `{"cap": 0}`, `{"cap":0}`, ""},
		{MetricGauge, `{"cap": 9223372036854775807}`, `{"cap":9223372036854775807}`, ""},
		{MetricGauge, `{"cap": -1}`, "", "value.cap"},
		{MetricGauge, `{"cap": 1.5}`, "", "value.cap"},
		{MetricGauge, `{"enabled": true}`, "", "value.cap"},
		{MetricStatic, `{"config": {"model": "gpt", "n": 1}}`, `{"config":{"model":"gpt","n":1}}`, ""},
		{MetricStatic, `{"config": {}}`, `{"config":{}}`, ""},
		{MetricStatic, `{"config": [1]}`, "", "value.config"},
		{MetricStatic, `{"config": null}`, "", "value.config"},
		{MetricStatic, `{}`, "", "value.config"},
		{MetricGauge, `[1]`, "", "value"},
		{MetricGauge, `"x"`, "", "value"},
	}
	for _, tc := range tests {
		got, err := EntitlementValue(tc.typ, json.RawMessage(tc.in))
		if tc.field != "" {
			if e, ok := AsError(err); !ok || e.Kind != KindBadRequest || e.Field != tc.field {
				t.Errorf("%s %s: %v, want 400 naming %s", tc.typ, tc.in, err, tc.field)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("%s %s = %s, %v; want %s", tc.typ, tc.in, got, err, tc.want)
		}
	}
}
