package persist

import (
	"context"
	"slices"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// The lean write (issue 10): a batch's new rows (operations, ledger
// entries, the events stored as sent) are inserted with no per-row
// conflict check: no speculative insertion, no ON CONFLICT index probe and
// its confirmation WAL record. Only the rows that are rewritten (accounts
// and blocks, one per customer and per block in the batch: columnsOf keeps
// the newest) still go through an upsert. A replay trips a unique key and
// Apply writes the batch again the ON CONFLICT way.
//
// A big batch goes in by COPY, which Postgres inserts page by page (one
// WAL record per page of rows rather than one per row, no executor per
// row) but which costs up to seven round trips (BEGIN, the fork check,
// COPY operations and ledger_entries, the upserts, COPY webhook_events when
// the events are stored as sent, COMMIT); a small one is one pipelined
// round trip of plain INSERTs.
// Postgres CPU per consume (persist/profile_test.go, schedstat, 3 runs):
// groups of 30, ~64 µs by COPY and ~59 by INSERT; of 60, ~53 both; of
// 150, ~47 and ~51; of 300, ~44 and ~48.

// copyMinMutations is the smallest batch copyApply writes; smaller ones
// go through insertApply.
const copyMinMutations = 60

// Apply's INSERTs without their ON CONFLICT clause: the lean write lets a
// stored row fail the batch instead.
var (
	freshOperationsSQL = withoutConflictClause(insertOperationsSQL)
	freshEntriesSQL    = withoutConflictClause(insertEntriesSQL)
)

// withoutConflictClause cuts sql's trailing ON CONFLICT clause.
func withoutConflictClause(sql string) string {
	i := strings.LastIndex(sql, "ON CONFLICT")
	if i < 0 {
		panic("persist: no ON CONFLICT clause in " + sql)
	}
	return sql[:i]
}

// insertApply is the lean write of a small batch: queueApply's statements
// and order without the conflict clauses, in one pipelined round trip
// (pgx commits a batch as one implicit transaction).
//
// When every event is stored as sent (leanEvents), the counters are
// bumped first and the entries and rows take their sequences from them
// (eventCopy); else the events are numbered by freshEventsSQL at the end.
func (s *Store) insertApply(ctx context.Context, ms []engine.Mutation, alerts *alertOutcome) error {
	b := &pgx.Batch{}
	events, plain, filled := leanEvents(ms, alerts, s.shape())
	var back map[uuid.UUID]int64
	if events != nil {
		events.queueBump(b)
		back = events.entrySequences(false)
	} else {
		// The counters first all the same: every writer's lock order.
		queueLockSequences(b, ms)
	}
	if err := queueRows(b, ms, true, s.shape(), back); err != nil {
		return err
	}
	if events != nil {
		events.queueInsert(b)
	} else {
		queueEventRows(b, plain, filled, freshEventsSQL)
	}
	queueAlertStates(b, alerts)
	return s.pool.SendBatch(ctx, b).Close()
}

// leanEvents is the events of ms for a lean write: an eventCopy of the
// rows and carried events when none needs completing in SQL and there is
// any, else nil and the rows (none carried) for freshEventsSQL.
func leanEvents(ms []engine.Mutation, alerts *alertOutcome, shape recordShape) (events *eventCopy, plain, filled *eventBatch) {
	// Only a Mutation without a Context owes rows to complete in SQL, which
	// are numbered there with the others: a batch holding one carries
	// nothing, decided before the rows are derived, once.
	carry := !slices.ContainsFunc(ms, func(m engine.Mutation) bool { return m.Context == nil })
	plain, filled, carried := eventRowsOf(ms, alerts, shape, carry)
	if len(filled.id) > 0 {
		return nil, plain, filled
	}
	if c := newEventCopy(plain, carried); !c.empty() {
		return c, plain, filled
	}
	return nil, plain, filled
}

// Column lists of the copies, in the order copyApply gives the values:
// those of Apply's INSERTs, so the two writes cannot drift apart.
var (
	operationCopyColumns = insertColumns(insertOperationsSQL)
	entryCopyColumns     = insertColumns(insertEntriesSQL)
)

// insertColumns is the column list of sql's INSERT INTO table (...) clause.
func insertColumns(sql string) []string {
	open, end := strings.Index(sql, "("), strings.Index(sql, ")")
	if open < 0 || end < open {
		panic("persist: no column list in " + sql)
	}
	cols := strings.Split(sql[open+1:end], ",")
	for i := range cols {
		cols[i] = strings.TrimSpace(cols[i])
	}
	return cols
}

// copyApply writes ms in one transaction: COPY into operations and
// ledger_entries, then the upserts and sections in one pipelined batch,
// then the events (by COPY when they are stored as sent, else by INSERT
// at the batch's end: the table order of queueApply). It fails
// with a unique violation when any row it copies is already stored.
func (s *Store) copyApply(ctx context.Context, ms []engine.Mutation, alerts *alertOutcome) error {
	steps, err := copySteps(ms, alerts, s.shape())
	if err != nil {
		return err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	// After Commit, Rollback does nothing; on an error it ends the
	// transaction even if ctx has ended.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	for _, step := range steps {
		if err := step.run(ctx, tx); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// copyStep is one round trip of copyApply, named for the profile.
type copyStep struct {
	name string
	run  func(ctx context.Context, tx pgx.Tx) error
	// batch is the step's statements when it sends one batch, so a
	// profile can run them one by one.
	batch *pgx.Batch
	// read, when set, reads the rows of the batch's first statement.
	read func(pgx.Rows) error
}

// copySteps are copyApply's round trips for ms, in order.
func copySteps(ms []engine.Mutation, alerts *alertOutcome, shape recordShape) ([]copyStep, error) {
	cols, err := columnsOf(ms, shape)
	if err != nil {
		return nil, err
	}
	b := &pgx.Batch{}
	// The rollup of the copied entries comes first: the table order of
	// queueRows.
	queueUsageSummed(b, cols)
	if err := queueStateAndSections(b, cols, ms); err != nil {
		return nil, err
	}
	// Events stored as sent go in by COPY, numbered from the counters the
	// first step bumps and reads back (eventCopy), and so do the entries
	// that carry events; a group with events to complete in SQL inserts
	// them with freshEventsSQL.
	events, plain, filled := leanEvents(ms, alerts, shape)
	if events == nil {
		queueEventRows(b, plain, filled, freshEventsSQL)
	}
	queueAlertStates(b, alerts)
	check := &pgx.Batch{}
	if events != nil {
		events.queueBump(check)
	} else {
		// The counters first all the same: every writer's lock order.
		queueLockSequences(check, ms)
	}
	queueForkCheck(check, ms)
	// The fork check reads the accounts before anything of the batch is in.
	var steps []copyStep
	if check.Len() > 0 {
		first := copyStep{name: "fork check", batch: check, run: func(ctx context.Context, tx pgx.Tx) error {
			return tx.SendBatch(ctx, check).Close()
		}}
		if events != nil {
			first.read = events.readSequences
			first.run = func(ctx context.Context, tx pgx.Tx) error {
				return sendReadingFirst(ctx, tx, check, events.readSequences)
			}
		}
		steps = append(steps, first)
	}

	copyIn := func(table string, columns []string, n int, row func(i int) []any) {
		if n == 0 {
			return
		}
		steps = append(steps, copyStep{name: "COPY " + table, run: func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{table}, columns,
				pgx.CopyFromSlice(n, func(i int) ([]any, error) { return row(i), nil }))
			return err
		}})
	}
	o := &cols.ops
	copyIn("operations", operationCopyColumns, len(o.opID), func(i int) []any {
		// Ids by pointer into their columns: boxing a pointer does not
		// allocate, and registerUUID encodes it as the id (issue 26).
		return []any{&o.opID[i], &o.tenant[i], &o.customer[i], o.idem[i], o.rh[i], o.version[i], o.mutation[i], o.at[i]}
	})
	e := &cols.entries
	var carried []*int64
	copyIn("ledger_entries", entryCopyColumns, len(e.id), func(i int) []any {
		if carried == nil {
			// The first step has numbered the events by now.
			carried = make([]*int64, len(e.id))
			if events != nil {
				carried = e.carried(events.entrySequences(true))
			}
		}
		var blocks []uuid.UUID
		var amounts []int64
		if from, to := e.drawFrom[i], e.drawTo[i]; to >= from {
			blocks, amounts = e.drawBlock[from-1:to], e.drawAmount[from-1:to]
		}
		return []any{&e.id[i], &e.opID[i], &e.tenant[i], &e.customer[i], e.env[i], e.delta[i], e.typ[i], e.source[i],
			e.block[i], e.metric[i], e.units[i], e.rate[i], e.overage[i], e.idem[i], e.ref[i], e.reason[i],
			e.meta[i], e.at[i], blocks, amounts, e.head[i], carried[i]}
	})
	steps = append(steps, copyStep{name: "upserts", batch: b, run: func(ctx context.Context, tx pgx.Tx) error {
		return tx.SendBatch(ctx, b).Close()
	}})
	if events != nil && len(events.rows.id) > 0 {
		steps = append(steps, copyStep{name: "COPY webhook_events", run: events.copyIn})
	}
	return steps, nil
}

// sendReadingFirst sends b in tx and hands the rows of its first statement
// to read.
func sendReadingFirst(ctx context.Context, tx pgx.Tx, b *pgx.Batch, read func(pgx.Rows) error) error {
	res := tx.SendBatch(ctx, b)
	defer res.Close()
	rows, err := res.Query()
	if err != nil {
		return err
	}
	err = read(rows)
	rows.Close()
	if err == nil {
		err = rows.Err()
	}
	if err != nil {
		return err
	}
	for range b.Len() - 1 {
		if _, err := res.Exec(); err != nil {
			return err
		}
	}
	return res.Close()
}

// ReplayedApplies counts the Applies whose lean copy met a row already
// stored and that were written again with ON CONFLICT statements.
func (s *Store) ReplayedApplies() int64 { return s.replays.Load() }
