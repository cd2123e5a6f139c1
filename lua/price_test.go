package lua

import (
	"context"
	"errors"
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// priceProbe runs prelude/pricing.lua's terms_parse and price on ARGV[1] (terms)
// and ARGV[2] (units), replying the cost in decimal or the first word of
// the error ("OVERFLOW", "BADTERMS", "BADARG").
var priceProbe = withPrelude(`
local t = terms_parse(ARGV[1])
if not t then return 'BADTERMS' end
local units = m_parse(ARGV[2])
if not units then return 'BADARG' end
local c, err = price(t, units)
if not c then return (string.match(err, '^(%S+)')) end
return m_fmt(c)
`)

// mulProbe runs prelude/money.lua's m_mul on two decimal strings.
var mulProbe = withPrelude(`
local c = m_mul(m_parse(ARGV[1]), m_parse(ARGV[2]))
if not c then return 'OVERFLOW' end
return m_fmt(c)
`)

// luaPrice is what prelude/pricing.lua's price answers for terms and units.
func luaPrice(t testing.TB, rdb redis.UniversalClient, terms engine.RuleTerms, units int64) string {
	t.Helper()
	arg, err := termsArg(terms)
	if err != nil {
		t.Fatal(err)
	}
	v, err := priceProbe.Run(context.Background(), rdb, []string{"{x}"}, arg, strconv.FormatInt(units, 10)).Text()
	if err != nil {
		t.Fatalf("price probe %q %d: %v", arg, units, err)
	}
	return v
}

// goPrice is engine.Price in the probe's words.
func goPrice(t testing.TB, terms engine.RuleTerms, units int64) string {
	t.Helper()
	c, err := engine.Price(engine.MeteringRule{CostType: terms.CostType, BaseCost: terms.BaseCost,
		UnitCost: terms.UnitCost, TierConfig: terms.TierConfig}, units)
	switch {
	case errors.Is(err, engine.ErrOverflow):
		return "OVERFLOW"
	case err != nil:
		t.Fatalf("engine.Price: %v", err)
	}
	return strconv.FormatInt(c, 10)
}

func flatTerms(base int64) engine.RuleTerms {
	return engine.RuleTerms{CostType: engine.CostFlat, BaseCost: base}
}

func perUnitTerms(unit int64) engine.RuleTerms {
	return engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: unit}
}

func tieredTerms(mode engine.TierMode, tiers ...engine.Tier) engine.RuleTerms {
	return engine.RuleTerms{CostType: engine.CostTiered, TierConfig: &engine.TierConfig{Mode: mode, Tiers: tiers}}
}

func tier(upTo *int64, unit, flat int64) engine.Tier {
	return engine.Tier{UpTo: upTo, UnitCost: unit, FlatCost: flat}
}

