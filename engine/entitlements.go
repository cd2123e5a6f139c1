package engine

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
)

// Entitlements answers checks and charges usage: the hot path. A metered
// check is one Redis round trip: customer, tenant, metric and rule come from
// in-process caches.
type Entitlements struct {
	customers CustomerLookup
	metering  *Metering
	credits   *Credits
	hot       MeteringStore
	clock     Clock
	plans     PlanView
	snapshots snapshotCache
	stamps    *Stamps
	applied   AppliedReader
	// appliedDown tells an unreachable Postgres in applied's errors.
	appliedDown SourceDown
	// usageIDs is the tenant index of usage event ids (nil: none).
	usageIDs UsageIDs
	// leases and leaseIndex serve lease renew and release.
	leases     LeaseStore
	leaseIndex LeaseIndex
}

// SubscriptionFacts is what a live subscription says on a check.
type SubscriptionFacts struct {
	Status   string
	PlanName string
	// AllowUsage is false while past_due on a variant that forbids usage
	// while overdue (docs/spec/addendum.md §6).
	AllowUsage bool
	// Values maps a metric key to its value: a live override, else the
	// variant entitlement (docs/spec/addendum.md §5 resolution order).
	Values map[string]json.RawMessage
	// expiresAt is the soonest expiry of an override in Values (zero when
	// none): facts are never served stale past it.
	expiresAt time.Time
	// subscription is the subscription they are of, so an override write
	// can forget them.
	subscription uuid.UUID
}

// facts is the customer's subscription facts, nil without a plan view or
// subscription.
func (s *Entitlements) facts(ctx context.Context, c Customer) (*SubscriptionFacts, error) {
	if s.plans == nil {
		return nil, nil
	}
	return s.plans.ForCustomer(ctx, c)
}

// value is the metric's value for a customer: subscription (override or
// variant) first, else the metric default.
func value(f *SubscriptionFacts, m BillableMetric) json.RawMessage {
	if f != nil {
		if v, ok := f.Values[m.Key]; ok {
			return v
		}
	}
	return m.DefaultValue
}

// meteredDenied reports whether the subscription keeps the customer from a
// metered metric: usage while overdue is off, or the variant says
// {enabled: false} for it.
func meteredDenied(f *SubscriptionFacts, key string) bool {
	if f == nil {
		return false
	}
	if !f.AllowUsage {
		return true
	}
	if v, ok := f.Values[key]; ok {
		var e struct {
			Enabled *bool `json:"enabled"`
		}
		if json.Unmarshal(v, &e) == nil && e.Enabled != nil && !*e.Enabled {
			return true
		}
	}
	return false
}

// ErrUsageNotAllowed: the subscription forbids usage now (past_due without
// allow_usage_while_overdue, or the plan denies the metric).
var ErrUsageNotAllowed = &Error{Kind: KindConflict, Detail: "the customer's subscription does not allow this usage now"}

// EntitlementsDeps is what the entitlement service is built from; every
// dependency is given here, none is set after construction.
type EntitlementsDeps struct {
	// Customers resolves the customer of every call (a CachedCustomers in
	// a running creditd).
	Customers CustomerLookup
	Metering  *Metering
	Credits   *Credits
	Hot       MeteringStore
	Clock     Clock
	// Plans plugs subscriptions into checks, consumes and reservations (nil: every
	// value is the metric default).
	Plans PlanView
	// Applied lets usage batches find events charged so long ago that Redis
	// no longer remembers them (event ids are idempotent forever); nil: none.
	Applied AppliedReader
	// AppliedDown tells a look-up of Applied that failed because Postgres
	// could not answer (internal/app: persist.Unavailable): the batch then
	// runs on the seen filter alone (Usage). nil: SourceDown's default.
	AppliedDown SourceDown
	// UsageIDs claims usage event ids per tenant before their consumes
	// run, so an id re-sent for another customer is a reuse even before
	// Postgres holds the first charge (issue 26). nil: only Applied tells.
	UsageIDs UsageIDs
	// Leases and LeaseIndex serve lease renew and release.
	Leases     LeaseStore
	LeaseIndex LeaseIndex
	// Stamps keeps cached snapshots from outliving a change made on
	// another node (nil: a node alone).
	Stamps *Stamps
}

// NewEntitlements returns the entitlement service.
func NewEntitlements(d EntitlementsDeps) *Entitlements {
	return &Entitlements{customers: d.Customers, metering: d.Metering, credits: d.Credits, hot: d.Hot, clock: d.Clock,
		plans: d.Plans, applied: d.Applied, appliedDown: d.AppliedDown, usageIDs: d.UsageIDs, leases: d.Leases, leaseIndex: d.LeaseIndex, stamps: d.Stamps}
}

