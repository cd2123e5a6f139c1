package lua

import (
	"context"
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/creditd/creditd/engine"
)

// moneyProbe runs prelude/money.lua's money arithmetic on two decimal strings and
// replies {a+b, a-b, cmp(a,b)} with "OVERFLOW" for results outside int64, or
// "BAD" when an operand does not parse.
var moneyProbe = withPrelude(`
local a, b = m_parse(ARGV[1]), m_parse(ARGV[2])
if not a or not b then return 'BAD' end
local function out(m) if m_fits(m) then return m_fmt(m) end return 'OVERFLOW' end
return {out(m_add(a, b)), out(m_sub(a, b)), tostring(m_cmp(a, b))}
`)

// bigWant is what moneyProbe must answer, computed with math/big.
func bigWant(a, b int64) []string {
	out := func(x *big.Int) string {
		if !x.IsInt64() {
			return "OVERFLOW"
		}
		return x.String()
	}
	x, y := big.NewInt(a), big.NewInt(b)
	return []string{out(new(big.Int).Add(x, y)), out(new(big.Int).Sub(x, y)), strconv.Itoa(x.Cmp(y))}
}

// TestMoneyArithmetic: Lua money is exact over all of int64 and refuses
// results outside it (invariant 7), checked against math/big on edge values
// and random pairs, on every backend.
func TestMoneyArithmetic(t *testing.T) {
	t.Parallel()
	edges := []int64{0, 1, -1, 999_999_999, 1_000_000_000, -1_000_000_000, -999_999_999, 1 << 53, 1<<53 + 1,
		-(1<<53 + 1), math.MaxInt64, math.MaxInt64 - 1, math.MinInt64, math.MinInt64 + 1, 9_223_372_036_000_000_000}
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		check := func(a, c int64) {
			t.Helper()
			got, err := moneyProbe.Run(ctx, b.rdb, []string{"{x}"}, strconv.FormatInt(a, 10), strconv.FormatInt(c, 10)).StringSlice()
			if err != nil {
				t.Fatalf("%d, %d: %v", a, c, err)
			}
			if want := bigWant(a, c); len(got) != 3 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
				t.Errorf("%d, %d: got %v, want %v", a, c, got, want)
			}
		}
		for _, a := range edges {
			for _, c := range edges {
				check(a, c)
			}
		}
		r := rand.New(rand.NewPCG(1, 2))
		for range 300 {
			check(int64(r.Uint64()), int64(r.Uint64()>>uint(r.IntN(64))))
		}
		for _, bad := range []string{"", "1.5", "1e3", "9223372036854775808", "-9223372036854775809", "12345678901234567890", "+1", " 1"} {
			if v, err := moneyProbe.Run(ctx, b.rdb, []string{"{x}"}, bad, "0").Text(); err != nil || v != "BAD" {
				t.Errorf("parse %q: %v %v, want BAD", bad, v, err)
			}
		}
		if v, err := moneyProbe.Run(ctx, b.rdb, []string{"{x}"}, "-000000000000000000000007", "0").StringSlice(); err != nil || v[0] != "-7" {
			t.Errorf("leading zeros: %v %v", v, err)
		}
	})
}

// b36Probe runs prelude/text.lua's b36_enc and b36_dec on an integer's
// decimal text and replies {the base-36 text, it decoded back}.
var b36Probe = withPrelude(`
local n = tonumber(ARGV[1])
local s = b36_enc(n)
return {s, string.format('%.0f', b36_dec(s))}
`)

// TestBase36: b36_enc writes what Go's strconv.FormatInt(n, 36) writes (the
// reservation and block instants load.go writes from Postgres), and b36_dec
// reads it back, over every integer a Lua number holds exactly.
func TestBase36(t *testing.T) {
	t.Parallel()
	cases := []int64{0, 1, 9, 10, 35, 36, 37, 1295, 1296, 46655, 46656, -1, -35, -36, -1296,
		1_796_089_786_526, 1_796_090_386_526, -1_796_089_786_526, 1<<53 - 1, -(1<<53 - 1)}
	r := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		cases = append(cases, r.Int64N(1<<53)-1<<52)
	}
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		for _, n := range cases {
			got, err := b36Probe.Run(ctx, b.rdb, []string{"{x}"}, strconv.FormatInt(n, 10)).StringSlice()
			if err != nil {
				t.Fatalf("%d: %v", n, err)
			}
			if want := strconv.FormatInt(n, 36); len(got) != 2 || got[0] != want || got[1] != strconv.FormatInt(n, 10) {
				t.Errorf("%d: got %v, want [%s %d]", n, got, want, n)
			}
		}
	})
}

// TestMoneyModesAcrossCalls: a call runs money as numbers until it makes a
// value past 9e15, then as pairs (lua/prelude/money.lua). The library's memos
// keep decoded blocks and terms across calls, so a later call that takes a
// memo holding a pair must switch too (a number version given a pair is a
// Lua error: a 500). Big and small accounts alternate on one library, and
// a cost whose product passes 9e15 is made inside another call's
// arguments (the price's m_mul inside the charge).
func TestMoneyModesAcrossCalls(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		huge, small := newCustomer(), newCustomer()
		b.known(t, huge)
		b.known(t, small)
		b.grant(t, grantCmd(huge, math.MaxInt64-10, t0))
		b.grant(t, grantCmd(small, 1000, t0))
		wantHuge, wantSmall := int64(math.MaxInt64-10), int64(1000)
		unit := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 1}
		pricey := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 3_000_000_000}
		for i := range 3 {
			for _, step := range []struct {
				c     engine.CustomerKey
				units int64
				terms engine.RuleTerms
				want  *int64
			}{
				{huge, 1, unit, &wantHuge},
				{small, 7, unit, &wantSmall},
				// 3e9 x 3,000,001 = 9,000,003,000,000,000: past 9e15.
				{huge, 3_000_001, pricey, &wantHuge},
				{small, 1, unit, &wantSmall},
			} {
				res, err := b.store.Consume(ctx, consumeCmd(step.c, step.units, step.terms, engine.OveragePolicyBlock, t0))
				if err != nil {
					t.Fatalf("round %d: consume %d units: %v", i, step.units, err)
				}
				cost := step.units * step.terms.UnitCost
				*step.want -= cost
				if u := res.Mutation.Usage; u == nil || u.Cost != cost || u.Charged != cost {
					t.Errorf("round %d: usage %+v, want cost and charge %d", i, u, cost)
				}
				if got := res.Mutation.Account.Balance; got != *step.want {
					t.Errorf("round %d: balance %d, want %d", i, got, *step.want)
				}
			}
			// Terms past 9e15 on the small account: its own figures are all
			// numbers, so only the memo of the terms (made in round 0) can
			// switch the later rounds' calls.
			huger := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 10_000_000_000_000_000}
			if _, err := b.store.Consume(ctx, consumeCmd(small, 1, huger, engine.OveragePolicyBlock, t0)); !errors.Is(err, engine.ErrInsufficientCredits) {
				t.Errorf("round %d: a cost past the balance: %v, want insufficient credits", i, err)
			}
		}
	})
}
