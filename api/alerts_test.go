package api

import (
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestAlertSettingsPayload: each bad member is a 422 naming it.
func TestAlertSettingsPayload(t *testing.T) {
	str := func(s string) *string { return &s }
	i64 := func(v int64) *int64 { return &v }
	ths := func(ts ...alertThresholdPayload) *[]alertThresholdPayload { return &ts }
	many := make([]alertThresholdPayload, engine.MaxAlertThresholds+1)
	for i := range many {
		many[i] = alertThresholdPayload{Type: str("absolute"), AmountMC: i64(int64(i + 1))}
	}
	tests := []struct {
		name  string
		in    alertSettingsPayload
		field string
	}{
		{"thresholds missing", alertSettingsPayload{}, "thresholds"},
		{"too many", alertSettingsPayload{Thresholds: &many}, "thresholds"},
		{"type missing", alertSettingsPayload{Thresholds: ths(alertThresholdPayload{AmountMC: i64(1)})}, "thresholds[0].type"},
		{"bad type", alertSettingsPayload{Thresholds: ths(alertThresholdPayload{Type: str("ratio")})}, "thresholds[0].type"},
		{"absolute without amount", alertSettingsPayload{Thresholds: ths(alertThresholdPayload{Type: str("absolute")})}, "thresholds[0].amount_mc"},
		{"absolute zero", alertSettingsPayload{Thresholds: ths(alertThresholdPayload{Type: str("absolute"), AmountMC: i64(0)})}, "thresholds[0].amount_mc"},
		{"absolute with percent", alertSettingsPayload{Thresholds: ths(alertThresholdPayload{Type: str("absolute"), AmountMC: i64(5), Percent: i64(5)})}, "thresholds[0].percent"},
		{"percent over 100", alertSettingsPayload{Thresholds: ths(alertThresholdPayload{Type: str("percent_of_last_grant"), Percent: i64(101)})}, "thresholds[0].percent"},
		{"percent with amount", alertSettingsPayload{Thresholds: ths(alertThresholdPayload{Type: str("percent_of_period_allowance"), Percent: i64(5), AmountMC: i64(1)})}, "thresholds[0].amount_mc"},
		{"duplicate", alertSettingsPayload{Thresholds: ths(alertThresholdPayload{Type: str("absolute"), AmountMC: i64(5)}, alertThresholdPayload{Type: str("absolute"), AmountMC: i64(5)})}, "thresholds[1]"},
		{"topup below", alertSettingsPayload{Thresholds: ths(), Topup: &topupRulePayload{BelowMC: i64(0), AmountMC: i64(1)}}, "topup.below_mc"},
		{"topup amount", alertSettingsPayload{Thresholds: ths(), Topup: &topupRulePayload{BelowMC: i64(1)}}, "topup.amount_mc"},
		{"topup window", alertSettingsPayload{Thresholds: ths(), Topup: &topupRulePayload{BelowMC: i64(1), AmountMC: i64(1), DedupeWindowSeconds: i64(59)}}, "topup.dedupe_window_seconds"},
		{"valid", alertSettingsPayload{Thresholds: ths(alertThresholdPayload{Type: str("percent_of_last_grant"), Percent: i64(20)}), Topup: &topupRulePayload{BelowMC: i64(1), AmountMC: i64(1)}}, ""},
	}
	for _, tt := range tests {
		got, err := tt.in.toCommand()
		if tt.field == "" {
			if err != nil || got.Topup == nil || got.Topup.DedupeWindowSeconds != engine.DefaultTopupDedupeSeconds {
				t.Errorf("%s: %v %+v", tt.name, err, got)
			}
			continue
		}
		e, ok := engine.AsError(err)
		if !ok || e.Kind != engine.KindValidation || e.Field != tt.field {
			t.Errorf("%s: error %v, want a validation error naming %s", tt.name, err, tt.field)
		}
	}
}
