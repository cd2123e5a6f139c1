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

func TestVariantFixedFields(t *testing.T) {
	v := PlanVariant{BillingCycle: CycleMonthly, BillingMode: BillingPrepaid, RenewalDueDays: 3, GracePeriodDays: 3, AllowUsageWhileOverdue: true}
	tests := []struct {
		in    UpdateVariant
		field string
	}{
		{UpdateVariant{BillingCycle: planPtr(CycleMonthly), BillingMode: planPtr(BillingPrepaid), RenewalDueDays: planPtr(3),
			GracePeriodDays: planPtr(3), AllowUsageWhileOverdue: planPtr(true)}, ""},
		{UpdateVariant{BillingCycle: planPtr(CycleYearly)}, "billing_cycle"},
		{UpdateVariant{BillingMode: planPtr(BillingPostpaid)}, "billing_mode"},
		{UpdateVariant{RenewalDueDays: planPtr(4)}, "renewal_due_days"},
		{UpdateVariant{GracePeriodDays: planPtr(0)}, "grace_period_days"},
		{UpdateVariant{AllowUsageWhileOverdue: planPtr(false)}, "allow_usage_while_overdue"},
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
