// Consume: charging one metric (or up to 20 items) for a customer's usage,
// from input to the ConsumeCommand the account script runs, and its answer.

package engine

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine/idempotency"
)

// ConsumeCredits is a consume (POST /v1/entitlements/consume) whose shape
// api/ checked (required members, units and items bounds, metadata): what
// is left to the engine is the rules, pricing and the customer.
type ConsumeCredits struct {
	// Customer is customer_id as sent: a service id or an external id
	// (created when unknown, unless Dry).
	Customer string
	// Metric and Units are the single form's; Items (non-nil) the
	// multi-metric form's, every item charged or none.
	Metric string
	Units  int64
	Items  []ConsumeItem
	// ItemProblem is the shape problem of item len(Items), which api/
	// found: the answer once the rules of the items before it are checked
	// (the order the API names its problems in, item by item).
	ItemProblem error
	Metadata    Metadata // canonical; nil: none
	// Dry asks what the charge would do without doing it: nothing changes
	// and no Idempotency-Key is claimed (issue 28 item 5).
	Dry bool
}

// ConsumeItem is one checked metric of a multi-metric consume.
type ConsumeItem struct {
	Metric string
	Units  int64
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

// ConsumeResult is the 200 body of a consume (docs/spec/addendum.md §7).
type ConsumeResult struct {
	TransactionID *uuid.UUID `json:"transaction_id"`
	CustomerID    uuid.UUID  `json:"customer_id"`
	// BillableMetricKey and Units are the single form's metric and units;
	// nil (JSON null) for the items form, whatever the number of items,
	// as credit.consumed and the ledger entry have no metric for it either
	// (docs/decisions.md "Multi-metric consume answer (issue 31 item 2)").
	BillableMetricKey *string `json:"billable_metric_key"`
	Units             *int64  `json:"units"`
	Cost              int64   `json:"cost"`
	Charged           int64   `json:"charged"`
	OverageMC         int64   `json:"overage_mc"`
	// PoolMC is the part of Charged the customer's parent paid (shared
	// pools); omitted when none.
	PoolMC           int64   `json:"pool_mc,omitempty"`
	BalanceAfter     int64   `json:"balance_after"`
	EffectiveBalance int64   `json:"effective_balance"`
	Reason           *string `json:"reason"`
	// Items lists each item's cost when the request used items; nil for
	// the single form.
	Items []ItemCost `json:"items,omitempty"`
	// Dry marks a dry run's answer, which adds Draws and Events: what each
	// block would pay, in spend order, and the events the charge would
	// fire. A dry run has no TransactionID.
	Dry    bool        `json:"dry_run,omitempty"`
	Draws  []BlockDraw `json:"draws,omitempty"`
	Events []EventType `json:"events,omitempty"`
	// replayed: the customer had applied this key before (a usage batch
	// reports the event as a duplicate).
	replayed bool
}

// ReasonDuplicateReplay marks a consume retried after the HTTP replay window.
const ReasonDuplicateReplay = "duplicate_replay"

// meteredRule finds the active rule of a metered metric, or the 400/404 a
// consume or reservation gets without one.
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
func (s *Entitlements) Consume(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ConsumeCredits) (ConsumeResult, error) {
	cmd, err := s.consumeCommand(ctx, scope, tenant, idem, in)
	if err != nil {
		return ConsumeResult{}, err
	}
	res, err := s.charge(ctx, cmd)
	return consumeOutcome(cmd, res, err)
}

// ConsumeDry answers what Consume of in would do, changing nothing: the
// same checks and pricing, then the very script of a charge run on a
// scratch copy of the account (MeteringStore.ConsumeDry). A charge that would
// be refused gets the refusal it would get, marked dry_run, with the
// events the refusal would fire. No Idempotency-Key is claimed or
// consulted: a dry run never replays an earlier answer. Nor does it create
// a customer it does not find (404, where a consume would create one).
func (s *Entitlements) ConsumeDry(ctx context.Context, scope Scope, tenant Tenant, in ConsumeCredits) (ConsumeResult, error) {
	cmd, err := s.consumeCommand(ctx, scope, tenant, Idempotency{}, in)
	if err != nil {
		return ConsumeResult{}, err
	}
	res, err := withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) {
		return withPool(ctx, s.credits, cmd.Pool, func() (MutationResult, error) { return s.hot.ConsumeDry(ctx, cmd) })
	})
	if errors.Is(err, ErrInsufficientCredits) {
		return ConsumeResult{}, dryRefusal(res.Mutation)
	}
	if errors.Is(err, ErrBudgetExceeded) {
		return ConsumeResult{}, dryBudgetRefusal(err, res.Mutation)
	}
	out, err := consumeOutcome(cmd, res, err)
	if err != nil {
		return ConsumeResult{}, err
	}
	out.TransactionID, out.Reason, out.Dry = nil, nil, true
	out.Draws, out.Events = blockDraws(nil, res.Mutation), eventTypes(EventsOf(res.Mutation))
	if res.Pool != nil {
		// The child spends its own blocks first, then its parent's: the
		// parent's blocks follow, and the parent's events (its low
		// balance, say) come first, as its Mutation does.
		out.Draws = blockDraws(out.Draws, *res.Pool)
		out.Events = append(eventTypes(EventsOf(*res.Pool)), out.Events...)
	}
	return out, nil
}

