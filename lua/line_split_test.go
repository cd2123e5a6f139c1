package lua

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/creditd/creditd/engine"
)

// lineSplitProbe runs prelude/credit_line.lua's line_split on an account owing ARGV[2]
// with effective balance ARGV[1], a reservation part ARGV[3], a cost ARGV[4] and
// a line ARGV[5]: {"no"} when refused, else {"ok", from blocks, to debt}.
var lineSplitProbe = withPrelude(`
local a = {d = m_parse(ARGV[2])}
local from, debt = line_split(a, m_parse(ARGV[1]), m_parse(ARGV[3]), m_parse(ARGV[4]), m_parse(ARGV[5]))
if not from then return {'no'} end
return {'ok', m_fmt(from), m_fmt(debt)}
`)

// TestLineSplitAgrees holds the script's credit-line rule to engine.LineSplit
// (style: rules are pure Go, Lua agrees) on edge cases and random ones,
// including sums past int64, on every backend.
func TestLineSplitAgrees(t *testing.T) {
	t.Parallel()
	type tc struct{ eff, debt, held, cost, line int64 }
	cases := []tc{
		{100, 0, 0, 100, 0}, {100, 0, 0, 101, 0}, {100, 0, 0, 130, 50}, {100, 0, 0, 151, 50},
		{-30, 30, 0, 20, 50}, {-30, 30, 0, 21, 50}, {-20, 30, 80, 60, 0}, {20, 0, 80, 150, 50},
		{math.MinInt64 + 1, 0, 0, 1, engine.MaxCreditLimitMC}, {math.MaxInt64, 0, math.MaxInt64, math.MaxInt64, engine.MaxCreditLimitMC},
		{0, math.MaxInt64, math.MaxInt64, math.MaxInt64, 0}, {-engine.MaxCreditLimitMC, engine.MaxCreditLimitMC, 0, 0, engine.MaxCreditLimitMC},
	}
	r := rand.New(rand.NewPCG(3, 4))
	for range 200 {
		cases = append(cases, tc{r.Int64N(2000) - 1000, r.Int64N(500), r.Int64N(300), r.Int64N(1500), r.Int64N(600)})
	}
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		s := func(v int64) string { return strconv.FormatInt(v, 10) }
		for _, c := range cases {
			got, err := lineSplitProbe.Run(ctx, b.rdb, []string{"{x}"}, s(c.eff), s(c.debt), s(c.held), s(c.cost), s(c.line)).StringSlice()
			if err != nil {
				t.Fatalf("%+v: %v", c, err)
			}
			from, debt, ok := engine.LineSplit(c.eff, c.debt, c.held, c.cost, c.line)
			want := []string{"no"}
			if ok {
				want = []string{"ok", s(from), s(debt)}
			}
			if len(got) != len(want) || got[0] != want[0] || (ok && (got[1] != want[1] || got[2] != want[2])) {
				t.Errorf("%+v: script %v, engine.LineSplit %v", c, got, want)
			}
		}
	})
}
