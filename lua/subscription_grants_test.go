package lua

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestGrantAccumulationCap: a capped grant gives min(amount, cap - balance),
// nothing at or above the cap, and a retried key of a no-op stays a no-op.
func TestGrantAccumulationCap(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		c := newCustomer()
		b.known(t, c)
		ctx := context.Background()
		b.grant(t, grantCmd(c, 700, t0))

		tests := []struct {
			name      string
			amount    int64
			cap       int64
			wantGrant int64
			wantBal   int64
		}{
			{"room for part", 500, 1000, 300, 1000},
			{"at the cap", 500, 1000, 0, 1000},
			{"above the cap", 500, 800, 0, 1000},
			{"higher cap, room for all", 100, 5000, 100, 1100},
		}
		for i, tc := range tests {
			cmd := grantCmd(c, tc.amount, t0.Add(time.Duration(i+1)*time.Second))
			cmd.EntryType = engine.EntryPlanGrant
			cmd.Block.Source = engine.SourcePlanGrant
			cmd.AccumulationCap = &tc.cap
			cmd.IdempotencyKey = "cap-" + tc.name
			res, err := b.store.Grant(ctx, cmd)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			got := int64(0)
			for _, e := range res.Mutation.Entries {
				if e.Role == engine.RoleMain {
					got += e.Delta
				}
			}
			if got != tc.wantGrant {
				t.Fatalf("%s: granted %d, want %d", tc.name, got, tc.wantGrant)
			}
			if bal := b.snapshot(t, c, cmd.Now).Balance; bal != tc.wantBal {
				t.Fatalf("%s: balance %d, want %d", tc.name, bal, tc.wantBal)
			}
			// A retry of the same firing changes nothing.
			again, err := b.store.Grant(ctx, cmd)
			if err != nil {
				t.Fatalf("%s retry: %v", tc.name, err)
			}
			if tc.wantGrant > 0 && !again.Replayed {
				t.Fatalf("%s retry was not a replay", tc.name)
			}
			if bal := b.snapshot(t, c, cmd.Now).Balance; bal != tc.wantBal {
				t.Fatalf("%s retry: balance %d, want %d", tc.name, bal, tc.wantBal)
			}
		}
		// The no-op wrote nothing to the outbox: 1 plain grant + 2 granting caps.
		if n := len(b.outbox(t, c)); n != 3 {
			t.Fatalf("outbox has %d mutations, want 3", n)
		}
	})
}

// TestRollover: the previous cycle's blocks expire and floor(unused * pct /
// 100) moves to a new block; nothing left is a no-op.
func TestRollover(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		g1 := grantCmd(c, 1000, t0)
		g1.Block.Priority = 0
		b.grant(t, g1)
		other := b.grant(t, grantCmd(c, 50, t0))
		_ = other
		// Spend 333 of the plan block (priority 0 spends first... both 0; drain explicitly).
		if _, err := b.store.Debit(ctx, debitCmd(c, 333, t0.Add(time.Second))); err != nil {
			t.Fatal(err)
		}
		before := b.snapshot(t, c, t0.Add(2*time.Second)).Balance
		var g1Left int64
		for _, blk := range b.snapshot(t, c, t0.Add(2*time.Second)).Blocks {
			if blk.ID == g1.Block.ID {
				g1Left = blk.RemainingAmount
			}
		}
		exp := t0.Add(time.Hour)
		cmd := engine.RolloverCommand{OpID: uuid.New(), Customer: c, IdempotencyKey: "roll-1", Now: t0.Add(2 * time.Second),
			Blocks: []uuid.UUID{g1.Block.ID, uuid.New()}, Percentage: 33,
			Block:     engine.Block{ID: uuid.New(), Source: engine.SourcePlanGrant, ExpiresAt: &exp},
			EntryType: engine.EntryPlanGrant}
		res, err := b.store.Rollover(ctx, cmd)
		if err != nil {
			t.Fatal(err)
		}
		carry := g1Left * 33 / 100
		m := res.Mutation
		if m.Kind != engine.MutationRollover || len(m.Entries) != 2 || m.Entries[0].Delta != -g1Left ||
			m.Entries[0].Type != engine.EntryExpiry || m.Entries[1].Delta != carry || m.Entries[1].Role != engine.RoleMain {
			t.Fatalf("rollover mutation = %+v (left %d)", m, g1Left)
		}
		if got := b.snapshot(t, c, cmd.Now).Balance; got != before-g1Left+carry {
			t.Fatalf("balance %d, want %d", got, before-g1Left+carry)
		}
		if again, err := b.store.Rollover(ctx, cmd); err != nil || !again.Replayed {
			t.Fatalf("retry: %+v, %v", again, err)
		}
		// Nothing left in the listed blocks: a no-op.
		cmd2 := cmd
		cmd2.OpID, cmd2.IdempotencyKey, cmd2.Block.ID = uuid.New(), "roll-2", uuid.New()
		res, err = b.store.Rollover(ctx, cmd2)
		if err != nil || len(res.Mutation.Entries) != 0 {
			t.Fatalf("empty rollover: %+v, %v", res, err)
		}
		// Big figures stay exact: floor(9e18 * 99 / 100).
		big := newCustomer()
		b.known(t, big)
		gb := grantCmd(big, 9_000_000_000_000_000_001, t0)
		b.grant(t, gb)
		cmd3 := engine.RolloverCommand{OpID: uuid.New(), Customer: big, Now: t0.Add(time.Second),
			Blocks: []uuid.UUID{gb.Block.ID}, Percentage: 99,
			Block: engine.Block{ID: uuid.New(), Source: engine.SourcePlanGrant}, EntryType: engine.EntryPlanGrant}
		res, err = b.store.Rollover(ctx, cmd3)
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Mutation.Entries[1].Delta; got != 8_910_000_000_000_000_000 {
			t.Fatalf("big carry %d", got)
		}
		if _, err := b.store.Rollover(ctx, engine.RolloverCommand{OpID: uuid.New(), Customer: newCustomer(), Now: t0,
			Block: engine.Block{ID: uuid.New(), Source: engine.SourcePlanGrant}}); !errors.Is(err, engine.ErrStateMissing) {
			t.Fatalf("unknown customer: %v", err)
		}
	})
}
