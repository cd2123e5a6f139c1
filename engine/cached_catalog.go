// CachedCatalog: the Catalog decorator that serves the hot path's metric
// and rule look-ups (CatalogLookup) from memory, stale while one background
// read revalidates a key in use, and forgets a key as soon as a write
// through it changes the key's metric or rule.

package engine

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// catalogCacheTTL bounds how long a metric or rule is kept without a
// Postgres read while no write moves the tenant's catalog stamp (Stamps:
// a change made anywhere in the fleet is seen by the next request; the TTL
// bounds staleness only while the stamps cannot be read).
const catalogCacheTTL = 2 * time.Second

// catalogStaleLimit bounds how long past catalogCacheTTL a metric or rule
// is served while its background refresh runs; maxCatalogEntries bounds
// each cache's memory.
const (
	catalogStaleLimit = 10 * time.Second
	maxCatalogEntries = 100_000
)

// catalogKey names one metric key of a tenant's environment; the API key
// of the scope plays no part (the rows do not depend on it).
type catalogKey struct {
	tenant uuid.UUID
	env    Environment
	key    string
}

type cachedMetric struct {
	m     BillableMetric
	found bool
}

type cachedRule struct {
	r     MeteringRule
	found bool
}

// storeCatalogLookup is the uncached CatalogLookup of a Catalog.
type storeCatalogLookup struct{ store Catalog }

// NewCatalogLookup reads store afresh on every look-up.
func NewCatalogLookup(store Catalog) CatalogLookup { return storeCatalogLookup{store} }

// Metric reads the metric.
func (l storeCatalogLookup) Metric(ctx context.Context, s Scope, key string) (BillableMetric, bool, error) {
	m, err := l.store.GetMetric(ctx, s, key)
	if errors.Is(err, ErrNotFound) {
		return BillableMetric{}, false, nil
	}
	return m, err == nil, err
}

// Rule reads the active rule.
func (l storeCatalogLookup) Rule(ctx context.Context, s Scope, key string) (MeteringRule, bool, error) {
	r, err := l.store.ActiveRule(ctx, s, key)
	if errors.Is(err, ErrNotFound) {
		return MeteringRule{}, false, nil
	}
	return r, err == nil, err
}

// CachedCatalog is a Catalog whose CatalogLookup reads (found or not) are
// cached for catalogCacheTTL, lock-free, and served up to
// catalogStaleLimit past it while one background read refreshes them. Its
// other reads pass through; its writes forget the key they change.
type CachedCatalog struct {
	Catalog
	metrics *swrCache[catalogKey, cachedMetric]
	rules   *swrCache[catalogKey, cachedRule]
	stamps  *Stamps
	// down tells a failed read of an unreachable Postgres from an answer
	// (nil: SourceDown's default).
	down SourceDown
}

var (
	_ Catalog       = (*CachedCatalog)(nil)
	_ CatalogLookup = (*CachedCatalog)(nil)
)

// NewCachedCatalog caches store's look-ups.
func NewCachedCatalog(store Catalog) *CachedCatalog {
	return &CachedCatalog{Catalog: store, metrics: newSWRCache[catalogKey, cachedMetric](maxCatalogEntries),
		rules: newSWRCache[catalogKey, cachedRule](maxCatalogEntries)}
}

// WithStamps makes c check its entries against the fleet's catalog stamps
// and move them on every write; nil (the default) is a node alone.
func (c *CachedCatalog) WithStamps(st *Stamps) *CachedCatalog {
	c.stamps = st
	return c
}

// WithSourceDown makes c tell an unreachable source by down (internal/app:
// persist.Unavailable): a metric or rule whose read fails so is served
// from its last good copy, within lastGoodLimit.
func (c *CachedCatalog) WithSourceDown(down SourceDown) *CachedCatalog {
	c.down = down
	return c
}

