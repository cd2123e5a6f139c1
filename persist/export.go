package persist

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// What `creditd export` reads (issue 30 item 3): a tenant's ledger and
// events of a time range, streamed row by row (pgx hands rows over as
// they arrive, so memory does not grow with the range), each in a stable
// order so an export run twice writes the same files.

// ExportTenants lists the tenants with ledger entries created in [from,
// to), or tenant alone when it has any; sorted.
func (s *Store) ExportTenants(ctx context.Context, tenant *uuid.UUID, from, to time.Time) ([]uuid.UUID, error) {
	rows, err := s.pool.Query(ctx, `SELECT t.id FROM tenants t
		WHERE ($1::uuid IS NULL OR t.id = $1)
			AND EXISTS (SELECT 1 FROM ledger_entries l WHERE l.tenant_id = t.id AND l.created_at >= $2 AND l.created_at < $3)
		ORDER BY t.id`, tenant, from, to)
	if err != nil {
		return nil, fmt.Errorf("persist: export tenants: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return nil, fmt.Errorf("persist: export tenants: %w", err)
	}
	return ids, nil
}

// ExportLedger hands each ledger entry of tenant created in [from, to) to
// each, by (created_at, id), both environments; each's error stops the
// read and is returned.
func (s *Store) ExportLedger(ctx context.Context, tenant uuid.UUID, from, to time.Time, each func(engine.LedgerEntry) error) error {
	rows, err := s.pool.Query(ctx, `SELECT `+entryColumns+` FROM ledger_entries
		WHERE tenant_id = $1 AND created_at >= $2 AND created_at < $3
		ORDER BY created_at, id`, tenant, from, to)
	if err != nil {
		return fmt.Errorf("persist: export ledger: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return fmt.Errorf("persist: export ledger: %w", err)
		}
		if err := each(e); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("persist: export ledger: %w", err)
	}
	return nil
}

// exportEventsPage bounds the events ExportEvents holds at once (twice
// over: a page of rows and one of carried events).
const exportEventsPage = 1000

// ExportEvents hands each event of tenant created in [from, to) to each,
// by sequence: the rows and the carried events (carried.go) merged, each
// read in one form, in one snapshot (readEvents). Both are read a page at
// a time by sequence (their (tenant, sequence) indexes), so memory stays
// bounded; the walk starts at the tenant's first event and skips those
// outside the range.
func (s *Store) ExportEvents(ctx context.Context, tenant uuid.UUID, from, to time.Time, each func(engine.Event) error) error {
	return s.readEvents(ctx, func(tx pgx.Tx) error {
		var after int64
		for {
			rows, err := tx.Query(ctx, `SELECT `+eventColumns+` FROM webhook_events
				WHERE tenant_id = $1 AND sequence > $2 AND created_at >= $3 AND created_at < $4
				ORDER BY sequence LIMIT $5`, tenant, after, from, to, exportEventsPage)
			if err != nil {
				return fmt.Errorf("persist: export events: %w", err)
			}
			stored, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.Event, error) { return scanEvent(r) })
			if err != nil {
				return fmt.Errorf("persist: export events: %w", err)
			}
			rows, err = tx.Query(ctx, `SELECT `+carriedColumns+` FROM ledger_entries
				WHERE tenant_id = $1 AND event_sequence IS NOT NULL
					AND event_sequence > GREATEST($2::bigint,
						COALESCE((SELECT through FROM event_carried_through WHERE tenant_id = $1), 0))
					AND created_at >= $3 AND created_at < $4
				ORDER BY event_sequence LIMIT $5`, tenant, after, from, to, exportEventsPage)
			if err != nil {
				return fmt.Errorf("persist: export events: %w", err)
			}
			carried, err := pgx.CollectRows(rows, scanCarried)
			if err != nil {
				return fmt.Errorf("persist: export events: %w", err)
			}
			// Each page holds its source's first events after after, so the
			// first page's worth of the two merged are the first of all.
			page := mergeBySequence(stored, carried, true, exportEventsPage)
			if len(page) == 0 {
				return nil
			}
			for _, e := range page {
				if err := each(e); err != nil {
					return err
				}
			}
			after = *page[len(page)-1].Sequence
		}
	})
}
