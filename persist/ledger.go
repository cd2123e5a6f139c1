package persist

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// The ON CONFLICT statements of Apply (a replay, a dead-letter retry)
// each take whole columns as arrays and unnest them, so a batch of any
// size is one pipelined round trip inside one transaction. Rows are sorted
// by key first, so two Applies racing on the same rows lock them in the
// same order and cannot deadlock.

const insertOperationsSQL = `INSERT INTO operations
	(op_id, tenant_id, customer_id, idempotency_key, request_hash, account_version, mutation, created_at)
SELECT op_id, tenant_id, customer_id, idem, rh, version, m, at
FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::timestamptz[])
	AS t(op_id, tenant_id, customer_id, idem, rh, version, m, at)
ON CONFLICT (tenant_id, idempotency_key, op_id, created_at) DO NOTHING`

// insertEntriesSQL takes the entries' draws as two flat arrays ($19 block
// ids, $20 amounts) and each entry's 1-based range in them ($21..$22), so
// an entry that several blocks paid gets its draws as slices of typed
// arrays: no JSON, no side-table rows (migration 012). $23 is each entry's
// op_head, NULL but on the main entry of a lean consume, reserve, commit
// or release (ophead.go). $24 is
// each entry's back when it carries its consume's event (carried.go), NULL
// for most: the entry's event_sequence is its tenant's counter, bumped
// earlier in the transaction (eventCopy.queueBump), minus back.
const insertEntriesSQL = `INSERT INTO ledger_entries
	(id, op_id, tenant_id, customer_id, environment, delta, type, source, credit_block_id,
	 billable_metric_key, cost_units, exchange_rate, overage_mc, idempotency_key, reference_id,
	 reason, metadata, created_at, draw_block_ids, draw_amounts, op_head, event_sequence)
SELECT id, op_id, tenant_id, customer_id, env, delta, type, source, block, metric, units, rate,
	overage, idem, ref, reason, meta::jsonb, at,
	CASE WHEN dto >= dfrom THEN ($19::uuid[])[dfrom:dto] END,
	CASE WHEN dto >= dfrom THEN ($20::bigint[])[dfrom:dto] END, head,
	CASE WHEN back IS NOT NULL THEN (SELECT s.next FROM event_sequences s WHERE s.tenant_id = t.tenant_id) - back END
FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::uuid[], $5::text[], $6::bigint[], $7::text[],
	$8::text[], $9::uuid[], $10::text[], $11::bigint[], $12::bigint[], $13::bigint[], $14::text[],
	$15::uuid[], $16::text[], $17::text[], $18::timestamptz[], $21::int[], $22::int[], $23::text[], $24::bigint[])
	AS t(id, op_id, tenant_id, customer_id, env, delta, type, source, block, metric, units, rate,
	     overage, idem, ref, reason, meta, at, dfrom, dto, head, back)
ON CONFLICT (id, tenant_id, created_at) DO NOTHING`

// upsertBlocksSQL keeps a block's stored metadata when the incoming row has
// none: only the Mutation that creates a block carries its metadata (a
// drain does not copy it, invariant 13), and metadata never changes after.
// Its scope (applies_to, migration 030) likewise: $13 holds each one as a
// text[] literal, NULL when the row names none.
const upsertBlocksSQL = `INSERT INTO credit_blocks AS b
	(id, tenant_id, customer_id, original_amount, remaining_amount, priority, source, starts_at,
	 expires_at, created_at, metadata, version, applies_to)
SELECT id, tenant_id, customer_id, original, remaining, priority, source, starts, expires,
	created, meta::jsonb, version, scope::text[]
FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::bigint[], $5::bigint[], $6::int[], $7::text[],
	$8::timestamptz[], $9::timestamptz[], $10::timestamptz[], $11::text[], $12::bigint[], $13::text[])
	AS t(id, tenant_id, customer_id, original, remaining, priority, source, starts, expires,
	     created, meta, version, scope)
ON CONFLICT (id, tenant_id) DO UPDATE SET
	original_amount = EXCLUDED.original_amount, remaining_amount = EXCLUDED.remaining_amount,
	priority = EXCLUDED.priority, source = EXCLUDED.source, starts_at = EXCLUDED.starts_at,
	expires_at = EXCLUDED.expires_at, created_at = EXCLUDED.created_at,
	metadata = CASE WHEN EXCLUDED.metadata = '{}'::jsonb THEN b.metadata ELSE EXCLUDED.metadata END,
	applies_to = COALESCE(EXCLUDED.applies_to, b.applies_to),
	version = EXCLUDED.version
WHERE b.version < EXCLUDED.version`

