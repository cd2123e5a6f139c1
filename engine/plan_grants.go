// Plan credit grants: what a subscription to a variant is granted, and when
// (recurring, one-time, trial), and their command.

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
	// AppliesTo scopes the blocks it grants to metrics (nil: every metric;
	// docs/rules.md "Credits scoped to metrics").
	AppliesTo *AppliesTo `json:"applies_to"`
	// Metadata is always null (docs/spec/interface.md "Plan credit grant").
	Metadata  *struct{} `json:"metadata"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Interval is the parsed grant_interval of g (validated at creation).
func (g PlanGrant) Interval() GrantInterval {
	iv, _ := ParseGrantInterval(g.GrantInterval)
	return iv
}

// CreatePlanGrant is a checked request to add a credit schedule to a
// variant: api builds it from the body of POST
// /v1/plans/{id}/variants/{vid}/grants (or the console's grant form).
type CreatePlanGrant struct {
	Credits             int64
	GrantInterval       string // a valid grant_interval, as sent
	GrantType           GrantType
	Source              *Source  // nil: plan_grant
	ExpiresAfterSeconds *int64   // nil: null
	AccumulationCap     *int64   // nil: null
	RolloverPercentage  *int     // nil: 0
	MaxRolloverCycles   *int     // nil: null
	Scope               []string // ScopeKeys of applies_to; nil: every metric
}

// CreateGrant adds a credit schedule to a variant of the plan; it grants no
// credit itself. Errors: 404 (no such variant under that plan).
func (s *Plans) CreateGrant(ctx context.Context, scope Scope, planID, variantID uuid.UUID, in CreatePlanGrant) (PlanGrant, error) {
	now := s.clock.Now()
	g := PlanGrant{ID: uuid.Must(uuid.NewV7()), PlanVariantID: variantID, TenantID: scope.TenantID,
		Environment: scope.Environment, Credits: in.Credits, GrantInterval: in.GrantInterval,
		ExpiresAfterSeconds: in.ExpiresAfterSeconds, AccumulationCap: in.AccumulationCap,
		MaxRolloverCycles: in.MaxRolloverCycles, GrantType: in.GrantType, Source: SourcePlanGrant,
		AppliesTo: AppliesToOf(in.Scope), CreatedAt: now, UpdatedAt: now}
	if in.Source != nil {
		g.Source = *in.Source
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

// Grant types of docs/spec/interface.md "Plan credit grant".
const (
	GrantRecurring GrantType = "recurring"
	GrantOneTime   GrantType = "one_time"
	GrantTrial     GrantType = "trial"
)