// Metric is the cached look-up of a metric.
func (c *CachedCatalog) Metric(ctx context.Context, s Scope, key string) (BillableMetric, bool, error) {
	k := catalogKey{s.TenantID, s.Environment, key}
	e, st := c.metrics.get(k, time.Now(), catalogStaleLimit, c.stamps.Seen(s.TenantID, maskCatalog))
	switch st {
	case cacheFresh:
		return e.m, e.found, nil
	case cacheRefresh:
		c.metrics.refreshInBackground(k, c.down, func(ctx context.Context) error {
			_, err := c.loadMetric(ctx, s, k)
			return err
		})
		return e.m, e.found, nil
	}
	fresh, err := c.loadMetric(ctx, s, k)
	if st != cacheMiss && c.down.says(err) {
		if st == cacheExpired {
			c.metrics.markDown(k, time.Now())
		}
		return e.m, e.found, nil // Postgres unreachable: the last good copy (invariant 16)
	}
	return fresh.m, fresh.found, err
}

func (c *CachedCatalog) loadMetric(ctx context.Context, s Scope, k catalogKey) (cachedMetric, error) {
	gen, stamp := c.metrics.generation(), c.stamps.Seen(s.TenantID, maskCatalog)
	m, err := c.Catalog.GetMetric(ctx, s, k.key)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return cachedMetric{}, err
	}
	e := cachedMetric{m: m, found: err == nil}
	c.metrics.put(k, e, time.Now().Add(c.stamps.TTL(catalogCacheTTL)), gen, stamp)
	return e, nil
}

// Rule is the cached look-up of a metric's active rule.
func (c *CachedCatalog) Rule(ctx context.Context, s Scope, key string) (MeteringRule, bool, error) {
	k := catalogKey{s.TenantID, s.Environment, key}
	e, st := c.rules.get(k, time.Now(), catalogStaleLimit, c.stamps.Seen(s.TenantID, maskCatalog))
	switch st {
	case cacheFresh:
		return e.r, e.found, nil
	case cacheRefresh:
		c.rules.refreshInBackground(k, c.down, func(ctx context.Context) error {
			_, err := c.loadRule(ctx, s, k)
			return err
		})
		return e.r, e.found, nil
	}
	fresh, err := c.loadRule(ctx, s, k)
	if st != cacheMiss && c.down.says(err) {
		if st == cacheExpired {
			c.rules.markDown(k, time.Now())
		}
		return e.r, e.found, nil // Postgres unreachable: the last good copy (invariant 16)
	}
	return fresh.r, fresh.found, err
}

func (c *CachedCatalog) loadRule(ctx context.Context, s Scope, k catalogKey) (cachedRule, error) {
	gen, stamp := c.rules.generation(), c.stamps.Seen(s.TenantID, maskCatalog)
	r, err := c.Catalog.ActiveRule(ctx, s, k.key)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return cachedRule{}, err
	}
	e := cachedRule{r: r, found: err == nil}
	c.rules.put(k, e, time.Now().Add(c.stamps.TTL(catalogCacheTTL)), gen, stamp)
	return e, nil
}

// CreateMetric inserts m, then forgets its key (here and in the fleet).
func (c *CachedCatalog) CreateMetric(ctx context.Context, m BillableMetric) error {
	err := c.Catalog.CreateMetric(ctx, m)
	if err == nil {
		c.forget(ctx, m.TenantID, m.Environment, m.Key)
	}
	return err
}

// UpdateMetric writes m, then forgets its key.
func (c *CachedCatalog) UpdateMetric(ctx context.Context, m BillableMetric) error {
	err := c.Catalog.UpdateMetric(ctx, m)
	if err == nil {
		c.forget(ctx, m.TenantID, m.Environment, m.Key)
	}
	return err
}

// CreateRule inserts r (and its metric when missing), then forgets its key.
func (c *CachedCatalog) CreateRule(ctx context.Context, r MeteringRule, metricIfMissing BillableMetric) error {
	err := c.Catalog.CreateRule(ctx, r, metricIfMissing)
	if err == nil {
		c.forget(ctx, r.TenantID, r.Environment, r.BillableMetricKey)
	}
	return err
}

// forget drops the key here, then moves the tenant's catalog stamp so
// every other node drops it before its next request.
func (c *CachedCatalog) forget(ctx context.Context, tenant uuid.UUID, env Environment, key string) {
	k := catalogKey{tenant, env, key}
	c.metrics.delete(k)
	c.rules.delete(k)
	c.stamps.Bump(ctx, tenant, StampCatalog)
}
