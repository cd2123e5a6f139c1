package engine

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// The product catalogue: plans, their variants, the credit grants a variant
// schedules and the entitlements it carries (interface.md Plan, Plan variant,
// Plan credit grant, Plans; addendum 5). Like metrics, every row belongs to
// one tenant and one environment: the API key that writes it selects both.

// PlanStatus is the lifecycle flag of a plan or variant.
type PlanStatus string

// Plan and variant statuses (interface.md "Plan and plan variant status").
const (
	PlanActive  PlanStatus = "active"
	PlanRetired PlanStatus = "retired"
)

// Valid reports whether st is active or retired.
func (st PlanStatus) Valid() bool { return st == PlanActive || st == PlanRetired }

// BillingCycle is how long one period of a variant lasts.
type BillingCycle string

// Billing cycles of interface.md "Plan variant".
const (
	CycleDaily   BillingCycle = "daily"
	CycleWeekly  BillingCycle = "weekly"
	CycleMonthly BillingCycle = "monthly"
	CycleYearly  BillingCycle = "yearly"
	CycleOneTime BillingCycle = "one_time"
)

// Valid reports whether c is a known billing cycle.
func (c BillingCycle) Valid() bool {
	switch c {
	case CycleDaily, CycleWeekly, CycleMonthly, CycleYearly, CycleOneTime:
		return true
	}
	return false
}

// BillingMode says who moves a variant's periods on.
type BillingMode string

// Billing modes of interface.md "Plan variant".
const (
	BillingPrepaid  BillingMode = "prepaid"
	BillingPostpaid BillingMode = "postpaid"
)

// Valid reports whether m is prepaid or postpaid.
func (m BillingMode) Valid() bool { return m == BillingPrepaid || m == BillingPostpaid }

// GrantType says how often a plan grant fires.
type GrantType string

// Grant types of interface.md "Plan credit grant".
const (
	GrantRecurring GrantType = "recurring"
	GrantOneTime   GrantType = "one_time"
	GrantTrial     GrantType = "trial"
)

// Valid reports whether t is a known grant type.
func (t GrantType) Valid() bool { return t == GrantRecurring || t == GrantOneTime || t == GrantTrial }

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

// Variant defaults of interface.md "Plan variant".
const (
	DefaultRenewalDueDays  = 3
	DefaultGracePeriodDays = 3
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
	// Variants appears only in GET /v1/plans (interface.md: "only on GET
	// /v1/plans"; GET /v1/plans/{id} is "never with variants"): nil
	// elsewhere, so the member is left out; in the list it is [] unless
	// include_variants=true.
	Variants *[]VariantDetail `json:"variants,omitempty"`
}

// PlanVariant is one way to buy a plan: cycle, trial, billing mode.
type PlanVariant struct {
	ID                     uuid.UUID    `json:"id"`
	PlanID                 uuid.UUID    `json:"plan_id"`
	TenantID               uuid.UUID    `json:"tenant_id"`
	Environment            Environment  `json:"environment"`
	BillingCycle           BillingCycle `json:"billing_cycle"`
	TrialDays              int          `json:"trial_days"`
	Status                 PlanStatus   `json:"status"`
	BillingMode            BillingMode  `json:"billing_mode"`
	RenewalDueDays         int          `json:"renewal_due_days"`
	GracePeriodDays        int          `json:"grace_period_days"`
	AllowUsageWhileOverdue bool         `json:"allow_usage_while_overdue"`
	Metadata               Metadata     `json:"metadata"`
	CreatedAt              time.Time    `json:"created_at"`
	UpdatedAt              time.Time    `json:"updated_at"`
}

// VariantDetail is a variant with the grants it schedules and the
// entitlements it carries, both oldest first (GET /v1/plan-variants/{id},
// GET /v1/plans?include_variants=true). Both lists are never nil.
type VariantDetail struct {
	PlanVariant
	Grants       []PlanGrant          `json:"grants"`
	Entitlements []VariantEntitlement `json:"entitlements"`
}

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

// VariantEntitlement is what a variant grants for one billable metric
// (addendum 5). Value is shaped by Type like an override value.
type VariantEntitlement struct {
	ID                uuid.UUID       `json:"id"`
	PlanVariantID     uuid.UUID       `json:"plan_variant_id"`
	TenantID          uuid.UUID       `json:"-"`
	Environment       Environment     `json:"-"`
	BillableMetricKey string          `json:"billable_metric_key"`
	Type              MetricType      `json:"type"`
	Value             json.RawMessage `json:"value"`
	CreatedAt         time.Time       `json:"created_at"`
}

