package lua

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// scopedGrant is a grant of amount at priority prio, scoped to keys (none:
// every metric), started a minute before t0.
func scopedGrant(c engine.CustomerKey, amount int64, prio int, keys ...string) engine.GrantCommand {
	g := grantCmd(c, amount, t0.Add(-time.Minute))
	g.Block.Priority = prio
	if len(keys) > 0 {
		g.Block.AppliesTo = &engine.AppliesTo{BillableMetricKeys: keys}
	}
	return g
}

// metricConsume is a block consume of units of metric at 1 mc each.
func metricConsume(c engine.CustomerKey, metric string, units int64) engine.ConsumeCommand {
	cmd := consumeCmd(c, units, perUnitTerms(1), engine.OveragePolicyBlock, t0)
	cmd.Metric = metric
	return cmd
}

// remainingByScope sums the snapshot's remaining credit by scope text.
func remainingByScope(a engine.Account) map[string]int64 {
	out := map[string]int64{}
	for _, b := range a.Blocks {
		k := ""
		if b.AppliesTo != nil {
			k = strings.Join(b.AppliesTo.BillableMetricKeys, ",")
		}
		out[k] += b.RemainingAmount
	}
	return out
}

// TestScopedConsume: a consume of metric M drains, in spend order, only the
// blocks scoped to M and the unscoped ones, and is refused past them
// whatever the other scopes hold; the scope survives the drain, the
// Mutation of the grant names it and the snapshot reports it.
func TestScopedConsume(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		metric   string
		units    int64
		refused  bool
		wantLeft map[string]int64
	}{
		{"scoped first by priority", "a", 30, false, map[string]int64{"a": 10, "b": 50, "": 20}},
		{"scoped then unscoped", "a", 55, false, map[string]int64{"a": 0, "b": 50, "": 5}},
		{"all a may use", "a", 60, false, map[string]int64{"a": 0, "b": 50, "": 0}},
		{"past what a may use", "a", 61, true, map[string]int64{"a": 40, "b": 50, "": 20}},
		{"another metric only unscoped", "c", 20, false, map[string]int64{"a": 40, "b": 50, "": 0}},
		{"another metric refused", "c", 21, true, map[string]int64{"a": 40, "b": 50, "": 20}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, b bundle) {
				c := newCustomer()
				b.known(t, c)
				g := b.grant(t, scopedGrant(c, 40, 0, "a"))
				if len(g.Blocks) != 1 || !reflect.DeepEqual(g.Blocks[0].Scope, []string{"a"}) {
					t.Fatalf("grant Mutation blocks %+v, want scope [a]", g.Blocks)
				}
				b.grant(t, scopedGrant(c, 50, 0, "b"))
				b.grant(t, scopedGrant(c, 20, 1))
				res, err := b.store.Consume(context.Background(), metricConsume(c, tt.metric, tt.units))
				if refused := errors.Is(err, engine.ErrInsufficientCredits); refused != tt.refused || (err != nil && !refused) {
					t.Fatalf("consume: %v, want refused %v", err, tt.refused)
				}
				if err == nil {
					for _, mb := range res.Mutation.Blocks {
						if len(mb.Scope) != 0 {
							t.Fatalf("a drain's Mutation names the scope: %+v", mb)
						}
					}
				}
				got := remainingByScope(b.snapshot(t, c, t0))
				for k, v := range tt.wantLeft {
					if got[k] != v {
						t.Fatalf("left %v, want %v", got, tt.wantLeft)
					}
				}
			})
		})
	}
}

