package persist

import (
	"context"
	"errors"
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
		if err := tx.QueryRow(ctx, `SELECT version FROM credit_accounts WHERE customer_id = $1 AND tenant_id = $2 FOR UPDATE`,
			c.CustomerID, c.TenantID).Scan(&stored); err != nil {
			if err == pgx.ErrNoRows {
				return nil
			}
			return err
		}
		ok = true
		fenced = max(stored, storeVersion) + forkFenceMargin
		_, err := tx.Exec(ctx, `UPDATE credit_accounts SET version = GREATEST(version, $2 + 1), op_id = NULL,
				fenced_version = GREATEST(fenced_version, $2), fenced_at = now()
			WHERE customer_id = $1 AND tenant_id = $3`, c.CustomerID, fenced, c.TenantID)
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
				Int64("version", st.Version).Msg("forked account reloaded from postgres; its forked ops are applied again on it")
			return nil
		}
	}
	return fmt.Errorf("persist: fence fork of %s: redis kept moving", c.CustomerID)
}

// forkRepairLimit bounds how many forked ops one repair pass takes on; the
// rest wait for the next hold refresh (1 s).
const forkRepairLimit = 100

// ForkResolutionPrefix starts the resolution of a dead letter whose
// forked op was applied again (docs/operations.md): `creditd deadletters
// list --repaired` shows them.
const ForkResolutionPrefix = "repaired: "

// forkLetter is an unresolved dead letter of a fenced fork's history: its
// op was acknowledged by the forked Redis and waits to be applied again.
type forkLetter struct {
	id       int64
	customer engine.CustomerKey
	version  int64
	fenced   int64
	raw      []byte
}

