// CachedPlanStore: the PlanStore decorator that keeps the hot path's
// look-ups of variants and plan names (PlanLookup) in memory for a moment
// and forgets a variant as soon as a write through it changes the variant.

package engine

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
)

// variantCacheTTL bounds how long a variant's grants and entitlements, or a
// plan's name, are kept without a Postgres read while no write moves the
// tenant's plan stamp (Stamps: a change made anywhere in the fleet is seen
// by the next request; the TTL bounds staleness only while the stamps
// cannot be read). This process forgets its own changes at once.
const variantCacheTTL = 2 * time.Second

// maxCachedVariants bounds each of the caches' memory; a full cache starts
// over.
const maxCachedVariants = 100_000

type variantKey struct {
	tenant uuid.UUID
	env    Environment
	id     uuid.UUID
}

type cachedVariant struct {
	v       VariantDetail
	expires time.Time
	stamp   uint64 // the tenant's plan stamp as seen before the read
}

type cachedName struct {
	name    string
	expires time.Time
	stamp   uint64
}

// storePlanLookup is the uncached PlanLookup of a PlanStore.
type storePlanLookup struct{ store PlanStore }

// NewPlanLookup reads store afresh on every look-up.
func NewPlanLookup(store PlanStore) PlanLookup { return storePlanLookup{store} }

// VariantDetail reads the variant, then its grants and entitlements.
func (l storePlanLookup) VariantDetail(ctx context.Context, s Scope, id uuid.UUID) (VariantDetail, error) {
	v, err := l.store.GetVariant(ctx, s, id)
	if err != nil {
		return VariantDetail{}, err
	}
	ds, err := variantDetails(ctx, l.store, s, []PlanVariant{v})
	if err != nil {
		return VariantDetail{}, err
	}
	return ds[0], nil
}

// PlanName reads the plan.
func (l storePlanLookup) PlanName(ctx context.Context, s Scope, id uuid.UUID) (string, error) {
	p, err := l.store.GetPlan(ctx, s, id)
	if err != nil {
		return "", err
	}
	return p.Name, nil
}

// CachedPlanStore is a PlanStore whose PlanLookup reads are cached for
// variantCacheTTL (misses and errors are never cached); its other reads
// pass through, and its variant, grant and entitlement writes forget the
// variant they change.
type CachedPlanStore struct {
	PlanStore
	read   storePlanLookup
	stamps *Stamps
	// down tells a failed read of an unreachable Postgres from an answer
	// (nil: SourceDown's default).
	down SourceDown

	mu       sync.Mutex
	variants map[variantKey]cachedVariant
	names    map[uuid.UUID]cachedName
}

var (
	_ PlanStore  = (*CachedPlanStore)(nil)
	_ PlanLookup = (*CachedPlanStore)(nil)
)

// NewCachedPlanStore caches store's look-ups.
func NewCachedPlanStore(store PlanStore) *CachedPlanStore {
	return &CachedPlanStore{PlanStore: store, read: storePlanLookup{store},
		variants: map[variantKey]cachedVariant{}, names: map[uuid.UUID]cachedName{}}
}

// WithSourceDown makes c tell an unreachable source by down (internal/app:
// persist.Unavailable): a variant or plan name whose read fails so is
// served from its last good copy, within lastGoodLimit of its expiry.
func (c *CachedPlanStore) WithSourceDown(down SourceDown) *CachedPlanStore {
	c.down = down
	return c
}

// WithStamps makes c check its entries against the fleet's plan stamps
// and move them on every write. nil (the default) is a node alone.
func (c *CachedPlanStore) WithStamps(st *Stamps) *CachedPlanStore {
	c.stamps = st
	return c
}

