package lua

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// layoutState is an account of n random blocks at u: priorities and
// expiries collide often (so every spend-order key decides somewhere),
// some blocks have no expiry, some wait for a later start (stack_after),
// some hold more than 2^53 millicredits.
func layoutState(rng *rand.Rand, c engine.CustomerKey, n int, u int64) engine.AccountState {
	st := engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
		AccountID: "acct", Version: 1, UpdatedAtMS: u}
	for i := 0; i < n; i++ {
		created := u - int64(rng.IntN(3))*3_600_000
		starts := created
		if rng.IntN(5) == 0 {
			starts = u + int64(1+rng.IntN(4))*3_600_000
		}
		var exp *int64
		if rng.IntN(4) != 0 {
			e := max(starts, u) + int64(1+rng.IntN(6))*3_600_000
			exp = &e
		}
		rem := int64(1 + rng.IntN(1_000_000))
		if rng.IntN(10) == 0 {
			rem = 1<<53 + int64(rng.IntN(1000))
		}
		st.Blocks = append(st.Blocks, engine.MutationBlock{ID: uuid.New(), Remaining: rem, Original: rem,
			Priority: rng.IntN(3), CreatedMS: created, StartsMS: starts, ExpiresMS: exp, Source: engine.SourceManual})
		st.LifetimeEarned += rem
	}
	return st
}

// oldLayout strips the layout v2 fields, as a hash written before them.
func oldLayout(t *testing.T, b bundle, c engine.CustomerKey) {
	t.Helper()
	if err := b.rdb.HDel(context.Background(), b.store.accountKey(c.CustomerID), "s", "o", "k").Err(); err != nil {
		t.Fatal(err)
	}
}

// oracleDraws are the blocks a debit of amount takes at nowMS, by
// engine.SpendOrder over the live started blocks of the hash.
func oracleDraws(blocks []engine.MutationBlock, amount, nowMS int64) []string {
	var spendable []engine.MutationBlock
	for _, b := range blocks {
		if b.Live(nowMS) && b.Started(nowMS) {
			spendable = append(spendable, b)
		}
	}
	engine.SpendOrder(spendable)
	var out []string
	for _, b := range spendable {
		if amount <= 0 {
			break
		}
		take := min(b.Remaining, amount)
		amount -= take
		out = append(out, fmt.Sprintf("%s:%d", b.ID, -take))
	}
	return out
}