// TestPriceTiers: the Lua price of every cost type and tier mode at and
// around each tier boundary (up_to is inclusive) is the hand-computed
// figure and engine.Price's, on every backend; overflow is refused by both.
func TestPriceTiers(t *testing.T) {
	t.Parallel()
	// 0-10 at 5 (+100 on entry), 11-20 at 3 (+50), 21+ at 1 (+7).
	three := []engine.Tier{tier(ptr[int64](10), 5, 100), tier(ptr[int64](20), 3, 50), tier(nil, 1, 7)}
	grad, vol := tieredTerms(engine.TierGraduated, three...), tieredTerms(engine.TierVolume, three...)
	maxFlat := tieredTerms(engine.TierGraduated, tier(ptr[int64](1), 0, math.MaxInt64), tier(nil, 0, 1))
	cases := []struct {
		name  string
		terms engine.RuleTerms
		units int64
		want  string
	}{
		{"flat one unit", flatTerms(250), 1, "250"},
		{"flat ignores units", flatTerms(250), 1e18, "250"},
		{"flat zero", flatTerms(0), 5, "0"},
		{"per_unit one", perUnitTerms(5), 1, "5"},
		{"per_unit seven", perUnitTerms(5), 7, "35"},
		{"per_unit past 2^53", perUnitTerms(3), 1 << 53, "27021597764222976"},
		{"per_unit just fits", perUnitTerms(2), math.MaxInt64 / 2, strconv.FormatInt(math.MaxInt64-1, 10)},
		{"per_unit one past", perUnitTerms(2), math.MaxInt64/2 + 1, "OVERFLOW"},
		{"per_unit max units", perUnitTerms(1), math.MaxInt64, strconv.FormatInt(math.MaxInt64, 10)},
		{"per_unit square fits", perUnitTerms(3037000499), 3037000499, "9223372030926249001"},
		{"per_unit square overflows", perUnitTerms(3037000500), 3037000500, "OVERFLOW"},
		{"per_unit zero cost", perUnitTerms(0), math.MaxInt64, "0"},
		{"graduated 1", grad, 1, "105"},
		{"graduated 10 (top of tier 1)", grad, 10, "150"},
		{"graduated 11 (enters tier 2)", grad, 11, "203"},
		{"graduated 20 (top of tier 2)", grad, 20, "230"},
		{"graduated 21 (enters tier 3)", grad, 21, "238"},
		{"graduated 100", grad, 100, "317"},
		{"volume 1", vol, 1, "105"},
		{"volume 10", vol, 10, "150"},
		{"volume 11", vol, 11, "83"},
		{"volume 20", vol, 20, "110"},
		{"volume 21", vol, 21, "28"},
		{"volume 100", vol, 100, "107"},
		{"graduated single open tier", tieredTerms(engine.TierGraduated, tier(nil, 4, 0)), 3, "12"},
		{"graduated flat reaches max", maxFlat, 1, strconv.FormatInt(math.MaxInt64, 10)},
		{"graduated flat overflows", maxFlat, 2, "OVERFLOW"},
		{"graduated huge slice", tieredTerms(engine.TierGraduated, tier(ptr[int64](1<<60), 8, 0), tier(nil, 8, 0)), 1<<60 + 1, "OVERFLOW"},
		{"graduated huge fits", tieredTerms(engine.TierGraduated, tier(ptr[int64](1<<60), 7, 0), tier(nil, 8, 0)), 1<<60 + 1, strconv.FormatInt(7<<60+8, 10)},
		{"volume unit overflows", tieredTerms(engine.TierVolume, tier(nil, math.MaxInt64, 0)), 2, "OVERFLOW"},
		{"volume flat overflows", tieredTerms(engine.TierVolume, tier(nil, math.MaxInt64, 1)), 1, "OVERFLOW"},
		{"volume past last bounded tier", tieredTerms(engine.TierVolume, tier(ptr[int64](5), 2, 0), tier(nil, 1, 3)), math.MaxInt64 - 3, strconv.FormatInt(math.MaxInt64, 10)},
	}
	eachBackend(t, func(t *testing.T, b bundle) {
		for _, tc := range cases {
			if g := goPrice(t, tc.terms, tc.units); g != tc.want {
				t.Errorf("%s: engine.Price %s, table says %s", tc.name, g, tc.want)
			}
			if got := luaPrice(t, b.rdb, tc.terms, tc.units); got != tc.want {
				t.Errorf("%s: lua price %s, want %s", tc.name, got, tc.want)
			}
		}
		for _, bad := range []string{"", "flat|1|0|", "tiered|0|0|graduated|", "tiered|0|0|volume|x:1:1", "per_unit|1.5|0||"} {
			v, err := priceProbe.Run(context.Background(), b.rdb, []string{"{x}"}, bad, "1").Text()
			if err != nil || (v != "BADTERMS") {
				t.Errorf("terms %q: %q %v, want BADTERMS", bad, v, err)
			}
		}
		if v := luaPrice(t, b.rdb, flatTerms(1), 0); v != "BADARG" {
			t.Errorf("0 units: %q, want BADARG", v)
		}
	})
}

// TestMoneyMultiply: m_mul is exact over all of int64 and refuses every
// product outside it, checked against math/big on edges and random pairs.
func TestMoneyMultiply(t *testing.T) {
	t.Parallel()
	edges := []int64{0, 1, 2, 3, 999_999, 1_000_000, 1_000_001, 999_999_999, 1_000_000_000, 1 << 31, 1<<32 + 1,
		3037000499, 3037000500, 1 << 53, 1<<53 + 1, math.MaxInt64 / 2, math.MaxInt64 - 1, math.MaxInt64}
	eachBackend(t, func(t *testing.T, b bundle) {
		check := func(x, y int64) {
			t.Helper()
			got, err := mulProbe.Run(context.Background(), b.rdb, []string{"{x}"}, strconv.FormatInt(x, 10), strconv.FormatInt(y, 10)).Text()
			if err != nil {
				t.Fatal(err)
			}
			want := "OVERFLOW"
			if p := new(big.Int).Mul(big.NewInt(x), big.NewInt(y)); p.IsInt64() {
				want = p.String()
			}
			if got != want {
				t.Errorf("%d * %d: %s, want %s", x, y, got, want)
			}
		}
		for _, x := range edges {
			for _, y := range edges {
				check(x, y)
			}
		}
		r := rand.New(rand.NewPCG(3, 4))
		for range 300 {
			check(int64(r.Uint64()>>1>>uint(r.IntN(63))), int64(r.Uint64()>>1>>uint(r.IntN(63))))
		}
	})
}

// magnitude draws a non-negative int64 from a scale chosen at random, so
// small, mid-sized, past-2^53 and near-MaxInt64 values all turn up.
func magnitude(r *rand.Rand) int64 {
	switch r.IntN(7) {
	case 0:
		return 0
	case 1:
		return r.Int64N(10)
	case 2:
		return r.Int64N(1_000)
	case 3:
		return r.Int64N(1_000_000_000)
	case 4:
		return r.Int64N(1 << 40)
	case 5:
		return r.Int64N(1 << 62)
	default:
		return math.MaxInt64 - r.Int64N(1000)
	}
}