// CheckResult is the body of an entitlement check; which members appear
// depends on the metric type (docs/spec/interface.md "Entitlement checks").
type CheckResult struct {
	Type              MetricType `json:"type"`
	Allowed           bool       `json:"allowed"`
	CustomerID        uuid.UUID  `json:"customer_id"`
	BillableMetricKey string     `json:"billable_metric_key"`
	Units             *int64     `json:"units,omitempty"`
	Balance           *int64     `json:"balance,omitempty"`
	ReservedBalance   *int64     `json:"reserved_balance,omitempty"`
	PendingBalance    *int64     `json:"pending_balance,omitempty"`
	EffectiveBalance  *int64     `json:"effective_balance,omitempty"`
	// CreditLimitMC is the customer's credit line; AvailableMC what it
	// may spend now: the effective balance plus the line under policy
	// block (AvailableOf). Metered only.
	CreditLimitMC *int64 `json:"credit_limit_mc,omitempty"`
	AvailableMC   *int64 `json:"available_mc,omitempty"`
	// BudgetRemainingMC is what the customer's budgets that count the
	// metric still allow in their current periods (the least of them);
	// absent when none counts it. Metered only.
	BudgetRemainingMC *int64 `json:"budget_remaining_mc,omitempty"`
	// PoolAvailableMC is what a child customer may still draw from its
	// parent for the metric (the parent's effective balance, within the
	// draw limit), counted in AvailableMC; absent without a parent.
	PoolAvailableMC    *int64          `json:"pool_available_mc,omitempty"`
	EstimatedCost      *int64          `json:"estimated_cost,omitempty"`
	BalanceAfter       *int64          `json:"balance_after,omitempty"`
	Enabled            *bool           `json:"enabled,omitempty"`
	Config             json.RawMessage `json:"config,omitempty"`
	Current            *int64          `json:"current,omitempty"`
	Cap                *int64          `json:"cap,omitempty"`
	Headroom           *int64          `json:"headroom,omitempty"`
	SubscriptionStatus *string         `json:"subscription_status"`
	OveragePolicy      *OveragePolicy  `json:"overage_policy,omitempty"`
}

// Check answers whether the customer may use the metric now; it never
// changes a balance. A lenient ref auto-creates the customer (Common rules 4)
// once the metric is known to be checkable. Errors: 400 (units, cross-tenant
// id), 404 (metered without an active rule, strict unknown external id).
// metricKey and units >= 1 are api/'s to check (the query's shape,
// api/entitlements.go parseUnits).
func (s *Entitlements) Check(ctx context.Context, scope Scope, tenant Tenant, ref CustomerRef, metricKey string, units int64) (CheckResult, error) {
	m, ok, err := s.metering.Metric(ctx, scope, metricKey)
	if err != nil {
		return CheckResult{}, err
	}
	mtype := MetricMetered
	if ok {
		mtype = m.Type
	}
	var rule MeteringRule
	if mtype == MetricMetered {
		r, found, err := s.metering.ActiveRule(ctx, scope, metricKey)
		if err != nil {
			return CheckResult{}, err
		}
		if !found {
			return CheckResult{}, NotFound("no active metering rule for " + metricKey)
		}
		rule = r
	}
	c, err := s.customers.Resolve(ctx, scope, ref, !ref.Strict)
	if err != nil {
		return CheckResult{}, err
	}
	f, err := s.facts(ctx, c)
	if err != nil {
		return CheckResult{}, err
	}
	res := CheckResult{Type: mtype, CustomerID: c.ID, BillableMetricKey: metricKey}
	if f != nil {
		st := f.Status
		res.SubscriptionStatus = &st
	}
	switch mtype {
	case MetricMetered:
		res, err = s.checkMetered(ctx, c, tenant, rule, units, res)
		if err == nil && meteredDenied(f, metricKey) {
			res.Allowed = false
		}
		return res, err
	case MetricBoolean:
		on := enabledOf(value(f, m))
		res.Enabled, res.Allowed = &on, on
	case MetricStatic:
		res.Config, res.Allowed = configOf(value(f, m)), true
	case MetricGauge:
		capMC := gaugeCap(value(f, m))
		var cur int64
		_, err := withLoad(ctx, s.credits, CustomerKeyOf(c), func() (MutationResult, error) {
			var e error
			cur, e = s.hot.GaugeValue(ctx, CustomerKeyOf(c), metricKey)
			return MutationResult{}, e
		})
		if err != nil {
			return CheckResult{}, err
		}
		head := capMC - cur
		res.Current, res.Cap, res.Headroom, res.Allowed = &cur, &capMC, &head, head > 0
	}
	return res, nil
}

