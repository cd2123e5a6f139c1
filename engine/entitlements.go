package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/google/uuid"
)

// httpReplayWindow is the HTTP idempotency replay window (Common rules 1);
// a retry the customer's memory catches after it is a duplicate_replay.
const httpReplayWindow = 24 * time.Hour

// Entitlements answers checks and charges usage: the hot path. A metered
// check is one Redis round trip: customer, tenant, metric and rule come from
// in-process caches.
type Entitlements struct {
	customers *Customers
	metering  *Metering
	credits   *Credits
	hot       HotStore
	clock     Clock
	plans     PlanView
	snapshots snapshotCache
	applied   AppliedReader
	// leases and leaseIndex serve lease renew and release (UseLeases).
	leases     LeaseStore
	leaseIndex LeaseIndex
}

// SubscriptionFacts is what a live subscription says on a check.
type SubscriptionFacts struct {
	Status   string
	PlanName string
	// AllowUsage is false while past_due on a variant that forbids usage
	// while overdue (addendum 6).
	AllowUsage bool
	// Values maps a metric key to its value: a live override, else the
	// variant entitlement (addendum 5 resolution order).
	Values map[string]json.RawMessage
	// expiresAt is the soonest expiry of an override in Values (zero when
	// none): facts are never served stale past it.
	expiresAt time.Time
}

// SetPlanView plugs subscriptions into checks, consumes and holds.
func (s *Entitlements) SetPlanView(pv PlanView) { s.plans = pv }

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

// NewEntitlements returns the entitlement service.
func NewEntitlements(customers *Customers, metering *Metering, credits *Credits, hot HotStore, clock Clock) *Entitlements {
	return &Entitlements{customers: customers, metering: metering, credits: credits, hot: hot, clock: clock}
}

