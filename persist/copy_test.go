package persist

import (
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestLeanApplyReplays states that the lean write, by COPY or by INSERT,
// keeps Apply idempotent: a batch holding Mutations already stored (a
// replay after a crash between commit and acknowledgement, whole or mixed
// with new ones) falls back to the ON CONFLICT write and stores every row
// exactly once, while a fresh batch (duplicates within it included) never
// needs the fallback.
func TestLeanApplyReplays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, way := range []struct {
		name    string
		copyMin int
	}{{"copy", 1}, {"insert", copyMinMutations}} {
		t.Run(way.name, func(t *testing.T) {
			leanApplyReplays(t, b, &Store{pool: b.pool, copyMin: way.copyMin})
		})
	}
}

func leanApplyReplays(t *testing.T, b *bundle, store *Store) {
	tenant := uuid.New()
	tests := []struct {
		name string
		// batches are applied in order; each is a list of indexes into the
		// customer's consumes.
		batches      [][]int
		keyless      bool
		wantFallback int64
	}{
		{"fresh batches", [][]int{{0, 1}, {2}}, false, 0},
		{"duplicate inside one batch", [][]int{{0, 0, 1, 1}}, false, 0},
		{"same batch twice", [][]int{{0, 1, 2}, {0, 1, 2}}, false, 1},
		{"stored mixed with new", [][]int{{0}, {0, 1, 2}}, false, 1},
		{"new, then a replay of an older one alone", [][]int{{0, 1}, {2}, {1}}, false, 1},
		{"keyless replay", [][]int{{0, 1}, {1, 2}}, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 2, balance: 2_000_000}
			if err := store.Apply(b.ctx, []engine.Mutation{c.grant(tenant)}); err != nil {
				t.Fatal(err)
			}
			ms := make([]engine.Mutation, 3)
			for i := range ms {
				ms[i] = c.consume(tenant, true)
				if tt.keyless {
					ms[i].IdempotencyKey = ""
				}
			}
			before := store.ReplayedApplies()
			seen := map[int]bool{}
			for _, idx := range tt.batches {
				var batch []engine.Mutation
				for _, i := range idx {
					batch = append(batch, ms[i])
					seen[i] = true
				}
				if err := store.Apply(b.ctx, batch); err != nil {
					t.Fatal(err)
				}
			}
			if got := store.ReplayedApplies() - before; got != tt.wantFallback {
				t.Errorf("%d Applies fell back to ON CONFLICT, want %d", got, tt.wantFallback)
			}
			n := len(seen)
			wantOps := n + 1 // and the grant's
			if tt.keyless {
				wantOps = 1
			}
			for _, q := range []struct {
				sql  string
				want int
			}{
				{`SELECT count(*) FROM ledger_entries WHERE customer_id = $1 AND type = 'consumption'`, n},
				{`SELECT count(*) FROM operations WHERE customer_id = $1`, wantOps},
				{`SELECT count(*) FROM webhook_events WHERE customer_id = $1 AND event_type = 'credit.consumed'`, n},
			} {
				var got int
				if err := b.pool.QueryRow(b.ctx, q.sql, c.id).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != q.want {
					t.Errorf("%s: %d, want %d", q.sql, got, q.want)
				}
			}
			var sum int64
			if err := b.pool.QueryRow(b.ctx, `SELECT sum(delta) FROM ledger_entries WHERE customer_id = $1`, c.id).Scan(&sum); err != nil {
				t.Fatal(err)
			}
			if want := int64(2_000_000 - 300*n); sum != want {
				t.Errorf("ledger sums to %d, want %d", sum, want)
			}
		})
	}
}