// TestScopedReservationsStayBacked: a reservation for metric b backed by b's scoped block
// and the unscoped one keeps them: a consume of a may not take the
// unscoped credit the reservation needs, the commit then settles from them, and
// a multi-metric reservation needs unscoped credit.
func TestScopedReservationsStayBacked(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		b.grant(t, scopedGrant(c, 50, 0, "a"))
		b.grant(t, scopedGrant(c, 30, 0, "b"))
		b.grant(t, scopedGrant(c, 40, 1))
		// b may use 70: a reservation of 60 fits, one of 71 does not.
		big := reserveCmd(c, 71, perUnitTerms(1), time.Hour, t0)
		big.Metric = "b"
		if _, err := b.store.Reserve(ctx, big); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("reserve 71 of b: %v", err)
		}
		reservation := reserveCmd(c, 60, perUnitTerms(1), time.Hour, t0)
		reservation.Metric = "b"
		b.reserve(t, reservation)
		// E(b) = 70 >= 60 must stay: a may take its 50 and 10 unscoped.
		if _, err := b.store.Consume(ctx, metricConsume(c, "a", 61)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("consume 61 of a: %v", err)
		}
		if _, err := b.store.Consume(ctx, metricConsume(c, "a", 60)); err != nil {
			t.Fatalf("consume 60 of a: %v", err)
		}
		// Another reservation of b has nothing left.
		more := reserveCmd(c, 1, perUnitTerms(1), time.Hour, t0)
		more.Metric = "b"
		if _, err := b.store.Reserve(ctx, more); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("reserve 1 more of b: %v", err)
		}
		// A multi-metric reservation is backed by unscoped credit only (30 left,
		// all held): refused.
		multi := engine.ReserveCommand{CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: t0},
			ReservationID: uuid.New(), ExpiresAt: t0.Add(time.Hour),
			Items: []engine.ReserveLine{{Metric: "b", EstimatedUnits: 1, Terms: perUnitTerms(1)}}}
		if _, err := b.store.Reserve(ctx, multi); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("multi-metric reserve: %v", err)
		}
		res, err := b.store.Commit(ctx, commitCmd(c, reservation.ReservationID, 60, perUnitTerms(1), t0))
		if err != nil {
			t.Fatalf("commit: %v", err)
		}
		if res.Mutation.Account.Balance != 0 || res.Mutation.Account.Reserved != 0 {
			t.Fatalf("after the commit %+v, want all spent", res.Mutation.Account)
		}
	})
}

// TestScopedMultiConsume: each item of a multi-metric consume drains the
// blocks that apply to its metric; one item past them refuses the whole
// call and changes nothing.
func TestScopedMultiConsume(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		b.grant(t, scopedGrant(c, 30, 0, "a"))
		b.grant(t, scopedGrant(c, 30, 0, "b"))
		b.grant(t, scopedGrant(c, 10, 1))
		multi := func(ua, ub int64) engine.ConsumeCommand {
			cmd := consumeCmd(c, 1, perUnitTerms(1), engine.OveragePolicyBlock, t0)
			cmd.Items = []engine.ConsumeLine{{Metric: "a", Units: ua, Terms: perUnitTerms(1)},
				{Metric: "b", Units: ub, Terms: perUnitTerms(1)}}
			return cmd
		}
		// a 35 takes a's 30 and 5 unscoped; b 40 would need 10 unscoped.
		if _, err := b.store.Consume(ctx, multi(35, 40)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("multi consume 35+40: %v", err)
		}
		if got := remainingByScope(b.snapshot(t, c, t0)); got["a"] != 30 || got["b"] != 30 || got[""] != 10 {
			t.Fatalf("a refusal changed the blocks: %v", got)
		}
		res, err := b.store.Consume(ctx, multi(35, 35))
		if err != nil {
			t.Fatalf("multi consume 35+35: %v", err)
		}
		if got := remainingByScope(b.snapshot(t, c, t0)); got["a"] != 0 || got["b"] != 0 || got[""] != 0 {
			t.Fatalf("after 35+35: %v", got)
		}
		e := res.Mutation.Entries[len(res.Mutation.Entries)-1]
		if _, draws := e.PaidBy(); len(draws) != 3 || e.Delta != -70 {
			t.Fatalf("entry %+v: want one draw per block and -70", e)
		}
	})
}