// blockDraws appends to dst what each block pays in m's main entries, in
// spend order (never nil: a JSON list).
func blockDraws(dst []BlockDraw, m Mutation) []BlockDraw {
	if dst == nil {
		dst = []BlockDraw{}
	}
	for _, e := range m.Entries {
		if e.Role != RoleMain {
			continue
		}
		switch id, draws := e.PaidBy(); {
		case draws != nil:
			for _, d := range draws {
				dst = append(dst, BlockDraw{BlockID: d.BlockID, Amount: d.Amount})
			}
		case id != nil && e.Delta != 0:
			dst = append(dst, BlockDraw{BlockID: *id, Amount: -e.Delta})
		}
	}
	return dst
}

// dryRefusal is the 409 a dry run answers for the refusal m records: the
// charge's own, marked dry_run, with the events the refusal would fire.
func dryRefusal(m Mutation) error {
	return &Error{Kind: KindInsufficientCredits,
		Detail: ErrInsufficientCredits.Detail + " (dry run: nothing was changed)",
		Extra:  map[string]any{"dry_run": true, "events": eventTypes(EventsOf(m))}}
}

// dryBudgetRefusal is the 409 budget-exceeded a dry run answers for a
// charge a budget would refuse: the charge's own, marked dry_run, with the
// events the refusal would fire (credit.budget_reached when it would be
// the period's first).
func dryBudgetRefusal(err error, m Mutation) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	extra := make(map[string]any, len(e.Extra)+2)
	for k, v := range e.Extra {
		extra[k] = v
	}
	extra["dry_run"], extra["events"] = true, eventTypes(EventsOf(m))
	return &Error{Kind: e.Kind, Detail: e.Detail + " (dry run: nothing was changed)", Extra: extra}
}

// BlockDraw is what one block pays towards a charge, as the API shows it.
type BlockDraw struct {
	BlockID uuid.UUID `json:"credit_block_id"`
	Amount  int64     `json:"amount"`
}

// eventTypes is the types of evs, in order (never nil: a JSON list).
func eventTypes(evs []Event) []EventType {
	out := make([]EventType, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.EventType)
	}
	return out
}

