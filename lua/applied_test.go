package lua

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

// fakeApplied is Postgres's operations table for the store's look-ups:
// the Mutations it holds, found by customer and key.
type fakeApplied []engine.Mutation

func (f fakeApplied) AppliedOps(_ context.Context, refs []engine.OpRef) ([]engine.Mutation, []bool, error) {
	ms, found := make([]engine.Mutation, len(refs)), make([]bool, len(refs))
	for i, r := range refs {
		for _, m := range f {
			if m.CustomerID == r.Customer.CustomerID && m.IdempotencyKey == r.Key {
				ms[i], found[i] = m, true
			}
		}
	}
	return ms, found, nil
}

// countingApplied counts look-ups and finds nothing.
type countingApplied struct{ n atomic.Int64 }

func (c *countingApplied) AppliedOps(_ context.Context, refs []engine.OpRef) ([]engine.Mutation, []bool, error) {
	c.n.Add(int64(len(refs)))
	return make([]engine.Mutation, len(refs)), make([]bool, len(refs)), nil
}

// failingApplied is a Postgres that does not answer.
type failingApplied struct{}

func (failingApplied) AppliedOps(context.Context, []engine.OpRef) ([]engine.Mutation, []bool, error) {
	return nil, nil, errors.New("connection refused")
}

// TestAppliedFirstUnknown: when Postgres cannot say whether a key was
// applied, a money call with that key runs nothing and answers
// ErrAppliedUnknown (a 503 to retry), never a guess that could apply twice.
func TestAppliedFirstUnknown(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		b.grant(t, grantCmd(c, 100, t0))
		version := b.snapshot(t, c, t0).Version
		b.store.WithAppliedOps(failingApplied{})
		g := grantCmd(c, 5, t0)
		g.IdempotencyKey, g.RequestHash = "g", "rh"
		if _, err := b.store.Grant(ctx, g); !errors.Is(err, engine.ErrAppliedUnknown) {
			t.Errorf("grant: %v, want ErrAppliedUnknown", err)
		}
		if errs := b.store.GrantBatch(ctx, []engine.GrantCommand{g}); !errors.Is(errs[0], engine.ErrAppliedUnknown) {
			t.Errorf("grant batch: %v, want ErrAppliedUnknown", errs[0])
		}
		if v := b.snapshot(t, c, t0).Version; v != version {
			t.Errorf("account moved to version %d (was %d)", v, version)
		}
		// Without a key there is nothing to look up.
		if _, err := b.store.Grant(ctx, grantCmd(c, 5, t0)); err != nil {
			t.Errorf("grant without a key: %v", err)
		}
	})
}

// TestAppliedFirst: once the persister let an op key go, every money call
// with that key answers from Postgres (the original Mutation, Replayed, or
// a mismatch for another request) and moves nothing: exactly one effect per
// idempotency key, forever (invariant 4). A key Postgres lacks runs the
// script; a call without a key never asks; a caller's fresh look-up
// (AppliedCheckedAt) is not repeated.
func TestAppliedFirst(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		g := grantCmd(c, 1000, t0)
		g.IdempotencyKey, g.RequestHash = "grant-1", "rh-grant"
		first := b.grant(t, g)
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 10}
		cons := consumeCmd(c, 3, terms, engine.OveragePolicyBlock, t0)
		cons.IdempotencyKey, cons.RequestHash = "consume-1", "rh-consume"
		res, err := b.store.Consume(ctx, cons)
		if err != nil {
			t.Fatal(err)
		}
		consumed := res.Mutation
		// The persister committed both and the grace ran out.
		for _, k := range []string{"grant-1", "consume-1"} {
			b.rdb.Del(ctx, b.store.opKeyOf(c.CustomerID, k))
		}
		b.store.WithAppliedOps(fakeApplied{first, consumed})
		version := b.snapshot(t, c, t0).Version

		for _, tc := range []struct {
			name    string
			run     func() (engine.MutationResult, error)
			wantOp  engine.Mutation
			wantErr error
		}{
			{"grant retried", func() (engine.MutationResult, error) {
				g2 := g
				g2.OpID = uuid.New()
				return b.store.Grant(ctx, g2)
			}, first, nil},
			{"grant key reused with another body", func() (engine.MutationResult, error) {
				g2 := g
				g2.RequestHash = "rh-other"
				return b.store.Grant(ctx, g2)
			}, engine.Mutation{}, engine.ErrIdempotencyMismatch},
			{"consume retried", func() (engine.MutationResult, error) {
				c2 := cons
				c2.Now = t0.Add(48 * time.Hour)
				return b.store.Consume(ctx, c2)
			}, consumed, nil},
			{"consume retried under a stale caller look-up", func() (engine.MutationResult, error) {
				c2 := cons
				c2.AppliedCheckedAt = time.Now().Add(-idempotency.AppliedLookupFresh)
				return b.store.Consume(ctx, c2)
			}, consumed, nil},
			{"debit under the consume's key", func() (engine.MutationResult, error) {
				d := debitCmd(c, 5, t0)
				d.IdempotencyKey, d.RequestHash = "consume-1", "rh-consume"
				return b.store.Debit(ctx, d)
			}, consumed, nil},
		} {
			got, err := tc.run()
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("%s: err %v, want %v", tc.name, err, tc.wantErr)
			}
			if tc.wantErr == nil && (!got.Replayed || got.Mutation.OpID != tc.wantOp.OpID) {
				t.Errorf("%s: replayed %v op %s, want op %s", tc.name, got.Replayed, got.Mutation.OpID, tc.wantOp.OpID)
			}
			if v := b.snapshot(t, c, t0).Version; v != version {
				t.Errorf("%s: account moved to version %d (was %d)", tc.name, v, version)
			}
		}

		// A key Postgres does not hold runs the script once.
		fresh := cons
		fresh.OpID, fresh.IdempotencyKey = uuid.New(), "consume-2"
		if res, err := b.store.Consume(ctx, fresh); err != nil || res.Replayed {
			t.Fatalf("fresh key: %v replayed=%v", err, res.Replayed)
		}
		if v := b.snapshot(t, c, t0).Version; v != version+1 {
			t.Errorf("fresh key: version %d, want %d", v, version+1)
		}

		// Calls without a key never ask; a fresh caller look-up is not repeated.
		var count countingApplied
		b.store.WithAppliedOps(&count)
		nokey := consumeCmd(c, 1, terms, engine.OveragePolicyBlock, t0)
		if _, err := b.store.Consume(ctx, nokey); err != nil {
			t.Fatal(err)
		}
		checked := consumeCmd(c, 1, terms, engine.OveragePolicyBlock, t0)
		checked.IdempotencyKey, checked.RequestHash, checked.AppliedCheckedAt = "consume-3", "rh", time.Now()
		if _, err := b.store.Consume(ctx, checked); err != nil {
			t.Fatal(err)
		}
		if n := count.n.Load(); n != 0 {
			t.Errorf("%d look-ups, want 0", n)
		}
	})
}