// TestScopedRebuildAndBigAccount: a hash of more than LAYOUT_MIN_ITEMS
// blocks with scoped ones takes the slow path ("sc"), and a rebuild of the
// snapshot's blocks writes the hash the scripts wrote.
func TestScopedRebuildAndBigAccount(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		for i := range 10 {
			g := scopedGrant(c, 10, i%3)
			if i%2 == 0 {
				g = scopedGrant(c, 10, i%3, "a", "z")
			}
			b.grant(t, g)
		}
		// b may use the five unscoped blocks only.
		if _, err := b.store.Consume(ctx, metricConsume(c, "b", 51)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("consume 51 of b: %v", err)
		}
		if _, err := b.store.Consume(ctx, metricConsume(c, "b", 45)); err != nil {
			t.Fatal(err)
		}
		acct := b.snapshot(t, c, t0)
		if got := remainingByScope(acct); got["a,z"] != 50 || got[""] != 5 {
			t.Fatalf("left %v", got)
		}
		before, scBefore := b.dump(t, c), b.hasSC(t, c)
		blocks := make([]engine.MutationBlock, 0, len(acct.Blocks))
		for _, bl := range acct.Blocks {
			mb := engine.MutationBlock{ID: bl.ID, Original: bl.OriginalAmount, Remaining: bl.RemainingAmount,
				Priority: bl.Priority, Source: bl.Source, StartsMS: bl.StartsAt.UnixMilli(), CreatedMS: bl.CreatedAt.UnixMilli()}
			if bl.AppliesTo != nil {
				mb.Scope = bl.AppliesTo.BillableMetricKeys
			}
			blocks = append(blocks, mb)
		}
		b.load(t, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
			AccountID: acct.ID, Version: acct.Version + 1, LifetimeEarned: acct.LifetimeEarned, Blocks: blocks,
			UpdatedAtMS: t0.UnixMilli()})
		if got := remainingByScope(b.snapshot(t, c, t0)); got["a,z"] != 50 || got[""] != 5 {
			t.Fatalf("after the rebuild %v", got)
		}
		if !scBefore || !b.hasSC(t, c) {
			t.Fatalf("no sc field:\n%s", before)
		}
		if _, err := b.store.Consume(ctx, metricConsume(c, "z", 55)); err != nil {
			t.Fatalf("consume 55 of z after the rebuild: %v", err)
		}
		if _, err := b.store.Consume(ctx, metricConsume(c, "b", 1)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("consume 1 of b: %v", err)
		}
	})
}

// scopeFreeProbe runs prelude/scopes.lua's scope_free and scope_room on blocks
// given as ARGV triples (remaining, priority, scope "" or "k1,k2"), the
// reservations as "metric,held" pairs (ARGV[1], space separated), freed and skip
// (ARGV[2], ARGV[3]) for the charge's metric ARGV[4]; the blocks from
// ARGV[5]. It answers {free, room}.
var scopeFreeProbe = withPrelude(`
local a = {blocks = {}, res = {}, rs = MONEY_ZERO}
local n = 0
for m, held in string.gmatch(ARGV[1], '([^ ,]*),(%d+)') do
  n = n + 1
  a.res['h' .. n] = 'a|1|' .. held .. '|zz|0||||0|' .. m .. '|'
  a.rs = m_add(a.rs, m_parse(held))
end
for i = 5, #ARGV, 3 do
  local b = {id = string.format('b%03d', i), rem = m_parse(ARGV[i]), prio = tonumber(ARGV[i + 1]), created = i,
    starts = 0, expires = nil}
  if ARGV[i + 2] ~= '' then b.scope = ',' .. ARGV[i + 2] .. ',' end
  a.blocks[#a.blocks + 1] = b
end
local skip = ARGV[3]
if skip == '' then skip = nil end
return {m_fmt(scope_free(a, 1, ARGV[4], m_parse(ARGV[2]), skip)), m_fmt(scope_room(a, 1, ARGV[4]))}
`)