// CheckResult is the body of an entitlement check; which members appear
// depends on the metric type (interface.md "Entitlement checks").
type CheckResult struct {
	Type               MetricType      `json:"type"`
	Allowed            bool            `json:"allowed"`
	CustomerID         uuid.UUID       `json:"customer_id"`
	BillableMetricKey  string          `json:"billable_metric_key"`
	Units              *int64          `json:"units,omitempty"`
	Balance            *int64          `json:"balance,omitempty"`
	ReservedBalance    *int64          `json:"reserved_balance,omitempty"`
	PendingBalance     *int64          `json:"pending_balance,omitempty"`
	EffectiveBalance   *int64          `json:"effective_balance,omitempty"`
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

// ParseUnits reads the optional units query value: default 1; anything but
// an integer >= 1 is a 400.
func ParseUnits(raw string) (int64, error) {
	if raw == "" {
		return 1, nil
	}
	var n int64
	for i, ch := range raw {
		if ch < '0' || ch > '9' || i > 18 {
			return 0, BadRequest("units", "units must be an integer >= 1")
		}
		n = n*10 + int64(ch-'0')
	}
	if n < 1 {
		return 0, BadRequest("units", "units must be an integer >= 1")
	}
	return n, nil
}

// Check answers whether the customer may use the metric now; it never
// changes a balance. A lenient ref auto-creates the customer (Common rules 4)
// once the metric is known to be checkable. Errors: 400 (units, cross-tenant
// id), 404 (metered without an active rule, strict unknown external id).
func (s *Entitlements) Check(ctx context.Context, scope Scope, tenant Tenant, ref CustomerRef, metricKey string, units int64) (CheckResult, error) {
	if metricKey == "" {
		return CheckResult{}, BadRequest("billable_metric_key", "billable_metric_key is required")
	}
	if units < 1 {
		return CheckResult{}, BadRequest("units", "units must be an integer >= 1")
	}
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
	c, err := s.customers.Cached(ctx, scope, ref, !ref.Strict)
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
	fig := &checkFigures{units: units, cost: cost, bal: bal, after: bal.Effective - cost, policy: PolicyOf(c, tenant)}
	res.Units, res.EstimatedCost, res.BalanceAfter = &fig.units, &fig.cost, &fig.after
	res.Balance, res.ReservedBalance = &fig.bal.Balance, &fig.bal.Reserved
	res.PendingBalance, res.EffectiveBalance = &fig.bal.Pending, &fig.bal.Effective
	res.OveragePolicy = &fig.policy
	res.Allowed = fig.after >= 0 || fig.policy != OveragePolicyBlock
	return res, nil
}

// checkFigures backs a metered CheckResult's pointers.
type checkFigures struct {
	units, cost, after int64
	bal                Balances
	policy             OveragePolicy
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
	now := s.clock.Now()
	if br, ok := s.credits.blocks.(BalanceReader); ok {
		return br.Balances(ctx, key, now)
	}
	acct, err := s.credits.blocks.Snapshot(ctx, key, now)
	return Balances{Balance: acct.Balance, Reserved: acct.ReservedBalance, Pending: acct.PendingBalance, Effective: acct.EffectiveBalance}, err
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
	return MutationContext{ExternalID: c.ExternalID, ThresholdMC: ThresholdOf(c, t), Policy: PolicyOf(c, t)}
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

// ConsumeInput is the body of POST /v1/entitlements/consume.
type ConsumeInput struct {
	CustomerID        *string `json:"customer_id"`
	BillableMetricKey *string `json:"billable_metric_key"`
	Units             *int64  `json:"units"`
	// Items is the multi-metric form: given instead of billable_metric_key
	// and units, every item is charged or none is.
	Items    []ConsumeItem `json:"items"`
	Metadata Metadata      `json:"metadata"`
}

// ConsumeItem is one metric of a multi-metric consume.
type ConsumeItem struct {
	BillableMetricKey *string `json:"billable_metric_key"`
	Units             *int64  `json:"units"`
}

// MaxConsumeItems bounds a multi-metric consume: its items are priced and
// written in one script, whose time grows with their number (invariant 13).
const MaxConsumeItems = 20

// ItemCost is what one item of a multi-metric consume cost.
type ItemCost struct {
	BillableMetricKey string `json:"billable_metric_key"`
	Units             int64  `json:"units"`
	Cost              int64  `json:"cost"`
}

// ConsumeResult is the 200 body of a consume (addendum 7).
type ConsumeResult struct {
	TransactionID     *uuid.UUID `json:"transaction_id"`
	CustomerID        uuid.UUID  `json:"customer_id"`
	BillableMetricKey string     `json:"billable_metric_key"`
	Units             int64      `json:"units"`
	Cost              int64      `json:"cost"`
	Charged           int64      `json:"charged"`
	OverageMC         int64      `json:"overage_mc"`
	BalanceAfter      int64      `json:"balance_after"`
	EffectiveBalance  int64      `json:"effective_balance"`
	Reason            *string    `json:"reason"`
	// Items lists each item's cost when the request used items; nil for
	// the single form.
	Items []ItemCost `json:"items,omitempty"`
	// replayed: the customer had applied this key before (a usage batch
	// reports the event as a duplicate).
	replayed bool
}

// ReasonDuplicateReplay marks a consume retried after the HTTP replay window.
const ReasonDuplicateReplay = "duplicate_replay"

// meteredRule finds the active rule of a metered metric, or the 400/404 a
// consume or hold gets without one.
func (s *Entitlements) meteredRule(ctx context.Context, scope Scope, key string) (MeteringRule, error) {
	m, ok, err := s.metering.Metric(ctx, scope, key)
	if err != nil {
		return MeteringRule{}, err
	}
	if ok && m.Type != MetricMetered {
		return MeteringRule{}, BadRequest("billable_metric_key", "the metric is not metered")
	}
	r, found, err := s.metering.ActiveRule(ctx, scope, key)
	if err != nil {
		return MeteringRule{}, err
	}
	if !found {
		return MeteringRule{}, NotFound("no active metering rule for " + key)
	}
	return r, nil
}

// Consume prices and charges units atomically. Errors: 422/400 for the body,
// 400 non-metered metric or cross-tenant id, 404 no active rule, 409
// insufficient-credits under block (nothing charged).
func (s *Entitlements) Consume(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ConsumeInput) (ConsumeResult, error) {
	cmd, err := s.consumeCommand(ctx, scope, tenant, idem, in)
	if err != nil {
		return ConsumeResult{}, err
	}
	res, err := withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) { return s.hot.Consume(ctx, cmd) })
	return consumeOutcome(cmd, res, err)
}

