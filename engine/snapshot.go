package engine

import (
	"context"
	"encoding/json"
	"math"
	"sync"
	"time"

	"github.com/google/uuid"
)

// SnapshotMaxAge is how old a served snapshot may be (docs/spec/interface.md Limits).
const SnapshotMaxAge = 30 * time.Second

// Snapshot is a customer's whole entitlement picture (docs/spec/interface.md
// "Entitlement checks", snapshot).
type Snapshot struct {
	CustomerID       uuid.UUID   `json:"customer_id"`
	Environment      Environment `json:"environment"`
	Balance          int64       `json:"balance"`
	ReservedBalance  int64       `json:"reserved_balance"`
	PendingBalance   int64       `json:"pending_balance"`
	EffectiveBalance int64       `json:"effective_balance"`
	// CreditLimitMC is the customer's credit line and DebtMC what it owes
	// on it; AvailableMC is what it may spend now (AvailableOf), which the
	// entries' allowed and affordable_units are computed from.
	CreditLimitMC      int64                    `json:"credit_limit_mc"`
	DebtMC             int64                    `json:"debt_mc"`
	AvailableMC        int64                    `json:"available_mc"`
	SubscriptionStatus *string                  `json:"subscription_status"`
	PlanName           *string                  `json:"plan_name"`
	Entitlements       map[string]SnapshotEntry `json:"entitlements"`
	CachedAt           time.Time                `json:"cached_at"`
}

// SnapshotEntry is one metric in a snapshot.
type SnapshotEntry struct {
	Type                 MetricType      `json:"type"`
	BillableMetricKey    string          `json:"billable_metric_key"`
	Allowed              bool            `json:"allowed"`
	EstimatedCostPerUnit *int64          `json:"estimated_cost_per_unit,omitempty"`
	AffordableUnits      *int64          `json:"affordable_units,omitempty"`
	CostType             *CostType       `json:"cost_type,omitempty"`
	Enabled              *bool           `json:"enabled,omitempty"`
	Current              *int64          `json:"current,omitempty"`
	Cap                  *int64          `json:"cap,omitempty"`
	Headroom             *int64          `json:"headroom,omitempty"`
	Config               json.RawMessage `json:"config,omitempty"`
	// AvailableMC is what this metered metric may spend when some block
	// of the account pays for some metrics only (MetricAvailable); absent
	// otherwise, when the snapshot's available_mc is every metric's.
	AvailableMC *int64 `json:"available_mc,omitempty"`
}

// snapshotCache keeps built snapshots per customer for SnapshotMaxAge,
// each with the tenant's change stamps it was built under (Stamps): a
// snapshot built before a change made on any node (an override, a plan, a
// rule, a setting) is not served after it.
type snapshotCache struct {
	mu      sync.Mutex
	entries map[uuid.UUID]stampedSnapshot
}

type stampedSnapshot struct {
	snap  Snapshot
	stamp uint64
}

func (c *snapshotCache) get(id uuid.UUID, now time.Time, stamp uint64) (Snapshot, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[id]
	if !ok || now.Sub(e.snap.CachedAt) >= SnapshotMaxAge || e.stamp != stamp {
		return Snapshot{}, false
	}
	return e.snap, true
}

func (c *snapshotCache) put(s Snapshot, stamp uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries) > 100_000 {
		c.entries = map[uuid.UUID]stampedSnapshot{}
	}
	c.entries[s.CustomerID] = stampedSnapshot{snap: s, stamp: stamp}
}

// Forget drops a customer's cached snapshot (an override changed).
func (c *snapshotCache) Forget(id uuid.UUID) {
	c.mu.Lock()
	delete(c.entries, id)
	c.mu.Unlock()
}

// ForgetSnapshot drops a customer's cached snapshot, so the next one is
// built afresh (overrides refresh it at once).
func (s *Entitlements) ForgetSnapshot(customer uuid.UUID) { s.snapshots.Forget(customer) }

