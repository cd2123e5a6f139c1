// Comparing one account's Redis state with Postgres, field by field (pure;
// the reconcile run and the sampler share it).

package engine

import (
	"fmt"
	"slices"
	"sort"

	"github.com/google/uuid"
)

// CompareAccount compares Postgres' state of one customer (st, and the sum
// of its ledger deltas) with the store's; ok is true when they agree. An
// account the store does not hold agrees with the store (it is loaded from
// Postgres on first use) but is still held to its ledger.
func CompareAccount(st AccountState, stored StoredAccount, ledgerSum int64) (Difference, bool) {
	d := Difference{
		Customer:        CustomerKey{TenantID: st.TenantID, Environment: st.Environment, CustomerID: st.CustomerID},
		StoreVersion:    -1,
		PostgresVersion: st.Version,
		PostgresBalance: sumRemaining(st.Blocks) - st.Debt,
		LedgerSum:       ledgerSum,
	}
	if stored.Present {
		d.StoreVersion = stored.Version
		d.StoreBalance = sumRemaining(stored.Blocks) - stored.Debt
		if stored.Version != st.Version {
			d.Kinds = append(d.Kinds, DivergenceVersion)
		}
		if !sameBlocks(st.Blocks, stored.Blocks) {
			d.Kinds = append(d.Kinds, DivergenceBlocks)
		}
		if stored.Reserved != st.Reserved {
			d.Kinds = append(d.Kinds, DivergenceReserved)
		}
		if stored.LifetimeEarned != st.LifetimeEarned {
			d.Kinds = append(d.Kinds, DivergenceEarned)
		}
		if stored.Debt != st.Debt {
			d.Kinds = append(d.Kinds, DivergenceDebt)
		}
		if stored.AccountID != st.AccountID {
			d.Kinds = append(d.Kinds, DivergenceAccountID)
		}
		if len(gaugeDifferences(stored.Gauges, st.Gauges)) > 0 {
			d.Kinds = append(d.Kinds, DivergenceGauges)
		}
		if len(leaseDifferences(stored.Leases, st.Leases)) > 0 {
			d.Kinds = append(d.Kinds, DivergenceLeases)
		}
		if stored.Version == st.Version && len(budgetDifferences(stored.Budgets, st.Budgets)) > 0 {
			d.Kinds = append(d.Kinds, DivergenceBudgets)
		}
	}
	if d.PostgresBalance != ledgerSum {
		d.Kinds = append(d.Kinds, DivergenceLedger)
	}
	return d, len(d.Kinds) == 0
}

// sumRemaining is the credit left in blocks (saturating: a sum past int64
// differs from any ledger sum Postgres can hold anyway).
func sumRemaining(blocks []MutationBlock) int64 {
	var n int64
	for _, b := range blocks {
		if b.Remaining > 0 && n > maxInt64-b.Remaining {
			return maxInt64
		}
		n += b.Remaining
	}
	return n
}

// maxInt64 is the saturation bound of sumRemaining.
const maxInt64 = 1<<63 - 1

// sameBlocks tells whether a and b hold the same blocks with credit left,
// with the same amounts, priority, instants and scope (metadata is not
// compared: a drain does not carry it).
func sameBlocks(a, b []MutationBlock) bool {
	live := func(bs []MutationBlock) []MutationBlock {
		out := make([]MutationBlock, 0, len(bs))
		for _, x := range bs {
			if x.Remaining > 0 {
				out = append(out, x)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].ID.String() < out[j].ID.String() })
		return out
	}
	la, lb := live(a), live(b)
	if len(la) != len(lb) {
		return false
	}
	for i := range la {
		x, y := la[i], lb[i]
		if x.ID != y.ID || x.Remaining != y.Remaining || x.Original != y.Original || x.Priority != y.Priority ||
			x.StartsMS != y.StartsMS || x.CreatedMS != y.CreatedMS || !sameInstant(x.ExpiresMS, y.ExpiresMS) ||
			!slices.Equal(x.Scope, y.Scope) {
			return false
		}
	}
	return true
}

