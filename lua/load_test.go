package lua

import (
	"context"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// TestLoadEncodingMatchesPrelude: the hash values Go prepares for load.lua
// are byte for byte what prelude/blocks.lua's block_enc and
// prelude/reservations.lua's res_enc write, so a
// rebuilt account reads exactly like one the scripts wrote. A change of the
// encoding in the prelude fails here until load.go follows.
func TestLoadEncodingMatchesPrelude(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	ctx := context.Background()
	blockLua := preludeLua + `
local b = {rem = m_parse(ARGV[1]), orig = m_parse(ARGV[2]), prio = int_parse(ARGV[3]), created = int_parse(ARGV[4]),
  starts = int_parse(ARGV[5]), expires = int_parse(ARGV[6]), src = ARGV[7]}
if ARGV[8] ~= '' then b.scope = ',' .. ARGV[8] .. ',' end
return block_enc(b)`
	reservationLua := preludeLua + `
local function opt(s) if s == '' then return nil end return m_parse(s) end
local r = {status = ARGV[1], est_units = m_parse(ARGV[2]), est_cost = m_parse(ARGV[3]), expires = int_parse(ARGV[4]),
  created = int_parse(ARGV[5]), final = int_parse(ARGV[6]), act_units = opt(ARGV[7]), act_cost = opt(ARGV[8]),
  released = m_parse(ARGV[9]), metric = ARGV[10]}
return res_enc(r)`
	redrawLua := preludeLua + `
local b = block_dec('x', ARGV[1])
b.rem = m_parse(ARGV[2])
return block_enc(b)`
	rng := rand.New(rand.NewPCG(10, 10))
	money := []int64{1, 999_999_999, 1_000_000_000, 123_456_789_012_345, math.MaxInt64, 9_007_199_254_740_993}
	instants := []int64{0, 1, 1_763_900_000_000, 4_102_444_800_000}
	sources := []engine.Source{engine.SourcePlanGrant, engine.SourceTopup, engine.SourcePromotional, engine.SourceCompensation,
		engine.SourceReferral, engine.SourceManual, engine.SourceMigration, "partner_credit"}
	pick := func(s []int64) int64 { return s[rng.IntN(len(s))] + rng.Int64N(1000) }
	str := func(v *int64) string {
		if v == nil {
			return ""
		}
		return dec(*v)
	}
	for i := 0; i < 300; i++ {
		created := pick(instants)
		starts := created
		if i%2 == 1 {
			starts += rng.Int64N(1e9)
		}
		var expires *int64
		if i%3 != 0 {
			e := starts + 1 + rng.Int64N(1e10)
			expires = &e
		}
		rem := min(pick(money), math.MaxInt64)
		orig := rem
		if i%4 == 3 {
			orig = min(pick(money), math.MaxInt64)
		}
		b := engine.MutationBlock{ID: uuid.New(), Remaining: rem, Original: orig, Priority: rng.IntN(100),
			CreatedMS: created, StartsMS: starts, ExpiresMS: expires, Source: sources[i%len(sources)]}
		// Every fifth block scoped to metrics (its eighth field).
		if i%5 == 2 {
			b.Scope = []string{"api.calls", "gpu:seconds"}[:1+i%2]
		}
		want, err := rdb.Eval(ctx, blockLua, nil, dec(b.Remaining), dec(b.Original), dec(int64(b.Priority)),
			dec(b.CreatedMS), dec(b.StartsMS), str(b.ExpiresMS), string(b.Source), engine.ScopeText(b.Scope)).Text()
		if err != nil {
			t.Fatal(err)
		}
		if got := blockValue(b); got != want {
			t.Fatalf("block %+v: Go %q, prelude %q", b, got, want)
		}
		if back, err := decodeBlock(engine.CompactID(b.ID), want); err != nil || !reflect.DeepEqual(back.Scope, b.Scope) {
			t.Fatalf("block %+v: decodeBlock of %q gives scope %v, %v", b, want, back.Scope, err)
		}
		// A drain writes the block back from its stored text (block_dec's
		// raw): still what Go writes for the drained block, whether the
		// drain leaves remaining at the original or not.
		for _, left := range []int64{b.Remaining, b.Original, b.Remaining / 2, 0} {
			got, err := rdb.Eval(ctx, redrawLua, nil, want, dec(left)).Text()
			if err != nil {
				t.Fatal(err)
			}
			d := b
			d.Remaining = left
			if got != blockValue(d) {
				t.Fatalf("block %+v drained to %d: prelude %q, Go %q", b, left, got, blockValue(d))
			}
		}

		status := []engine.ReservationStatus{engine.ReservationActive, engine.ReservationCommitted,
			engine.ReservationReleased, engine.ReservationExpired}[i%4]
		r := engine.MutationReservation{ID: uuid.New(), Status: status, EstimatedUnits: pick(money), EstimatedCost: pick(money),
			ExpiresMS: pick(instants), CreatedMS: pick(instants), Released: pick(money) - 1, Metric: "tokens"}
		var final *int64
		if status != engine.ReservationActive {
			f := pick(instants)
			final = &f
			if i%8 < 4 {
				au, ac := pick(money), pick(money)
				r.ActualUnits, r.ActualCost = &au, &ac
			}
		}
		want, err = rdb.Eval(ctx, reservationLua, nil, string(status), dec(r.EstimatedUnits), dec(r.EstimatedCost), dec(r.ExpiresMS),
			dec(r.CreatedMS), str(final), str(r.ActualUnits), str(r.ActualCost), dec(r.Released), r.Metric).Text()
		if err != nil {
			t.Fatal(err)
		}
		if got := reservationValue(r, final); got != want {
			t.Fatalf("reservation %+v: Go %q, prelude %q", r, got, want)
		}
	}
}

// TestLoadRefusesMalformedBatch: load.lua checks every account of a call
// before it writes, so a malformed one changes nothing for any of them.
func TestLoadRefusesMalformedBatch(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	ctx := context.Background()
	keys := []string{"{p}:rexp", "{p}:a:1", "{p}:a:2"}
	good := []any{"3", "0", "1", "0", "", "v", "3"}
	for _, tc := range []struct {
		name string
		bad  []any
	}{
		{"version not a number", []any{"x", "0", "1", "0", "", "v", "x"}},
		{"short of its fields", []any{"3", "0", "2", "0", "", "v", "3"}},
		{"expected version not a number", []any{"3", "0", "1", "0", "soon", "v", "3"}},
		{"names an op key it lacks", []any{"3", "1", "1", "0", "", "v", "3", "1000", "{}"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]any{"2"}, good...), tc.bad...)
			if err := loadScript.eval.Run(ctx, rdb, keys, args...).Err(); err == nil {
				t.Fatal("load.lua accepted a malformed account")
			}
			if n := rdb.Exists(ctx, keys[1], keys[2]).Val(); n != 0 {
				t.Fatalf("%d hashes written by a refused batch", n)
			}
		})
	}
	args := append(append([]any{"2"}, good...), "4", "0", "1", "0", "", "v", "4")
	if got, err := loadScript.eval.Run(ctx, rdb, keys, args...).Int64Slice(); err != nil || len(got) != 2 || got[0] != 1 || got[1] != 1 {
		t.Fatalf("well-formed batch: %v, %v", got, err)
	}
}