// Snapshot builds (or serves from cache, unless fresh is set) the
// customer's entitlement picture: one entry per metric the tenant defines.
// A lenient ref auto-creates the customer; a strict one is 404 when unknown.
func (s *Entitlements) Snapshot(ctx context.Context, scope Scope, tenant Tenant, ref CustomerRef, fresh bool) (Snapshot, error) {
	c, err := s.customers.Resolve(ctx, scope, ref, !ref.Strict)
	if err != nil {
		return Snapshot{}, err
	}
	now := s.clock.Now()
	stamp := s.stamps.Seen(scope.TenantID, maskSnapshot)
	if !fresh {
		if snap, ok := s.snapshots.get(c.ID, now, stamp); ok {
			return snap, nil
		}
	}
	key := CustomerKeyOf(c)
	acct, err := s.credits.snapshotAt(ctx, key, now)
	if err != nil {
		return Snapshot{}, err
	}
	f, err := s.facts(ctx, c)
	if err != nil {
		return Snapshot{}, err
	}
	metrics, err := s.metering.AllMetrics(ctx, scope)
	if err != nil {
		return Snapshot{}, err
	}
	snap := Snapshot{CustomerID: c.ID, Environment: c.Environment, Balance: acct.Balance,
		ReservedBalance: acct.ReservedBalance, PendingBalance: acct.PendingBalance,
		EffectiveBalance: acct.EffectiveBalance, Entitlements: make(map[string]SnapshotEntry, len(metrics)), CachedAt: now}
	if f != nil {
		st, pn := f.Status, f.PlanName
		snap.SubscriptionStatus, snap.PlanName = &st, &pn
	}
	policy := PolicyOf(c, tenant)
	snap.CreditLimitMC, snap.DebtMC = c.CreditLimitMC, acct.DebtMC
	snap.AvailableMC = AvailableOf(acct.EffectiveBalance, c.CreditLimitMC, policy)
	scoped := false
	for _, b := range acct.Blocks {
		scoped = scoped || b.AppliesTo != nil
	}
	// A child may also spend its parent's credit (docs/rules.md "Shared
	// pools"): each metered entry counts what it may draw.
	var pool *poolView
	if c.ParentID != nil {
		if pool, err = s.poolOf(ctx, c, tenant); err != nil {
			return Snapshot{}, err
		}
	}
	for _, m := range metrics {
		// What this metric may spend: the blocks that apply to it
		// (MetricAvailable; the account's figure when none has a scope).
		avail := snap.AvailableMC
		if scoped {
			avail = MetricAvailable(acct, c.CreditLimitMC, policy, m.Key, now.UnixMilli())
		}
		if pool != nil && m.Type == MetricMetered {
			avail += pool.available(m.Key)
		}
		e, err := s.snapshotEntry(ctx, scope, key, m, f, avail, policy)
		if err != nil {
			return Snapshot{}, err
		}
		if (scoped || pool != nil) && m.Type == MetricMetered {
			e.AvailableMC = &avail
		}
		snap.Entitlements[m.Key] = e
	}
	s.snapshots.put(snap, stamp)
	return snap, nil
}

func (s *Entitlements) snapshotEntry(ctx context.Context, scope Scope, key CustomerKey, m BillableMetric, f *SubscriptionFacts, available int64, policy OveragePolicy) (SnapshotEntry, error) {
	e := SnapshotEntry{Type: m.Type, BillableMetricKey: m.Key}
	switch m.Type {
	case MetricMetered:
		r, found, err := s.metering.ActiveRule(ctx, scope, m.Key)
		if err != nil {
			return e, err
		}
		if !found {
			return e, nil
		}
		ct := r.CostType
		e.CostType = &ct
		if per, err := Price(r, 1); err == nil {
			e.EstimatedCostPerUnit = &per
			// As a check of one unit answers: only `block` stops at the
			// balance (and its credit line: available); `allow` and `notify`
			// go on and log the rest as overage.
			e.Allowed = (per <= available || policy != OveragePolicyBlock) && !meteredDenied(f, m.Key)
		}
		e.AffordableUnits = affordableUnits(r, available)
	case MetricBoolean:
		on := enabledOf(value(f, m))
		e.Enabled, e.Allowed = &on, on
	case MetricStatic:
		e.Config, e.Allowed = configOf(value(f, m)), true
	case MetricGauge:
		capMC := gaugeCap(value(f, m))
		cur, err := s.hot.GaugeValue(ctx, key, m.Key)
		if err != nil {
			return e, err
		}
		head := capMC - cur
		e.Current, e.Cap, e.Headroom, e.Allowed = &cur, &capMC, &head, head > 0
	}
	return e, nil
}

// affordableUnits is the most units whose price fits in effective: a binary
// search over Price, which only grows with units. It is nil when the price
// never outgrows the balance (a flat or free rule the balance covers).
func affordableUnits(r MeteringRule, effective int64) *int64 {
	var zero int64
	if effective <= 0 {
		if p, err := Price(r, 1); err == nil && p <= effective {
			return nil
		}
		return &zero
	}
	fits := func(n int64) bool {
		p, err := Price(r, n)
		return err == nil && p <= effective
	}
	if fits(math.MaxInt64) {
		return nil
	}
	lo, hi := int64(0), int64(math.MaxInt64)
	for lo < hi {
		mid := lo + (hi-lo)/2 + 1 // never overflows, unlike (hi-lo+1)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return &lo
}