// TestAppliedFirstGrantBatch: a batch of grants answers the ones Postgres
// holds from it and applies only the others (an import retried after its
// op keys were let go grants nothing twice).
func TestAppliedFirstGrantBatch(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		g := grantCmd(c, 100, t0)
		g.IdempotencyKey, g.RequestHash = "imp#0", "rh"
		done := b.grant(t, g)
		b.rdb.Del(ctx, b.store.opKeyOf(c.CustomerID, "imp#0"))
		b.store.WithAppliedOps(fakeApplied{done})
		again, other, mismatch := g, grantCmd(c, 50, t0), g
		other.IdempotencyKey, other.RequestHash = "imp#1", "rh"
		mismatch.RequestHash = "rh-other"
		errs := b.store.GrantBatch(ctx, []engine.GrantCommand{again, other, mismatch})
		if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], engine.ErrIdempotencyMismatch) {
			t.Fatalf("errs %v, want nil, nil, mismatch", errs)
		}
		if a := b.snapshot(t, c, t0); a.Balance != 150 {
			t.Errorf("balance %d, want 150 (100 once, then 50)", a.Balance)
		}
	})
}

// TestForgetOps: after a commit the persister shortens the batch's op keys
// to the grace (idempotency.OpKeyGrace), leaves other keys alone, and a money
// script writes its op key with the 24 h safety net, never longer.
func TestForgetOps(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		var ms []engine.Mutation
		for _, k := range []string{"k1", "k2", "kept"} {
			g := grantCmd(c, 10, t0)
			g.IdempotencyKey, g.RequestHash = k, "rh"
			ms = append(ms, b.grant(t, g))
		}
		for _, k := range []string{"k1", "kept"} {
			if ttl := b.rdb.PTTL(ctx, b.store.opKeyOf(c.CustomerID, k)).Val(); ttl <= OpRetention-time.Minute || ttl > OpRetention {
				t.Errorf("op key %s written with TTL %s, want %s", k, ttl, OpRetention)
			}
		}
		noKey := b.grant(t, grantCmd(c, 10, t0))
		if err := b.store.ForgetOps(ctx, Partition(c.CustomerID), append(ms[:2:2], noKey)); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			key      string
			min, max time.Duration
		}{
			{"k1", 0, idempotency.OpKeyGrace},
			{"k2", 0, idempotency.OpKeyGrace},
			{"kept", OpRetention - time.Minute, OpRetention},
		} {
			ttl := b.rdb.PTTL(ctx, b.store.opKeyOf(c.CustomerID, tc.key)).Val()
			if ttl <= tc.min || ttl > tc.max {
				t.Errorf("op key %s: TTL %s, want in (%s, %s]", tc.key, ttl, tc.min, tc.max)
			}
		}
		if err := b.store.ForgetOps(ctx, Partitions, ms); err == nil {
			t.Errorf("partition out of range accepted")
		}
	})
}