// upsertAccountsSQL also stores the op that set the version (op_id) and its
// outbox entry's stream id milliseconds (outbox_ms, NULL when unknown),
// which credit_fork_check compares (migration 015).
const upsertAccountsSQL = `INSERT INTO credit_accounts AS a
	(customer_id, id, tenant_id, environment, balance, reserved_balance, pending_balance,
	 lifetime_earned, version, updated_at, op_id, outbox_ms, debt)
SELECT customer_id, NULLIF(id, '')::uuid, tenant_id, env, balance, reserved, pending, earned,
	version, at, op, NULLIF(outbox, 0), debt
FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::bigint[], $6::bigint[],
	$7::bigint[], $8::bigint[], $9::bigint[], $10::timestamptz[], $11::uuid[], $12::bigint[], $13::bigint[])
	AS t(customer_id, id, tenant_id, env, balance, reserved, pending, earned, version, at, op, outbox, debt)
ON CONFLICT (customer_id, tenant_id) DO UPDATE SET
	id = COALESCE(EXCLUDED.id, a.id), tenant_id = EXCLUDED.tenant_id,
	environment = EXCLUDED.environment, balance = EXCLUDED.balance,
	reserved_balance = EXCLUDED.reserved_balance, pending_balance = EXCLUDED.pending_balance,
	lifetime_earned = EXCLUDED.lifetime_earned, version = EXCLUDED.version,
	updated_at = EXCLUDED.updated_at, op_id = EXCLUDED.op_id, outbox_ms = EXCLUDED.outbox_ms,
	debt = EXCLUDED.debt
WHERE a.version < EXCLUDED.version`

// forkCheckSQL refuses a batch holding an op of a second history of an
// account (SQLSTATE 23F01, migration 015); it runs before the batch writes
// anything, so a new op's own entries cannot vouch for it.
const forkCheckSQL = `SELECT credit_fork_check($1::uuid[], $2::bigint[], $3::uuid[], $4::uuid[], $5::bigint[])`

// forkRefused is the SQLSTATE of credit_fork_check.
const forkRefused = "23F01"

// outboxFenceSQL refuses a transaction that comes with an outbox lease
// older than one a commit of the same partition came with (SQLSTATE
// 55F01, migration 022).
const outboxFenceSQL = `SELECT credit_outbox_fence($1::int[], $2::bigint[])`

// leaseStale is the SQLSTATE of credit_outbox_fence: the persister lost the
// partition to another one, which committed already.
const leaseStale = "55F01"

// queueOutboxFence queues outboxFenceSQL for the partitions whose entries
// in ms came with a lease (Mutation.OutboxLease), the greatest token of
// each, in partition order.
func queueOutboxFence(b *pgx.Batch, ms []engine.Mutation) {
	var fences map[int]int64
	for i := range ms {
		m := &ms[i]
		if m.OutboxLease == 0 {
			continue
		}
		if fences == nil {
			fences = map[int]int64{}
		}
		if t, ok := fences[m.OutboxPartition]; !ok || t < m.OutboxLease {
			fences[m.OutboxPartition] = m.OutboxLease
		}
	}
	if len(fences) == 0 {
		return
	}
	parts := make([]int32, 0, len(fences))
	for p := range fences {
		parts = append(parts, int32(p))
	}
	slices.Sort(parts)
	tokens := make([]int64, len(parts))
	for i, p := range parts {
		tokens[i] = fences[int(p)]
	}
	b.Queue(outboxFenceSQL, parts, tokens)
}

