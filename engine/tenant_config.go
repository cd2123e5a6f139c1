// A tenant's settings: its defaults (overage policy, low-balance threshold)
// and its rate limits.

package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// TenantConfigChange is a checked change of the tenant defaults (PATCH
// /v1/tenant, docs/spec/addendum.md §2); a nil field keeps its value.
type TenantConfigChange struct {
	DefaultOveragePolicy         *OveragePolicy
	DefaultLowBalanceThresholdMC *int64
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

// UpdateConfig changes the tenant defaults. Errors: 404.
func (s *Tenants) UpdateConfig(ctx context.Context, tenant uuid.UUID, in TenantConfigChange) (TenantConfig, error) {
	t, err := s.Get(ctx, tenant)
	if err != nil {
		return TenantConfig{}, err
	}
	if in.DefaultOveragePolicy != nil {
		t.DefaultOveragePolicy = *in.DefaultOveragePolicy
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

// RateLimitChange is the operator's checked rate limit change; a nil field
// keeps its value.
type RateLimitChange struct {
	PerSecond *int
	Burst     *int
}

// SetRateLimit changes a tenant's per-key token bucket. Errors: 404.
func (s *Tenants) SetRateLimit(ctx context.Context, tenant uuid.UUID, in RateLimitChange) (TenantConfig, error) {
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