// randomTerms builds valid pricing terms (engine.ValidateRule passes) of
// kind%3 (flat, per_unit, tiered) from a seed; tiers get increasing up_to.
func randomTerms(kind uint8, base, unit int64, volume bool, ntiers uint8, seed uint64) engine.RuleTerms {
	abs := func(v int64) int64 {
		if v < 0 {
			return -(v + 1)
		}
		return v
	}
	switch kind % 3 {
	case 0:
		return flatTerms(abs(base))
	case 1:
		return perUnitTerms(max(abs(unit), 1))
	}
	r := rand.New(rand.NewPCG(seed, uint64(ntiers)))
	mode := engine.TierGraduated
	if volume {
		mode = engine.TierVolume
	}
	n := 1 + int(ntiers%6)
	tiers := make([]engine.Tier, n)
	var prev int64
	for i := range tiers {
		tiers[i] = tier(nil, magnitude(r), magnitude(r))
		if i < n-1 {
			// Leave room for the tiers after this one to keep increasing.
			step := int64(1)
			if room := math.MaxInt64 - int64(n) - prev; room > 1 {
				step = 1 + magnitude(r)%room
			}
			prev += step
			tiers[i].UpTo = ptr(prev)
		}
	}
	return tieredTerms(mode, tiers...)
}

// randomUnits is 1..MaxInt64, often at or next to a tier boundary.
func randomUnits(r *rand.Rand, terms engine.RuleTerms) int64 {
	if terms.TierConfig != nil && r.IntN(2) == 0 {
		var bounds []int64
		for _, t := range terms.TierConfig.Tiers {
			if t.UpTo != nil {
				bounds = append(bounds, *t.UpTo)
			}
		}
		if len(bounds) > 0 {
			u := bounds[r.IntN(len(bounds))] + int64(r.IntN(3)-1)
			if u >= 1 {
				return u
			}
		}
	}
	return max(magnitude(r), 1)
}

// FuzzPriceAgreesWithGo: for any valid terms and units >= 1, price in Lua
// and engine.Price agree exactly: the same cost, or both refuse overflow.
// Plain `go test` runs the seeds; `go test -fuzz FuzzPriceAgreesWithGo`
// explores.
func FuzzPriceAgreesWithGo(f *testing.F) {
	f.Add(uint8(0), int64(250), int64(0), false, uint8(0), uint64(1), int64(3))
	f.Add(uint8(1), int64(0), int64(7), false, uint8(0), uint64(1), int64(1<<60))
	f.Add(uint8(1), int64(0), int64(math.MaxInt64), false, uint8(0), uint64(1), int64(2))
	f.Add(uint8(2), int64(0), int64(0), false, uint8(2), uint64(42), int64(10))
	f.Add(uint8(2), int64(0), int64(0), true, uint8(2), uint64(42), int64(10))
	f.Add(uint8(2), int64(0), int64(0), false, uint8(5), uint64(7), int64(math.MaxInt64))
	f.Add(uint8(2), int64(0), int64(0), true, uint8(5), uint64(9), int64(1<<53+1))
	f.Add(uint8(2), int64(0), int64(0), true, uint8(0), uint64(3), int64(1))
	m := miniredis.RunT(f)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	f.Cleanup(func() { _ = rdb.Close() })
	f.Fuzz(func(t *testing.T, kind uint8, base, unit int64, volume bool, ntiers uint8, seed uint64, units int64) {
		terms := randomTerms(kind, base, unit, volume, ntiers, seed)
		if err := engine.ValidateRule(engine.MeteringRule{CostType: terms.CostType, BaseCost: terms.BaseCost,
			UnitCost: terms.UnitCost, TierConfig: terms.TierConfig}); err != nil {
			t.Fatalf("randomTerms built an invalid rule: %v", err)
		}
		if units < 1 {
			units = units&math.MaxInt64 | 1
		}
		if got, want := luaPrice(t, rdb, terms, units), goPrice(t, terms, units); got != want {
			arg, _ := termsArg(terms)
			t.Errorf("terms %s units %d: lua %s, go %s", arg, units, got, want)
		}
	})
}

// TestPriceRandomAgreesWithGo runs a few hundred random terms and units
// (many at tier boundaries, many overflowing) through both prices.
func TestPriceRandomAgreesWithGo(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	r := rand.New(rand.NewPCG(11, 12))
	overflows := 0
	for i := range 500 {
		terms := randomTerms(uint8(r.IntN(3)), magnitude(r), magnitude(r), r.IntN(2) == 0, uint8(r.IntN(6)), r.Uint64())
		units := randomUnits(r, terms)
		got, want := luaPrice(t, rdb, terms, units), goPrice(t, terms, units)
		if got != want {
			arg, _ := termsArg(terms)
			t.Fatalf("case %d: terms %s units %d: lua %s, go %s", i, arg, units, got, want)
		}
		if want == "OVERFLOW" {
			overflows++
		}
	}
	if overflows < 20 || overflows > 480 {
		t.Errorf("%d of 500 cases overflowed: the generator no longer covers both outcomes", overflows)
	}
}