// TestLayoutFastEqualsSlow: one random account twice, once with the layout
// v2 fields (the fast path, and its refresh at expiries and starts) and
// once stripped of them before every step (a hash written before them: the
// slow path, which reads every block), takes the same random debits,
// consumes, grants and gauge moves at instants that step onto expiries and
// starts. Both answer the same Mutation, the Go oracle
// (engine.ComputeBalances, engine.SpendOrder) agrees with it, and after
// each step both hashes and expiry zset scores are identical.
func TestLayoutFastEqualsSlow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(9, 9))
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 7}
		for round := 0; round < 12; round++ {
			fast, slow := newCustomer(), newCustomer()
			slow.TenantID = fast.TenantID
			u := t0.UnixMilli()
			st := layoutState(rng, fast, 6+rng.IntN(20), u)
			for _, c := range []engine.CustomerKey{fast, slow} {
				st.CustomerID = c.CustomerID
				b.load(t, st)
			}
			// Instants: every expiry and start exactly, one before, and
			// random ones, in order.
			var instants []int64
			for _, bl := range st.Blocks {
				if bl.ExpiresMS != nil {
					instants = append(instants, *bl.ExpiresMS-1, *bl.ExpiresMS)
				}
				if bl.StartsMS > u {
					instants = append(instants, bl.StartsMS-1, bl.StartsMS)
				}
			}
			for i := 0; i < 10; i++ {
				instants = append(instants, u+rng.Int64N(8*3_600_000))
			}
			sort.Slice(instants, func(i, j int) bool { return instants[i] < instants[j] })
			for step, nowMS := range instants {
				now := time.UnixMilli(nowMS)
				before, err := b.store.readAccount(ctx, b.store.accountKey(slow.CustomerID))
				if err != nil {
					t.Fatal(err)
				}
				want := engine.ComputeBalances(before.blocks, before.reserved, nowMS)
				op := uuid.New()
				var wantDraws []string
				run := func(c engine.CustomerKey) (engine.MutationResult, error) {
					switch step % 4 {
					case 0:
						amount := 1 + rng.Int64N(max(want.Effective, 1)*3/2+1)
						cmd := debitCmd(c, amount, now)
						cmd.OpID = op
						if c == fast {
							wantDraws = oracleDraws(before.blocks, amount, nowMS)
						}
						return b.store.Debit(ctx, cmd)
					case 1:
						cmd := consumeCmd(c, 1+rng.Int64N(100_000), terms, engine.OveragePolicyAllow, now)
						cmd.OpID = op
						return b.store.Consume(ctx, cmd)
					case 2:
						g := grantCmd(c, 1+rng.Int64N(1_000_000), now)
						var id uuid.UUID
						for i := range id {
							id[i] = byte(rng.IntN(256))
						}
						g.OpID, g.Block.ID, g.Block.Priority = op, id, rng.IntN(3)
						if rng.IntN(2) == 0 {
							g.Block.ExpiresAt = ptr(now.Add(time.Duration(1+rng.IntN(5)) * time.Hour))
						}
						return b.store.Grant(ctx, g)
					default:
						return b.store.Gauge(ctx, engine.GaugeCommand{CommandHeader: engine.CommandHeader{OpID: op, Customer: c, Now: now}, Metric: "seats", Delta: 1, Cap: 1 << 40})
					}
				}
				// Both answer from the same random draws.
				seed := rng.Uint64()
				rng = rand.New(rand.NewPCG(seed, 1))
				fr, ferr := run(fast)
				rng = rand.New(rand.NewPCG(seed, 1))
				// The reference always reads whole: a hash written before
				// the layout fields.
				oldLayout(t, b, slow)
				sr, serr := run(slow)
				if (ferr == nil) != (serr == nil) || (ferr != nil && !errors.Is(ferr, engine.ErrInsufficientCredits) && ferr.Error() != serr.Error()) {
					t.Fatalf("round %d step %d: fast %v, slow %v", round, step, ferr, serr)
				}
				if ferr == nil {
					fm, sm := fr.Mutation, sr.Mutation
					fm.CustomerID = sm.CustomerID
					if !reflect.DeepEqual(fm, sm) {
						fj, _ := json.Marshal(fm)
						sj, _ := json.Marshal(sm)
						t.Fatalf("round %d step %d: Mutations differ\nfast %s\nslow %s", round, step, fj, sj)
					}
					if fm.EffectiveBefore == nil || *fm.EffectiveBefore != want.Effective {
						t.Fatalf("round %d step %d: effective before %v, oracle %d", round, step, fm.EffectiveBefore, want.Effective)
					}
					if wantDraws != nil {
						var got []string
						for _, e := range fm.Entries {
							if e.Role == engine.RoleMain {
								got = append(got, fmt.Sprintf("%s:%d", e.BlockID, e.Delta))
							}
						}
						if !reflect.DeepEqual(got, wantDraws) {
							t.Fatalf("round %d step %d: debit drew %v, spend order says %v", round, step, got, wantDraws)
						}
					}
					after, err := b.store.readAccount(ctx, b.store.accountKey(fast.CustomerID))
					if err != nil {
						t.Fatal(err)
					}
					ab := engine.ComputeBalances(after.blocks, after.reserved, nowMS)
					if fm.Account.Balance != ab.Balance || fm.Account.Pending != ab.Pending {
						t.Fatalf("round %d step %d: Mutation balance %d pending %d, oracle %+v", round, step,
							fm.Account.Balance, fm.Account.Pending, ab)
					}
					fh := b.rdb.HGetAll(ctx, b.store.accountKey(fast.CustomerID)).Val()
					sh := b.rdb.HGetAll(ctx, b.store.accountKey(slow.CustomerID)).Val()
					if !reflect.DeepEqual(fh, sh) {
						t.Fatalf("round %d step %d: hashes differ\nfast %v\nslow %v", round, step, fh, sh)
					}
				}
			}
		}
	})
}