// TestScopeFreeAgrees holds scope_free and scope_room to engine.ScopeFree
// and engine.ScopeRoom (rules are pure Go, Lua agrees) on random accounts.
func TestScopeFreeAgrees(t *testing.T) {
	t.Parallel()
	scopes := []string{"", "", "a", "b", "a,b", "c"}
	metrics := []string{"a", "b", "c", "d", ""}
	eachBackend(t, func(t *testing.T, bd bundle) {
		// One generator per backend (they run in parallel), seeded alike so
		// both see the same accounts.
		r := rand.New(rand.NewPCG(7, 8))
		ctx := context.Background()
		for i := range 150 {
			var blocks []engine.MutationBlock
			args := []any{}
			nb := r.IntN(6)
			for j := range nb {
				rem, prio, sc := r.Int64N(100)+1, r.IntN(3), scopes[r.IntN(len(scopes))]
				id := uuid.UUID{}
				copy(id[:], fmt.Sprintf("b%03d", 5+3*j))
				mb := engine.MutationBlock{ID: id, Remaining: rem, Original: rem, Priority: prio, CreatedMS: int64(5 + 3*j)}
				if sc != "" {
					mb.Scope = strings.Split(sc, ",")
				}
				blocks = append(blocks, mb)
				args = append(args, strconv.FormatInt(rem, 10), strconv.Itoa(prio), sc)
			}
			var reservations []string
			var hm []string
			seen := map[string]bool{}
			var reserved int64
			for range r.IntN(3) {
				m, held := metrics[r.IntN(len(metrics))], r.Int64N(80)
				reservations = append(reservations, m+","+strconv.FormatInt(held, 10))
				reserved += held
				if !seen[m] {
					seen[m] = true
					hm = append(hm, m)
				}
			}
			freed := int64(0)
			if reserved > 0 {
				freed = r.Int64N(reserved + 1)
			}
			metric := metrics[r.IntN(len(metrics)-1)]
			argv := append([]any{strings.Join(reservations, " "), strconv.FormatInt(freed, 10), "", metric}, args...)
			got, err := scopeFreeProbe.Run(ctx, bd.rdb, []string{"{x}"}, argv...).StringSlice()
			if err != nil {
				t.Fatalf("case %d: %v", i, err)
			}
			want := []string{strconv.FormatInt(engine.ScopeFree(blocks, hm, reserved, freed, metric, 1), 10),
				strconv.FormatInt(engine.ScopeRoom(blocks, hm, reserved, metric, 1), 10)}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("case %d (holds %v freed %d metric %q blocks %v): script %v, Go %v", i, reservations, freed, metric, args, got, want)
			}
		}
	})
}

// TestScopedGrantToBigAccount: a scoped grant to an account on the
// summary's fast path marks the hash ("sc"), so the next charge reads every
// block and leaves the scoped credit to its metric.
func TestScopedGrantToBigAccount(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		for range 8 {
			b.grant(t, scopedGrant(c, 100, 1))
		}
		if b.hasSC(t, c) {
			t.Fatal("an unscoped account is marked sc")
		}
		b.grant(t, scopedGrant(c, 1000, 0, "a"))
		if !b.hasSC(t, c) {
			t.Fatal("no sc after a scoped grant")
		}
		if _, err := b.store.Consume(ctx, metricConsume(c, "b", 801)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("consume 801 of b: %v", err)
		}
		if _, err := b.store.Consume(ctx, metricConsume(c, "b", 800)); err != nil {
			t.Fatal(err)
		}
		if got := remainingByScope(b.snapshot(t, c, t0)); got["a"] != 1000 || got[""] != 0 {
			t.Fatalf("left %v", got)
		}
		// The last scoped credit spent: the mark goes with it.
		if _, err := b.store.Consume(ctx, metricConsume(c, "a", 1000)); err != nil {
			t.Fatal(err)
		}
		if b.hasSC(t, c) {
			t.Fatal("sc stays after the last scoped block")
		}
	})
}