// consumeCommand prices in: the command a consume runs.
func (s *Entitlements) consumeCommand(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ConsumeCredits) (ConsumeCommand, error) {
	if in.Items != nil {
		return s.multiConsumeCommand(ctx, scope, tenant, idem, in)
	}
	rule, err := s.meteredRule(ctx, scope, in.Metric)
	if err != nil {
		return ConsumeCommand{}, err
	}
	if _, err := Price(rule, in.Units); err != nil {
		return ConsumeCommand{}, priceError(err, "units")
	}
	c, err := s.customers.Resolve(ctx, scope, CustomerRef{Value: in.Customer}, !in.Dry)
	if err != nil {
		return ConsumeCommand{}, err
	}
	if err := s.usageAllowed(ctx, c, rule.BillableMetricKey); err != nil {
		return ConsumeCommand{}, err
	}
	cmd := s.newConsume(c, tenant, idem, rule, in.Units, orEmpty(in.Metadata))
	if cmd.Pool, err = poolDraw(ctx, s.customers, c, tenant, cmd.OpID); err != nil {
		return ConsumeCommand{}, err
	}
	return cmd, nil
}

// charge runs the consume cmd, loading the customer's credit state, and
// its parent's for a pool draw, when the store has none.
func (s *Entitlements) charge(ctx context.Context, cmd ConsumeCommand) (MutationResult, error) {
	return withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) {
		return withPool(ctx, s.credits, cmd.Pool, func() (MutationResult, error) { return s.hot.Consume(ctx, cmd) })
	})
}

// ItemsMetadataKey is the member of a multi-metric consume's ledger entry
// metadata that lists each item (metric, units, cost): the entry has no
// single metric, and the breakdown travels in the one row (issue 10).
const ItemsMetadataKey = "items"

// multiConsumeCommand prices every item of a multi-metric consume (in.Items
// set): the command charging all of them or none.
func (s *Entitlements) multiConsumeCommand(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ConsumeCredits) (ConsumeCommand, error) {
	lines := make([]ConsumeLine, len(in.Items))
	var units, cost int64
	for i, it := range in.Items {
		field := fmt.Sprintf("items[%d].", i)
		rule, err := s.meteredRule(ctx, scope, it.Metric)
		if err != nil {
			return ConsumeCommand{}, refield(err, "billable_metric_key", field+"billable_metric_key")
		}
		c, err := Price(rule, it.Units)
		if err != nil {
			return ConsumeCommand{}, priceError(err, field+"units")
		}
		// The totals must fit int64 too (invariant 7): the script checks
		// the cost again, Go names the field first.
		var ok bool
		if units, ok = addInt64(units, it.Units); !ok {
			return ConsumeCommand{}, Invalid("items", "the items' total units would overflow a 64-bit amount")
		}
		if cost, ok = addInt64(cost, c); !ok {
			return ConsumeCommand{}, Invalid("items", "the items' total cost would overflow a 64-bit amount")
		}
		lines[i] = ConsumeLine{Metric: rule.BillableMetricKey, Units: it.Units, Terms: TermsOf(rule)}
	}
	if in.ItemProblem != nil {
		return ConsumeCommand{}, in.ItemProblem
	}
	c, err := s.customers.Resolve(ctx, scope, CustomerRef{Value: in.Customer}, !in.Dry)
	if err != nil {
		return ConsumeCommand{}, err
	}
	for _, l := range lines {
		if err := s.usageAllowed(ctx, c, l.Metric); err != nil {
			return ConsumeCommand{}, err
		}
	}
	cmd := s.newConsume(c, tenant, idem, MeteringRule{}, 0, orEmpty(in.Metadata))
	cmd.Metric, cmd.Units, cmd.Items = "", units, lines
	if cmd.Pool, err = poolDraw(ctx, s.customers, c, tenant, cmd.OpID); err != nil {
		return ConsumeCommand{}, err
	}
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
		CommandHeader: headerOf(CustomerKeyOf(c), idem, s.clock.Now()),
		Metric:        rule.BillableMetricKey, Units: units,
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
	if res.Replayed && cmd.Now.Sub(res.Mutation.At()) > idempotency.ReplayWindow {
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
		out.Cost, out.Charged, out.OverageMC, out.PoolMC = u.Cost, u.Charged, u.Overage, u.Pool
		if u.Items == nil {
			// Pointing into the usage (already on the heap) costs the hot
			// path no allocation.
			out.BillableMetricKey, out.Units = &u.Metric, &u.Units
		} else {
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
