package engine

import (
	"slices"
	"strings"
	"time"
)

// Credits scoped to metrics (issue 28 item 1; docs/rules.md "Credits
// scoped to metrics", docs/decisions.md). A block may carry a scope: the
// billable metric keys it pays for. A block without one pays for every
// metric. Charges for metric M take, in spend order, only blocks that
// apply to M; lua/prelude/scopes.lua scope_free and scope_room decide how much, and
// ScopeFree and ScopeRoom below are their Go twins (lua
// TestScopeFreeAgrees runs both on the same cases).

// MaxScopeKeys bounds the metric keys of one scope (docs/limits.md): a
// charge tests each block's scope once per reservation metric.
const MaxScopeKeys = 20

// AppliesTo is the applies_to member of grants, plan grants, topups,
// import rows and blocks.
type AppliesTo struct {
	BillableMetricKeys []string `json:"billable_metric_keys"`
}

// ScopeKeys checks a's keys and returns them sorted without repeats
// (the form blocks store), nil for a nil a (every metric). field names the
// member in the 422: 1 to MaxScopeKeys keys, each a valid metric key. An
// unknown metric is accepted: plans and grants may name a metric before it
// is defined (docs/decisions.md "Credits scoped to metrics").
func ScopeKeys(field string, a *AppliesTo) ([]string, error) {
	if a == nil {
		return nil, nil
	}
	f := field + ".billable_metric_keys"
	n := len(a.BillableMetricKeys)
	if n == 0 || n > MaxScopeKeys {
		return nil, Invalid(f, f+" must hold 1 to 20 metric keys")
	}
	out := make([]string, 0, n)
	for _, k := range a.BillableMetricKeys {
		if !ValidMetricKey(k) {
			return nil, Invalid(f, f+" holds an invalid metric key")
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// AppliesToOf is the applies_to of stored scope keys: nil for none.
func AppliesToOf(keys []string) *AppliesTo {
	if len(keys) == 0 {
		return nil
	}
	return &AppliesTo{BillableMetricKeys: slices.Clone(keys)}
}

// ScopeText is the scope as grant.lua takes it: keys joined by ",".
func ScopeText(keys []string) string { return strings.Join(keys, ",") }

// Applies reports whether block b pays for metric: b has no scope or names
// it. The metric "" (a multi-metric reservation) only unscoped blocks back.
func (b MutationBlock) Applies(metric string) bool {
	return len(b.Scope) == 0 || (metric != "" && slices.Contains(b.Scope, metric))
}

// ScopedAny reports whether some block of blocks has a scope.
func ScopedAny(blocks []MutationBlock) bool {
	for _, b := range blocks {
		if len(b.Scope) > 0 {
			return true
		}
	}
	return false
}

// eligible is E(m): what the started live blocks that apply to m hold.
func eligible(blocks []MutationBlock, metric string, nowMS int64) int64 {
	var e int64
	for _, b := range blocks {
		if b.Live(nowMS) && b.Started(nowMS) && b.Applies(metric) {
			e += b.Remaining
		}
	}
	return e
}

// ScopeFree is prelude scope_free: the most a charge for metric may take
// from blocks at nowMS while every metric in reservationMetrics (the metrics of
// the active reservations that stay) keeps E(m) >= reserved - freed. Walking the
// blocks that apply to metric in spend order, it stops where one more unit
// would break that. Never negative.
func ScopeFree(blocks []MutationBlock, reservationMetrics []string, reserved, freed int64, metric string, nowMS int64) int64 {
	owed := reserved - freed
	slack := make([]int64, len(reservationMetrics))
	taken := make([]int64, len(reservationMetrics))
	for i, m := range reservationMetrics {
		slack[i] = eligible(blocks, m, nowMS) - owed
	}
	var elig []MutationBlock
	for _, b := range blocks {
		if b.Live(nowMS) && b.Started(nowMS) && b.Applies(metric) {
			elig = append(elig, b)
		}
	}
	SpendOrder(elig)
	var cum int64
	for _, b := range elig {
		capped, limit := false, int64(0)
		for i, m := range reservationMetrics {
			if !b.Applies(m) {
				continue
			}
			if room := slack[i] - taken[i]; room < b.Remaining {
				c := cum + max(room, 0)
				if !capped || c < limit {
					capped, limit = true, c
				}
			}
			taken[i] += b.Remaining
		}
		if capped {
			return limit
		}
		cum += b.Remaining
	}
	return cum
}

// ScopeRoom is prelude scope_room: what a reservation for metric may take or grow
// by, min over metric and reservationMetrics of E(m) - reserved (negative when
// reservations lean on the credit line).
func ScopeRoom(blocks []MutationBlock, reservationMetrics []string, reserved int64, metric string, nowMS int64) int64 {
	room := eligible(blocks, metric, nowMS) - reserved
	for _, m := range reservationMetrics {
		room = min(room, eligible(blocks, m, nowMS)-reserved)
	}
	return room
}

// MetricAvailable is what a charge for metric may take now (checks and
// snapshots, docs/rules.md "Credits scoped to metrics"): AvailableOf the
// account, and no more than the blocks that apply to the metric may pay
// (ScopeFree) plus, under block, what is left of the credit line, as the
// money scripts decide (prelude scope_split, scope_avail).
func MetricAvailable(acct Account, limitMC int64, policy OveragePolicy, metric string, nowMS int64) int64 {
	avail := AvailableOf(acct.EffectiveBalance, limitMC, policy)
	blocks := make([]MutationBlock, 0, len(acct.Blocks))
	for _, b := range acct.Blocks {
		blocks = append(blocks, b.mutationBlock())
	}
	if !ScopedAny(blocks) {
		return avail
	}
	free := ScopeFree(blocks, acct.ReservationMetrics, acct.ReservedBalance, 0, metric, nowMS)
	if policy == OveragePolicyBlock {
		if s, ok := AddChecked(free, limitMC-acct.DebtMC); ok {
			free = s
		} else {
			free = maxInt64
		}
	}
	return min(avail, free)
}

// mutationBlock is b as the scripts' rules see it.
func (b Block) mutationBlock() MutationBlock {
	out := MutationBlock{ID: b.ID, Original: b.OriginalAmount, Remaining: b.RemainingAmount, Priority: b.Priority,
		Source: b.Source, StartsMS: b.StartsAt.UnixMilli(), CreatedMS: b.CreatedAt.UnixMilli()}
	if b.ExpiresAt != nil {
		ms := b.ExpiresAt.UnixMilli()
		out.ExpiresMS = &ms
	}
	if b.AppliesTo != nil {
		out.Scope = b.AppliesTo.BillableMetricKeys
	}
	return out
}

// ScopeBalance is one scope's share of an account's live blocks: what they
// reservation (balance, as the account's, before debt) and what of it has not
// started (pending). AppliesTo nil is the unscoped credit.
type ScopeBalance struct {
	AppliesTo *AppliesTo `json:"applies_to"`
	Balance   int64      `json:"balance"`
	Pending   int64      `json:"pending"`
}

// ScopeBalances groups the live blocks of a snapshot (Account.Blocks) at
// now by scope: the unscoped credit first (always present), then each scope in
// the order of its keys' text.
func ScopeBalances(blocks []Block, now time.Time) []ScopeBalance {
	out := []ScopeBalance{{}}
	at := map[string]int{"": 0}
	for _, b := range blocks {
		k := ""
		if b.AppliesTo != nil {
			k = ScopeText(b.AppliesTo.BillableMetricKeys)
		}
		i, ok := at[k]
		if !ok {
			i = len(out)
			at[k] = i
			out = append(out, ScopeBalance{AppliesTo: AppliesToOf(b.AppliesTo.BillableMetricKeys)})
		}
		out[i].Balance += b.RemainingAmount
		if b.StartsAt.After(now) {
			out[i].Pending += b.RemainingAmount
		}
	}
	slices.SortStableFunc(out[1:], func(x, y ScopeBalance) int {
		return strings.Compare(ScopeText(x.AppliesTo.BillableMetricKeys), ScopeText(y.AppliesTo.BillableMetricKeys))
	})
	return out
}

// ScopeBalances is the package function at the service's clock.
func (s *Credits) ScopeBalances(blocks []Block) []ScopeBalance {
	return ScopeBalances(blocks, s.clock.Now())
}
