package persist

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that Store is the system of record's side of a
// reconcile pass.
var _ engine.ReconcileSource = (*Store)(nil)

// Compile-time check that Store pages a tenant's accounts and samples
// accounts for the reconcile sampler.
var _ engine.ReconcileSampleSource = (*Store)(nil)

// ReconcileStates pages the accounts of scope after customer id after, in
// customer id order, with what a comparison needs: the account row and its
// live blocks, in one snapshot (two queries a page; the applied operations,
// reservations and gauges a rebuild also reads are left out).
func (s *Store) ReconcileStates(ctx context.Context, scope engine.ReconcileScope, after uuid.UUID, limit int) ([]engine.AccountState, error) {
	var tenant *uuid.UUID
	if scope.TenantID != uuid.Nil {
		tenant = &scope.TenantID
	}
	var env *string
	if scope.Environment != "" {
		e := string(scope.Environment)
		env = &e
	}
	states, err := s.comparableStates(ctx, `SELECT `+accountColumns+` FROM credit_accounts
		WHERE customer_id > $1 AND ($2::uuid IS NULL OR tenant_id = $2) AND ($3::text IS NULL OR environment = $3)
		ORDER BY customer_id LIMIT $4`, after, tenant, env, limit)
	if err != nil {
		return nil, fmt.Errorf("persist: reconcile states: %w", err)
	}
	return states, nil
}

// sampleOversample is how many times n rows a sample's pages are meant to
// reservation: TABLESAMPLE SYSTEM picks whole pages, each with probability p, so
// the rows it yields vary; the extra is cut by the LIMIT.
const sampleOversample = 3

// sampleCountCap bounds the count SampleStates falls back on when the
// planner has no row estimate yet (a table never analyzed).
const sampleCountCap = 100_000

// SampleStates reads up to n accounts at random for the reconcile sampler:
// TABLESAMPLE SYSTEM over credit_accounts with a percentage aimed at
// sampleOversample*n rows from the planner's row estimate (pg_class, scaled
// to the table's current size), so
// the cost is a few pages whatever the table's size; rows of one page are
// picked together (accounts created about the same time), which a sample
// looking for mismatches can live with. A table with fewer than
// sampleOversample*n rows is read whole and n rows picked at random.
func (s *Store) SampleStates(ctx context.Context, n int) ([]engine.AccountState, error) {
	if n <= 0 {
		return []engine.AccountState{}, nil
	}
	// The planner's own estimate: rows per page at the last analyze times
	// the pages the table has now, so a table grown since is not
	// underestimated (which would sample far too many pages).
	var estimate float64
	if err := s.pool.QueryRow(ctx, `SELECT CASE WHEN relpages > 0 AND reltuples > 0
			THEN reltuples / relpages * (pg_relation_size(oid) / current_setting('block_size')::int) ELSE -1 END
		FROM pg_class WHERE oid = 'credit_accounts'::regclass`).Scan(&estimate); err != nil {
		return nil, fmt.Errorf("persist: sample states: %w", err)
	}
	if estimate <= 0 {
		var count int64
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM credit_accounts LIMIT $1) c`,
			sampleCountCap).Scan(&count); err != nil {
			return nil, fmt.Errorf("persist: sample states: %w", err)
		}
		estimate = float64(count)
	}
	percent := 100.0
	if want := float64(sampleOversample * n); estimate > want {
		percent = 100 * want / estimate
	}
	states, err := s.comparableStates(ctx, `SELECT `+accountColumns+` FROM credit_accounts WHERE customer_id IN (
		SELECT customer_id FROM credit_accounts TABLESAMPLE SYSTEM ($1) ORDER BY random() LIMIT $2)
		ORDER BY customer_id`, percent, n)
	if err != nil {
		return nil, fmt.Errorf("persist: sample states: %w", err)
	}
	return states, nil
}

// comparableStates runs accountSQL and reads each account's live blocks in
// the same repeatable-read snapshot.
func (s *Store) comparableStates(ctx context.Context, accountSQL string, args ...any) ([]engine.AccountState, error) {
	var states []engine.AccountState
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var err error
		states, _, _, err = readStatesWithBlocks(ctx, tx, accountSQL, args, false)
		return err
	})
	if err != nil {
		return nil, err
	}
	if states == nil {
		states = []engine.AccountState{}
	}
	return states, nil
}

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
