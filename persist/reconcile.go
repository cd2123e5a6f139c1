package persist

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that Store is the system of record's side of a
// reconcile pass.
var _ engine.ReconcileSource = (*Store)(nil)

// LedgerSums sums each customer's ledger deltas (expiry entries included,
// invariant 1) in one query through the history index's customer_id
// prefix; a customer without entries is absent from the map. A sum beyond
// int64 fails the query rather than wrap.
func (s *Store) LedgerSums(ctx context.Context, customers []uuid.UUID) (map[uuid.UUID]int64, error) {
	out := make(map[uuid.UUID]int64, len(customers))
	if len(customers) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, `SELECT customer_id, sum(delta)::bigint FROM ledger_entries
		WHERE customer_id = ANY($1) GROUP BY customer_id`, customers)
	if err != nil {
		return nil, fmt.Errorf("persist: ledger sums: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id uuid.UUID
		var sum int64
		if err := rows.Scan(&id, &sum); err != nil {
			return nil, fmt.Errorf("persist: ledger sums: %w", err)
		}
		out[id] = sum
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("persist: ledger sums: %w", err)
	}
	return out, nil
}