// queueForkCheck queues the outbox fence (queueOutboxFence), then
// forkCheckSQL for the state-changing Mutations of ms: all but refusal
// records, which keep the version they found.
func queueForkCheck(b *pgx.Batch, ms []engine.Mutation) {
	queueOutboxFence(b, ms)
	customers := make([]uuid.UUID, 0, len(ms))
	versions := make([]int64, 0, len(ms))
	ops := make([]uuid.UUID, 0, len(ms))
	entries := make([]*uuid.UUID, 0, len(ms))
	outbox := make([]int64, 0, len(ms))
	for i := range ms {
		m := &ms[i]
		if refused(m) {
			continue
		}
		customers = append(customers, m.CustomerID)
		versions = append(versions, m.Account.Version)
		ops = append(ops, m.OpID)
		var first *uuid.UUID
		if len(m.Entries) > 0 {
			id := engine.EntryID(m.OpID, 0)
			first = &id
		}
		entries = append(entries, first)
		outbox = append(outbox, m.OutboxMS)
	}
	if len(customers) > 0 {
		b.Queue(forkCheckSQL, customers, versions, ops, entries, outbox)
	}
}

// refused tells whether m is a refusal record (a consume, reservation or commit
// refused for credit under block): no entries, the version it found.
func refused(m *engine.Mutation) bool { return m.Usage != nil && m.Usage.Refused }

// Apply writes ms in one transaction, idempotently (engine.LedgerWriter):
// operations with an idempotency key and ledger entries (id
// engine.EntryID(op, i)) are inserted unless present; blocks and accounts
// are upserted only when the incoming account version is newer than the
// stored one, so a late or replayed Mutation never rolls state back
// (invariant 5). It is safe to call with the same batch twice or from
// several goroutines at once.
//
// It first tries the lean write (copy.go): operations, entries and events
// inserted with no per-row conflict check. A batch holding a Mutation
// already stored (a replay after a crash between commit and
// acknowledgement, or a claimed batch another process committed) fails
// that on a unique key and is written again with the per-row ON CONFLICT
// statements, which skip what is there.
func (s *Store) Apply(ctx context.Context, ms []engine.Mutation) error {
	if len(ms) == 0 {
		return nil
	}
	alerts, err := s.beforeApply(ctx, s.pool, ms)
	if err != nil {
		return fmt.Errorf("persist: apply %d mutations: %w", len(ms), err)
	}
	if len(ms) >= s.copyMin {
		err = s.copyApply(ctx, ms, alerts)
	} else {
		err = s.insertApply(ctx, ms, alerts)
	}
	if sqlState(err) == uniqueViolation {
		s.replays.Add(1)
		err = s.pipelinedApply(ctx, ms, alerts)
	}
	if err != nil {
		return fmt.Errorf("persist: apply %d mutations: %w", len(ms), err)
	}
	return nil
}

// pipelinedApply writes ms with the ON CONFLICT statements in one
// pipelined round trip: pgx runs a batch in one implicit transaction
// (committed at its Sync, rolled back at the first error), so BEGIN and
// COMMIT need no round trips of their own.
func (s *Store) pipelinedApply(ctx context.Context, ms []engine.Mutation, alerts *alertOutcome) error {
	b := &pgx.Batch{}
	if err := queueApply(b, ms, alerts, s.shape()); err != nil {
		return err
	}
	return s.pool.SendBatch(ctx, b).Close()
}

// applyIn is Apply's statements inside tx, so a dead-letter replay can
// commit them with its own bookkeeping (deadletter.go); alerts are the
// alert events and states of ms and its low-balance thresholds
// (beforeApply), nil for none; shape is the Store's (Store.shape).
func applyIn(ctx context.Context, tx pgx.Tx, ms []engine.Mutation, alerts *alertOutcome, shape recordShape) error {
	b := &pgx.Batch{}
	if err := queueApply(b, ms, alerts, shape); err != nil {
		return err
	}
	return tx.SendBatch(ctx, b).Close()
}

