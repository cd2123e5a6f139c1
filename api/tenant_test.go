package api

import (
	"strings"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestTenantPayloads: each bad member of PATCH /v1/tenant and of the
// operator's rate limit change and webhook URL is a 422 naming it, the first wrong one
// first; an absent member stays nil (it keeps its value).
func TestTenantPayloads(t *testing.T) {
	bad, good := "sometimes", "notify"
	neg, zero := int64(-1), int64(0)
	n0, n1, tooFast, tooBig := 0, 1, 1_000_001, 10_000_001
	empty, long := "", "https://x.example/"+strings.Repeat("a", engine.MaxWebhookURLBytes)
	ftp, rel, hook := "ftp://public.test/", "/hooks", "http://[fe80::1%25eth0]:8080/hooks"
	tests := []struct {
		name  string
		check func() error
		field string
	}{
		{"bad policy", func() error {
			_, err := (&TenantConfigPayload{DefaultOveragePolicy: &bad, DefaultLowBalanceThresholdMC: &neg}).ToCommand()
			return err
		}, "default_overage_policy"},
		{"negative threshold", func() error {
			_, err := (&TenantConfigPayload{DefaultOveragePolicy: &good, DefaultLowBalanceThresholdMC: &neg}).ToCommand()
			return err
		}, "default_low_balance_threshold_mc"},
		{"good config", func() error {
			cmd, err := (&TenantConfigPayload{DefaultLowBalanceThresholdMC: &zero}).ToCommand()
			if err == nil && (cmd.DefaultOveragePolicy != nil || *cmd.DefaultLowBalanceThresholdMC != 0) {
				t.Errorf("good config: %+v", cmd)
			}
			return err
		}, ""},
		{"zero per second", func() error { _, err := (&RateLimitPayload{PerSecond: &n0, Burst: &n0}).ToCommand(); return err }, "rate_limit_per_second"},
		{"too fast", func() error { _, err := (&RateLimitPayload{PerSecond: &tooFast}).ToCommand(); return err }, "rate_limit_per_second"},
		{"burst too big", func() error { _, err := (&RateLimitPayload{PerSecond: &n1, Burst: &tooBig}).ToCommand(); return err }, "rate_limit_burst"},
		{"good limit", func() error { _, err := (&RateLimitPayload{Burst: &n1}).ToCommand(); return err }, ""},
		{"no url", func() error { _, err := (&WebhookPayload{}).ToCommand(); return err }, "url"},
		{"empty url", func() error { _, err := (&WebhookPayload{URL: &empty}).ToCommand(); return err }, "url"},
		{"long url", func() error { _, err := (&WebhookPayload{URL: &long}).ToCommand(); return err }, "url"},
		{"ftp url", func() error { _, err := (&WebhookPayload{URL: &ftp}).ToCommand(); return err }, "url"},
		{"relative url", func() error { _, err := (&WebhookPayload{URL: &rel}).ToCommand(); return err }, "url"},
		{"good url", func() error {
			target, err := (&WebhookPayload{URL: &hook}).ToCommand()
			if err == nil && (target.URL != hook || target.Host != "fe80::1%eth0") {
				t.Errorf("good url: %+v", target)
			}
			return err
		}, ""},
	}
	for _, tt := range tests {
		wantCheck(t, tt.name, tt.check(), engine.KindValidation, tt.field, "")
	}
}