// sameInstant compares two optional instants.
func sameInstant(a, b *int64) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// FieldDifferences lists the figures on which Postgres' state of one
// customer (st, and its ledger sum) and the store's differ, with both
// values: version, balance and pending at nowMS (the blocks started and not
// expired, and those not started yet), reserved, lifetime earned, account
// id, every field of every live block (a block one side lacks is "absent"
// there), and Postgres against its own ledger.
func FieldDifferences(st AccountState, stored StoredAccount, ledgerSum, nowMS int64) []FieldDifference {
	var out []FieldDifference
	add := func(field string, redis, postgres any) {
		r, p := fmt.Sprint(redis), fmt.Sprint(postgres)
		if r != p {
			out = append(out, FieldDifference{Field: field, Redis: r, Postgres: p})
		}
	}
	if stored.Present {
		sb, sp := balanceAt(stored.Blocks, nowMS)
		pb, pp := balanceAt(st.Blocks, nowMS)
		add("version", stored.Version, st.Version)
		add("balance", sb, pb)
		add("pending", sp, pp)
		add("reserved", stored.Reserved, st.Reserved)
		add("lifetime_earned", stored.LifetimeEarned, st.LifetimeEarned)
		add("debt", stored.Debt, st.Debt)
		add("account_id", stored.AccountID, st.AccountID)
		out = append(out, blockDifferences(stored.Blocks, st.Blocks)...)
		out = append(out, gaugeDifferences(stored.Gauges, st.Gauges)...)
		out = append(out, leaseDifferences(stored.Leases, st.Leases)...)
		if stored.Version == st.Version {
			out = append(out, budgetDifferences(stored.Budgets, st.Budgets)...)
		}
	}
	// The ledger sums to the blocks' credit less the debt of the credit line.
	if pb := sumRemaining(st.Blocks); pb-st.Debt != ledgerSum {
		held := fmt.Sprintf("%d (its blocks hold %d)", ledgerSum, pb)
		if st.Debt != 0 {
			held = fmt.Sprintf("%d (its blocks hold %d, it owes %d)", ledgerSum, pb, st.Debt)
		}
		out = append(out, FieldDifference{Field: "ledger_sum", Redis: "-", Postgres: held})
	}
	return out
}

// balanceAt splits blocks' credit at nowMS into the balance (started, not
// expired) and pending (not started yet), as a read would.
func balanceAt(blocks []MutationBlock, nowMS int64) (balance, pending int64) {
	for _, b := range blocks {
		switch {
		case b.Remaining <= 0 || (b.ExpiresMS != nil && *b.ExpiresMS <= nowMS):
		case b.StartsMS > nowMS:
			pending += b.Remaining
		default:
			balance += b.Remaining
		}
	}
	return balance, pending
}

// blockDifferences compares the live blocks field by field, by block id.
func blockDifferences(redis, postgres []MutationBlock) []FieldDifference {
	index := func(bs []MutationBlock) map[uuid.UUID]MutationBlock {
		m := make(map[uuid.UUID]MutationBlock, len(bs))
		for _, b := range bs {
			if b.Remaining > 0 {
				m[b.ID] = b
			}
		}
		return m
	}
	r, p := index(redis), index(postgres)
	ids := unionIDs(r, p)
	instant := func(v *int64) string {
		if v == nil {
			return "none"
		}
		return fmt.Sprint(*v)
	}
	var out []FieldDifference
	for _, id := range ids {
		x, inR := r[id]
		y, inP := p[id]
		name := "block " + id.String()
		if !inR || !inP {
			d := FieldDifference{Field: name, Redis: "absent", Postgres: "absent"}
			if inR {
				d.Redis = fmt.Sprintf("remaining %d", x.Remaining)
			} else {
				d.Postgres = fmt.Sprintf("remaining %d", y.Remaining)
			}
			out = append(out, d)
			continue
		}
		for _, f := range []struct {
			field string
			r, p  string
		}{
			{"remaining", fmt.Sprint(x.Remaining), fmt.Sprint(y.Remaining)},
			{"original", fmt.Sprint(x.Original), fmt.Sprint(y.Original)},
			{"priority", fmt.Sprint(x.Priority), fmt.Sprint(y.Priority)},
			{"starts_ms", fmt.Sprint(x.StartsMS), fmt.Sprint(y.StartsMS)},
			{"expires_ms", instant(x.ExpiresMS), instant(y.ExpiresMS)},
			{"created_ms", fmt.Sprint(x.CreatedMS), fmt.Sprint(y.CreatedMS)},
			{"applies_to", ScopeText(x.Scope), ScopeText(y.Scope)},
		} {
			if f.r != f.p {
				out = append(out, FieldDifference{Field: name + " " + f.field, Redis: f.r, Postgres: f.p})
			}
		}
	}
	return out
}