// consumeCommand checks in and prices it: the command a consume runs.
func (s *Entitlements) consumeCommand(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ConsumeInput) (ConsumeCommand, error) {
	if in.CustomerID == nil || *in.CustomerID == "" {
		return ConsumeCommand{}, Invalid("customer_id", "customer_id is required")
	}
	if in.Items != nil {
		return s.multiConsumeCommand(ctx, scope, tenant, idem, in)
	}
	if in.BillableMetricKey == nil || *in.BillableMetricKey == "" {
		return ConsumeCommand{}, Invalid("billable_metric_key", "billable_metric_key is required")
	}
	if in.Units == nil {
		return ConsumeCommand{}, Invalid("units", "units is required")
	}
	if *in.Units < 1 {
		return ConsumeCommand{}, BadRequest("units", "units must be >= 1")
	}
	if err := CheckLine("billable_metric_key", *in.BillableMetricKey); err != nil {
		return ConsumeCommand{}, err
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return ConsumeCommand{}, err
	}
	rule, err := s.meteredRule(ctx, scope, *in.BillableMetricKey)
	if err != nil {
		return ConsumeCommand{}, err
	}
	if _, err := Price(rule, *in.Units); err != nil {
		return ConsumeCommand{}, priceError(err, "units")
	}
	c, err := s.customers.Cached(ctx, scope, CustomerRef{Value: *in.CustomerID}, true)
	if err != nil {
		return ConsumeCommand{}, err
	}
	if err := s.usageAllowed(ctx, c, rule.BillableMetricKey); err != nil {
		return ConsumeCommand{}, err
	}
	return s.newConsume(c, tenant, idem, rule, *in.Units, orEmpty(meta)), nil
}

// ItemsMetadataKey is the member of a multi-metric consume's ledger entry
// metadata that lists each item (metric, units, cost): the entry has no
// single metric, and the breakdown travels in the one row (issue 10).
const ItemsMetadataKey = "items"

// multiConsumeCommand checks a multi-metric consume (in.Items set) and
// prices every item: the command charging all of them or none.
func (s *Entitlements) multiConsumeCommand(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ConsumeInput) (ConsumeCommand, error) {
	if in.BillableMetricKey != nil || in.Units != nil {
		return ConsumeCommand{}, BadRequest("items", "give either items or billable_metric_key and units, not both")
	}
	if len(in.Items) < 1 || len(in.Items) > MaxConsumeItems {
		return ConsumeCommand{}, BadRequest("items", fmt.Sprintf("items must hold 1 to %d items", MaxConsumeItems))
	}
	if _, ok := in.Metadata[ItemsMetadataKey]; ok {
		return ConsumeCommand{}, BadRequest("metadata."+ItemsMetadataKey, "metadata."+ItemsMetadataKey+" is reserved for the item breakdown of a multi-metric consume")
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return ConsumeCommand{}, err
	}
	lines := make([]ConsumeLine, len(in.Items))
	seen := make(map[string]bool, len(in.Items))
	var units, cost int64
	for i, it := range in.Items {
		if _, _, err := checkItem(i, it.BillableMetricKey, it.Units, consumeItemUnits, seen); err != nil {
			return ConsumeCommand{}, err
		}
		field := fmt.Sprintf("items[%d].", i)
		rule, err := s.meteredRule(ctx, scope, *it.BillableMetricKey)
		if err != nil {
			return ConsumeCommand{}, refield(err, "billable_metric_key", field+"billable_metric_key")
		}
		c, err := Price(rule, *it.Units)
		if err != nil {
			return ConsumeCommand{}, priceError(err, field+"units")
		}
		// The totals must fit int64 too (invariant 7): the script checks
		// the cost again, Go names the field first.
		var ok bool
		if units, ok = addInt64(units, *it.Units); !ok {
			return ConsumeCommand{}, Invalid("items", "the items' total units would overflow a 64-bit amount")
		}
		if cost, ok = addInt64(cost, c); !ok {
			return ConsumeCommand{}, Invalid("items", "the items' total cost would overflow a 64-bit amount")
		}
		lines[i] = ConsumeLine{Metric: rule.BillableMetricKey, Units: *it.Units, Terms: TermsOf(rule)}
	}
	c, err := s.customers.Cached(ctx, scope, CustomerRef{Value: *in.CustomerID}, true)
	if err != nil {
		return ConsumeCommand{}, err
	}
	for _, l := range lines {
		if err := s.usageAllowed(ctx, c, l.Metric); err != nil {
			return ConsumeCommand{}, err
		}
	}
	cmd := s.newConsume(c, tenant, idem, MeteringRule{}, 0, orEmpty(meta))
	cmd.Metric, cmd.Units, cmd.Items = "", units, lines
	return cmd, nil
}