// hasSC reports whether the customer's hash holds field "sc".
func (b bundle) hasSC(t *testing.T, c engine.CustomerKey) bool {
	t.Helper()
	ok, err := b.rdb.HExists(context.Background(), b.store.accountKey(c.CustomerID), "sc").Result()
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestScopedDebit: a negative adjustment takes the credit every metric may
// use before scoped credit, and is refused when it would leave an active
// reservation without credit that applies to it.
func TestScopedDebit(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		b.grant(t, scopedGrant(c, 100, 0, "a"))
		b.grant(t, scopedGrant(c, 100, 1))
		if _, err := b.store.Debit(ctx, debitCmd(c, 150, t0)); err != nil {
			t.Fatal(err)
		}
		if got := remainingByScope(b.snapshot(t, c, t0)); got["a"] != 50 || got[""] != 0 {
			t.Fatalf("after a debit of 150: %v, want the unscoped 100 taken first", got)
		}
		b.grant(t, scopedGrant(c, 100, 1))
		reservation := reserveCmd(c, 60, perUnitTerms(1), time.Hour, t0)
		reservation.Metric = "a"
		b.reserve(t, reservation)
		// Unscoped credit goes first: 60 leaves a its 50 and 40 unscoped,
		// still the 60 its reservation needs.
		if _, err := b.store.Debit(ctx, debitCmd(c, 60, t0)); err != nil {
			t.Fatalf("debit of 60 beside the reservation: %v", err)
		}
		// Credit for b only raises the effective balance to 130; 31 more
		// would still leave a 59 < 60.
		b.grant(t, scopedGrant(c, 100, 0, "b"))
		if _, err := b.store.Debit(ctx, debitCmd(c, 31, t0)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("debit of 31 beside the reservation: %v", err)
		}
		if _, err := b.store.Debit(ctx, debitCmd(c, 30, t0)); err != nil {
			t.Fatalf("debit of 30 beside the reservation: %v", err)
		}
		if got := remainingByScope(b.snapshot(t, c, t0)); got["a"] != 50 || got[""] != 10 || got["b"] != 100 {
			t.Fatalf("after the debits: %v, want a 50, unscoped 10, b 100", got)
		}
	})
}

// TestScopedRolloverStackExpiry: a rollover's carry keeps the scope of the
// blocks it carries, a stack_after block keeps its scope until and after it
// starts, and an expired scoped block leaves with its scope (the expiry
// entry names it; no other metric gained its credit).
func TestScopedRolloverStackExpiry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		g := scopedGrant(c, 1000, 0, "a")
		b.grant(t, g)
		exp := t0.Add(time.Hour)
		roll := engine.RolloverCommand{OpID: uuid.New(), Customer: c, IdempotencyKey: "sroll-1", Now: t0,
			Blocks: []uuid.UUID{g.Block.ID}, Percentage: 50,
			Block:     engine.Block{ID: uuid.New(), Source: engine.SourcePlanGrant, ExpiresAt: &exp},
			EntryType: engine.EntryPlanGrant}
		res, err := b.store.Rollover(ctx, roll)
		if err != nil {
			t.Fatal(err)
		}
		var carried bool
		for _, mb := range res.Mutation.Blocks {
			if mb.ID == roll.Block.ID {
				carried = reflect.DeepEqual(mb.Scope, []string{"a"}) && mb.Remaining == 500
			}
		}
		if !carried {
			t.Fatalf("rollover blocks %+v: want the carry of 500 scoped to a", res.Mutation.Blocks)
		}
		if got := remainingByScope(b.snapshot(t, c, t0)); got["a"] != 500 || len(got) != 1 {
			t.Fatalf("after the rollover: %v", got)
		}
		// stack_after: starts when the carry expires, scoped to b.
		st := scopedGrant(c, 300, 0, "b")
		st.Now, st.DurationSeconds = t0, 3600
		st.StackAfter = &engine.StackAfter{MetadataMatch: engine.Metadata{}, Fallback: engine.FallbackNow}
		b.grant(t, st)
		later := t0.Add(90 * time.Minute)
		acct := b.snapshot(t, c, later)
		if got := remainingByScope(acct); got["b"] != 300 || got["a"] != 0 {
			t.Fatalf("after the carry expired: %v, want b's 300 started", got)
		}
		cons := metricConsume(c, "a", 1)
		cons.Now = later
		if _, err := b.store.Consume(ctx, cons); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("a after its credit expired: %v", err)
		}
		cons = metricConsume(c, "b", 300)
		cons.Now = later
		if _, err := b.store.Consume(ctx, cons); err != nil {
			t.Fatalf("b's stacked credit: %v", err)
		}
	})
}