// variantCacheTTL bounds how stale another process's view of a variant's
// grants and entitlements can be; this process forgets its own changes at once.
const variantCacheTTL = 2 * time.Second

// Plans manages the catalogue and serves cached variant look-ups to
// subscriptions and entitlement checks.
type Plans struct {
	store   PlanStore
	metrics MetricLookup
	clock   Clock

	mu       sync.Mutex
	variants map[variantKey]cachedVariant
}

type variantKey struct {
	tenant uuid.UUID
	env    Environment
	id     uuid.UUID
}

type cachedVariant struct {
	v       VariantDetail
	expires time.Time
}

// NewPlans returns the catalogue service.
func NewPlans(store PlanStore, metrics MetricLookup, clock Clock) *Plans {
	return &Plans{store: store, metrics: metrics, clock: clock, variants: map[variantKey]cachedVariant{}}
}

// ---- plans ----

// CreatePlanInput is the body of POST /v1/plans.
type CreatePlanInput struct {
	Name      *string  `json:"name"`
	IsDefault *bool    `json:"is_default"`
	Metadata  Metadata `json:"metadata"`
}

// Validate names the first wrong field.
func (in *CreatePlanInput) Validate() error {
	if in.Name == nil {
		return Invalid("name", "name is required")
	}
	var err error
	if in.Metadata, err = in.Metadata.Canonical("metadata"); err != nil {
		return err
	}
	return validatePlanName(*in.Name)
}

func validatePlanName(name string) error {
	if strings.TrimSpace(name) == "" {
		return Invalid("name", "name must not be empty")
	}
	if utf8.RuneCountInString(name) > MaxPlanNameChars {
		return Invalid("name", "name is longer than 200 characters")
	}
	return CheckLine("name", name)
}

// UpdatePlanInput is the body of PATCH /v1/plans/{id}; nil fields keep
// their value and metadata, when sent, replaces the old one outright.
type UpdatePlanInput struct {
	Name      *string  `json:"name"`
	Status    *string  `json:"status"`
	IsDefault *bool    `json:"is_default"`
	Metadata  Metadata `json:"metadata"`
}

// Validate names the first wrong field.
func (in *UpdatePlanInput) Validate() error {
	if in.Name != nil {
		if err := validatePlanName(*in.Name); err != nil {
			return err
		}
	}
	if in.Status != nil && !PlanStatus(*in.Status).Valid() {
		return Invalid("status", "status must be active or retired")
	}
	var err error
	in.Metadata, err = in.Metadata.Canonical("metadata")
	return err
}

// errRetireDefault is the 409 of interface.md "Plan and plan variant status".
var errRetireDefault = &Error{Kind: KindConflict, Field: "status",
	Detail: "the default plan cannot be retired; make another plan the default or set is_default false first"}