func (s *Entitlements) checkMetered(ctx context.Context, c Customer, tenant Tenant, rule MeteringRule, units int64, res CheckResult) (CheckResult, error) {
	cost, err := Price(rule, units)
	if errors.Is(err, ErrOverflow) {
		// units is a query parameter: its bad values are the check's 400s.
		return CheckResult{}, BadRequest("units", "units is too large: the cost would overflow a 64-bit amount")
	}
	if err != nil {
		return CheckResult{}, err
	}
	bal, err := s.balances(ctx, CustomerKeyOf(c))
	if err != nil {
		return CheckResult{}, err
	}
	// One allocation holds every figure the result points at.
	fig := &checkFigures{units: units, cost: cost, bal: bal, after: bal.Effective - cost, policy: PolicyOf(c, tenant),
		limit: c.CreditLimitMC}
	fig.available = AvailableOf(bal.Effective, c.CreditLimitMC, fig.policy)
	if bal.Scoped {
		// Some block pays for some metrics only: what this one may take
		// comes from the blocks (docs/rules.md "Credits scoped to metrics").
		acct, err := s.credits.snapshotAt(ctx, CustomerKeyOf(c), s.clock.Now())
		if err != nil {
			return CheckResult{}, err
		}
		fig.available = MetricAvailable(acct, c.CreditLimitMC, fig.policy, rule.BillableMetricKey, s.clock.Now().UnixMilli())
	}
	if c.ParentID != nil {
		// A child may spend its parent's credit past its own (docs/rules.md
		// "Shared pools"): the check reads the parent's balances too.
		v, err := s.poolOf(ctx, c, tenant)
		if err != nil {
			return CheckResult{}, err
		}
		if v != nil {
			fig.pool = v.available(rule.BillableMetricKey)
			fig.available += fig.pool
			res.PoolAvailableMC = &fig.pool
		}
	}
	res.Units, res.EstimatedCost, res.BalanceAfter = &fig.units, &fig.cost, &fig.after
	res.Balance, res.ReservedBalance = &fig.bal.Balance, &fig.bal.Reserved
	res.PendingBalance, res.EffectiveBalance = &fig.bal.Pending, &fig.bal.Effective
	res.CreditLimitMC, res.AvailableMC = &fig.limit, &fig.available
	res.OveragePolicy = &fig.policy
	// What the charge would do (prelude line_split): under block it fits
	// when the effective balance after it stays at or above minus the line.
	res.Allowed = cost <= fig.available || fig.policy != OveragePolicyBlock
	// A budget refuses whatever the balance and the policy (lua/prelude/budgets.lua
	// budget_take): only customers with budgets pay the extra read.
	if r, ok := s.hot.(BudgetCounterReader); ok && len(c.Budgets) > 0 {
		var left int64
		var counted bool
		_, err := withLoad(ctx, s.credits, CustomerKeyOf(c), func() (MutationResult, error) {
			var e error
			left, counted, e = budgetRemaining(ctx, r, CustomerKeyOf(c), c.Budgets, rule.BillableMetricKey, s.clock.Now())
			return MutationResult{}, e
		})
		if err != nil {
			return CheckResult{}, err
		}
		if counted {
			fig.budgetLeft = left
			res.BudgetRemainingMC = &fig.budgetLeft
			res.Allowed = res.Allowed && cost <= left
		}
	}
	return res, nil
}

// poolView is what a child may draw from its parent at an instant: the
// parent's figures and what the child's draw limit leaves (-1: no limit).
type poolView struct {
	bal  Balances
	acct *Account // the parent's blocks, when some has a scope
	left int64
	now  time.Time
}

// available is what the child may draw for metric: the parent's effective
// balance for it (never its credit line), at least 0, within the limit.
func (v *poolView) available(metric string) int64 {
	avail := v.bal.Effective
	if v.acct != nil {
		avail = MetricAvailable(*v.acct, 0, OveragePolicyBlock, metric, v.now.UnixMilli())
	}
	avail = max(avail, 0)
	if v.left >= 0 {
		avail = min(avail, v.left)
	}
	return avail
}

// poolOf reads what child c may draw from its parent now; nil when c has
// no parent or it is gone.
func (s *Entitlements) poolOf(ctx context.Context, c Customer, tenant Tenant) (*poolView, error) {
	p, err := poolDraw(ctx, s.customers, c, tenant, uuid.Nil)
	if err != nil || p == nil {
		return nil, err
	}
	v := &poolView{left: -1, now: s.clock.Now()}
	if v.bal, err = s.balances(ctx, p.Parent); err != nil {
		return nil, err
	}
	if v.bal.Scoped {
		acct, err := s.credits.snapshotAt(ctx, p.Parent, v.now)
		if err != nil {
			return nil, err
		}
		v.acct = &acct
	}
	if r, ok := s.hot.(BudgetCounterReader); ok && p.Limit != nil {
		var vals []string
		_, err := withLoad(ctx, s.credits, CustomerKeyOf(c), func() (MutationResult, error) {
			var e error
			vals, e = r.BudgetCounters(ctx, CustomerKeyOf(c), []string{p.Limit.Field()})
			return MutationResult{}, e
		})
		if err != nil {
			return nil, err
		}
		cnt, ok := ParseBudgetCounter(vals[0])
		st := DrawLimitStatusOf(*p.Limit, cnt, ok, v.now)
		v.left = max(p.Limit.LimitMC-st.DrawnMC, 0)
	}
	return v, nil
}