// gaugeDifferences lists the gauges whose counters differ, as
// "gauge:<metric>"; a counter at 0 and an absent one agree (a gauge moved
// back to zero may keep its field or not).
func gaugeDifferences(redis, postgres map[string]int64) []FieldDifference {
	keys := make([]string, 0, len(redis)+len(postgres))
	for k := range redis {
		keys = append(keys, k)
	}
	for k := range postgres {
		if _, ok := redis[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []FieldDifference
	for _, k := range keys {
		if r, p := redis[k], postgres[k]; r != p {
			out = append(out, FieldDifference{Field: "gauge:" + k, Redis: fmt.Sprint(r), Postgres: fmt.Sprint(p)})
		}
	}
	return out
}

// budgetDifferences lists the budget counters whose spend in the current
// period differs, as "budget:<field>": Postgres' counters (one per budget
// of the customer, summed from the ledger) against the hash's fields. A
// hash counter of an earlier period counts zero (the scripts reset it at
// their next charge); one of a later counting start than Postgres' (a
// budget set again since the read) is not compared; the reached mark is
// not compared (a refusal sets it without a ledger entry).
func budgetDifferences(redis map[string]string, postgres map[string]BudgetCounter) []FieldDifference {
	keys := make([]string, 0, len(postgres))
	for k := range postgres {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []FieldDifference
	for _, k := range keys {
		p := postgres[k]
		var spent int64
		if raw, ok := redis[k]; ok {
			c, ok := ParseBudgetCounter(raw)
			switch {
			case !ok:
				out = append(out, FieldDifference{Field: "budget:" + k, Redis: raw, Postgres: p.String()})
				continue
			case c.FromMS > p.FromMS:
				continue
			case c.FromMS == p.FromMS:
				spent = c.SpentMC
			}
		}
		if spent != p.SpentMC {
			out = append(out, FieldDifference{Field: "budget:" + k, Redis: fmt.Sprint(spent), Postgres: fmt.Sprint(p.SpentMC)})
		}
	}
	return out
}

// leaseDifferences lists the active leases that differ, as "lease:<id>"
// with "metric amount expires" on each side ("absent" where one side lacks
// it). Both sides keep a lease past its expires until the sweep writes the
// lapse down in both, so the whole sets are compared.
func leaseDifferences(redis, postgres []StoredLease) []FieldDifference {
	text := func(ls []StoredLease) map[uuid.UUID]string {
		m := make(map[uuid.UUID]string, len(ls))
		for _, l := range ls {
			m[l.ID] = fmt.Sprintf("%s %d %d", l.Metric, l.Amount, l.ExpiresMS)
		}
		return m
	}
	r, p := text(redis), text(postgres)
	ids := unionIDs(r, p)
	var out []FieldDifference
	for _, id := range ids {
		rv, rok := r[id]
		pv, pok := p[id]
		if rok && pok && rv == pv {
			continue
		}
		if !rok {
			rv = "absent"
		}
		if !pok {
			pv = "absent"
		}
		out = append(out, FieldDifference{Field: "lease:" + id.String(), Redis: rv, Postgres: pv})
	}
	return out
}

// unionIDs is the ids that are keys of r or p, each once, in UUID text
// order, so differences are listed the same way every time.
func unionIDs[V any](r, p map[uuid.UUID]V) []uuid.UUID {
	ids := make([]uuid.UUID, 0, len(r)+len(p))
	for id := range r {
		ids = append(ids, id)
	}
	for id := range p {
		if _, ok := r[id]; !ok {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].String() < ids[j].String() })
	return ids
}
