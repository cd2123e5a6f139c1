package engine

import (
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Shared pools (issue 28 item 4): a customer may have a parent customer
// whose credit it spends once its own is gone, up to an optional cap per
// period on what it draws. The rules are docs/rules.md "Shared pools"; the
// choices (one level, the child's id minted in its parent's slot, what a
// re-parenting costs) docs/decisions.md "Shared pools".

// DrawLimit caps what a child customer may draw from its parent's credit
// per period of a time zone. Since is when the limit (its period and time
// zone) was set: its counter counts draws from the later of Since and the
// period's start, as a budget's does.
type DrawLimit struct {
	Period   BudgetPeriod `json:"period"`
	TimeZone string       `json:"time_zone"`
	LimitMC  int64        `json:"limit_mc"`
	Since    time.Time    `json:"since"`
}

// budget is the limit as a budget of every metric, whose windows and
// counters it shares.
func (d DrawLimit) budget() Budget {
	return Budget{Period: d.Period, TimeZone: d.TimeZone, LimitMC: d.LimitMC, Since: d.Since}
}

// Field is the child's account hash field that counts its draws in the
// current period (lua/prelude/pools.lua pool_take): "p:d" or "p:m".
func (d DrawLimit) Field() string { return "p:" + string(d.Period[:1]) }

// CheckDrawLimit validates a draw limit (the API's field path is prefix);
// it fills the default time zone.
func CheckDrawLimit(prefix string, d *DrawLimit) error {
	if d == nil {
		return nil
	}
	if !d.Period.Valid() {
		return Invalid(prefix+".period", `must be "day" or "month"`)
	}
	if d.TimeZone == "" {
		d.TimeZone = "UTC"
	}
	if _, err := BudgetLocation(d.TimeZone); err != nil {
		return Invalid(prefix+".time_zone", "must be UTC or an IANA time zone name")
	}
	if d.LimitMC < 0 || d.LimitMC > MaxBudgetLimitMC {
		return Invalid(prefix+".limit_mc", fmt.Sprintf("must be between 0 and %d", MaxBudgetLimitMC))
	}
	return nil
}

// mergeDrawLimit is next with its Since kept from prev when both count the
// same period and zone (a change of the limit alone carries the count on).
func mergeDrawLimit(prev, next *DrawLimit, now time.Time) *DrawLimit {
	if next == nil {
		return nil
	}
	out := *next
	out.Since = now
	if prev != nil && prev.Period == out.Period && prev.TimeZone == out.TimeZone {
		out.Since = prev.Since
	}
	return &out
}

// CountingFrom is the instant the limit's counter counts from in the
// period that holds now, and the period's end (Budget.CountingFrom).
func (d DrawLimit) CountingFrom(now time.Time) (from, end time.Time) {
	return d.budget().CountingFrom(now)
}

// DrawLimitStatus is a draw limit with what the child drew in the current
// period: the API's answer on the credits endpoint.
type DrawLimitStatus struct {
	DrawLimit
	DrawnMC     int64     `json:"drawn_mc"`
	PeriodStart time.Time `json:"period_start"`
	ResetsAt    time.Time `json:"resets_at"`
}

// DrawLimitStatusOf is d at now given its stored counter (ok false: none).
func DrawLimitStatusOf(d DrawLimit, c BudgetCounter, ok bool, now time.Time) DrawLimitStatus {
	st := BudgetStatusOf(d.budget(), c, ok, now)
	return DrawLimitStatus{DrawLimit: d, DrawnMC: st.SpentMC, PeriodStart: st.PeriodStart, ResetsAt: st.ResetsAt}
}

// PoolDraw is what a child's charge needs to draw on its parent's credit:
// the parent, the context of the parent's Mutation (its events), the op id
// of that Mutation and the child's draw limit.
type PoolDraw struct {
	Parent        CustomerKey
	ParentContext MutationContext
	OpID          uuid.UUID
	Limit         *DrawLimit
}

// PoolOpID is the op id of the parent's Mutation of a pool draw made by the
// child's operation op: derived (name-based, SHA-1) so a replayed script
// writes the same id and every reader agrees on it.
func PoolOpID(op uuid.UUID) uuid.UUID {
	return uuid.NewHash(sha1.New(), op, []byte("pool"), 5)
}

// PoolArg is the pool member of a money script's arguments (lua/prelude/pools.lua
// pool_of): "<parent id>|<field>|<from ms>|<end ms>|<limit>" with the
// window of the draw limit holding now, or "<parent id>" alone without a
// limit.
func PoolArg(p *PoolDraw, now time.Time) string {
	if p == nil {
		return ""
	}
	if p.Limit == nil {
		return p.Parent.CustomerID.String()
	}
	from, end := p.Limit.budget().CountingFrom(now)
	var sb strings.Builder
	sb.WriteString(p.Parent.CustomerID.String())
	sb.WriteByte('|')
	sb.WriteString(p.Limit.Field())
	sb.WriteByte('|')
	sb.WriteString(strconv.FormatInt(from.UnixMilli(), 10))
	sb.WriteByte('|')
	sb.WriteString(strconv.FormatInt(end.UnixMilli(), 10))
	sb.WriteByte('|')
	sb.WriteString(strconv.FormatInt(p.Limit.LimitMC, 10))
	return sb.String()
}

// ErrPoolStateMissing: the store holds no credit state for the parent of a
// pool draw; the caller loads the parent and runs the charge again (the
// script changed nothing).
var ErrPoolStateMissing = errors.New("engine: no credit state for the parent customer")

// poolDraw is the pool draw of a charge by c: nil when c has no parent, or
// its parent is gone (deleted: the child then spends its own credit only).
func poolDraw(ctx context.Context, customers CustomerLookup, c Customer, tenant Tenant, op uuid.UUID) (*PoolDraw, error) {
	if c.ParentID == nil {
		return nil, nil
	}
	key := CustomerKey{TenantID: c.TenantID, Environment: c.Environment, CustomerID: *c.ParentID}
	p, err := customers.CustomerByKey(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &PoolDraw{Parent: key, ParentContext: contextOf(p, tenant), OpID: PoolOpID(op), Limit: c.ParentDrawLimit}, nil
}

// withPool runs op, the charge of a child whose pool is p, loading the
// parent's credit state first when the store has none (loading the
// child's is withLoad's).
func withPool(ctx context.Context, s *Credits, p *PoolDraw, op func() (MutationResult, error)) (MutationResult, error) {
	res, err := op()
	if p == nil || !errors.Is(err, ErrPoolStateMissing) {
		return res, err
	}
	if err := s.Load(ctx, p.Parent); err != nil {
		return MutationResult{}, err
	}
	return op()
}
