package persist

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
)

// A fork (issue 11, migration 015): after a Redis failover the promoted
// replica may lack an op the old master ran and the persister stored, and
// its next op on that customer reuses the version. credit_fork_check
// refuses that op (dead-lettered, an alarm: it applied on a state Postgres
// does not have); the persister then fences the fork: Postgres, the system
// of record, stays as it is, its version is moved above every version the
// forked Redis holds (plus forkFenceMargin for ops racing the reload), and
// Redis is reloaded from it, fenced on the version it was read at. Later
// entries of the forked history (version <= the fence) are refused one by
// one; ops on the reloaded state persist as usual.

// forkFenceMargin is how many versions past the forked Redis' version the
// fence reaches, so ops the forked Redis runs between its read and the
// reload are refused too (the reload then retries on the new version).
const forkFenceMargin = 1000

// forkFenceTries bounds the reload attempts of one fence: each failed one
// means the forked Redis moved in between.
const forkFenceTries = 3

// forkScanLimit bounds how many unfenced forks one look-up returns.
const forkScanLimit = 100

// ForkedMutation is a refused op of a second history not yet fenced.
type ForkedMutation struct {
	Customer engine.CustomerKey
	Version  int64
}

// FenceFork fences c's fork above storeVersion, the version the forked
// Redis holds: the account's fenced_version becomes at least
// max(its version, storeVersion) + forkFenceMargin and its version one
// more (its op_id cleared: no op set it). It returns the fence; ok is
// false when Postgres has no account.
func (s *Store) FenceFork(ctx context.Context, c engine.CustomerKey, storeVersion int64) (fenced int64, ok bool, err error) {
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{}, func(tx pgx.Tx) error {
		var stored int64
		if err := tx.QueryRow(ctx, `SELECT version FROM credit_accounts WHERE customer_id = $1 FOR UPDATE`,
			c.CustomerID).Scan(&stored); err != nil {
			if err == pgx.ErrNoRows {
				return nil
			}
			return err
		}
		ok = true
		fenced = max(stored, storeVersion) + forkFenceMargin
		_, err := tx.Exec(ctx, `UPDATE credit_accounts SET version = GREATEST(version, $2 + 1), op_id = NULL,
				fenced_version = GREATEST(fenced_version, $2), fenced_at = now()
			WHERE customer_id = $1`, c.CustomerID, fenced)
		return err
	})
	if err != nil {
		return 0, false, fmt.Errorf("persist: fence fork of %s: %w", c.CustomerID, err)
	}
	return fenced, ok, nil
}

// UnfencedForks lists customers with an unresolved fork dead letter that
// no fence covers yet (the fence failed or the process died first).
func (s *Store) UnfencedForks(ctx context.Context) ([]ForkedMutation, error) {
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT ON (d.customer_id) d.customer_id, d.tenant_id, a.environment, d.account_version
		FROM outbox_dead_letters d
		JOIN credit_accounts a ON a.customer_id = d.customer_id
		WHERE d.resolved_at IS NULL AND d.sqlstate = $1
		  AND (a.fenced_version IS NULL OR a.fenced_version < d.account_version)
		ORDER BY d.customer_id, d.account_version DESC
		LIMIT $2`, forkRefused, forkScanLimit)
	if err != nil {
		return nil, fmt.Errorf("persist: unfenced forks: %w", err)
	}
	var out []ForkedMutation
	var f ForkedMutation
	var env string
	_, err = pgx.ForEachRow(rows, []any{&f.Customer.CustomerID, &f.Customer.TenantID, &env, &f.Version}, func() error {
		f.Customer.Environment = engine.Environment(env)
		out = append(out, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("persist: unfenced forks: %w", err)
	}
	return out, nil
}

// forkWriter is what the persister needs of its writer to fence forks
// (Store).
type forkWriter interface {
	engine.ReconcileSource
	FenceFork(ctx context.Context, c engine.CustomerKey, storeVersion int64) (int64, bool, error)
	UnfencedForks(ctx context.Context) ([]ForkedMutation, error)
}

var _ forkWriter = (*Store)(nil)

// fenceFork fences c's fork and reloads Redis from Postgres over the
// forked state, fenced on the Redis version it read; it tries
// forkFenceTries times while the forked Redis moves past the fence.
func fenceFork(ctx context.Context, w forkWriter, store engine.ReconcileStore, c engine.CustomerKey, clock engine.Clock,
	log zerolog.Logger) error {
	for try := 0; try < forkFenceTries; try++ {
		stored, err := store.StoredAccounts(ctx, []uuid.UUID{c.CustomerID})
		if err != nil {
			return err
		}
		r := int64(-1)
		if stored[0].Present {
			r = stored[0].Version
		}
		fenced, ok, err := w.FenceFork(ctx, c, r)
		if err != nil || !ok {
			return err
		}
		st, ok, err := w.AccountState(ctx, c, clock.Now().Add(-engine.AppliedRetention))
		if err != nil || !ok {
			return err
		}
		wrote, err := store.Reload(ctx, st, r)
		if err != nil {
			return err
		}
		if wrote {
			log.Warn().Str("customer_id", c.CustomerID.String()).Int64("redis_version", r).Int64("fenced_version", fenced).
				Int64("version", st.Version).Msg("forked account reloaded from postgres; the forked ops stay dead letters")
			return nil
		}
	}
	return fmt.Errorf("persist: fence fork of %s: redis kept moving", c.CustomerID)
}