// addInt64 is a + b and whether it fits int64 (both >= 0 here).
func addInt64(a, b int64) (int64, bool) {
	if b > 0 && a > math.MaxInt64-b {
		return 0, false
	}
	return a + b, true
}

// refield names to instead of from in a validation error of err, so an
// item's error carries its path (items[2].billable_metric_key).
func refield(err error, from, to string) error {
	if e, ok := AsError(err); ok && e.Field == from {
		c := *e
		c.Field = to
		return &c
	}
	return err
}

// usageAllowed refuses usage the customer's subscription forbids.
func (s *Entitlements) usageAllowed(ctx context.Context, c Customer, metricKey string) error {
	f, err := s.facts(ctx, c)
	if err != nil {
		return err
	}
	if meteredDenied(f, metricKey) {
		return ErrUsageNotAllowed
	}
	return nil
}

// newConsume is the command of a consume of units of rule by c, now.
func (s *Entitlements) newConsume(c Customer, tenant Tenant, idem Idempotency, rule MeteringRule, units int64, meta Metadata) ConsumeCommand {
	return ConsumeCommand{
		OpID: uuid.Must(uuid.NewV7()), Customer: CustomerKeyOf(c), IdempotencyKey: idem.Key,
		RequestHash: idem.RequestHash, Now: s.clock.Now(), Metric: rule.BillableMetricKey, Units: units,
		Terms: TermsOf(rule), Policy: PolicyOf(c, tenant), EntryMetadata: meta, Context: contextOf(c, tenant),
		AppliedCheckedAt: idem.CheckedAt,
	}
}

// consumeOutcome is the answer to cmd from its store result.
func consumeOutcome(cmd ConsumeCommand, res MutationResult, err error) (ConsumeResult, error) {
	if err != nil {
		if cmd.Items != nil {
			return ConsumeResult{}, priceError(err, "items")
		}
		return ConsumeResult{}, priceError(err, "units")
	}
	out := consumeResult(res.Mutation)
	out.replayed = res.Replayed
	if res.Replayed && cmd.Now.Sub(res.Mutation.At()) > httpReplayWindow {
		r := ReasonDuplicateReplay
		out.Reason = &r
	}
	return out, nil
}

// priceError names the field of an overflow.
func priceError(err error, field string) error {
	if errors.Is(err, ErrOverflow) {
		return Invalid(field, "the cost would overflow a 64-bit amount")
	}
	return err
}

func consumeResult(m Mutation) ConsumeResult {
	out := ConsumeResult{CustomerID: m.CustomerID}
	if u := m.Usage; u != nil {
		out.BillableMetricKey, out.Units, out.Cost, out.Charged, out.OverageMC = u.Metric, u.Units, u.Cost, u.Charged, u.Overage
		if u.Items != nil {
			out.Items = make([]ItemCost, len(u.Items))
			for i, it := range u.Items {
				out.Items[i] = ItemCost{BillableMetricKey: it.Metric, Units: it.Units, Cost: it.Cost}
			}
		}
	}
	for i, e := range m.Entries {
		if e.Role == RoleMain {
			id := EntryID(m.OpID, i)
			out.TransactionID = &id
			break
		}
	}
	eff := m.Account.Balance - m.Account.Reserved - m.Account.Pending
	out.BalanceAfter, out.EffectiveBalance = eff, eff
	return out
}