// VariantDetail is the cached variant with its grants and entitlements.
func (c *CachedPlanStore) VariantDetail(ctx context.Context, s Scope, id uuid.UUID) (VariantDetail, error) {
	k := variantKey{s.TenantID, s.Environment, id}
	now := time.Now()
	stamp := c.stamps.Seen(s.TenantID, maskPlans)
	c.mu.Lock()
	e, hit := c.variants[k]
	c.mu.Unlock()
	if hit && now.Before(e.expires) && e.stamp == stamp {
		return e.v, nil
	}
	d, err := c.read.VariantDetail(ctx, s, id)
	if hit && now.Before(e.expires.Add(lastGoodLimit)) && c.down.says(err) {
		return e.v, nil // Postgres unreachable: the last good copy (invariant 16)
	}
	if err != nil {
		return VariantDetail{}, err
	}
	c.mu.Lock()
	if len(c.variants) > maxCachedVariants {
		c.variants = map[variantKey]cachedVariant{}
	}
	c.variants[k] = cachedVariant{v: d, expires: now.Add(c.stamps.TTL(variantCacheTTL)), stamp: stamp}
	c.mu.Unlock()
	return d, nil
}

// PlanName is the cached name of a plan.
func (c *CachedPlanStore) PlanName(ctx context.Context, s Scope, id uuid.UUID) (string, error) {
	now := time.Now()
	stamp := c.stamps.Seen(s.TenantID, maskPlans)
	c.mu.Lock()
	n, hit := c.names[id]
	c.mu.Unlock()
	if hit && now.Before(n.expires) && n.stamp == stamp {
		return n.name, nil
	}
	name, err := c.read.PlanName(ctx, s, id)
	if hit && now.Before(n.expires.Add(lastGoodLimit)) && c.down.says(err) {
		return n.name, nil // Postgres unreachable: the last good copy (invariant 16)
	}
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	if len(c.names) > maxCachedVariants {
		c.names = map[uuid.UUID]cachedName{}
	}
	c.names[id] = cachedName{name: name, expires: now.Add(c.stamps.TTL(variantCacheTTL)), stamp: stamp}
	c.mu.Unlock()
	return name, nil
}

// UpdatePlan writes the plan, then forgets its name (here and in the
// fleet).
func (c *CachedPlanStore) UpdatePlan(ctx context.Context, s Scope, id uuid.UUID, change func(*Plan) error) (Plan, error) {
	p, err := c.PlanStore.UpdatePlan(ctx, s, id, change)
	if err == nil {
		c.mu.Lock()
		delete(c.names, id)
		c.mu.Unlock()
		c.stamps.Bump(ctx, s.TenantID, StampPlans)
	}
	return p, err
}

// UpdateVariant writes the variant, then forgets it (here and in the
// fleet).
func (c *CachedPlanStore) UpdateVariant(ctx context.Context, s Scope, planID, id uuid.UUID, change func(*PlanVariant) error) (PlanVariant, error) {
	v, err := c.PlanStore.UpdateVariant(ctx, s, planID, id, change)
	if err == nil {
		c.forget(ctx, s.TenantID, s.Environment, id)
	}
	return v, err
}

// CreateGrant writes the grant, then forgets its variant.
func (c *CachedPlanStore) CreateGrant(ctx context.Context, planID uuid.UUID, g PlanGrant) error {
	err := c.PlanStore.CreateGrant(ctx, planID, g)
	if err == nil {
		c.forget(ctx, g.TenantID, g.Environment, g.PlanVariantID)
	}
	return err
}

// PutEntitlement writes the entitlement, then forgets its variant.
func (c *CachedPlanStore) PutEntitlement(ctx context.Context, planID uuid.UUID, e VariantEntitlement) error {
	err := c.PlanStore.PutEntitlement(ctx, planID, e)
	if err == nil {
		c.forget(ctx, e.TenantID, e.Environment, e.PlanVariantID)
	}
	return err
}

// forget drops the variant here, then moves the tenant's plan stamp so
// every other node drops it before its next request.
func (c *CachedPlanStore) forget(ctx context.Context, tenant uuid.UUID, env Environment, id uuid.UUID) {
	c.mu.Lock()
	delete(c.variants, variantKey{tenant, env, id})
	c.mu.Unlock()
	c.stamps.Bump(ctx, tenant, StampPlans)
}