// TestLayoutOldHashUpgraded: a hash without the layout v2 fields gets them
// from its first script, equal to what a rebuild writes; from then on a
// consume reads only the block it drains (a block it does not reach is
// unreadable here, which the slow path would choke on).
func TestLayoutOldHashUpgraded(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		u := t0.UnixMilli()
		st := layoutState(rand.New(rand.NewPCG(3, 3)), c, 12, u)
		for i := range st.Blocks {
			st.Blocks[i].StartsMS, st.Blocks[i].ExpiresMS = st.Blocks[i].CreatedMS, nil
		}
		b.load(t, st)
		key := b.store.accountKey(c.CustomerID)
		rebuilt := b.rdb.HMGet(ctx, key, "s", "o", "k").Val()
		oldLayout(t, b, c)
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 1}
		consume := func() engine.Mutation {
			t.Helper()
			cmd := consumeCmd(c, 1, terms, engine.OveragePolicyBlock, t0)
			res, err := b.store.Consume(ctx, cmd)
			if err != nil {
				t.Fatalf("consume: %v", err)
			}
			return res.Mutation
		}
		m := consume()
		got := b.rdb.HMGet(ctx, key, "s", "o", "k").Val()
		if got[0] == nil || got[1] == nil || got[2] == nil {
			t.Fatalf("layout fields after the first script: %v", got)
		}
		// The consume took 1 from the first block: the index is the
		// rebuilt one, the summary one less.
		if got[1] != rebuilt[1] || got[2] != rebuilt[2] {
			t.Fatalf("upgraded index/kept %q %q, rebuild writes %q %q", got[1], got[2], rebuilt[1], rebuilt[2])
		}
		if m.Account.Balance != st.LifetimeEarned-1 {
			t.Fatalf("balance %d, want %d", m.Account.Balance, st.LifetimeEarned-1)
		}
		order := append([]engine.MutationBlock(nil), st.Blocks...)
		engine.SpendOrder(order)
		for _, bl := range order[1:] {
			if err := b.rdb.HSet(ctx, key, "b:"+bl.ID.String(), "unreadable").Err(); err != nil {
				t.Fatal(err)
			}
		}
		m = consume()
		if len(m.Blocks) != 1 || m.Blocks[0].ID != order[0].ID || m.Account.Balance != st.LifetimeEarned-2 {
			t.Fatalf("fast consume: blocks %+v balance %d", m.Blocks, m.Account.Balance)
		}
	})
}

