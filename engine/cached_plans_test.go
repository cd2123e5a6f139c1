package engine

import (
	"context"
	"errors"
	"testing"

	"github.com/google/uuid"
)

// countingPlans is a PlanStore of one variant of one plan that counts the
// variant and plan reads reaching it.
type countingPlans struct {
	PlanStore
	variant PlanVariant
	plan    Plan
	reads   int
}

func (p *countingPlans) GetVariant(_ context.Context, _ Scope, id uuid.UUID) (PlanVariant, error) {
	p.reads++
	if id != p.variant.ID {
		return PlanVariant{}, ErrNotFound
	}
	return p.variant, nil
}

func (p *countingPlans) ListGrants(context.Context, Scope, []uuid.UUID) ([]PlanGrant, error) {
	return nil, nil
}

func (p *countingPlans) ListEntitlements(context.Context, Scope, []uuid.UUID) ([]VariantEntitlement, error) {
	return nil, nil
}

func (p *countingPlans) GetPlan(context.Context, Scope, uuid.UUID) (Plan, error) {
	p.reads++
	return p.plan, nil
}

func (p *countingPlans) UpdateVariant(_ context.Context, _ Scope, _, _ uuid.UUID, change func(*PlanVariant) error) (PlanVariant, error) {
	if err := change(&p.variant); err != nil {
		return PlanVariant{}, err
	}
	return p.variant, nil
}

func (p *countingPlans) CreateGrant(context.Context, uuid.UUID, PlanGrant) error { return nil }

func (p *countingPlans) PutEntitlement(context.Context, uuid.UUID, VariantEntitlement) error {
	return nil
}

// TestCachedPlanStore: variants and plan names are read once until a
// write through the decorator changes the variant; misses are not cached.
func TestCachedPlanStore(t *testing.T) {
	ctx := context.Background()
	tenant := uuid.New()
	scope := Scope{TenantID: tenant, Environment: EnvironmentLive}
	v := PlanVariant{ID: uuid.New(), TenantID: tenant, Environment: EnvironmentLive, TrialDays: 1}
	tests := []struct {
		name      string
		run       func(c *CachedPlanStore) error
		wantReads int
	}{
		{"variant read once", func(c *CachedPlanStore) error {
			c.VariantDetail(ctx, scope, v.ID)
			_, err := c.VariantDetail(ctx, scope, v.ID)
			return err
		}, 1},
		{"plan name read once", func(c *CachedPlanStore) error {
			c.PlanName(ctx, scope, uuid.Nil)
			name, err := c.PlanName(ctx, scope, uuid.Nil)
			if name != "Pro" {
				return errors.New("wrong name")
			}
			return err
		}, 1},
		{"an unknown variant is not cached", func(c *CachedPlanStore) error {
			c.VariantDetail(ctx, scope, uuid.Nil)
			if _, err := c.VariantDetail(ctx, scope, uuid.Nil); !errors.Is(err, ErrNotFound) {
				return errors.New("no ErrNotFound")
			}
			return nil
		}, 2},
		{"an update is seen at once", func(c *CachedPlanStore) error {
			c.VariantDetail(ctx, scope, v.ID)
			if _, err := c.UpdateVariant(ctx, scope, uuid.Nil, v.ID, func(pv *PlanVariant) error { pv.TrialDays = 7; return nil }); err != nil {
				return err
			}
			d, err := c.VariantDetail(ctx, scope, v.ID)
			if d.TrialDays != 7 {
				return errors.New("stale variant after the update")
			}
			return err
		}, 2},
		{"a refused update forgets nothing", func(c *CachedPlanStore) error {
			c.VariantDetail(ctx, scope, v.ID)
			c.UpdateVariant(ctx, scope, uuid.Nil, v.ID, func(*PlanVariant) error { return errors.New("no") })
			_, err := c.VariantDetail(ctx, scope, v.ID)
			return err
		}, 1},
		{"a grant forgets its variant", func(c *CachedPlanStore) error {
			c.VariantDetail(ctx, scope, v.ID)
			c.CreateGrant(ctx, uuid.Nil, PlanGrant{PlanVariantID: v.ID, TenantID: tenant, Environment: EnvironmentLive})
			_, err := c.VariantDetail(ctx, scope, v.ID)
			return err
		}, 2},
		{"an entitlement forgets its variant", func(c *CachedPlanStore) error {
			c.VariantDetail(ctx, scope, v.ID)
			c.PutEntitlement(ctx, uuid.Nil, VariantEntitlement{PlanVariantID: v.ID, TenantID: tenant, Environment: EnvironmentLive})
			_, err := c.VariantDetail(ctx, scope, v.ID)
			return err
		}, 2},
		{"another environment's entitlement forgets nothing", func(c *CachedPlanStore) error {
			c.VariantDetail(ctx, scope, v.ID)
			c.PutEntitlement(ctx, uuid.Nil, VariantEntitlement{PlanVariantID: v.ID, TenantID: tenant, Environment: EnvironmentSandbox})
			_, err := c.VariantDetail(ctx, scope, v.ID)
			return err
		}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store := &countingPlans{variant: v, plan: Plan{Name: "Pro"}}
			if err := tc.run(NewCachedPlanStore(store)); err != nil {
				t.Fatal(err)
			}
			if store.reads != tc.wantReads {
				t.Errorf("%d store reads, want %d", store.reads, tc.wantReads)
			}
		})
	}
}