// queueApply queues Apply's ON CONFLICT statements for ms into b. Every
// writer of these tables takes them in one order (operations, entries,
// blocks, accounts, the sections, events; rows sorted by key within each),
// so two transactions racing on the same rows wait rather than deadlock.
func queueApply(b *pgx.Batch, ms []engine.Mutation, alerts *alertOutcome, shape recordShape) error {
	queueLockSequences(b, ms)
	if err := queueRows(b, ms, false, shape, nil); err != nil {
		return err
	}
	queueEvents(b, ms, alerts, insertMutationEventsSQL, shape)
	return nil
}

// queueRows queues ms's operations and ledger entries (lean: without
// their conflict clauses, copy.go), the usage rollup, then the block and
// account upserts and the sections: every write path takes the tables in
// this one order.
//
// carriedBack maps each entry that carries its consume's event to its back
// (eventCopy.entrySequences); nil when none does.
func queueRows(b *pgx.Batch, ms []engine.Mutation, lean bool, shape recordShape, carriedBack map[uuid.UUID]int64) error {
	operationsSQL, entriesSQL := insertOperationsSQL, insertEntriesSQL
	if lean {
		operationsSQL, entriesSQL = freshOperationsSQL, freshEntriesSQL
	}
	cols, err := columnsOf(ms, shape)
	if err != nil {
		return err
	}
	queueForkCheck(b, ms)
	if o := cols.ops; len(o.opID) > 0 {
		b.Queue(operationsSQL, o.opID, o.tenant, o.customer, o.idem, o.rh, o.version, o.mutation, o.at)
	}
	if e := cols.entries; len(e.id) > 0 {
		args := []any{e.id, e.opID, e.tenant, e.customer, e.env, e.delta, e.typ, e.source,
			e.block, e.metric, e.units, e.rate, e.overage, e.idem, e.ref, e.reason, e.meta, e.at,
			e.drawBlock, e.drawAmount, e.drawFrom, e.drawTo, e.head, e.carried(carriedBack)}
		if lean {
			// The lean insert stores every entry or fails the batch, so the
			// rollup takes them all (usage.go).
			b.Queue(entriesSQL, args...)
			queueUsageSummed(b, cols)
		} else if u, ok := usageContributions(cols); ok {
			// Some entries may be stored already: the rollup takes only
			// those this insert returns.
			b.Queue(insertEntriesUsageSQL, append(args, u.entry, u.customer, u.hour, u.metric, u.tenant,
				u.env, u.units, u.cost)...)
		} else {
			b.Queue(entriesSQL, args...)
		}
	}
	return queueStateAndSections(b, cols, ms)
}

// queueStateAndSections queues the block and account upserts and the
// optional sections (reservations, gauges).
func queueStateAndSections(b *pgx.Batch, cols *applyColumns, ms []engine.Mutation) error {
	if k := cols.blocks; len(k.id) > 0 {
		b.Queue(upsertBlocksSQL, k.id, k.tenant, k.customer, k.original, k.remaining, k.priority, k.source,
			k.starts, k.expires, k.created, k.meta, k.version, k.scope)
	}
	a := cols.accounts
	b.Queue(upsertAccountsSQL, a.customer, a.id, a.tenant, a.env, a.balance, a.reserved, a.pending,
		a.earned, a.version, a.at, a.op, a.outbox, a.debt)
	for _, section := range sectionWriters {
		if err := section.queue(b, ms); err != nil {
			return fmt.Errorf("%s: %w", section.name, err)
		}
	}
	return nil
}

// applyColumns are Apply's rows, column by column.
type applyColumns struct {
	ops struct {
		opID, tenant, customer []uuid.UUID
		idem, rh, mutation     []string
		version                []int64
		at                     []time.Time
	}
	entries  entryCols
	blocks   blockCols
	accounts accountCols
}

