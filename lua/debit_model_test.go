package lua

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// randomBlocks draws a block set full of ties: few priorities, shared
// expiries (some due, one exactly at now), shared created times, blocks that
// start later, and sometimes amounts far past 2^53.
func randomBlocks(r *rand.Rand, nowMS int64) []engine.MutationBlock {
	n := 1 + r.IntN(8)
	out := make([]engine.MutationBlock, n)
	for i := range out {
		created := nowMS - int64(r.IntN(3))*60_000
		b := engine.MutationBlock{
			ID: uuid.New(), Priority: r.IntN(3), Source: engine.SourceManual,
			CreatedMS: created, StartsMS: created,
		}
		if r.IntN(4) == 0 {
			b.StartsMS = nowMS + int64(1+r.IntN(2))*60_000
		}
		switch r.IntN(3) {
		case 0: // no expiry
		case 1:
			e := b.StartsMS + int64(r.IntN(3)-1)*60_000 + 60_000
			b.ExpiresMS = &e
		default:
			e := nowMS + int64(r.IntN(3)-1)*60_000 // due, exactly now, or later
			b.ExpiresMS = &e
		}
		b.Original = 1 + int64(r.IntN(1000))
		if r.IntN(10) == 0 {
			b.Original = 1<<55 + int64(r.IntN(1000))
		}
		b.Remaining = 1 + r.Int64N(b.Original)
		out[i] = b
	}
	return out
}

// TestDebitMatchesPlanDebit: debit.lua and engine.PlanDebit (the pure rule)
// agree on random block sets: the same refusals and, block by block, the
// same draws in the same order.
func TestDebitMatchesPlanDebit(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		r := rand.New(rand.NewPCG(7, uint64(len(t.Name()))))
		nowMS := t0.UnixMilli()
		for i := range 300 {
			c := newCustomer()
			blocks := randomBlocks(r, nowMS)
			reserved := int64(0)
			if r.IntN(3) == 0 {
				reserved = int64(r.IntN(500))
			}
			bal := engine.ComputeBalances(blocks, reserved, nowMS)
			amount := 1 + r.Int64N(max(bal.Effective, 1)+50)
			if _, err := b.store.LoadAt(ctx, engine.AccountState{
				TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
				AccountID: "a", Version: 1, Reserved: reserved, Blocks: blocks,
			}, t0); err != nil {
				t.Fatal(err)
			}
			draws, ok := engine.PlanDebit(blocks, reserved, amount, nowMS)
			res, err := b.store.Debit(ctx, debitCmd(c, amount, t0))
			if !ok {
				if !errors.Is(err, engine.ErrInsufficientCredits) {
					t.Fatalf("case %d: PlanDebit refuses %d of %+v, debit.lua says %v", i, amount, bal, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("case %d: debit.lua: %v", i, err)
			}
			var want, got []string
			for _, d := range draws {
				want = append(want, fmt.Sprintf("%s:%d", d.Block.ID, d.Amount))
			}
			for _, e := range res.Mutation.Entries {
				if e.Role == engine.RoleMain {
					got = append(got, fmt.Sprintf("%s:%d", *e.BlockID, -e.Delta))
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("case %d: amount %d\nlua  %v\nplan %v\nblocks %+v", i, amount, got, want, blocks)
			}
			after := engine.ComputeBalances(blocks, reserved, nowMS)
			if res.Mutation.Account.Balance != after.Balance-amount {
				t.Fatalf("case %d: balance %d, want %d", i, res.Mutation.Account.Balance, after.Balance-amount)
			}
		}
	})
}

// TestConcurrentDebitsNoDoubleSpend: 50 goroutines each debit 1 against K
// credits on real Redis: exactly K succeed, the rest are refused, and the
// balance ends at exactly 0 (invariant 2).
func TestConcurrentDebitsNoDoubleSpend(t *testing.T) {
	t.Parallel()
	const k, workers = 20, 50
	b := backends[1].open(t)
	c := newCustomer()
	b.known(t, c)
	b.grant(t, grantCmd(c, k, t0))
	succeeded, short := race(t, workers, func(i int) error {
		d := debitCmd(c, 1, t0.Add(time.Duration(i)*time.Millisecond))
		d.IdempotencyKey, d.RequestHash = fmt.Sprintf("w%d", i), "h"
		_, err := b.store.Debit(context.Background(), d)
		return err
	})
	if succeeded != k || short != workers-k {
		t.Errorf("%d succeeded and %d refused, want %d and %d", succeeded, short, k, workers-k)
	}
	a := b.snapshot(t, c, t0.Add(time.Minute))
	if a.Balance != 0 || a.Version != 1+k {
		t.Errorf("final balance %d version %d, want 0 and %d", a.Balance, a.Version, 1+k)
	}
	if n := len(b.outbox(t, c)); n != 1+k {
		t.Errorf("outbox has %d entries, want %d", n, 1+k)
	}
}

// race runs op from workers goroutines at once and counts how many succeeded
// and how many were refused for credit; any other error fails the test.
func race(t *testing.T, workers int, op func(i int) error) (succeeded, short int) {
	t.Helper()
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := op(i)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				succeeded++
			case errors.Is(err, engine.ErrInsufficientCredits):
				short++
			default:
				t.Errorf("worker %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	return succeeded, short
}
