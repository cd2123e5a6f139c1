package engine

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// The product catalogue: plans, their variants, the credit grants a variant
// schedules and the entitlements it carries (docs/spec/interface.md Plan, Plan variant,
// Plan credit grant, Plans; docs/spec/addendum.md §5). Like metrics, every row belongs to
// one tenant and one environment: the API key that writes it selects both.

// PlanStatus is the lifecycle flag of a plan or variant.
type PlanStatus string

// Plan and variant statuses (docs/spec/interface.md "Plan and plan variant status").
const (
	PlanActive  PlanStatus = "active"
	PlanRetired PlanStatus = "retired"
)

// Valid reports whether st is active or retired.
func (st PlanStatus) Valid() bool { return st == PlanActive || st == PlanRetired }

// Catalogue limits where the spec leaves sizes open (docs/decisions.md).
const (
	// MaxPlanNameChars bounds a plan name, like a customer display_name.
	MaxPlanNameChars = 200
	// MaxVariantDays bounds trial_days, renewal_due_days and
	// grace_period_days (ten years).
	MaxVariantDays = 3650
	// MaxGrantSeconds bounds expires_after_seconds and a custom
	// grant_interval, like a manual grant's duration_seconds (ten years).
	MaxGrantSeconds = 315360000
	// MinGrantInterval is the shortest custom grant_interval (Limits).
	MinGrantInterval = 5 * time.Minute
)

// Plan is a named bundle of variants. It holds no price or billing detail.
type Plan struct {
	ID          uuid.UUID   `json:"id"`
	TenantID    uuid.UUID   `json:"tenant_id"`
	Environment Environment `json:"environment"`
	Name        string      `json:"name"`
	IsDefault   bool        `json:"is_default"`
	Status      PlanStatus  `json:"status"`
	Metadata    Metadata    `json:"metadata"`
	CreatedAt   time.Time   `json:"created_at"`
	UpdatedAt   time.Time   `json:"updated_at"`
	// Variants appears only in GET /v1/plans (docs/spec/interface.md: "only on GET
	// /v1/plans"; GET /v1/plans/{id} is "never with variants"): nil
	// elsewhere, so the member is left out; in the list it is [] unless
	// include_variants=true.
	Variants *[]VariantDetail `json:"variants,omitempty"`
}

// Plans manages the catalogue and serves cached variant look-ups to
// subscriptions and entitlement checks.
type Plans struct {
	store   PlanStore
	lookup  PlanLookup
	metrics MetricLookup
	clock   Clock
}

// NewPlans returns the catalogue service.
func NewPlans(store PlanStore, lookup PlanLookup, metrics MetricLookup, clock Clock) *Plans {
	return &Plans{store: store, lookup: lookup, metrics: metrics, clock: clock}
}

// ---- plans ----

// CreatePlan is a checked request to add a plan: api builds it from the
// body of POST /v1/plans (or the console's plan form).
type CreatePlan struct {
	Name      string
	IsDefault bool
	Metadata  Metadata // canonical; nil: none
}

// UpdatePlan is a checked PATCH of a plan: a nil field keeps its value and
// Metadata, when not nil, replaces the old one outright.
type UpdatePlan struct {
	Name      *string
	Status    *PlanStatus
	IsDefault *bool
	Metadata  Metadata // canonical
}

// errRetireDefault is the 409 of docs/spec/interface.md "Plan and plan variant status".
var errRetireDefault = &Error{Kind: KindConflict, Field: "status",
	Detail: "the default plan cannot be retired; make another plan the default or set is_default false first"}

// CreatePlan adds an active plan; is_default true makes it the scope's only
// default.
func (s *Plans) CreatePlan(ctx context.Context, scope Scope, in CreatePlan) (Plan, error) {
	now := s.clock.Now()
	p := Plan{ID: uuid.Must(uuid.NewV7()), TenantID: scope.TenantID, Environment: scope.Environment,
		Name: in.Name, IsDefault: in.IsDefault, Status: PlanActive,
		Metadata: orEmpty(in.Metadata), CreatedAt: now, UpdatedAt: now}
	if err := s.store.CreatePlan(ctx, p); err != nil {
		return Plan{}, err
	}
	return p, nil
}