// TestLayoutValidUntilBoundary: a block expiring and a block starting
// exactly at now are seen as the slow path sees them (expired; spendable),
// one millisecond before as not yet, and the summary never carries a
// figure past either instant.
func TestLayoutValidUntilBoundary(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		u := t0.UnixMilli()
		st := layoutState(rand.New(rand.NewPCG(5, 5)), c, 10, u)
		for i := range st.Blocks {
			st.Blocks[i].StartsMS, st.Blocks[i].ExpiresMS = st.Blocks[i].CreatedMS, nil
			st.Blocks[i].Priority = 5
		}
		exp, start := u+3_600_000, u+7_200_000
		// Spent first (priority 0) and expiring at exp; then one waiting
		// for start, spent first once started.
		st.Blocks[0].Priority, st.Blocks[0].ExpiresMS = 0, &exp
		st.Blocks[1].Priority, st.Blocks[1].StartsMS = 0, start
		b.load(t, st)
		total := st.LifetimeEarned
		rest := append([]engine.MutationBlock(nil), st.Blocks[2:]...)
		engine.SpendOrder(rest)
		r0, r1 := st.Blocks[0].Remaining, st.Blocks[1].Remaining
		for _, tc := range []struct {
			at              int64
			balance, pend   int64
			drawn, expiries int
			first           uuid.UUID
		}{
			{exp - 1, total - 1, r1, 1, 0, st.Blocks[0].ID},
			{exp, total - r0 - 1, r1, 1, 1, rest[0].ID},
			{start - 1, total - r0 - 2, r1, 1, 0, uuid.Nil},
			{start, total - r0 - 3, 0, 1, 0, st.Blocks[1].ID},
		} {
			cmd := debitCmd(c, 1, time.UnixMilli(tc.at))
			res, err := b.store.Debit(ctx, cmd)
			if err != nil {
				t.Fatalf("at %d: %v", tc.at, err)
			}
			m := res.Mutation
			var expiries, drawn int
			var first uuid.UUID
			for _, e := range m.Entries {
				if e.Type == engine.EntryExpiry {
					expiries++
				} else {
					drawn++
					first = *e.BlockID
				}
			}
			if m.Account.Balance != tc.balance || m.Account.Pending != tc.pend || drawn != tc.drawn || expiries != tc.expiries ||
				(tc.first != uuid.Nil && first != tc.first) {
				t.Fatalf("at %d: balance %d pending %d drawn %d expiries %d first %s; want %+v", tc.at, m.Account.Balance,
					m.Account.Pending, drawn, expiries, first, tc)
			}
		}
	})
}

// TestLayoutBalancesFromSummary: a check of a big account reads the
// summary alone once it has seen one (a block it cannot parse is never
// read), with the figures the blocks give at every instant around the
// expiries and starts, and falls back to the whole hash outside the
// summary's window or once the summary is gone.
func TestLayoutBalancesFromSummary(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		u := t0.UnixMilli()
		st := layoutState(rand.New(rand.NewPCG(7, 7)), c, 14, u)
		st.Reserved = 5
		b.load(t, st)
		key := b.store.accountKey(c.CustomerID)
		want := func(nowMS int64) engine.Balances {
			a, err := b.store.readAccount(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			return engine.ComputeBalances(a.blocks, a.reserved, nowMS)
		}
		instants := []int64{u, u + 1}
		for _, bl := range st.Blocks {
			if bl.ExpiresMS != nil {
				instants = append(instants, *bl.ExpiresMS-1, *bl.ExpiresMS)
			}
			if bl.StartsMS > u {
				instants = append(instants, bl.StartsMS-1, bl.StartsMS)
			}
		}
		for _, at := range instants {
			for i := 0; i < 2; i++ {
				got, err := b.store.Balances(ctx, c, time.UnixMilli(at))
				if err != nil {
					t.Fatal(err)
				}
				if w := want(at); got != w {
					t.Fatalf("at %d (read %d): %+v, blocks say %+v", at, i, got, w)
				}
			}
		}
		if !b.store.layouts.has(key) {
			t.Fatal("the account's summary was not remembered")
		}
		w := want(u)
		if err := b.rdb.HSet(ctx, key, "b:"+st.Blocks[0].ID.String(), "unreadable").Err(); err != nil {
			t.Fatal(err)
		}
		if got, err := b.store.Balances(ctx, c, t0); err != nil || got != w {
			t.Fatalf("from the summary: %+v %v, want %+v", got, err, w)
		}
		oldLayout(t, b, c)
		if _, err := b.store.Balances(ctx, c, t0); err == nil {
			t.Fatal("without a summary the check read the summary")
		}
		if b.store.layouts.has(key) {
			t.Fatal("an account without a summary is still remembered")
		}
	})
}