// unrepairedForks lists up to forkRepairLimit unresolved dead letters of
// fenced forks (refused as a fork, or held behind such a letter, at a
// version the fence covers), in replay order per customer.
func (s *Store) unrepairedForks(ctx context.Context) ([]forkLetter, error) {
	rows, err := s.pool.Query(ctx, `SELECT d.id, d.customer_id, d.tenant_id, a.environment, d.account_version,
			a.fenced_version, d.raw
		FROM outbox_dead_letters d
		JOIN credit_accounts a ON a.customer_id = d.customer_id AND a.tenant_id = d.tenant_id
		WHERE d.resolved_at IS NULL AND d.account_version <= a.fenced_version
		  AND (d.sqlstate = $1 OR EXISTS (
			SELECT 1 FROM outbox_dead_letters h WHERE h.id = d.held_by AND h.sqlstate = $1))
		ORDER BY d.customer_id, d.account_version, d.id
		LIMIT $2`, forkRefused, forkRepairLimit)
	if err != nil {
		return nil, fmt.Errorf("persist: unrepaired forks: %w", err)
	}
	var out []forkLetter
	var l forkLetter
	var env string
	_, err = pgx.ForEachRow(rows, []any{&l.id, &l.customer.CustomerID, &l.customer.TenantID, &env, &l.version, &l.fenced, &l.raw},
		func() error {
			l.customer.Environment = engine.Environment(env)
			out = append(out, l)
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("persist: unrepaired forks: %w", err)
	}
	return out, nil
}

// resolveForkLetter resolves dead letter id as repaired with note; false
// when it was resolved already (another node's repair, an operator).
func (s *Store) resolveForkLetter(ctx context.Context, id int64, note string) (bool, error) {
	tag, err := s.pool.Exec(ctx, `UPDATE outbox_dead_letters
		SET resolved_at = now(), resolution = $2, retry_error = NULL
		WHERE id = $1 AND resolved_at IS NULL`, id, humanText(ForkResolutionPrefix+note))
	if err != nil {
		return false, fmt.Errorf("persist: resolve fork dead letter %d: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// noteForkRepairFailure keeps why dead letter id's repair failed on its
// row, which stays unresolved (the alarm stands) for the next pass.
func (s *Store) noteForkRepairFailure(ctx context.Context, id int64, cause error) error {
	_, err := s.pool.Exec(ctx, `UPDATE outbox_dead_letters SET retry_error = $2 WHERE id = $1 AND resolved_at IS NULL`,
		id, humanText("fork repair failed: "+cause.Error()))
	if err != nil {
		return fmt.Errorf("persist: note fork repair failure %d: %w", id, err)
	}
	return nil
}

// forkRepairer is what the persister needs of its writer to repair forks
// (Store).
type forkRepairer interface {
	forkWriter
	unrepairedForks(ctx context.Context) ([]forkLetter, error)
	resolveForkLetter(ctx context.Context, id int64, note string) (bool, error)
	noteForkRepairFailure(ctx context.Context, id int64, cause error) error
}

var _ forkRepairer = (*Store)(nil)

// forkHotStore is what the persister needs of its outbox to repair forks
// (lua.Store): the reconcile reads and reload, and the money scripts.
type forkHotStore interface {
	engine.ReconcileStore
	engine.ForkRepairStore
}

// repairForks applies every fenced fork's dead letters again on the true
// state (engine.RepairFork) and resolves each as repaired, a customer's in
// version order; a customer whose repair failed keeps its later letters
// for the next pass, so they never apply out of order. A Redis still
// holding the forked state (the fence reached Postgres, the reload did
// not) is fenced and reloaded first: a repair on it would fork again.
// It returns how many letters it resolved and how many failed.
func repairForks(ctx context.Context, w forkRepairer, store forkHotStore, clock engine.Clock,
	log zerolog.Logger) (repaired, failed int64) {
	letters, err := w.unrepairedForks(ctx)
	if err != nil {
		log.Error().Err(err).Msg("fork repair look-up failed; retried at the next hold refresh")
		return 0, 1
	}
	stuck := map[uuid.UUID]bool{}
	reloaded := map[uuid.UUID]bool{}
	var applied engine.AppliedOps
	if st, ok := w.(*Store); ok {
		applied = NewAppliedBatcher(st)
	}
	for _, l := range letters {
		c := l.customer.CustomerID
		if stuck[c] {
			continue
		}
		fail := func(err error) {
			stuck[c] = true
			failed++
			log.Error().Err(err).Int64("dead_letter_id", l.id).Str("customer_id", c.String()).
				Msg("fork repair failed; the dead letter stays unresolved and is retried at the next hold refresh")
			if nerr := w.noteForkRepairFailure(ctx, l.id, err); nerr != nil {
				log.Error().Err(nerr).Msg("fork repair failure not recorded")
			}
		}
		if !reloaded[c] {
			stored, err := store.StoredAccounts(ctx, []uuid.UUID{c})
			if err != nil {
				fail(err)
				continue
			}
			if stored[0].Present && stored[0].Version <= l.fenced {
				if err := fenceFork(ctx, w, store, l.customer, clock, log); err != nil {
					fail(err)
					continue
				}
			}
			reloaded[c] = true
		}
		var m engine.Mutation
		if err := engine.DecodeMutation(l.raw, &m); err != nil || m.OpID == uuid.Nil || m.CustomerID != c {
			if err == nil {
				err = errors.New("no op id or another customer's op")
			}
			fail(fmt.Errorf("undecodable forked op: %w", err))
			continue
		}
		rep, err := engine.RepairFork(ctx, store, w, applied, m, clock.Now())
		if err != nil {
			fail(err)
			continue
		}
		note := rep.Note()
		ok, err := w.resolveForkLetter(ctx, l.id, note)
		if err != nil {
			fail(err)
			continue
		}
		if !ok {
			continue
		}
		repaired++
		log.Warn().Int64("dead_letter_id", l.id).Str("op_id", m.OpID.String()).Str("kind", string(m.Kind)).
			Str("tenant_id", m.TenantID.String()).Str("customer_id", c.String()).Int64("account_version", l.version).
			Str("action", string(rep.Plan.Action)).Str("repair_op_id", rep.Result.Mutation.OpID.String()).
			Int64("shortfall_mc", rep.ShortfallMC).Bool("replayed", rep.Result.Replayed).
			Msg("forked op repaired from the ledger: " + note)
	}
	return repaired, failed
}

// ListRepairedForks returns up to limit (at most MaxDeadLetterList) dead
// letters resolved by a fork repair, the latest first, and how many there
// are in all: what `creditd deadletters list --repaired` shows.
func (s *Store) ListRepairedForks(ctx context.Context, limit int) ([]DeadLetterRecord, int64, error) {
	if limit <= 0 || limit > MaxDeadLetterList {
		limit = MaxDeadLetterList
	}
	var total int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_letters
		WHERE resolved_at IS NOT NULL AND starts_with(resolution, $1)`, ForkResolutionPrefix).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("persist: count repaired forks: %w", err)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+deadLetterColumns+` FROM outbox_dead_letters
		WHERE resolved_at IS NOT NULL AND starts_with(resolution, $1)
		ORDER BY resolved_at DESC, id DESC LIMIT $2`, ForkResolutionPrefix, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("persist: list repaired forks: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterRecord, error) { return scanDeadLetter(r) })
	if err != nil {
		return nil, 0, fmt.Errorf("persist: list repaired forks: %w", err)
	}
	return out, total, nil
}
