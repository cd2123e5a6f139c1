package persist

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that Store feeds the seen filter's seeding.
var _ engine.AppliedKeys = (*Store)(nil)

// AppliedKeysSince streams the (customer, idempotency key) of every
// operation created at or after since to fn, page at a time
// (engine.AppliedKeys): the operations rows and the lean consumes, whose
// record is their ledger entry's op head (ophead.go). It is one read, not
// pages of reads (the seeding runs once per node start); the BRIN indexes
// on created_at (migration 025) keep it to the rows since.
func (s *Store) AppliedKeysSince(ctx context.Context, since time.Time, page int, fn func([]engine.OpRef) error) error {
	if page < 1 {
		return fmt.Errorf("persist: applied keys: page %d", page)
	}
	rows, err := s.pool.Query(ctx, appliedKeysSinceSQL, since)
	if err != nil {
		return fmt.Errorf("persist: applied keys: %w", err)
	}
	defer rows.Close()
	refs := make([]engine.OpRef, 0, page)
	for rows.Next() {
		var tenant, customer uuid.UUID
		var key string
		if err := rows.Scan(&tenant, &customer, &key); err != nil {
			return fmt.Errorf("persist: applied keys: %w", err)
		}
		refs = append(refs, engine.OpRef{Customer: engine.CustomerKey{TenantID: tenant, CustomerID: customer}, Key: key})
		if len(refs) == page {
			if err := fn(refs); err != nil {
				return err
			}
			refs = refs[:0]
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("persist: applied keys: %w", err)
	}
	if len(refs) > 0 {
		return fn(refs)
	}
	return nil
}

// appliedKeysSinceSQL lists the keys applied since $1 (AppliedKeysSince).
const appliedKeysSinceSQL = `SELECT tenant_id, customer_id, idempotency_key FROM operations
		WHERE created_at >= $1 AND idempotency_key <> ''
		UNION ALL
		SELECT tenant_id, customer_id, idempotency_key FROM ledger_entries
		WHERE created_at >= $1 AND op_head IS NOT NULL`
