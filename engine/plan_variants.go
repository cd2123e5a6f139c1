// Plan variants: the priced, billed versions of a plan (cycle, mode, trial,
// renewal and grace) and their commands.

package engine

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// BillingCycle is how long one period of a variant lasts.
type BillingCycle string

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

// Valid reports whether m is prepaid or postpaid.
func (m BillingMode) Valid() bool { return m == BillingPrepaid || m == BillingPostpaid }

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

// CreateVariant is a checked request to add a variant to a plan: api
// builds it from the body of POST /v1/plans/{id}/variants (or the console's
// variant form). A nil field takes the variant default.
type CreateVariant struct {
	BillingCycle           BillingCycle
	TrialDays              *int
	BillingMode            *BillingMode
	RenewalDueDays         *int
	GracePeriodDays        *int
	AllowUsageWhileOverdue *bool
	Metadata               Metadata // canonical; nil: none
}

// UpdateVariant is a checked PATCH of a variant: status, trial_days and
// metadata (replaced) change when not nil; the other fields are fixed at
// creation and, when sent, must equal their current value.
type UpdateVariant struct {
	Status    *PlanStatus
	TrialDays *int
	Metadata  Metadata // canonical

	BillingCycle           *BillingCycle
	BillingMode            *BillingMode
	RenewalDueDays         *int
	GracePeriodDays        *int
	AllowUsageWhileOverdue *bool
}

// immutable is the 422 of a PATCH that tries to change a fixed field.
func immutable(field string) error {
	return Invalid(field, field+" is fixed at creation and cannot be changed")
}

// checkFixed refuses a PATCH that sends a fixed field with another value.
func (in *UpdateVariant) checkFixed(v PlanVariant) error {
	switch {
	case in.BillingCycle != nil && *in.BillingCycle != v.BillingCycle:
		return immutable("billing_cycle")
	case in.BillingMode != nil && *in.BillingMode != v.BillingMode:
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
// Errors: 404 missing plan.
func (s *Plans) CreateVariant(ctx context.Context, scope Scope, planID uuid.UUID, in CreateVariant) (PlanVariant, error) {
	now := s.clock.Now()
	v := PlanVariant{ID: uuid.Must(uuid.NewV7()), PlanID: planID, TenantID: scope.TenantID, Environment: scope.Environment,
		BillingCycle: in.BillingCycle, Status: PlanActive, BillingMode: BillingPrepaid,
		RenewalDueDays: DefaultRenewalDueDays, GracePeriodDays: DefaultGracePeriodDays, AllowUsageWhileOverdue: true,
		Metadata: orEmpty(in.Metadata), CreatedAt: now, UpdatedAt: now}
	if in.TrialDays != nil {
		v.TrialDays = *in.TrialDays
	}
	if in.BillingMode != nil {
		v.BillingMode = *in.BillingMode
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
// variant of the plan. Errors: 404, 422 (a fixed field sent with another
// value).
func (s *Plans) UpdateVariant(ctx context.Context, scope Scope, planID, id uuid.UUID, in UpdateVariant) (PlanVariant, error) {
	now := s.clock.Now()
	v, err := s.store.UpdateVariant(ctx, scope, planID, id, func(v *PlanVariant) error {
		if err := in.checkFixed(*v); err != nil {
			return err
		}
		if in.Status != nil {
			v.Status = *in.Status
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

// CachedVariant is Variant through the service's PlanLookup (a short-lived
// cache in a running creditd), for the hot path (entitlement checks,
// schedulers). Errors: 404.
func (s *Plans) CachedVariant(ctx context.Context, scope Scope, id uuid.UUID) (VariantDetail, error) {
	d, err := s.lookup.VariantDetail(ctx, scope, id)
	if err != nil {
		return VariantDetail{}, variantNotFound(err)
	}
	return d, nil
}

// variantNotFound turns a store's ErrNotFound into the variant's 404.
func variantNotFound(err error) error {
	if errors.Is(err, ErrNotFound) {
		return NotFound("plan variant not found")
	}
	return err
}

// Billing cycles of docs/spec/interface.md "Plan variant".
const (
	CycleDaily   BillingCycle = "daily"
	CycleWeekly  BillingCycle = "weekly"
	CycleMonthly BillingCycle = "monthly"
	CycleYearly  BillingCycle = "yearly"
	CycleOneTime BillingCycle = "one_time"
)

// Billing modes of docs/spec/interface.md "Plan variant".
const (
	BillingPrepaid  BillingMode = "prepaid"
	BillingPostpaid BillingMode = "postpaid"
)

// Variant defaults of docs/spec/interface.md "Plan variant".
const (
	DefaultRenewalDueDays  = 3
	DefaultGracePeriodDays = 3
)