// blockCols are Apply's credit blocks, column by column.
type blockCols struct {
	id, tenant, customer         []uuid.UUID
	original, remaining, version []int64
	priority                     []int32
	source, meta                 []string
	scope                        []*string // "{a,b}" text[] literals, nil for none
	starts, created              []time.Time
	expires                      []*time.Time
}

// presize gives every column room for n blocks (entryCols.presize).
func (k *blockCols) presize(n int) {
	k.id, k.tenant, k.customer = make([]uuid.UUID, 0, n), make([]uuid.UUID, 0, n), make([]uuid.UUID, 0, n)
	k.original, k.remaining, k.version = make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
	k.priority = make([]int32, 0, n)
	k.source, k.meta = make([]string, 0, n), make([]string, 0, n)
	k.scope, k.expires = make([]*string, 0, n), make([]*time.Time, 0, n)
	k.starts, k.created = make([]time.Time, 0, n), make([]time.Time, 0, n)
}

// accountCols are Apply's credit accounts, column by column.
type accountCols struct {
	customer, tenant, op                        []uuid.UUID
	id, env                                     []string
	balance, reserved, pending, earned, version []int64
	outbox, debt                                []int64
	at                                          []time.Time
}

// presize gives every column room for n accounts (entryCols.presize).
func (a *accountCols) presize(n int) {
	a.customer, a.tenant, a.op = make([]uuid.UUID, 0, n), make([]uuid.UUID, 0, n), make([]uuid.UUID, 0, n)
	a.id, a.env = make([]string, 0, n), make([]string, 0, n)
	a.balance, a.reserved, a.pending = make([]int64, 0, n), make([]int64, 0, n), make([]int64, 0, n)
	a.earned, a.version = make([]int64, 0, n), make([]int64, 0, n)
	a.outbox, a.debt = make([]int64, 0, n), make([]int64, 0, n)
	a.at = make([]time.Time, 0, n)
}

// entryCols are Apply's ledger entries, column by column.
type entryCols struct {
	id, opID, tenant, customer []uuid.UUID
	env, typ, idem, meta       []string
	source, metric, reason     []*string
	// head is each entry's op_head (ophead.go), nil for most.
	head           []*string
	block, ref     []*uuid.UUID
	delta, overage []int64
	units, rate    []*int64
	at             []time.Time
	// The draws of every entry, flat, and each entry's 1-based
	// inclusive range in them (to < from: none).
	drawBlock        []uuid.UUID
	drawAmount       []int64
	drawFrom, drawTo []int32
}

// presize gives every column room for n entries (and their draws, two
// each as a consume's), so columnsOf's appends do not grow them step by
// step.
func (e *entryCols) presize(n int) {
	e.id, e.opID = make([]uuid.UUID, 0, n), make([]uuid.UUID, 0, n)
	e.tenant, e.customer = make([]uuid.UUID, 0, n), make([]uuid.UUID, 0, n)
	e.env, e.typ = make([]string, 0, n), make([]string, 0, n)
	e.idem, e.meta = make([]string, 0, n), make([]string, 0, n)
	e.source, e.metric, e.reason = make([]*string, 0, n), make([]*string, 0, n), make([]*string, 0, n)
	e.head = make([]*string, 0, n)
	e.block, e.ref = make([]*uuid.UUID, 0, n), make([]*uuid.UUID, 0, n)
	e.delta, e.overage = make([]int64, 0, n), make([]int64, 0, n)
	e.units, e.rate = make([]*int64, 0, n), make([]*int64, 0, n)
	e.at = make([]time.Time, 0, n)
	e.drawBlock, e.drawAmount = make([]uuid.UUID, 0, 2*n), make([]int64, 0, 2*n)
	e.drawFrom, e.drawTo = make([]int32, 0, n), make([]int32, 0, n)
}