// TestScopedFastPath: a big scoped hash without reservations runs consume.lua on
// the summary's fast path, skipping blocks of other scopes; field "sc"
// counts the scoped blocks exactly through drains that empty one and a
// grant that adds one, as a rebuild of the same blocks writes it.
func TestScopedFastPath(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		for range 10 {
			b.grant(t, scopedGrant(c, 100, 1))
		}
		b.grant(t, scopedGrant(c, 50, 0, "a"))
		b.grant(t, scopedGrant(c, 70, 0, "z"))
		sc := func() string {
			t.Helper()
			v, _ := b.rdb.HGet(ctx, b.store.accountKey(c.CustomerID), "sc").Result()
			return v
		}
		if got := sc(); got != "2" {
			t.Fatalf("sc = %q, want 2", got)
		}
		// z's block spends first for z, a's is skipped for z.
		res, err := b.store.Consume(ctx, metricConsume(c, "z", 120))
		if err != nil {
			t.Fatal(err)
		}
		e := res.Mutation.Entries[len(res.Mutation.Entries)-1]
		if _, draws := e.PaidBy(); len(draws) != 2 || draws[0].Amount != 70 || draws[1].Amount != 50 {
			t.Fatalf("entry %+v: want 70 from z's block, then 50 unscoped", e)
		}
		if got := sc(); got != "1" {
			t.Fatalf("sc = %q after z's block emptied, want 1", got)
		}
		if got := remainingByScope(b.snapshot(t, c, t0)); got["a"] != 50 || got["z"] != 0 || got[""] != 950 {
			t.Fatalf("left %v", got)
		}
		// b may not use a's 50: refused one past the unscoped 950.
		if _, err := b.store.Consume(ctx, metricConsume(c, "b", 951)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("consume 951 of b: %v", err)
		}
		if _, err := b.store.Consume(ctx, metricConsume(c, "a", 50)); err != nil {
			t.Fatal(err)
		}
		if got := sc(); got != "" {
			t.Fatalf("sc = %q after the last scoped block, want none", got)
		}
		b.grant(t, scopedGrant(c, 5, 0, "q"))
		if got := sc(); got != "1" {
			t.Fatalf("sc = %q after a scoped grant, want 1", got)
		}
	})
}