// UsageInput is the body of POST /v1/usage (addendum 7).
type UsageInput struct {
	Events []UsageEvent `json:"events"`
}

// UsageEvent is one metered use in a batch.
type UsageEvent struct {
	EventID           *string  `json:"event_id"`
	CustomerID        *string  `json:"customer_id"`
	BillableMetricKey *string  `json:"billable_metric_key"`
	Units             *int64   `json:"units"`
	Metadata          Metadata `json:"metadata"`
}

// UsageEventResult is one event's outcome.
type UsageEventResult struct {
	EventID       string     `json:"event_id"`
	Status        string     `json:"status"`
	TransactionID *uuid.UUID `json:"transaction_id"`
	Charged       int64      `json:"charged"`
	OverageMC     int64      `json:"overage_mc"`
	Error         *string    `json:"error"`
	// Cause is the unexpected failure behind an UsageInternalError, for the
	// log only: its text may name tables, addresses or SQL states. The API
	// logs it and adds the request id to Error.
	Cause error `json:"-"`
}

// UsageInternalError is the error of an event that failed for a reason that
// is not the caller's (no known engine error); what happened is only logged.
const UsageInternalError = "internal: an unexpected error occurred"

// Usage event statuses.
const (
	UsageCharged   = "charged"
	UsageDuplicate = "duplicate"
	UsageRefused   = "refused"
	UsageFailed    = "failed"
)

// MaxUsageEvents bounds one usage batch (addendum 7).
const MaxUsageEvents = 1000

// Usage charges a batch of events, each as a consume whose idempotency key
// is its event_id, so a re-sent event is charged once; one bad event never
// fails the others. Errors (whole batch): 422 for a missing or oversized list.
func (s *Entitlements) Usage(ctx context.Context, scope Scope, tenant Tenant, in UsageInput) ([]UsageEventResult, error) {
	if in.Events == nil {
		return nil, Invalid("events", "events is required")
	}
	if len(in.Events) > MaxUsageEvents {
		return nil, Invalid("events", "at most 1000 events per call")
	}
	checkedAt := time.Now()
	applied, err := s.appliedUsage(ctx, scope, in.Events)
	if err != nil {
		return nil, err
	}
	if s.applied == nil {
		checkedAt = time.Time{}
	}
	out := make([]UsageEventResult, len(in.Events))
	at := make([]int, 0, len(in.Events))
	cmds := make([]ConsumeCommand, 0, len(in.Events))
	for i, ev := range in.Events {
		checked := checkedAt
		if ev.EventID != nil {
			m, ok := applied[usageKey(*ev.EventID)]
			if ok && m.Environment == scope.Environment {
				out[i] = duplicateOf(*ev.EventID, m, usageHash(ev))
				continue
			}
			if ok {
				// Found for the other environment only (one row per key is
				// returned): the store looks this customer's key up itself.
				checked = time.Time{}
			}
		}
		cmd, err := s.usageCommand(ctx, scope, tenant, ev, checked)
		if err != nil {
			out[i] = usageFailure(ev, err)
			continue
		}
		at, cmds = append(at, i), append(cmds, cmd)
	}
	// One pipelined round trip per chunk instead of one per event; the
	// store runs a customer's events in the batch's order.
	for lo := 0; lo < len(cmds); lo += usagePipeline {
		hi := min(lo+usagePipeline, len(cmds))
		results, errs := s.hot.ConsumeBatch(ctx, cmds[lo:hi])
		for j := lo; j < hi; j++ {
			res, err := results[j-lo], errs[j-lo]
			if errors.Is(err, ErrStateMissing) {
				// Not in Redis: load it and run the event alone (its
				// customer's later events of the chunk come here too, in
				// order).
				cmd := cmds[j]
				res, err = withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) { return s.hot.Consume(ctx, cmd) })
			}
			out[at[j]] = usageOutcome(in.Events[at[j]], cmds[j], res, err)
		}
	}
	return out, nil
}

// usagePipeline is how many of a batch's events go to Redis in one
// pipelined round trip: large enough to spend the round trip's cost once
// over many scripts, small enough that one call does not hold a
// connection's replies for long.
const usagePipeline = 64

