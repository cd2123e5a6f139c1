package api

import (
	"net/url"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// getTenant answers GET /v1/tenant from a fresh read, not the auth cache,
// so a change made a moment ago shows.
func (s *Server) getTenant(c *call) error {
	t, err := s.tenants.Get(c.reqContext(), c.scope.TenantID)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, engine.ConfigOf(t))
}

// patchTenant answers PATCH /v1/tenant (docs/spec/addendum.md §2).
func (s *Server) patchTenant(c *call) error {
	var in TenantConfigPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.ToCommand()
	if err != nil {
		return err
	}
	cfg, err := s.tenants.UpdateConfig(c.reqContext(), c.scope.TenantID, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, cfg)
}

// TenantConfigPayload is the body of PATCH /v1/tenant (docs/spec/addendum.md §2); the
// console's settings form builds one too.
type TenantConfigPayload struct {
	DefaultOveragePolicy         *string `json:"default_overage_policy"`
	DefaultLowBalanceThresholdMC *int64  `json:"default_low_balance_threshold_mc"`
}

// ToCommand checks the body, naming the first wrong member.
func (in *TenantConfigPayload) ToCommand() (engine.TenantConfigChange, error) {
	if in.DefaultOveragePolicy != nil && !engine.OveragePolicy(*in.DefaultOveragePolicy).Valid() {
		return engine.TenantConfigChange{}, engine.Invalid("default_overage_policy", "default_overage_policy must be block, allow or notify")
	}
	if in.DefaultLowBalanceThresholdMC != nil && *in.DefaultLowBalanceThresholdMC < 0 {
		return engine.TenantConfigChange{}, engine.Invalid("default_low_balance_threshold_mc", "default_low_balance_threshold_mc must be >= 0")
	}
	cmd := engine.TenantConfigChange{DefaultLowBalanceThresholdMC: in.DefaultLowBalanceThresholdMC}
	if in.DefaultOveragePolicy != nil {
		p := engine.OveragePolicy(*in.DefaultOveragePolicy)
		cmd.DefaultOveragePolicy = &p
	}
	return cmd, nil
}

// RateLimitPayload is the body of PATCH /admin/v1/tenants/{id}; the console
// and the operator commands build one too.
type RateLimitPayload struct {
	PerSecond *int `json:"rate_limit_per_second"`
	Burst     *int `json:"rate_limit_burst"`
}

// ToCommand checks the body, naming the first wrong member.
func (in *RateLimitPayload) ToCommand() (engine.RateLimitChange, error) {
	if in.PerSecond != nil && (*in.PerSecond < 1 || *in.PerSecond > 1_000_000) {
		return engine.RateLimitChange{}, engine.Invalid("rate_limit_per_second", "rate_limit_per_second must be between 1 and 1000000")
	}
	if in.Burst != nil && (*in.Burst < 1 || *in.Burst > 10_000_000) {
		return engine.RateLimitChange{}, engine.Invalid("rate_limit_burst", "rate_limit_burst must be between 1 and 10000000")
	}
	return engine.RateLimitChange{PerSecond: in.PerSecond, Burst: in.Burst}, nil
}

// WebhookPayload is the body of PUT /admin/v1/tenants/{id}/webhook; the
// console and the operator commands build one too.
type WebhookPayload struct {
	URL *string `json:"url"`
}

// ToCommand checks the URL's form; whether its host may be called is the
// engine's to say.
func (in *WebhookPayload) ToCommand() (engine.WebhookTarget, error) {
	if in.URL == nil || *in.URL == "" {
		return engine.WebhookTarget{}, engine.Invalid("url", "url is required")
	}
	if len(*in.URL) > engine.MaxWebhookURLBytes {
		return engine.WebhookTarget{}, engine.Invalid("url", "url is longer than 2048 bytes")
	}
	u, err := url.Parse(*in.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return engine.WebhookTarget{}, engine.Invalid("url", "url must be an absolute http or https URL")
	}
	return engine.WebhookTarget{URL: *in.URL, Host: u.Hostname()}, nil
}