// GetPlan reads one plan, never with variants. Errors: 404.
func (s *Plans) GetPlan(ctx context.Context, scope Scope, id uuid.UUID) (Plan, error) {
	p, err := s.store.GetPlan(ctx, scope, id)
	if errors.Is(err, ErrNotFound) {
		return Plan{}, NotFound("plan not found")
	}
	if err != nil {
		return Plan{}, err
	}
	return p, nil
}

// UpdatePlan changes name, status, is_default and metadata (replaced). The
// default plan is always active: a change that would leave it retired and
// default is a 409. Errors: 404, 409, 422.
func (s *Plans) UpdatePlan(ctx context.Context, scope Scope, id uuid.UUID, in UpdatePlan) (Plan, error) {
	now := s.clock.Now()
	p, err := s.store.UpdatePlan(ctx, scope, id, func(p *Plan) error {
		if in.Name != nil {
			p.Name = *in.Name
		}
		if in.Status != nil {
			p.Status = *in.Status
		}
		if in.IsDefault != nil {
			p.IsDefault = *in.IsDefault
		}
		if in.Metadata != nil {
			p.Metadata = in.Metadata
		}
		if p.IsDefault && p.Status == PlanRetired {
			if in.Status != nil {
				return errRetireDefault
			}
			return &Error{Kind: KindConflict, Field: "is_default", Detail: "a retired plan cannot be the default plan; set status active too"}
		}
		p.UpdatedAt = now
		return nil
	})
	if errors.Is(err, ErrNotFound) {
		return Plan{}, NotFound("plan not found")
	}
	if err != nil {
		return Plan{}, err
	}
	return p, nil
}

// ListPlans pages plans newest first: active ones, and retired ones too
// when withRetired. withVariants nests each plan's variants (oldest first)
// with their grants and entitlements.
func (s *Plans) ListPlans(ctx context.Context, scope Scope, withRetired, withVariants bool, cursor string, limit int) (Page[Plan], error) {
	page, err := s.store.ListPlans(ctx, scope, withRetired, cursor, limit)
	if err != nil {
		return Page[Plan]{}, err
	}
	for i := range page.Data {
		page.Data[i].Variants = &[]VariantDetail{}
	}
	if !withVariants || len(page.Data) == 0 {
		return page, nil
	}
	ids := make([]uuid.UUID, len(page.Data))
	at := make(map[uuid.UUID]int, len(page.Data))
	for i, p := range page.Data {
		ids[i] = p.ID
		at[p.ID] = i
	}
	variants, err := s.store.ListVariants(ctx, scope, ids)
	if err != nil {
		return Page[Plan]{}, err
	}
	details, err := s.details(ctx, scope, variants)
	if err != nil {
		return Page[Plan]{}, err
	}
	for _, d := range details {
		i := at[d.PlanID]
		*page.Data[i].Variants = append(*page.Data[i].Variants, d)
	}
	return page, nil
}

// details attaches grants and entitlements to variants, keeping their order.
func (s *Plans) details(ctx context.Context, scope Scope, variants []PlanVariant) ([]VariantDetail, error) {
	return variantDetails(ctx, s.store, scope, variants)
}

// variantDetails attaches store's grants and entitlements to variants,
// keeping their order.
func variantDetails(ctx context.Context, store PlanStore, scope Scope, variants []PlanVariant) ([]VariantDetail, error) {
	out := make([]VariantDetail, len(variants))
	if len(variants) == 0 {
		return out, nil
	}
	ids := make([]uuid.UUID, len(variants))
	at := make(map[uuid.UUID]int, len(variants))
	for i, v := range variants {
		ids[i] = v.ID
		at[v.ID] = i
		out[i] = VariantDetail{PlanVariant: v, Grants: []PlanGrant{}, Entitlements: []VariantEntitlement{}}
	}
	grants, err := store.ListGrants(ctx, scope, ids)
	if err != nil {
		return nil, err
	}
	for _, g := range grants {
		i := at[g.PlanVariantID]
		out[i].Grants = append(out[i].Grants, g)
	}
	ents, err := store.ListEntitlements(ctx, scope, ids)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		i := at[e.PlanVariantID]
		out[i].Entitlements = append(out[i].Entitlements, e)
	}
	return out, nil
}

// ---- variants ----

// ---- grants ----

// ---- entitlements ----