// SetAppliedReader lets usage batches find events charged so long ago that
// Redis no longer remembers them (event ids are idempotent forever).
func (s *Entitlements) SetAppliedReader(r AppliedReader) { s.applied = r }

func usageKey(eventID string) string { return "usage:" + eventID }

// appliedUsage looks the batch's event ids up in Postgres in one query.
func (s *Entitlements) appliedUsage(ctx context.Context, scope Scope, events []UsageEvent) (map[string]Mutation, error) {
	if s.applied == nil {
		return nil, nil
	}
	keys := make([]string, 0, len(events))
	for _, ev := range events {
		// An id Postgres cannot hold is refused per event, never looked up.
		if ev.EventID != nil && *ev.EventID != "" && cleanText(*ev.EventID, false) {
			keys = append(keys, usageKey(*ev.EventID))
		}
	}
	return s.applied.AppliedMutations(ctx, scope.TenantID, keys)
}

// duplicateOf answers a re-sent event from its original Mutation; another
// content under the same event_id is a conflict.
func duplicateOf(id string, m Mutation, requestHash string) UsageEventResult {
	if m.RequestHash != requestHash {
		msg := "event_id was already used for a different event"
		return UsageEventResult{EventID: id, Status: UsageFailed, Error: &msg}
	}
	r := consumeResult(m)
	return UsageEventResult{EventID: id, Status: UsageDuplicate, TransactionID: r.TransactionID, Charged: r.Charged, OverageMC: r.OverageMC}
}

// usageCommand checks one event and builds its consume; checkedAt is when
// the batch's Postgres look-up found no operation under its id (zero: not
// looked up).
func (s *Entitlements) usageCommand(ctx context.Context, scope Scope, tenant Tenant, ev UsageEvent, checkedAt time.Time) (ConsumeCommand, error) {
	if ev.EventID == nil || *ev.EventID == "" {
		return ConsumeCommand{}, Invalid("event_id", "event_id is required")
	}
	id := *ev.EventID
	if len(id) > 256 {
		return ConsumeCommand{}, Invalid("event_id", "event_id is longer than 256 characters")
	}
	if err := CheckLine("event_id", id); err != nil {
		return ConsumeCommand{}, err
	}
	return s.consumeCommand(ctx, scope, tenant, Idempotency{Key: usageKey(id), RequestHash: usageHash(ev), CheckedAt: checkedAt},
		ConsumeInput{CustomerID: ev.CustomerID, BillableMetricKey: ev.BillableMetricKey, Units: ev.Units, Metadata: ev.Metadata})
}

// usageOutcome is event ev's result from its consume's.
func usageOutcome(ev UsageEvent, cmd ConsumeCommand, res MutationResult, err error) UsageEventResult {
	r, err := consumeOutcome(cmd, res, err)
	if errors.Is(err, ErrIdempotencyMismatch) {
		err = Conflict("event_id was already used for a different event")
	}
	if err != nil {
		return usageFailure(ev, err)
	}
	status := UsageCharged
	if r.replayed {
		status = UsageDuplicate
	}
	return UsageEventResult{EventID: *ev.EventID, Status: status, TransactionID: r.TransactionID, Charged: r.Charged, OverageMC: r.OverageMC}
}

// usageFailure is event ev's result when err stopped it: refused when
// credit was short, else failed, with err's public text (or, for an
// unexpected error, UsageInternalError and err kept for the log).
func usageFailure(ev UsageEvent, err error) UsageEventResult {
	id := ""
	if ev.EventID != nil {
		id = *ev.EventID
	}
	msg, public := ItemErrorText(err)
	if !public {
		msg = UsageInternalError
		return UsageEventResult{EventID: id, Status: UsageFailed, Error: &msg, Cause: err}
	}
	status := UsageFailed
	if errors.Is(err, ErrInsufficientCredits) {
		status = UsageRefused
	}
	return UsageEventResult{EventID: id, Status: status, Error: &msg}
}

