package persist

import (
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// drain is a's consume of amount from block as the scripts now write it:
// the changed block without its metadata (invariant 13).
func (a *account) drain(block engine.MutationBlock, amount int64) engine.Mutation {
	m := a.consume("", block.ID, amount, "m", 0)
	m.Blocks[0].Metadata = nil
	return m
}

// TestDrainKeepsBlockMetadata: a drain Mutation carries no block metadata,
// and Postgres keeps what the grant stored, whether the drain lands in a
// later batch or in the grant's own batch; the rebuild state (AccountState)
// restores it exactly.
func TestDrainKeepsBlockMetadata(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, tc := range []struct {
		name      string
		sameBatch bool
	}{
		{"drain in a later batch", false},
		{"drain in the grant's batch", true},
	} {
		a := newAccount(live, now)
		g := a.grant("g-"+tc.name, 100, nil)
		d1 := a.drain(g.Blocks[0], 10)
		d2 := a.drain(g.Blocks[0], 5)
		batches := [][]engine.Mutation{{g}, {d1, d2}}
		if tc.sameBatch {
			batches = [][]engine.Mutation{{g, d1, d2}}
		}
		for _, batch := range batches {
			if err := b.store.Apply(b.ctx, batch); err != nil {
				t.Fatalf("%s: apply: %v", tc.name, err)
			}
		}
		var meta string
		var remaining int64
		if err := b.pool.QueryRow(b.ctx, `SELECT metadata::text, remaining_amount FROM credit_blocks WHERE id = $1`,
			g.Blocks[0].ID).Scan(&meta, &remaining); err != nil {
			t.Fatal(err)
		}
		if meta != `{"campaign": "x"}` || remaining != 85 {
			t.Errorf("%s: stored block metadata %s remaining %d, want the grant's and 85", tc.name, meta, remaining)
		}
		st, ok, err := b.store.AccountState(b.ctx, a.key, now.Add(-time.Hour))
		if err != nil || !ok || len(st.Blocks) != 1 || string(st.Blocks[0].Metadata) != `{"campaign": "x"}` {
			t.Errorf("%s: rebuild state %v %v %+v", tc.name, ok, err, st.Blocks)
		}
	}
}

// TestReleaseKeepsReservationMetadata: a release Mutation carries no reservation
// metadata, and Postgres keeps what the reserve stored, in a later batch or
// in the reserve's own batch.
func TestReleaseKeepsReservationMetadata(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	for _, sameBatch := range []bool{false, true} {
		a := newAccount(live, now)
		b.apply(t, a.grant("", 1000, nil))
		res, h := a.reserve("", "gpu", 100, time.Hour)
		rel := a.finish(h, engine.ReservationReleased, 0)
		rel.Reservation.Metadata = nil
		if sameBatch {
			b.apply(t, res, rel)
		} else {
			b.apply(t, res)
			b.apply(t, rel)
		}
		var meta, status string
		if err := b.pool.QueryRow(b.ctx, `SELECT metadata::text, status FROM reservations WHERE id = $1`, h.ID).Scan(&meta, &status); err != nil {
			t.Fatal(err)
		}
		if meta != `{"job": "j1"}` || status != "released" {
			t.Errorf("same batch %v: reservation metadata %s status %s, want the reserve's and released", sameBatch, meta, status)
		}
	}
}