// carried is each entry's value from byEntry (a back or a sequence of
// the event it carries, eventCopy.entrySequences), nil for an entry that
// carries none.
func (e *entryCols) carried(byEntry map[uuid.UUID]int64) []*int64 {
	out := make([]*int64, len(e.id))
	if len(byEntry) == 0 {
		return out
	}
	for i, id := range e.id {
		if n, ok := byEntry[id]; ok {
			out[i] = &n
		}
	}
	return out
}

// queueLockSequences takes the event counters of ms's tenants (sorted)
// before any other statement, as every writer of the ledger does
// (eventCopy), so the ON CONFLICT write, which numbers its events last,
// waits for a lean write of the same tenant rather than deadlocking with
// it.
func queueLockSequences(b *pgx.Batch, ms []engine.Mutation) {
	tenants := make([]uuid.UUID, 0, 1)
	for i := range ms {
		tenants = append(tenants, ms[i].TenantID)
	}
	slices.SortFunc(tenants, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	tenants = slices.Compact(tenants)
	b.Queue(lockSequencesSQL, tenants)
}

// lockSequencesSQL takes the counter rows of tenants $1 (sorted), creating
// them at 0.
const lockSequencesSQL = `INSERT INTO event_sequences AS s (tenant_id, next)
SELECT unnest($1::uuid[]), 0
ON CONFLICT (tenant_id) DO UPDATE SET next = s.next`

// entryRow is one ledger entry before it is split into columns.
type entryRow struct {
	id   uuid.UUID
	m    *engine.Mutation
	e    *engine.MutationEntry
	head *string
}

// blockRow is the newest state of one block within the batch.
type blockRow struct {
	b       *engine.MutationBlock
	m       *engine.Mutation
	version int64
}

// columnsOf flattens ms into columns. A Mutation delivered twice in one
// batch counts once, and a block or account changed by several Mutations
// keeps only its newest version: one statement may not upsert a row twice.
// In the lean shape a consume's operation record is its main entry's
// op_head instead of an operations row (ophead.go).
func columnsOf(ms []engine.Mutation, shape recordShape) (*applyColumns, error) {
	c := &applyColumns{}
	seenOp := make(map[uuid.UUID]bool, len(ms))
	// Sized for a group of consumes (an entry, a block and an account
	// each at most), so the appends and the maps do not grow step by step.
	entries := make([]entryRow, 0, len(ms))
	blocks := make(map[uuid.UUID]blockRow, len(ms))
	accounts := make(map[uuid.UUID]*engine.Mutation, len(ms))
	ops := make([]*engine.Mutation, 0, len(ms))
	for i := range ms {
		m := &ms[i]
		if seenOp[m.OpID] {
			continue
		}
		seenOp[m.OpID] = true
		headAt, head := -1, ""
		if shape == shapeLean {
			var ok bool
			if head, headAt, ok = leanHead(m); !ok {
				headAt = -1
			}
		}
		if m.IdempotencyKey != "" && headAt < 0 {
			ops = append(ops, m)
		}
		for j := range m.Entries {
			r := entryRow{id: engine.EntryID(m.OpID, j), m: m, e: &m.Entries[j]}
			if j == headAt {
				r.head = &head
			}
			entries = append(entries, r)
		}
		for j := range m.Blocks {
			b := &m.Blocks[j]
			cur, ok := blocks[b.ID]
			switch {
			case !ok:
				blocks[b.ID] = blockRow{b: b, m: m, version: m.Account.Version}
			case cur.version < m.Account.Version:
				// The newer state of a block created earlier in the batch:
				// keep the creating Mutation's metadata, which a drain omits.
				// Its scope likewise (docs/rules.md "Credits scoped to
				// metrics": only the creating Mutation names it).
				if (len(b.Metadata) == 0 && len(cur.b.Metadata) > 0) || (len(b.Scope) == 0 && len(cur.b.Scope) > 0) {
					nb := *b
					if len(nb.Metadata) == 0 {
						nb.Metadata = cur.b.Metadata
					}
					if len(nb.Scope) == 0 {
						nb.Scope = cur.b.Scope
					}
					b = &nb
				}
				blocks[b.ID] = blockRow{b: b, m: m, version: m.Account.Version}
			case (len(cur.b.Metadata) == 0 && len(b.Metadata) > 0) || (len(cur.b.Scope) == 0 && len(b.Scope) > 0):
				nb := *cur.b
				if len(nb.Metadata) == 0 {
					nb.Metadata = b.Metadata
				}
				if len(nb.Scope) == 0 {
					nb.Scope = b.Scope
				}
				cur.b = &nb
				blocks[b.ID] = cur
			}
		}
		// A refusal record carries the state and version another op set
		// (that op's Mutation writes them): it owns no version, so it never
		// writes the account row, and a refusal that reaches Postgres
		// before the op it follows (a replayed dead letter) cannot take
		// that op's version from it (issue 25).
		if refused(m) {
			continue
		}
		if cur, ok := accounts[m.CustomerID]; !ok || cur.Account.Version < m.Account.Version {
			accounts[m.CustomerID] = m
		}
	}

	// slices.SortFunc rather than sort.Slice: no reflection to swap, and
	// the keys are unique, so the order is the same.
	slices.SortFunc(ops, func(a, b *engine.Mutation) int { return bytes.Compare(a.OpID[:], b.OpID[:]) })
	o := &c.ops
	o.opID, o.tenant, o.customer = make([]uuid.UUID, 0, len(ops)), make([]uuid.UUID, 0, len(ops)), make([]uuid.UUID, 0, len(ops))
	o.idem, o.rh = make([]string, 0, len(ops)), make([]string, 0, len(ops))
	o.version, o.at = make([]int64, 0, len(ops)), make([]time.Time, 0, len(ops))
	// The batch's documents (json.Marshal's bytes, written by hand) go
	// into one buffer made one string, each document a slice of it: a few
	// allocations a batch instead of several a document.
	// A consume's document is some 700 bytes.
	docs := make([]byte, 0, 768*len(ops))
	ends := make([]int, 0, len(ops))
	for _, m := range ops {
		var err error
		if docs, err = engine.AppendMutationJSON(docs, m); err != nil {
			return nil, fmt.Errorf("persist: encode mutation %s: %w", m.OpID, err)
		}
		ends = append(ends, len(docs))
		o.opID = append(o.opID, m.OpID)
		o.tenant = append(o.tenant, m.TenantID)
		o.customer = append(o.customer, m.CustomerID)
		o.idem = append(o.idem, m.IdempotencyKey)
		o.rh = append(o.rh, m.RequestHash)
		o.version = append(o.version, m.Account.Version)
		o.at = append(o.at, m.At())
	}
	all := string(docs)
	o.mutation = make([]string, 0, len(ops))
	start := 0
	for _, end := range ends {
		o.mutation = append(o.mutation, all[start:end])
		start = end
	}

	slices.SortFunc(entries, func(a, b entryRow) int { return bytes.Compare(a.id[:], b.id[:]) })
	e := &c.entries
	e.presize(len(entries))
	for _, r := range entries {
		var src *string
		if r.e.Source != nil {
			s := string(*r.e.Source)
			src = &s
		}
		var overage int64
		if r.e.Overage != nil {
			overage = *r.e.Overage
		}
		e.id = append(e.id, r.id)
		e.opID = append(e.opID, r.m.OpID)
		e.tenant = append(e.tenant, r.m.TenantID)
		e.customer = append(e.customer, r.m.CustomerID)
		e.env = append(e.env, string(r.m.Environment))
		e.delta = append(e.delta, r.e.Delta)
		e.typ = append(e.typ, string(r.e.Type))
		e.source = append(e.source, src)
		block, draws := r.e.PaidBy()
		e.block = append(e.block, block)
		e.metric = append(e.metric, r.e.Metric)
		e.units = append(e.units, r.e.Units)
		e.rate = append(e.rate, r.e.Rate)
		e.overage = append(e.overage, overage)
		e.idem = append(e.idem, r.m.IdempotencyKey)
		e.ref = append(e.ref, r.e.Ref)
		e.reason = append(e.reason, r.e.Reason)
		e.head = append(e.head, r.head)
		e.meta = append(e.meta, string(rawObject(r.e.Metadata)))
		e.at = append(e.at, r.m.At())
		e.drawFrom = append(e.drawFrom, int32(len(e.drawBlock)+1))
		for _, d := range draws {
			e.drawBlock = append(e.drawBlock, d.BlockID)
			e.drawAmount = append(e.drawAmount, d.Amount)
		}
		e.drawTo = append(e.drawTo, int32(len(e.drawBlock)))
	}
	if e.drawBlock == nil {
		e.drawBlock, e.drawAmount = []uuid.UUID{}, []int64{}
	}

	blockIDs := make([]uuid.UUID, 0, len(blocks))
	for id := range blocks {
		blockIDs = append(blockIDs, id)
	}
	slices.SortFunc(blockIDs, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	k := &c.blocks
	if len(blockIDs) > 0 {
		k.presize(len(blockIDs))
	}
	for _, id := range blockIDs {
		r := blocks[id]
		var expires *time.Time
		if r.b.ExpiresMS != nil {
			t := time.UnixMilli(*r.b.ExpiresMS).UTC()
			expires = &t
		}
		k.id = append(k.id, id)
		k.tenant = append(k.tenant, r.m.TenantID)
		k.customer = append(k.customer, r.m.CustomerID)
		k.original = append(k.original, r.b.Original)
		k.remaining = append(k.remaining, r.b.Remaining)
		k.priority = append(k.priority, int32(r.b.Priority))
		k.source = append(k.source, string(r.b.Source))
		k.starts = append(k.starts, time.UnixMilli(r.b.StartsMS).UTC())
		k.expires = append(k.expires, expires)
		k.created = append(k.created, time.UnixMilli(r.b.CreatedMS).UTC())
		k.meta = append(k.meta, string(rawObject(r.b.Metadata)))
		k.scope = append(k.scope, scopeText(r.b.Scope))
		k.version = append(k.version, r.version)
	}

	customers := make([]uuid.UUID, 0, len(accounts))
	for id := range accounts {
		customers = append(customers, id)
	}
	slices.SortFunc(customers, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	a := &c.accounts
	if len(customers) > 0 {
		// None (a group of refusals) leaves the columns nil, as before.
		a.presize(len(customers))
	}
	for _, id := range customers {
		m := accounts[id]
		a.customer = append(a.customer, id)
		a.id = append(a.id, m.Account.ID)
		a.tenant = append(a.tenant, m.TenantID)
		a.env = append(a.env, string(m.Environment))
		a.balance = append(a.balance, m.Account.Balance)
		a.reserved = append(a.reserved, m.Account.Reserved)
		a.pending = append(a.pending, m.Account.Pending)
		a.earned = append(a.earned, m.Account.LifetimeEarned)
		a.version = append(a.version, m.Account.Version)
		a.at = append(a.at, m.At())
		a.op = append(a.op, m.OpID)
		a.outbox = append(a.outbox, m.OutboxMS)
		a.debt = append(a.debt, m.Account.Debt)
	}
	return c, nil
}

// sectionWriter queues the statements that persist one optional section of
// a batch of Mutations (reservations, gauges, events) into Apply's batch, in
// the same transaction as the ledger entries. Each must be idempotent and
// move rows only forward in version.
type sectionWriter struct {
	name  string
	queue func(b *pgx.Batch, ms []engine.Mutation) error
}

// sectionWriters are registered by the files that own each section.
var sectionWriters []sectionWriter

// scopeText is a block scope as a Postgres text[] literal for
// upsertBlocksSQL, nil for none. Metric keys need no quoting
// (engine.ValidMetricKey: no comma, brace, quote or space).
func scopeText(keys []string) *string {
	if len(keys) == 0 {
		return nil
	}
	s := "{" + strings.Join(keys, ",") + "}"
	return &s
}