// usageHash fingerprints an event's content, so a re-sent event_id with the
// same content is a duplicate and with other content a conflict.
func usageHash(ev UsageEvent) string {
	b, _ := json.Marshal(ev)
	return "usage-" + hashHex(b)
}

// GaugeInput is the body of the gauge operations.
type GaugeInput struct {
	Amount *int64          `json:"amount"`
	Policy *string         `json:"policy"`
	Meta   json.RawMessage `json:"metadata"`
	// LeaseSeconds takes a lease on an increment's slots (leases.go).
	LeaseSeconds *int64 `json:"lease_seconds"`
}

// GaugeResult is the 200 body of a gauge operation.
type GaugeResult struct {
	BillableMetricKey string `json:"billable_metric_key"`
	Current           int64  `json:"current"`
	Cap               int64  `json:"cap"`
	Allowed           bool   `json:"allowed"`
	Headroom          int64  `json:"headroom"`
	// Lease is the lease the operation took, renewed or ended, if any.
	Lease *Lease `json:"lease,omitempty"`
}

// MoveGauge increments (up) or decrements a gauge. Errors: 400 (amount,
// policy, not a gauge, cross-tenant id), 404 (no such metric), 409 (cap
// under block, below zero).
func (s *Entitlements) MoveGauge(ctx context.Context, scope Scope, tenant Tenant, ref CustomerRef, metricKey string, up bool, idem Idempotency, in GaugeInput) (GaugeResult, error) {
	if in.Amount == nil || *in.Amount < 1 {
		return GaugeResult{}, BadRequest("amount", "amount must be an integer >= 1")
	}
	allow := false
	if up && in.Policy != nil {
		switch *in.Policy {
		case "block":
		case "allow":
			allow = true
		default:
			return GaugeResult{}, BadRequest("policy", "policy must be block or allow")
		}
	}
	if in.LeaseSeconds != nil {
		if !up {
			return GaugeResult{}, Invalid("lease_seconds", "only an increment takes a lease")
		}
		if err := leaseSeconds(*in.LeaseSeconds); err != nil {
			return GaugeResult{}, err
		}
	}
	m, ok, err := s.metering.Metric(ctx, scope, metricKey)
	if err != nil {
		return GaugeResult{}, err
	}
	if !ok {
		return GaugeResult{}, NotFound("billable metric not found")
	}
	if m.Type != MetricGauge {
		return GaugeResult{}, BadRequest("billable_metric_key", "the metric is not a gauge")
	}
	c, err := s.customers.Cached(ctx, scope, ref, !ref.Strict)
	if err != nil {
		return GaugeResult{}, err
	}
	delta := *in.Amount
	if !up {
		delta = -delta
	}
	f, err := s.facts(ctx, c)
	if err != nil {
		return GaugeResult{}, err
	}
	capMC := gaugeCap(value(f, m))
	cmd := GaugeCommand{OpID: uuid.Must(uuid.NewV7()), Customer: CustomerKeyOf(c), IdempotencyKey: idem.Key,
		RequestHash: idem.RequestHash, Now: s.clock.Now(), Metric: metricKey, Delta: delta, Cap: capMC,
		Allow: allow, Context: contextOf(c, tenant)}
	if in.LeaseSeconds != nil {
		cmd.LeaseID, cmd.LeaseSeconds = uuid.Must(uuid.NewV7()), *in.LeaseSeconds
	}
	res, err := withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) { return s.hot.Gauge(ctx, cmd) })
	if errors.Is(err, ErrOverflow) {
		// The count plus amount passes int64: the amount's fault, a 400 like
		// the gauge's other amount errors.
		return GaugeResult{}, BadRequest("amount", "amount is too large: the gauge count would overflow a 64-bit integer")
	}
	if err != nil {
		return GaugeResult{}, err
	}
	out := gaugeResult(metricKey, res.Mutation, capMC)
	if g := res.Mutation.Gauge; g != nil && in.LeaseSeconds != nil {
		// The lease this increment opened (a replay's is the original's):
		// the one active lease of the Mutation; the others lapsed.
		for _, l := range g.Leases {
			if l.Status == LeaseActive {
				out.Lease = leaseView(l)
			}
		}
	}
	return out, nil
}