// budgetRemaining is the least that the budgets of bs counting metric
// still allow at now (limit - spent, at least 0); counted is false when
// none counts the metric.
func budgetRemaining(ctx context.Context, r BudgetCounterReader, c CustomerKey, bs []Budget, metric string, now time.Time) (left int64, counted bool, err error) {
	var mine []Budget
	for _, b := range bs {
		if b.Metric() == "" || b.Metric() == metric {
			mine = append(mine, b)
		}
	}
	if len(mine) == 0 {
		return 0, false, nil
	}
	sts, err := budgetStatuses(ctx, r, c, mine, now)
	if err != nil {
		return 0, false, err
	}
	left = maxInt64
	for _, st := range sts {
		if l := max(st.LimitMC-st.SpentMC, 0); l < left {
			left = l
		}
	}
	return left, true, nil
}

// checkFigures backs a metered CheckResult's pointers.
type checkFigures struct {
	units, cost, after, limit, available int64
	budgetLeft, pool                     int64
	bal                                  Balances
	policy                               OveragePolicy
}

// AvailableOf is what a customer whose effective balance is effective may
// spend now under policy: the effective balance plus its credit line
// limitMC under block (docs/rules.md "Credit line"), the effective balance
// alone under allow and notify (they never draw the line); saturated at
// int64 (limitMC is at most MaxCreditLimitMC, so it never is in practice).
func AvailableOf(effective, limitMC int64, policy OveragePolicy) int64 {
	if policy != OveragePolicyBlock {
		return effective
	}
	if s, ok := AddChecked(effective, limitMC); ok {
		return s
	}
	return maxInt64
}

// balances reads the customer's figures for a check: the store's lean read
// when it has one (no blocks decoded), else a Snapshot; loaded from
// Postgres first when the store does not hold the customer.
func (s *Entitlements) balances(ctx context.Context, key CustomerKey) (Balances, error) {
	bal, err := s.readBalances(ctx, key)
	if !errors.Is(err, ErrStateMissing) {
		return bal, err
	}
	if err := s.credits.Load(ctx, key); err != nil {
		return Balances{}, err
	}
	return s.readBalances(ctx, key)
}

func (s *Entitlements) readBalances(ctx context.Context, key CustomerKey) (Balances, error) {
	return s.credits.balancesAt(ctx, key, s.clock.Now())
}

// PolicyOf is the customer's overage policy, else the tenant default.
func PolicyOf(c Customer, t Tenant) OveragePolicy {
	if c.OveragePolicy != nil {
		return *c.OveragePolicy
	}
	if t.DefaultOveragePolicy.Valid() {
		return t.DefaultOveragePolicy
	}
	return OveragePolicyBlock
}

// ThresholdOf is the customer's low-balance threshold, else the tenant's.
func ThresholdOf(c Customer, t Tenant) int64 {
	if c.LowBalanceThresholdMC != nil {
		return *c.LowBalanceThresholdMC
	}
	return t.DefaultLowBalanceThresholdMC
}

func contextOf(c Customer, t Tenant) MutationContext {
	return MutationContext{ExternalID: c.ExternalID, ThresholdMC: ThresholdOf(c, t), Policy: PolicyOf(c, t),
		LimitMC: c.CreditLimitMC, Budgets: c.Budgets}
}

// enabledOf reads a boolean value {enabled}.
func enabledOf(raw json.RawMessage) bool {
	var v struct {
		Enabled bool `json:"enabled"`
	}
	_ = json.Unmarshal(raw, &v)
	return v.Enabled
}

// configOf reads a static value {config}; {} when absent.
func configOf(raw json.RawMessage) json.RawMessage {
	var v struct {
		Config json.RawMessage `json:"config"`
	}
	_ = json.Unmarshal(raw, &v)
	if len(v.Config) == 0 {
		return json.RawMessage("{}")
	}
	return v.Config
}

func gaugeCap(raw json.RawMessage) int64 {
	var v struct {
		Cap int64 `json:"cap"`
	}
	_ = json.Unmarshal(raw, &v)
	return v.Cap
}
