package lua

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestBalancesMatchSnapshot: the check's lean read gives the figures of the
// full Snapshot for live, pending (stack_after), expired, drained and
// metadata-carrying blocks and a reservation-free account, at several
// instants around the expiries.
func TestBalancesMatchSnapshot(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		if _, err := b.store.Balances(ctx, c, t0); !errors.Is(err, engine.ErrStateMissing) {
			t.Fatalf("no state: err %v, want ErrStateMissing", err)
		}
		b.known(t, c)
		plain := grantCmd(c, 500, t0.Add(-time.Minute))
		b.grant(t, plain)
		expiring := grantCmd(c, 300, t0.Add(-time.Minute))
		expiring.Block.ExpiresAt = ptr(t0.Add(time.Hour))
		expiring.Block.Metadata = engine.Metadata{"plan": json.RawMessage(`"pro"`)}
		b.grant(t, expiring)
		stacked := grantCmd(c, 700, t0)
		stacked.DurationSeconds = 600
		stacked.StackAfter = &engine.StackAfter{MetadataMatch: engine.Metadata{"plan": json.RawMessage(`"pro"`)}, Fallback: "reject"}
		b.grant(t, stacked)
		drained := grantCmd(c, 50, t0.Add(-time.Minute))
		drained.Block.Priority = -1
		b.grant(t, drained)
		if _, err := b.store.Debit(ctx, debitCmd(c, 60, t0)); err != nil {
			t.Fatalf("debit: %v", err)
		}
		for _, at := range []time.Duration{0, time.Hour - time.Millisecond, time.Hour, time.Hour + 5*time.Minute, time.Hour + 10*time.Minute, 2 * time.Hour} {
			now := t0.Add(at)
			a := b.snapshot(t, c, now)
			want := engine.Balances{Balance: a.Balance, Reserved: a.ReservedBalance, Pending: a.PendingBalance, Effective: a.EffectiveBalance}
			got, err := b.store.Balances(ctx, c, now)
			if err != nil {
				t.Fatalf("at +%v: %v", at, err)
			}
			if got != want {
				t.Errorf("at +%v: balances %+v, snapshot says %+v", at, got, want)
			}
		}
	})
}

// TestAccountKeyOf: the fmt-free account key is the tag's layout
// ("{prefix:pNN}:a:<id>") with hash/fnv's partition, the key every script
// uses.
func TestAccountKeyOf(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"t", "bench20261121t07550110dd", ""} {
		s := NewStore(nil, prefix)
		for i := 0; i < 200; i++ {
			id := uuid.New()
			h := fnv.New32a()
			h.Write([]byte(id.String()))
			if got, want := s.accountKey(id), s.tag(int(h.Sum32()%Partitions))+":a:"+id.String(); got != want {
				t.Fatalf("accountKey(%s) = %q, want %q", id, got, want)
			}
		}
	}
}

// TestBlockFiguresMalformed: a block value short of its fields is an error,
// never a zero balance.
func TestBlockFiguresMalformed(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "100", "100|100|0|mi6kq0xc|", "x|100|0|mi6kq0xc|||p|", "100|100|0|!!|||p|"} {
		if _, _, _, _, err := blockFigures(v); err == nil {
			t.Errorf("blockFigures(%q): no error", v)
		}
	}
}

// TestBalancesConcurrent: checks read at once (so their reads are pipelined
// together) each get their own customer's figures, and a missing account
// stays ErrStateMissing inside a batch.
func TestBalancesConcurrent(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		customers := make([]engine.CustomerKey, 6)
		for i := range customers {
			customers[i] = newCustomer()
			if i == 0 {
				continue // never loaded
			}
			b.known(t, customers[i])
			b.grant(t, grantCmd(customers[i], int64(100*i), t0.Add(-time.Minute)))
		}
		var wg sync.WaitGroup
		errs := make(chan error, 64*30)
		for g := 0; g < 64; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < 30; n++ {
					i := (g + n) % len(customers)
					got, err := b.store.Balances(ctx, customers[i], t0)
					switch {
					case i == 0 && !errors.Is(err, engine.ErrStateMissing):
						errs <- fmt.Errorf("missing account: err %v", err)
					case i != 0 && (err != nil || got.Balance != int64(100*i) || got.Effective != int64(100*i)):
						errs <- fmt.Errorf("customer %d: %+v %v", i, got, err)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}
