// Plan credit grants: what a subscription to a variant is granted, and when\n(recurring, one-time, trial), with their input and validation.
package engine

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// GrantType says how often a plan grant fires.
type GrantType string

// Valid reports whether t is a known grant type.
func (t GrantType) Valid() bool { return t == GrantRecurring || t == GrantOneTime || t == GrantTrial }

// PlanGrant is a credit schedule on a variant; the scheduler fires it per
// subscription. It is never changed or deleted.
type PlanGrant struct {
	ID                  uuid.UUID   `json:"id"`
	PlanVariantID       uuid.UUID   `json:"plan_variant_id"`
	TenantID            uuid.UUID   `json:"tenant_id"`
	Environment         Environment `json:"environment"`
	Credits             int64       `json:"credits"`
	GrantInterval       string      `json:"grant_interval"`
	ExpiresAfterSeconds *int64      `json:"expires_after_seconds"`
	AccumulationCap     *int64      `json:"accumulation_cap"`
	RolloverPercentage  int         `json:"rollover_percentage"`
	MaxRolloverCycles   *int        `json:"max_rollover_cycles"`
	GrantType           GrantType   `json:"grant_type"`
	Source              Source      `json:"source"`
	// Metadata is always null (interface.md "Plan credit grant").
	Metadata  *struct{} `json:"metadata"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Interval is the parsed grant_interval of g (validated at creation).
func (g PlanGrant) Interval() GrantInterval {
	iv, _ := ParseGrantInterval(g.GrantInterval)
	return iv
}

// CreateGrantInput is the body of POST /v1/plans/{id}/variants/{vid}/grants.
type CreateGrantInput struct {
	Credits             *int64  `json:"credits"`
	GrantInterval       *string `json:"grant_interval"`
	GrantType           *string `json:"grant_type"`
	Source              *string `json:"source"`
	ExpiresAfterSeconds *int64  `json:"expires_after_seconds"`
	AccumulationCap     *int64  `json:"accumulation_cap"`
	RolloverPercentage  *int    `json:"rollover_percentage"`
	MaxRolloverCycles   *int    `json:"max_rollover_cycles"`
}

// Validate names the first wrong field.
func (in *CreateGrantInput) Validate() error {
	if in.Credits == nil {
		return Invalid("credits", "credits is required")
	}
	if *in.Credits < 1 {
		return Invalid("credits", "credits must be >= 1")
	}
	if in.GrantInterval == nil || *in.GrantInterval == "" {
		return Invalid("grant_interval", "grant_interval is required")
	}
	iv, err := ParseGrantInterval(*in.GrantInterval)
	if err != nil {
		return err
	}
	if in.GrantType == nil || *in.GrantType == "" {
		return Invalid("grant_type", "grant_type is required")
	}
	if !GrantType(*in.GrantType).Valid() {
		return Invalid("grant_type", "grant_type must be recurring, one_time or trial")
	}
	if GrantType(*in.GrantType) == GrantRecurring && iv.Keyword == IntervalOnActivation {
		return Invalid("grant_type", "a recurring grant cannot fire on_activation; use grant_type one_time")
	}
	if in.Source != nil {
		if src := Source(*in.Source); src != SourcePlanGrant && !src.ValidGrantSource() {
			return Invalid("source", "source must be plan_grant, promotional, compensation, referral, manual or migration")
		}
	}
	if v := in.ExpiresAfterSeconds; v != nil && (*v < 1 || *v > MaxGrantSeconds) {
		return Invalid("expires_after_seconds", "expires_after_seconds must be between 1 and 315360000, or null")
	}
	if v := in.AccumulationCap; v != nil && *v < 1 {
		return Invalid("accumulation_cap", "accumulation_cap must be >= 1, or null")
	}
	if v := in.RolloverPercentage; v != nil && (*v < 0 || *v > 100) {
		return Invalid("rollover_percentage", "rollover_percentage must be between 0 and 100")
	}
	if v := in.MaxRolloverCycles; v != nil && (*v < 0 || *v > 1_000_000) {
		return Invalid("max_rollover_cycles", "max_rollover_cycles must be between 0 and 1000000, or null")
	}
	return nil
}

// CreateGrant adds a credit schedule to a variant of the plan; it grants no
// credit itself. Errors: 404 (no such variant under that plan), 422.
func (s *Plans) CreateGrant(ctx context.Context, scope Scope, planID, variantID uuid.UUID, in CreateGrantInput) (PlanGrant, error) {
	if err := in.Validate(); err != nil {
		return PlanGrant{}, err
	}
	now := s.clock.Now()
	g := PlanGrant{ID: uuid.Must(uuid.NewV7()), PlanVariantID: variantID, TenantID: scope.TenantID,
		Environment: scope.Environment, Credits: *in.Credits, GrantInterval: *in.GrantInterval,
		ExpiresAfterSeconds: in.ExpiresAfterSeconds, AccumulationCap: in.AccumulationCap,
		MaxRolloverCycles: in.MaxRolloverCycles, GrantType: GrantType(*in.GrantType), Source: SourcePlanGrant,
		CreatedAt: now, UpdatedAt: now}
	if in.Source != nil {
		g.Source = Source(*in.Source)
	}
	if in.RolloverPercentage != nil {
		g.RolloverPercentage = *in.RolloverPercentage
	}
	if err := s.store.CreateGrant(ctx, planID, g); err != nil {
		if errors.Is(err, ErrNotFound) {
			return PlanGrant{}, NotFound("plan variant not found")
		}
		return PlanGrant{}, err
	}
	return g, nil
}

// Grant types of interface.md "Plan credit grant".
const (
	GrantRecurring GrantType = "recurring"
	GrantOneTime   GrantType = "one_time"
	GrantTrial     GrantType = "trial"
)