// TestScopedLayoutFastEqualsSlow: one random account with scoped blocks
// twice, once on the summary's fast path (scope_fast) and once stripped of
// the layout fields before every step (the slow path, scope_split), takes
// the same random consumes of three metrics under block and allow and
// scoped or plain grants at instants stepping onto expiries and starts:
// both answer the same Mutation (or both refuse), and after each step both
// hashes are identical, "sc" included.
func TestScopedLayoutFastEqualsSlow(t *testing.T) {
	t.Parallel()
	scopes := [][]string{nil, nil, {"a"}, {"b"}, {"a", "b"}}
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(11, 12))
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 7}
		for round := 0; round < 8; round++ {
			fast, slow := newCustomer(), newCustomer()
			slow.TenantID = fast.TenantID
			u := t0.UnixMilli()
			st := layoutState(rng, fast, 8+rng.IntN(16), u)
			for i := range st.Blocks {
				st.Blocks[i].Scope = scopes[rng.IntN(len(scopes))]
			}
			for _, c := range []engine.CustomerKey{fast, slow} {
				st.CustomerID = c.CustomerID
				b.load(t, st)
			}
			var instants []int64
			for _, bl := range st.Blocks {
				if bl.ExpiresMS != nil {
					instants = append(instants, *bl.ExpiresMS-1, *bl.ExpiresMS)
				}
			}
			for i := 0; i < 12; i++ {
				instants = append(instants, u+rng.Int64N(8*3_600_000))
			}
			slices.Sort(instants)
			for step, nowMS := range instants {
				now := time.UnixMilli(nowMS)
				op := uuid.New()
				run := func(c engine.CustomerKey) (engine.MutationResult, error) {
					if step%3 == 2 {
						g := grantCmd(c, 1+rng.Int64N(1_000_000), now)
						var id uuid.UUID
						for i := range id {
							id[i] = byte(rng.IntN(256))
						}
						g.OpID, g.Block.ID, g.Block.Priority = op, id, rng.IntN(3)
						if s := scopes[rng.IntN(len(scopes))]; s != nil {
							g.Block.AppliesTo = &engine.AppliesTo{BillableMetricKeys: s}
						}
						return b.store.Grant(ctx, g)
					}
					policy := []engine.OveragePolicy{engine.OveragePolicyBlock, engine.OveragePolicyAllow}[rng.IntN(2)]
					cmd := consumeCmd(c, 1+rng.Int64N(150_000), terms, policy, now)
					cmd.OpID, cmd.Metric = op, []string{"a", "b", "c"}[rng.IntN(3)]
					return b.store.Consume(ctx, cmd)
				}
				seed := rng.Uint64()
				rng = rand.New(rand.NewPCG(seed, 1))
				fr, ferr := run(fast)
				rng = rand.New(rand.NewPCG(seed, 1))
				oldLayout(t, b, slow)
				sr, serr := run(slow)
				if (ferr == nil) != (serr == nil) || (ferr != nil && ferr.Error() != serr.Error()) {
					t.Fatalf("round %d step %d: fast %v, slow %v", round, step, ferr, serr)
				}
				if ferr != nil {
					continue
				}
				fm, sm := fr.Mutation, sr.Mutation
				fm.CustomerID = sm.CustomerID
				if !reflect.DeepEqual(fm, sm) {
					fj, _ := json.Marshal(fm)
					sj, _ := json.Marshal(sm)
					t.Fatalf("round %d step %d: Mutations differ\nfast %s\nslow %s", round, step, fj, sj)
				}
				fh := b.rdb.HGetAll(ctx, b.store.accountKey(fast.CustomerID)).Val()
				sh := b.rdb.HGetAll(ctx, b.store.accountKey(slow.CustomerID)).Val()
				if !reflect.DeepEqual(fh, sh) {
					t.Fatalf("round %d step %d: hashes differ\nfast %v\nslow %v", round, step, fh, sh)
				}
			}
		}
	})
}

// TestScopedSnapshotReservationMetrics: a snapshot of a scoped hash names the
// metrics of its active reservations (what engine.MetricAvailable needs), read
// whole or in slices, and Balances says the hash is scoped; an unscoped
// hash names none.
func TestScopedSnapshotReservationMetrics(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		for range 9 {
			b.grant(t, scopedGrant(c, 100, 1))
		}
		plain := b.snapshot(t, c, t0)
		if plain.ReservationMetrics != nil {
			t.Fatalf("unscoped hash: reservation metrics %v", plain.ReservationMetrics)
		}
		b.grant(t, scopedGrant(c, 100, 0, "a"))
		for _, m := range []string{"z", "a", "z"} {
			h := reserveCmd(c, 10, perUnitTerms(1), time.Hour, t0)
			h.Metric = m
			b.reserve(t, h)
		}
		for range 2 { // whole, then in slices (the store learnt the layout)
			acct := b.snapshot(t, c, t0)
			if !reflect.DeepEqual(acct.ReservationMetrics, []string{"a", "z"}) {
				t.Fatalf("reservation metrics %v, want [a z]", acct.ReservationMetrics)
			}
			if got := engine.MetricAvailable(acct, 0, engine.OveragePolicyBlock, "q", t0.UnixMilli()); got != 870 {
				t.Fatalf("available for q %d, want 870 (900 unscoped less the 30 held)", got)
			}
		}
		bal, err := b.store.Balances(ctx, c, t0)
		if err != nil || !bal.Scoped {
			t.Fatalf("balances %+v %v: want Scoped", bal, err)
		}
	})
}
