package engine

import (
	"math"
	"sort"
)

// MaxSafeAmount bounds every money value: int64 (invariant 7). Anything that
// would pass it is refused with ErrOverflow instead of wrapping.
const MaxSafeAmount int64 = math.MaxInt64

// Spend order (docs/spec/interface.md "Credit block"): lowest priority first; ties by
// soonest expiry, a block without expiry last; then oldest; then by id so the
// order is total and Lua and Go agree on it.
func spendsBefore(a, b MutationBlock) bool {
	if a.Priority != b.Priority {
		return a.Priority < b.Priority
	}
	switch {
	case a.ExpiresMS != nil && b.ExpiresMS == nil:
		return true
	case a.ExpiresMS == nil && b.ExpiresMS != nil:
		return false
	case a.ExpiresMS != nil && *a.ExpiresMS != *b.ExpiresMS:
		return *a.ExpiresMS < *b.ExpiresMS
	}
	if a.CreatedMS != b.CreatedMS {
		return a.CreatedMS < b.CreatedMS
	}
	return a.ID.String() < b.ID.String()
}

// SpendOrder sorts blocks in the order they are spent.
func SpendOrder(blocks []MutationBlock) {
	sort.SliceStable(blocks, func(i, j int) bool { return spendsBefore(blocks[i], blocks[j]) })
}

// Live reports whether b still counts at nowMS: it has credit and has not
// reached its expires_at (a block stops counting at that instant).
func (b MutationBlock) Live(nowMS int64) bool {
	return b.Remaining > 0 && (b.ExpiresMS == nil || *b.ExpiresMS > nowMS)
}

// Started reports whether b may be spent at nowMS (stack_after blocks wait).
func (b MutationBlock) Started(nowMS int64) bool { return b.StartsMS <= nowMS }

// Balances are the derived figures of an account at one instant. Debt is
// what the account owes on its credit line (>= 0), already counted in
// Balance and Effective (WithDebt), which may then be negative.
type Balances struct {
	Balance, Reserved, Pending, Effective int64
	Debt                                  int64
	// Scoped: the account holds a block scoped to metrics, so what a
	// metric may spend is ScopeFree's, read from a snapshot.
	Scoped bool
}

// WithDebt is b owing debt on the credit line (docs/rules.md "Credit
// line"): the balance and the effective balance are lower by it.
func (b Balances) WithDebt(debt int64) Balances {
	b.Debt = debt
	b.Balance -= debt
	b.Effective -= debt
	return b
}

// ComputeBalances sums live blocks at nowMS: balance counts every live block,
// pending those not started yet; effective is balance - reserved - pending.
func ComputeBalances(blocks []MutationBlock, reserved int64, nowMS int64) Balances {
	var out Balances
	for _, b := range blocks {
		if !b.Live(nowMS) {
			continue
		}
		out.Balance += b.Remaining
		if !b.Started(nowMS) {
			out.Pending += b.Remaining
		}
	}
	out.Reserved = reserved
	out.Effective = out.Balance - reserved - out.Pending
	return out
}

// Draw is the amount a debit takes from one block.
type Draw struct {
	Block  MutationBlock
	Amount int64
}

// PlanDebit takes amount from the started live blocks in spend order. ok is
// false, with no draws, when the effective balance is short.
func PlanDebit(blocks []MutationBlock, reserved, amount int64, nowMS int64) (draws []Draw, ok bool) {
	if ComputeBalances(blocks, reserved, nowMS).Effective < amount {
		return nil, false
	}
	spendable := make([]MutationBlock, 0, len(blocks))
	for _, b := range blocks {
		if b.Live(nowMS) && b.Started(nowMS) {
			spendable = append(spendable, b)
		}
	}
	SpendOrder(spendable)
	left := amount
	for _, b := range spendable {
		if left == 0 {
			break
		}
		take := min(b.Remaining, left)
		draws = append(draws, Draw{Block: b, Amount: take})
		left -= take
	}
	return draws, true
}

// AddChecked adds two amounts, reporting false on int64 overflow.
func AddChecked(a, b int64) (int64, bool) {
	s := a + b
	if (b > 0 && s < a) || (b < 0 && s > a) {
		return 0, false
	}
	return s, true
}

// LineSplit is the rule of a charge under policy block (the Go twin of
// lua/prelude/credit_line.lua's line_split, held to it by lua's TestLineSplitAgrees): a
// charge of cost that settles held of a reservation (0 outside a commit), for an
// account of effective balance effective owing debt on a credit line of
// lineMC. ok is false when the effective balance would end below minus the
// line (effective + held - cost < -lineMC). Else the started blocks pay
// fromBlocks, all they hold beyond the other reservations (effective + debt +
// held) up to the cost, and toDebt goes on the line (docs/rules.md "Credit
// line"). With no line and no debt it is the plain cost <= effective +
// held. Sums that would pass int64 are taken at their true value
// (math/big-free: the operands are bounded by int64 and the line by
// MaxCreditLimitMC, and the comparisons are done in 128 bits).
func LineSplit(effective, debt, held, cost, lineMC int64) (fromBlocks, toDebt int64, ok bool) {
	room := add128(add128(wide(effective), wide(held)), wide(lineMC))
	if cmp128(room, wide(cost)) < 0 {
		return 0, 0, false
	}
	free := add128(add128(wide(effective), wide(debt)), wide(held))
	if cmp128(free, wide(cost)) >= 0 {
		return cost, 0, true
	}
	if cmp128(free, wide(0)) <= 0 {
		return 0, cost, true
	}
	f := free.lo // 0 < free < cost <= MaxInt64: fits
	return int64(f), cost - int64(f), true
}

// i128 is a two's-complement 128-bit integer, enough for sums of three
// int64 values.
type i128 struct {
	hi int64
	lo uint64
}

func wide(v int64) i128 { return i128{hi: v >> 63, lo: uint64(v)} }

func add128(a, b i128) i128 {
	lo := a.lo + b.lo
	carry := int64(0)
	if lo < a.lo {
		carry = 1
	}
	return i128{hi: a.hi + b.hi + carry, lo: lo}
}

func cmp128(a, b i128) int {
	switch {
	case a.hi != b.hi:
		if a.hi < b.hi {
			return -1
		}
		return 1
	case a.lo != b.lo:
		if a.lo < b.lo {
			return -1
		}
		return 1
	}
	return 0
}
