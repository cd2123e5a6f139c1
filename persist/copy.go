package persist

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// The lean write (issue 10): a batch's new rows (operations, ledger
// entries, the events stored as sent) go in by COPY, which Postgres
// inserts page by page (one WAL record per page of rows rather than one
// per row) with no per-row conflict check: no speculative insertion, no
// ON CONFLICT index probe, no executor per row. Only the rows that are
// rewritten (accounts and blocks, one per customer and per block in the
// batch: columnsOf keeps the newest) still go through an upsert. A replay
// trips a unique key and Apply writes the batch again the ON CONFLICT way.

// Column lists of the copies, in the order copyApply gives the values.
var (
	operationCopyColumns = []string{"op_id", "tenant_id", "customer_id", "idempotency_key", "request_hash",
		"account_version", "mutation", "created_at"}
	entryCopyColumns = []string{"id", "op_id", "tenant_id", "customer_id", "environment", "delta", "type", "source",
		"credit_block_id", "billable_metric_key", "cost_units", "exchange_rate", "overage_mc", "idempotency_key",
		"reference_id", "reason", "metadata", "created_at", "draw_block_ids", "draw_amounts"}
	eventCopyColumns = []string{"id", "tenant_id", "environment", "customer_id", "event_type", "payload", "status",
		"attempts", "next_retry_at", "created_at"}
)

// copyApply writes ms in one transaction: COPY into operations and
// ledger_entries, then the upserts and sections in one pipelined batch,
// then COPY into webhook_events (the table order of queueApply). It fails
// with a unique violation when any row it copies is already stored.
func (s *Store) copyApply(ctx context.Context, ms []engine.Mutation) error {
	cols, err := columnsOf(ms)
	if err != nil {
		return err
	}
	plain, filled := eventRowsOf(ms)
	b := &pgx.Batch{}
	if err := queueStateAndSections(b, cols, ms); err != nil {
		return err
	}
	queueFilledEvents(b, filled)

	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	// After Commit, Rollback does nothing; on an error it ends the
	// transaction even if ctx has ended.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	if o := &cols.ops; len(o.opID) > 0 {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"operations"}, operationCopyColumns,
			pgx.CopyFromSlice(len(o.opID), func(i int) ([]any, error) {
				return []any{o.opID[i], o.tenant[i], o.customer[i], o.idem[i], o.rh[i], o.version[i], o.mutation[i], o.at[i]}, nil
			})); err != nil {
			return err
		}
	}
	if e := &cols.entries; len(e.id) > 0 {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"ledger_entries"}, entryCopyColumns,
			pgx.CopyFromSlice(len(e.id), func(i int) ([]any, error) {
				var blocks []uuid.UUID
				var amounts []int64
				if from, to := e.drawFrom[i], e.drawTo[i]; to >= from {
					blocks, amounts = e.drawBlock[from-1:to], e.drawAmount[from-1:to]
				}
				return []any{e.id[i], e.opID[i], e.tenant[i], e.customer[i], e.env[i], e.delta[i], e.typ[i], e.source[i],
					e.block[i], e.metric[i], e.units[i], e.rate[i], e.overage[i], e.idem[i], e.ref[i], e.reason[i],
					e.meta[i], e.at[i], blocks, amounts}, nil
			})); err != nil {
			return err
		}
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return err
	}
	if len(plain.id) > 0 {
		if _, err := tx.CopyFrom(ctx, pgx.Identifier{"webhook_events"}, eventCopyColumns,
			pgx.CopyFromSlice(len(plain.id), func(i int) ([]any, error) {
				return []any{plain.id[i], plain.tenant[i], plain.env[i], plain.customer[i], plain.typ[i], plain.body[i],
					string(engine.EventPending), int32(0), plain.at[i], plain.at[i]}, nil
			})); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// ReplayedApplies counts the Applies whose lean copy met a row already
// stored and that were written again with ON CONFLICT statements.
func (s *Store) ReplayedApplies() int64 { return s.replays.Load() }