// CreatePlan adds an active plan; is_default true makes it the scope's only
// default. Errors: 422 naming the field.
func (s *Plans) CreatePlan(ctx context.Context, scope Scope, in CreatePlanInput) (Plan, error) {
	if err := in.Validate(); err != nil {
		return Plan{}, err
	}
	now := s.clock.Now()
	p := Plan{ID: uuid.Must(uuid.NewV7()), TenantID: scope.TenantID, Environment: scope.Environment,
		Name: *in.Name, IsDefault: in.IsDefault != nil && *in.IsDefault, Status: PlanActive,
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
func (s *Plans) UpdatePlan(ctx context.Context, scope Scope, id uuid.UUID, in UpdatePlanInput) (Plan, error) {
	if err := in.Validate(); err != nil {
		return Plan{}, err
	}
	now := s.clock.Now()
	p, err := s.store.UpdatePlan(ctx, scope, id, func(p *Plan) error {
		if in.Name != nil {
			p.Name = *in.Name
		}
		if in.Status != nil {
			p.Status = PlanStatus(*in.Status)
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
	grants, err := s.store.ListGrants(ctx, scope, ids)
	if err != nil {
		return nil, err
	}
	for _, g := range grants {
		i := at[g.PlanVariantID]
		out[i].Grants = append(out[i].Grants, g)
	}
	ents, err := s.store.ListEntitlements(ctx, scope, ids)
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

// CreateVariantInput is the body of POST /v1/plans/{id}/variants.
type CreateVariantInput struct {
	BillingCycle           *string  `json:"billing_cycle"`
	TrialDays              *int     `json:"trial_days"`
	BillingMode            *string  `json:"billing_mode"`
	RenewalDueDays         *int     `json:"renewal_due_days"`
	GracePeriodDays        *int     `json:"grace_period_days"`
	AllowUsageWhileOverdue *bool    `json:"allow_usage_while_overdue"`
	Metadata               Metadata `json:"metadata"`
}

// Validate names the first wrong field.
func (in *CreateVariantInput) Validate() error {
	if in.BillingCycle == nil || *in.BillingCycle == "" {
		return Invalid("billing_cycle", "billing_cycle is required")
	}
	if !BillingCycle(*in.BillingCycle).Valid() {
		return Invalid("billing_cycle", "billing_cycle must be daily, weekly, monthly, yearly or one_time")
	}
	if err := validateDays("trial_days", in.TrialDays); err != nil {
		return err
	}
	if in.BillingMode != nil && !BillingMode(*in.BillingMode).Valid() {
		return Invalid("billing_mode", "billing_mode must be prepaid or postpaid")
	}
	if err := validateDays("renewal_due_days", in.RenewalDueDays); err != nil {
		return err
	}
	var err error
	if in.Metadata, err = in.Metadata.Canonical("metadata"); err != nil {
		return err
	}
	return validateDays("grace_period_days", in.GracePeriodDays)
}

func validateDays(field string, v *int) error {
	if v != nil && (*v < 0 || *v > MaxVariantDays) {
		return Invalid(field, field+" must be between 0 and 3650")
	}
	return nil
}

// UpdateVariantInput is the body of PATCH /v1/plans/{id}/variants/{vid}:
// status, trial_days and metadata (replaced) change; the other fields are
// fixed at creation and may only be repeated with their current value.
type UpdateVariantInput struct {
	Status    *string  `json:"status"`
	TrialDays *int     `json:"trial_days"`
	Metadata  Metadata `json:"metadata"`

	BillingCycle           *string `json:"billing_cycle"`
	BillingMode            *string `json:"billing_mode"`
	RenewalDueDays         *int    `json:"renewal_due_days"`
	GracePeriodDays        *int    `json:"grace_period_days"`
	AllowUsageWhileOverdue *bool   `json:"allow_usage_while_overdue"`
}

// Validate names the first wrong field among the mutable ones.
func (in *UpdateVariantInput) Validate() error {
	if in.Status != nil && !PlanStatus(*in.Status).Valid() {
		return Invalid("status", "status must be active or retired")
	}
	var err error
	if in.Metadata, err = in.Metadata.Canonical("metadata"); err != nil {
		return err
	}
	return validateDays("trial_days", in.TrialDays)
}

// immutable is the 422 of a PATCH that tries to change a fixed field.
func immutable(field string) error {
	return Invalid(field, field+" is fixed at creation and cannot be changed")
}

// checkFixed refuses a PATCH that sends a fixed field with another value.
func (in *UpdateVariantInput) checkFixed(v PlanVariant) error {
	switch {
	case in.BillingCycle != nil && BillingCycle(*in.BillingCycle) != v.BillingCycle:
		return immutable("billing_cycle")
	case in.BillingMode != nil && BillingMode(*in.BillingMode) != v.BillingMode:
		return immutable("billing_mode")
	case in.RenewalDueDays != nil && *in.RenewalDueDays != v.RenewalDueDays:
		return immutable("renewal_due_days")
	case in.GracePeriodDays != nil && *in.GracePeriodDays != v.GracePeriodDays:
		return immutable("grace_period_days")
	case in.AllowUsageWhileOverdue != nil && *in.AllowUsageWhileOverdue != v.AllowUsageWhileOverdue:
		return immutable("allow_usage_while_overdue")
	}
	return nil
}

// CreateVariant adds an active variant to a plan, retired or not.
// Errors: 404 missing plan, 422 naming the field.
func (s *Plans) CreateVariant(ctx context.Context, scope Scope, planID uuid.UUID, in CreateVariantInput) (PlanVariant, error) {
	if err := in.Validate(); err != nil {
		return PlanVariant{}, err
	}
	now := s.clock.Now()
	v := PlanVariant{ID: uuid.Must(uuid.NewV7()), PlanID: planID, TenantID: scope.TenantID, Environment: scope.Environment,
		BillingCycle: BillingCycle(*in.BillingCycle), Status: PlanActive, BillingMode: BillingPrepaid,
		RenewalDueDays: DefaultRenewalDueDays, GracePeriodDays: DefaultGracePeriodDays, AllowUsageWhileOverdue: true,
		Metadata: orEmpty(in.Metadata), CreatedAt: now, UpdatedAt: now}
	if in.TrialDays != nil {
		v.TrialDays = *in.TrialDays
	}
	if in.BillingMode != nil {
		v.BillingMode = BillingMode(*in.BillingMode)
	}
	if in.RenewalDueDays != nil {
		v.RenewalDueDays = *in.RenewalDueDays
	}
	if in.GracePeriodDays != nil {
		v.GracePeriodDays = *in.GracePeriodDays
	}
	if in.AllowUsageWhileOverdue != nil {
		v.AllowUsageWhileOverdue = *in.AllowUsageWhileOverdue
	}
	if err := s.store.CreateVariant(ctx, v); err != nil {
		if errors.Is(err, ErrNotFound) {
			return PlanVariant{}, NotFound("plan not found")
		}
		return PlanVariant{}, err
	}
	return v, nil
}

// UpdateVariant changes status, trial_days and metadata (replaced) of a
// variant of the plan. Errors: 404, 422 (bad value, or a fixed field sent
// with another value).
func (s *Plans) UpdateVariant(ctx context.Context, scope Scope, planID, id uuid.UUID, in UpdateVariantInput) (PlanVariant, error) {
	if err := in.Validate(); err != nil {
		return PlanVariant{}, err
	}
	now := s.clock.Now()
	v, err := s.store.UpdateVariant(ctx, scope, planID, id, func(v *PlanVariant) error {
		if err := in.checkFixed(*v); err != nil {
			return err
		}
		if in.Status != nil {
			v.Status = PlanStatus(*in.Status)
		}
		if in.TrialDays != nil {
			v.TrialDays = *in.TrialDays
		}
		if in.Metadata != nil {
			v.Metadata = in.Metadata
		}
		v.UpdatedAt = now
		return nil
	})
	if errors.Is(err, ErrNotFound) {
		return PlanVariant{}, NotFound("plan variant not found")
	}
	if err != nil {
		return PlanVariant{}, err
	}
	s.forgetVariant(scope, id)
	return v, nil
}

// ListVariants lists a plan's variants oldest first, both statuses, without
// grants; an unknown plan has none.
func (s *Plans) ListVariants(ctx context.Context, scope Scope, planID uuid.UUID) ([]PlanVariant, error) {
	vs, err := s.store.ListVariants(ctx, scope, []uuid.UUID{planID})
	if err != nil {
		return nil, err
	}
	if vs == nil {
		vs = []PlanVariant{}
	}
	return vs, nil
}

// Variant reads a variant with its grants and entitlements. Errors: 404.
func (s *Plans) Variant(ctx context.Context, scope Scope, id uuid.UUID) (VariantDetail, error) {
	v, err := s.store.GetVariant(ctx, scope, id)
	if errors.Is(err, ErrNotFound) {
		return VariantDetail{}, NotFound("plan variant not found")
	}
	if err != nil {
		return VariantDetail{}, err
	}
	ds, err := s.details(ctx, scope, []PlanVariant{v})
	if err != nil {
		return VariantDetail{}, err
	}
	return ds[0], nil
}

// CachedVariant is Variant from a short-lived cache, for the hot path
// (entitlement checks, schedulers). Misses and errors are never cached.
func (s *Plans) CachedVariant(ctx context.Context, scope Scope, id uuid.UUID) (VariantDetail, error) {
	k := variantKey{scope.TenantID, scope.Environment, id}
	now := time.Now()
	s.mu.Lock()
	c, hit := s.variants[k]
	s.mu.Unlock()
	if hit && now.Before(c.expires) {
		return c.v, nil
	}
	d, err := s.Variant(ctx, scope, id)
	if err != nil {
		return VariantDetail{}, err
	}
	s.mu.Lock()
	if len(s.variants) > 100_000 {
		s.variants = map[variantKey]cachedVariant{}
	}
	s.variants[k] = cachedVariant{v: d, expires: now.Add(variantCacheTTL)}
	s.mu.Unlock()
	return d, nil
}

func (s *Plans) forgetVariant(scope Scope, id uuid.UUID) {
	s.mu.Lock()
	delete(s.variants, variantKey{scope.TenantID, scope.Environment, id})
	s.mu.Unlock()
}

// ---- grants ----

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
	s.forgetVariant(scope, variantID)
	return g, nil
}

// ---- entitlements ----

// EntitlementInput is the body of POST /v1/plans/{id}/variants/{vid}/entitlements.
type EntitlementInput struct {
	BillableMetricKey *string         `json:"billable_metric_key"`
	Value             json.RawMessage `json:"value"`
}

// Validate names the first missing field; the value's shape depends on the
// metric and is checked against it later.
func (in *EntitlementInput) Validate() error {
	if in.BillableMetricKey == nil || *in.BillableMetricKey == "" {
		return Invalid("billable_metric_key", "billable_metric_key is required")
	}
	if len(in.Value) == 0 || string(in.Value) == "null" {
		return Invalid("value", "value is required")
	}
	return nil
}

// PutEntitlement sets what a variant grants for one metric, replacing the
// previous entitlement of that metric (a new id). Errors: 404 (no such
// variant under that plan, or no such metric, naming billable_metric_key),
// 400 value not shaped for the metric's type, 422 missing field.
func (s *Plans) PutEntitlement(ctx context.Context, scope Scope, planID, variantID uuid.UUID, in EntitlementInput) (VariantEntitlement, error) {
	if err := in.Validate(); err != nil {
		return VariantEntitlement{}, err
	}
	m, ok, err := s.metrics.Metric(ctx, scope, *in.BillableMetricKey)
	if err != nil {
		return VariantEntitlement{}, err
	}
	if !ok {
		return VariantEntitlement{}, &Error{Kind: KindNotFound, Field: "billable_metric_key", Detail: "no billable metric has this key"}
	}
	val, err := EntitlementValue(m.Type, in.Value)
	if err != nil {
		return VariantEntitlement{}, err
	}
	e := VariantEntitlement{ID: uuid.Must(uuid.NewV7()), PlanVariantID: variantID, TenantID: scope.TenantID,
		Environment: scope.Environment, BillableMetricKey: m.Key, Type: m.Type, Value: val, CreatedAt: s.clock.Now()}
	if err := s.store.PutEntitlement(ctx, planID, e); err != nil {
		if errors.Is(err, ErrNotFound) {
			return VariantEntitlement{}, NotFound("plan variant not found")
		}
		return VariantEntitlement{}, err
	}
	s.forgetVariant(scope, variantID)
	return e, nil
}

// EntitlementValue checks an entitlement or override value against the
// metric type and returns it in canonical form: boolean and metered
// {"enabled": bool}, gauge {"cap": integer >= 0}, static {"config": object}
// (addendum 5). A mismatch is a 400 naming the member, as for overrides.
// Overrides refuse metered metrics before calling this.
func EntitlementValue(t MetricType, raw json.RawMessage) (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil || obj == nil {
		return nil, BadRequest("value", "value must be an object shaped for the metric's type")
	}
	switch t {
	case MetricBoolean, MetricMetered:
		var on bool
		if v, ok := obj["enabled"]; !ok || json.Unmarshal(v, &on) != nil {
			return nil, BadRequest("value.enabled", "a "+string(t)+" value is {\"enabled\": true|false}")
		}
		return json.Marshal(map[string]bool{"enabled": on})
	case MetricGauge:
		var c int64
		if v, ok := obj["cap"]; !ok || json.Unmarshal(v, &c) != nil || c < 0 {
			return nil, BadRequest("value.cap", "a gauge value is {\"cap\": integer >= 0}")
		}
		return json.Marshal(map[string]int64{"cap": c})
	case MetricStatic:
		v, ok := obj["config"]
		var cfg map[string]json.RawMessage
		if !ok || json.Unmarshal(v, &cfg) != nil || cfg == nil {
			return nil, BadRequest("value.config", "a static value is {\"config\": object}")
		}
		return json.Marshal(map[string]json.RawMessage{"config": v})
	}
	return nil, BadRequest("value", "the metric has an unknown type")
}
