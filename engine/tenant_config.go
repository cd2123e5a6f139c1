// A tenant's settings: its defaults (overage policy, low-balance threshold)\nand its rate limits.
package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// TenantConfigInput is the body of PATCH /v1/tenant (addendum 2).
type TenantConfigInput struct {
	DefaultOveragePolicy         *string `json:"default_overage_policy"`
	DefaultLowBalanceThresholdMC *int64  `json:"default_low_balance_threshold_mc"`
}

// TenantConfig is the body of GET /v1/tenant.
type TenantConfig struct {
	ID                           uuid.UUID     `json:"id"`
	Name                         string        `json:"name"`
	DefaultOveragePolicy         OveragePolicy `json:"default_overage_policy"`
	DefaultLowBalanceThresholdMC int64         `json:"default_low_balance_threshold_mc"`
	WebhookURL                   *string       `json:"webhook_url"`
	RateLimitPerSecond           int           `json:"rate_limit_per_second"`
	RateLimitBurst               int           `json:"rate_limit_burst"`
	CreatedAt                    time.Time     `json:"created_at"`
	UpdatedAt                    time.Time     `json:"updated_at"`
}

// ConfigOf is t's configuration as the API shows it.
func ConfigOf(t Tenant) TenantConfig {
	return TenantConfig{
		ID: t.ID, Name: t.Name, DefaultOveragePolicy: t.DefaultOveragePolicy,
		DefaultLowBalanceThresholdMC: t.DefaultLowBalanceThresholdMC, WebhookURL: t.WebhookURL,
		RateLimitPerSecond: t.RateLimitPerSecond, RateLimitBurst: t.RateLimitBurst,
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt,
	}
}

// UpdateConfig changes the tenant defaults. Errors: 422.
func (s *Tenants) UpdateConfig(ctx context.Context, tenant uuid.UUID, in TenantConfigInput) (TenantConfig, error) {
	if in.DefaultOveragePolicy != nil && !OveragePolicy(*in.DefaultOveragePolicy).Valid() {
		return TenantConfig{}, Invalid("default_overage_policy", "default_overage_policy must be block, allow or notify")
	}
	if in.DefaultLowBalanceThresholdMC != nil && *in.DefaultLowBalanceThresholdMC < 0 {
		return TenantConfig{}, Invalid("default_low_balance_threshold_mc", "default_low_balance_threshold_mc must be >= 0")
	}
	t, err := s.Get(ctx, tenant)
	if err != nil {
		return TenantConfig{}, err
	}
	if in.DefaultOveragePolicy != nil {
		t.DefaultOveragePolicy = OveragePolicy(*in.DefaultOveragePolicy)
	}
	if in.DefaultLowBalanceThresholdMC != nil {
		t.DefaultLowBalanceThresholdMC = *in.DefaultLowBalanceThresholdMC
	}
	t.UpdatedAt = s.clock.Now()
	if err := s.dir.UpdateTenant(ctx, t); err != nil {
		return TenantConfig{}, err
	}
	return ConfigOf(t), nil
}

// RateLimitInput is the operator's rate limit change.
type RateLimitInput struct {
	PerSecond *int `json:"rate_limit_per_second"`
	Burst     *int `json:"rate_limit_burst"`
}

// SetRateLimit changes a tenant's per-key token bucket. Errors: 404, 422.
func (s *Tenants) SetRateLimit(ctx context.Context, tenant uuid.UUID, in RateLimitInput) (TenantConfig, error) {
	if in.PerSecond != nil && (*in.PerSecond < 1 || *in.PerSecond > 1_000_000) {
		return TenantConfig{}, Invalid("rate_limit_per_second", "rate_limit_per_second must be between 1 and 1000000")
	}
	if in.Burst != nil && (*in.Burst < 1 || *in.Burst > 10_000_000) {
		return TenantConfig{}, Invalid("rate_limit_burst", "rate_limit_burst must be between 1 and 10000000")
	}
	t, err := s.Get(ctx, tenant)
	if err != nil {
		return TenantConfig{}, err
	}
	if in.PerSecond != nil {
		t.RateLimitPerSecond = *in.PerSecond
	}
	if in.Burst != nil {
		t.RateLimitBurst = *in.Burst
	}
	t.UpdatedAt = s.clock.Now()
	if err := s.dir.UpdateTenant(ctx, t); err != nil {
		return TenantConfig{}, err
	}
	return ConfigOf(t), nil
}