// TestLoadSameCustomerTwiceInOneCall: when one call carries two states of a
// customer, the newer one is written last, as if the two had been loaded
// one after the other, and no expiry index is written (the sweep asks
// Postgres).
func TestLoadSameCustomerTwiceInOneCall(t *testing.T) {
	ctx := context.Background()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	keys := []string{"{p}:rexp", "{p}:a:1", "{p}:a:1"}
	args := []any{"2", "3", "0", "1", "0", "", "v", "3", "4", "0", "1", "0", "", "v", "4"}
	got, err := loadScript.eval.Run(ctx, rdb, keys, args...).Int64Slice()
	if err != nil || len(got) != 2 || got[0] != 1 || got[1] != 1 {
		t.Fatalf("load: %v, %v", got, err)
	}
	if v := rdb.HGet(ctx, "{p}:a:1", "v").Val(); v != "4" {
		t.Fatalf("version %q, want 4", v)
	}
	if keys := mr.Keys(); len(keys) != 1 || keys[0] != "{p}:a:1" {
		t.Fatalf("keys after the load: %v, want only the account hash", keys)
	}
}

// TestBlockDecodesEveryEncoding: block values in the current encoding
// (original written out only while it differs from remaining, though a
// value with it written out anyway reads the same) decode alike in
// prelude/blocks.lua and in Go, and a drain writes each back as the
// current encoding. The layouts before issue 10 (an eighth field of
// metadata) are no longer read: layout_rewrite.lua rewrites them once
// (TestLayoutRewriteRoundTrip).
func TestBlockDecodesEveryEncoding(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	ctx := context.Background()
	decLua := preludeLua + `
local b = block_dec('x', ARGV[1])
local out = {m_fmt(b.rem), b.orig_s, tostring(b.prio), tostring(b.created), tostring(b.starts), tostring(b.expires), b.src, b.meta}
b.rem = m_parse(ARGV[2])
out[#out + 1] = block_enc(b)
return out`
	for _, tc := range []struct {
		name, raw         string
		orig              int64
		meta, drainedTo50 string
	}{
		{"current, untouched", "100||2|mhx2k3ab|1a|2b|g", 100, "", "50|100|2|mhx2k3ab|1a|2b|g"},
		{"current, drained", "80|100|2|mhx2k3ab|1a|2b|g", 100, "", "50|100|2|mhx2k3ab|1a|2b|g"},
		{"original written out", "100|100|2|mhx2k3ab|1a|2b|g", 100, "", "50|100|2|mhx2k3ab|1a|2b|g"},
		{"current, free-text source", "100||2|mhx2k3ab|||partner_credit", 100, "", "50|100|2|mhx2k3ab|||partner_credit"},
		{"scoped", "100||2|mhx2k3ab|||g|@api.calls,gpu", 100, "", "50|100|2|mhx2k3ab|||g|@api.calls,gpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rdb.Eval(ctx, decLua, nil, tc.raw, "50").StringSlice()
			if err != nil {
				t.Fatal(err)
			}
			b, err := decodeBlock(engine.CompactID(uuid.New()), tc.raw)
			if err != nil {
				t.Fatal(err)
			}
			exp := "nil"
			if b.ExpiresMS != nil {
				exp = dec(*b.ExpiresMS)
			}
			want := []string{dec(b.Remaining), dec(tc.orig), strconv.Itoa(b.Priority), dec(b.CreatedMS), dec(b.StartsMS), exp,
				string(b.Source), tc.meta, tc.drainedTo50}
			if b.Original != tc.orig || string(b.Metadata) != tc.meta {
				t.Errorf("Go: %+v", b)
			}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				t.Errorf("prelude %q\nwant    %q", got, want)
			}
		})
	}
}
