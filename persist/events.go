package persist

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

var _ engine.EventStore = (*Store)(nil)

// eventsSQLTemplate writes the events of a batch of Mutations in one
// statement and numbers them (issue 15 item 2). Plain rows ($1..$9, from
// Mutations that carry a Context: every hot-path script) are stored as
// sent, typed arrays in, no JSON parsed (issue 10). Filled rows ($10..$18,
// Mutations without a Context: the grant and debit scripts) get their
// external id from the customer row. Whether such a Mutation owes
// credit.low_balance is decided in Go (engine.LowBalanceEvent, on the
// thresholds Apply read before its transaction: beforeApply), so
// the rule has one home.
//
// The rows that are inserted take the next sequences of their tenant's
// counter row (event_sequences), in batch order (ord), in this same
// statement: a row skipped or a transaction rolled back hands out no
// number, so a tenant's sequences have no gap. The counter's row lock holds
// a tenant's other writers until this transaction commits, so sequences
// become visible in order. The sequence is prepended to the stored payload
// as text (no JSON parse). {{fresh}} is where the conflict-tolerant variant
// leaves out rows already stored: the earlier statements of its
// transaction (the account upserts) have waited for any concurrent writer
// of the same Mutation, and this statement's snapshot sees its rows.
const eventsSQLTemplate = `WITH e AS (
	SELECT p.id, p.tenant, p.env, p.customer, p.type, p.payload, p.at, p.ord, p.version, p.entry
	FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::uuid[], $5::text[], $6::text[], $7::timestamptz[],
		$8::int[], $9::bigint[], $19::uuid[]) AS p(id, tenant, env, customer, type, payload, at, ord, version, entry)
	UNION ALL
	SELECT f.id, f.tenant, f.env, f.customer, f.type,
		jsonb_set(f.payload::jsonb, '{external_customer_id}', COALESCE(to_jsonb(c.external_id), 'null'::jsonb))::text,
		f.at, f.ord, f.version, NULL::uuid
	FROM unnest($10::uuid[], $11::uuid[], $12::text[], $13::uuid[], $14::text[], $15::text[], $16::timestamptz[],
		$17::int[], $18::bigint[])
		AS f(id, tenant, env, customer, type, payload, at, ord, version)
	LEFT JOIN customers c ON c.id = f.customer
), fresh AS (
	SELECT e.*, row_number() OVER (PARTITION BY e.tenant ORDER BY e.ord) AS rn,
		count(*) OVER (PARTITION BY e.tenant) AS n
	FROM e {{fresh}}
), bumped AS (
	INSERT INTO event_sequences AS s (tenant_id, next)
	SELECT DISTINCT tenant, n FROM fresh ORDER BY tenant
	ON CONFLICT (tenant_id) DO UPDATE SET next = s.next + EXCLUDED.next
	RETURNING s.tenant_id, s.next
)
INSERT INTO webhook_events
	(id, tenant_id, environment, customer_id, event_type, payload, status, attempts, next_retry_at, created_at,
	sequence, account_version)
SELECT f.id, f.tenant, f.env, f.customer, f.type, '{"sequence":' || (b.next - f.n + f.rn) || ',' || substr(f.payload, 2),
	'pending', 0, f.at, f.at, b.next - f.n + f.rn, f.version
FROM fresh f JOIN bumped b ON b.tenant_id = f.tenant
ORDER BY f.id
ON CONFLICT (id, tenant_id, created_at) DO NOTHING`

// Apply's two event statements: insertMutationEventsSQL skips rows already
// stored (a replay), freshEventsSQL (the lean write) fails on one instead.
// A replay carries its events' instant (the Mutation's), so the look-up for
// a stored row names it and reads one month (migration 035).
// A replayed lean consume's credit.consumed (entry: the main entry that
// could carry it, carried.go) may be stored on that entry instead of as a
// row: the replay skips it then too.
var (
	insertMutationEventsSQL = strings.Replace(eventsSQLTemplate, "{{fresh}}",
		`WHERE NOT EXISTS (SELECT 1 FROM webhook_events w WHERE w.id = e.id AND w.tenant_id = e.tenant AND w.created_at = e.at)
			AND (e.entry IS NULL OR NOT EXISTS (
				SELECT 1 FROM ledger_entries l WHERE l.id = e.entry AND l.event_sequence IS NOT NULL))`, 1)
	freshEventsSQL = withoutConflictClause(strings.Replace(eventsSQLTemplate, "{{fresh}}", "", 1))
)

// eventRow is one event row of the events statement.
type eventRow struct {
	e       engine.Event
	ord     int
	version int64
	fill    bool
	// entry is the ledger entry that can carry the event (a lean
	// consume's credit.consumed: carried.go), nil for any other.
	entry *uuid.UUID
}

// queueEvents is the events section of Apply, queued after every other
// section: every event the batch's Mutations owe (engine.EventsOf),
// pending and due at once, numbered per tenant, by sql
// (insertMutationEventsSQL or freshEventsSQL), with the alert events of
// alerts after each Mutation's own, then the alert states.
func queueEvents(b *pgx.Batch, ms []engine.Mutation, alerts *alertOutcome, sql string, shape recordShape) {
	plain, filled, _ := eventRowsOf(ms, alerts, shape, false)
	queueEventRows(b, plain, filled, sql)
	queueAlertStates(b, alerts)
}

// queueEventRows queues sql (insertMutationEventsSQL or freshEventsSQL)
// for the event rows of eventRowsOf, if there are any.
func queueEventRows(b *pgx.Batch, plain, filled *eventBatch, sql string) {
	if len(plain.id)+len(filled.id) == 0 {
		return
	}
	b.Queue(sql, plain.id, plain.tenant, plain.env, plain.customer, plain.typ, plain.body, plain.at, plain.ord,
		plain.version, filled.id, filled.tenant, filled.env, filled.customer, filled.typ, filled.body, filled.at,
		filled.ord, filled.version, plain.entry)
}

// bumpSequencesSQL takes $2 sequences of each tenant $1 (sorted, so two
// writers lock counter rows in one order) and returns each counter's new
// last sequence: the tenant's rows get next-n+1..next. Its row lock holds
// the tenant's other writers until this transaction commits, as in
// eventsSQLTemplate.
const bumpSequencesSQL = `INSERT INTO event_sequences AS s (tenant_id, next)
SELECT * FROM unnest($1::uuid[], $2::bigint[])
ON CONFLICT (tenant_id) DO UPDATE SET next = s.next + EXCLUDED.next
RETURNING s.tenant_id, s.next`

// eventCopyColumns are the columns copyEvents gives, in its order.
var eventCopyColumns = []string{"id", "tenant_id", "environment", "customer_id", "event_type", "payload", "status",
	"attempts", "next_retry_at", "created_at", "sequence", "account_version"}

// eventCopy is the lean write of a group's events when all of them are
// stored as sent (every Mutation carries a Context, as every hot-path
// script's does): each tenant's rows are counted and ranked in batch order
// in Go, so Postgres runs no window, sort or union for them (issue 10).
// The carried events (lean consumes' credit.consumed, kept on their ledger
// entries: carried.go) are numbered with the rows, in the same batch
// order. Every lean write bumps its tenants' counters first (queueBump,
// before any other statement: every writer takes the counters before the
// rows, so two writers cannot deadlock), because the ledger entries that
// carry events are written before the event rows. A group written by
// COPY reads the counters back (readSequences) and copies its entries and
// rows with their sequences; a small group's INSERTs compute them in SQL
// from the counter (numberedEventsSQL, insertEntriesSQL). Like the
// operations and ledger entries, either fails the transaction on an event
// id already stored, and Apply writes the group again the ON CONFLICT way.
type eventCopy struct {
	rows, carried *eventBatch
	// tenants are the rows' and carried events' tenants, sorted, and
	// counts their events.
	tenants []uuid.UUID
	counts  []int64
	// back and carriedBack are each row's and carried event's distance
	// from its tenant's last event in batch order (ord): the event takes
	// its tenant's new counter minus back.
	back, carriedBack []int64
	// seq and carriedSeq are the sequences once readSequences has run.
	seq, carriedSeq []int64
}

// newEventCopy returns the lean write of rows (eventRowsOf's plain rows)
// and carried (its carried events).
func newEventCopy(rows, carried *eventBatch) *eventCopy {
	n := map[uuid.UUID]int64{}
	for _, t := range rows.tenant {
		n[t]++
	}
	for _, t := range carried.tenant {
		n[t]++
	}
	c := &eventCopy{rows: rows, carried: carried, tenants: make([]uuid.UUID, 0, len(n)), counts: make([]int64, 0, len(n)),
		back: make([]int64, len(rows.id)), carriedBack: make([]int64, len(carried.id))}
	for t := range n {
		c.tenants = append(c.tenants, t)
	}
	sort.Slice(c.tenants, func(i, j int) bool { return bytes.Compare(c.tenants[i][:], c.tenants[j][:]) < 0 })
	for _, t := range c.tenants {
		c.counts = append(c.counts, n[t])
	}
	// Both groups' events in descending batch order: each takes the count
	// of its tenant's events after it.
	type place struct {
		ord  int32
		back *int64
		t    uuid.UUID
	}
	order := make([]place, 0, len(rows.id)+len(carried.id))
	for i := range rows.id {
		order = append(order, place{rows.ord[i], &c.back[i], rows.tenant[i]})
	}
	for i := range carried.id {
		order = append(order, place{carried.ord[i], &c.carriedBack[i], carried.tenant[i]})
	}
	sort.Slice(order, func(i, j int) bool { return order[i].ord < order[j].ord })
	for _, p := range order {
		n[p.t]--
		*p.back = n[p.t]
	}
	return c
}

// empty tells whether the group has no event to number.
func (c *eventCopy) empty() bool { return len(c.tenants) == 0 }

// queueBump queues bumpSequencesSQL for the events' tenants, then
// carriedMonthsSQL for the carried events, if any.
func (c *eventCopy) queueBump(b *pgx.Batch) {
	b.Queue(bumpSequencesSQL, c.tenants, c.counts)
	if len(c.carried.id) > 0 {
		b.Queue(carriedMonthsSQL, c.carried.tenant, c.carried.at, c.carriedBack)
	}
}

// carriedMonthsSQL widens the spans of carried sequences (migration 037)
// by the carried events of tenants $1, dated $2, each its tenant's counter
// (just bumped by bumpSequencesSQL, whose row lock this transaction holds)
// minus back $3. Every lean write that carries events runs it, in the
// transaction that writes their entries, so once 037's contract is
// recorded the spans cover every carried entry (carriedEventsSQL). Rows in
// (tenant, month) order, as 037's contract takes them; a row that would
// not widen is left alone.
const carriedMonthsSQL = `INSERT INTO ledger_event_months AS m (tenant_id, month, low, high)
SELECT p.tenant, date_trunc('month', p.at, 'UTC'), max(s.next) - max(p.back), max(s.next) - min(p.back)
FROM unnest($1::uuid[], $2::timestamptz[], $3::bigint[]) AS p(tenant, at, back)
JOIN event_sequences s ON s.tenant_id = p.tenant
GROUP BY 1, 2 ORDER BY 1, 2
ON CONFLICT (tenant_id, month) DO UPDATE
	SET low = LEAST(m.low, EXCLUDED.low), high = GREATEST(m.high, EXCLUDED.high)
	WHERE EXCLUDED.low < m.low OR EXCLUDED.high > m.high`

// readSequences numbers the events from the counters bumpSequencesSQL
// returned: a tenant's events take its new sequences in batch order, as
// eventsSQLTemplate numbers them.
func (c *eventCopy) readSequences(rows pgx.Rows) error {
	next := make(map[uuid.UUID]int64, len(c.tenants))
	for rows.Next() {
		var t uuid.UUID
		var n int64
		if err := rows.Scan(&t, &n); err != nil {
			return err
		}
		next[t] = n
	}
	if err := rows.Err(); err != nil {
		return err
	}
	number := func(tenants []uuid.UUID, back []int64) ([]int64, error) {
		seq := make([]int64, len(tenants))
		for i, t := range tenants {
			n, ok := next[t]
			if !ok {
				return nil, fmt.Errorf("persist: no event sequence returned for tenant %s", t)
			}
			seq[i] = n - back[i]
		}
		return seq, nil
	}
	var err error
	if c.seq, err = number(c.rows.tenant, c.back); err != nil {
		return err
	}
	c.carriedSeq, err = number(c.carried.tenant, c.carriedBack)
	return err
}

// entrySequences maps each carrying entry to its event's sequence
// (readSequences has run) or, before, to its back (in SQL the entry
// takes its tenant's counter minus back).
func (c *eventCopy) entrySequences(numbered bool) map[uuid.UUID]int64 {
	if len(c.carried.id) == 0 {
		return nil
	}
	out := make(map[uuid.UUID]int64, len(c.carried.id))
	for i, e := range c.carried.entry {
		if numbered {
			out[*e] = c.carriedSeq[i]
		} else {
			out[*e] = c.carriedBack[i]
		}
	}
	return out
}

// numberedEventsSQL is the small group's insert of eventCopy's rows, in id
// order, each with its tenant's counter (bumped by queueBump earlier in
// the transaction) minus its back ($10).
const numberedEventsSQL = `INSERT INTO webhook_events
	(id, tenant_id, environment, customer_id, event_type, payload, status, attempts, next_retry_at, created_at,
	sequence, account_version)
SELECT p.id, p.tenant, p.env, p.customer, p.type, '{"sequence":' || (s.next - p.back) || ',' || substr(p.payload, 2),
	'pending', 0, p.at, p.at, s.next - p.back, p.version
FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::uuid[], $5::text[], $6::text[], $7::timestamptz[],
	$8::bigint[], $9::bigint[]) AS p(id, tenant, env, customer, type, payload, at, version, back)
JOIN event_sequences s ON s.tenant_id = p.tenant
ORDER BY p.id`

// queueInsert queues numberedEventsSQL for the rows (after queueBump).
func (c *eventCopy) queueInsert(b *pgx.Batch) {
	r := c.rows
	if len(r.id) == 0 {
		return
	}
	b.Queue(numberedEventsSQL, r.id, r.tenant, r.env, r.customer, r.typ, r.body, r.at, r.version, c.back)
}

// copyIn writes the rows by COPY, their sequences prepended to their
// payloads as eventsSQLTemplate does.
func (c *eventCopy) copyIn(ctx context.Context, tx pgx.Tx) error {
	r := c.rows
	if len(c.seq) != len(r.id) {
		return errors.New("persist: events copied before their sequences were read")
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"webhook_events"}, eventCopyColumns,
		pgx.CopyFromSlice(len(r.id), func(i int) ([]any, error) {
			// Ids by pointer: see copySteps.
			return []any{&r.id[i], &r.tenant[i], r.env[i], r.customer[i], r.typ[i], sequencedPayload(c.seq[i], r.body[i]),
				"pending", int32(0), r.at[i], r.at[i], c.seq[i], r.version[i]}, nil
		}))
	return err
}

// sequencedPayload is body with "sequence":seq as its first member, as
// SQL's '{"sequence":' || seq || ',' || substr(body, 2) makes it.
func sequencedPayload(seq int64, body string) string {
	var buf []byte
	buf = append(buf, `{"sequence":`...)
	buf = strconv.AppendInt(buf, seq, 10)
	buf = append(buf, ',')
	if len(body) > 0 {
		buf = append(buf, body[1:]...)
	}
	return string(buf)
}

// eventRowsOf derives the events ms owe, sorted by id, each once (a
// Mutation delivered twice in a batch owes its events once), each with
// its place in the batch (ord: Mutations in batch order, a Mutation's
// events in slot order), which orders their sequences: plain rows are
// stored as they are, filled rows get their external id in SQL. A
// Mutation without a Context owes credit.low_balance when it crosses its
// customer's threshold (alerts.thresholds, read by beforeApply).
// The alert events (complete, so plain) follow their Mutation's own. In
// the lean shape plain rows store lean bodies (eventbody.go); filled rows,
// whose body SQL rewrites as jsonb, stay whole.
//
// With carry (a lean write), a lean consume's credit.consumed goes to
// carried, under the id of its ledger entry's carried event
// (carried.go), rather than to plain; without, it stays a plain row that
// names that entry, so a replay skips it when the entry carries it.
func eventRowsOf(ms []engine.Mutation, alerts *alertOutcome, shape recordShape, carry bool) (plain, filled, carried *eventBatch) {
	rows := make([]eventRow, 0, len(ms))
	for i := range ms {
		m := &ms[i]
		fill := m.Context == nil
		var entry *uuid.UUID
		if main, ok := carriesConsumed(m, shape); ok {
			id := engine.EntryID(m.OpID, main)
			entry = &id
		}
		// Only a Mutation with a carrying entry needs the main event's id.
		var mainID uuid.UUID
		evs := engine.EventsOf
		if entry != nil {
			mainID = engine.EventID(m.OpID, engine.SlotMain)
			if carry {
				// Its credit.consumed goes to carried, which keeps no body.
				evs = engine.EventsOfCarried
			}
		}
		for _, e := range evs(*m) {
			r := eventRow{e: e, ord: len(rows), version: m.Account.Version, fill: fill}
			if entry != nil && e.ID == mainID && e.EventType == engine.EventCreditConsumed {
				r.entry = entry
				if carry {
					r.e.ID = engine.CarriedEventID(*entry)
				}
			}
			rows = append(rows, r)
		}
		for _, e := range alerts.eventsOf(m.OpID) {
			rows = append(rows, eventRow{e: e, ord: len(rows), version: m.Account.Version})
		}
		if !fill {
			continue
		}
		if ev, crossed := engine.LowBalanceEvent(*m, alerts.thresholdOf(m.CustomerID)); crossed {
			rows = append(rows, eventRow{e: ev, ord: len(rows), version: m.Account.Version, fill: true})
		}
	}
	// The rows are put in order by their indexes: an eventRow holds an
	// Event, too big to swap at each step of the sort.
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return bytes.Compare(rows[a].e.ID[:], rows[b].e.ID[:]) })
	plain, filled, carried = &eventBatch{}, &eventBatch{}, &eventBatch{}
	for i, k := range order {
		r := rows[k]
		if i > 0 && rows[order[i-1]].e.ID == r.e.ID {
			continue
		}
		switch {
		case r.fill:
			filled.add(r)
		case carry && r.entry != nil:
			carried.add(r)
		default:
			if shape == shapeLean {
				r.e.Payload = []byte(leanEventBody(string(r.e.Payload), r.e.ID, r.e.EventType, r.e.TenantID,
					r.e.Environment, r.e.CustomerID))
			}
			plain.add(r)
		}
	}
	return plain, filled, carried
}

// eventBatch is event rows column by column.
type eventBatch struct {
	id, tenant     []uuid.UUID
	customer       []*uuid.UUID
	env, typ, body []string
	at             []time.Time
	ord            []int32
	version        []int64
	entry          []*uuid.UUID
}

func (c *eventBatch) add(r eventRow) {
	c.id, c.tenant, c.customer = append(c.id, r.e.ID), append(c.tenant, r.e.TenantID), append(c.customer, r.e.CustomerID)
	c.env, c.typ, c.body = append(c.env, string(r.e.Environment)), append(c.typ, string(r.e.EventType)), append(c.body, string(r.e.Payload))
	c.at, c.ord, c.version = append(c.at, r.e.CreatedAt), append(c.ord, int32(r.ord)), append(c.version, r.version)
	c.entry = append(c.entry, r.entry)
}

// lockSequenceSQL takes the tenant's counter row (creating it at 0) before
// insertEventSQL, so that statement's snapshot sees an event a concurrent
// writer of the same id committed and hands out no number for it.
const lockSequenceSQL = `INSERT INTO event_sequences AS s (tenant_id, next) VALUES ($1, 0)
	ON CONFLICT (tenant_id) DO UPDATE SET next = s.next`

// insertEventSQL writes one event unless its id exists ({{stored}}: the
// look-up), with the tenant's next sequence prepended to its payload.
const insertEventSQL = `WITH fresh AS (
	SELECT 1 WHERE NOT EXISTS (SELECT 1 FROM webhook_events WHERE id = $1 AND tenant_id = $2{{stored}})
), bumped AS (
	UPDATE event_sequences SET next = next + 1 WHERE tenant_id = $2 AND EXISTS (SELECT 1 FROM fresh)
	RETURNING next
)
INSERT INTO webhook_events
	(id, tenant_id, environment, customer_id, event_type, payload, status, attempts, next_retry_at, created_at,
	sequence, account_version)
SELECT $1, $2, $3, $4, $5, '{"sequence":' || b.next || ',' || substr($6::text, 2), 'pending', 0, $7, $8, b.next, $9
FROM bumped b
ON CONFLICT (id, tenant_id, created_at) DO NOTHING`

// The two look-ups of insertEventSQL. A subscription event's (insertEvents)
// names no instant, one index probe per month kept: its id is a version 5
// UUID of the subscription and a tag (engine/subscription_events.go), and
// a tag does not fix the instant ("renewed:<period start>" is dated when
// a renewal is asked for), so only a look-up by id alone keeps an id once
// whatever a caller dates it; the path writes a few events per
// subscription change. A test.ping's (InsertEvent) names its instant, one
// month: its id is a fresh UUIDv7 (engine/webhooks.go Test), so only a
// retry of the same event can meet a stored one, and that carries the
// same instant. The instant is a parameter: Postgres prunes the other
// months at executor start in the generic plan (TestEventPlansPrune).
var (
	insertEventAnyMonthSQL = strings.Replace(insertEventSQL, "{{stored}}", "", 1)
	insertEventAtSQL       = strings.Replace(insertEventSQL, "{{stored}}", " AND created_at = $8", 1)
)

// InsertEvent writes one event that reports no stored state change
// (test.ping) unless an event with its id and instant exists, numbered in
// one transaction (insertEventAtSQL: its id is fresh).
func (s *Store) InsertEvent(ctx context.Context, e engine.Event) error {
	b := &pgx.Batch{}
	queueInsertEvent(b, e, insertEventAtSQL)
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("persist: insert event: %w", err)
	}
	return nil
}

// insertEvents writes evs in tx, in order, each unless its id exists: the
// events of the state change tx writes (subscription events), numbered in
// tx so they commit or roll back with it.
func insertEvents(ctx context.Context, tx pgx.Tx, evs []engine.Event) error {
	if len(evs) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, e := range evs {
		queueInsertEvent(b, e, insertEventAnyMonthSQL)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("persist: insert events: %w", err)
	}
	return nil
}

// queueInsertEvent queues lockSequenceSQL and sql (a form of
// insertEventSQL) for e.
func queueInsertEvent(b *pgx.Batch, e engine.Event, sql string) {
	next := e.CreatedAt
	if e.NextRetryAt != nil {
		next = *e.NextRetryAt
	}
	b.Queue(lockSequenceSQL, e.TenantID)
	b.Queue(sql, e.ID, e.TenantID, string(e.Environment), e.CustomerID, string(e.EventType),
		string(e.Payload), next, e.CreatedAt, e.Version)
}

const eventColumns = `id, tenant_id, environment, customer_id, event_type, payload::text, status, attempts,
	next_retry_at, last_error, created_at, delivered_at, sequence, account_version`

// eventColumnsE is eventColumns of the relation named e, for a statement
// that joins another with the same column names.
const eventColumnsE = `e.id, e.tenant_id, e.environment, e.customer_id, e.event_type, e.payload::text, e.status,
	e.attempts, e.next_retry_at, e.last_error, e.created_at, e.delivered_at, e.sequence, e.account_version`

func scanEvent(row pgx.Row) (engine.Event, error) {
	var e engine.Event
	var env, typ, status, payload string
	if err := row.Scan(&e.ID, &e.TenantID, &env, &e.CustomerID, &typ, &payload, &status, &e.Attempts,
		&e.NextRetryAt, &e.LastError, &e.CreatedAt, &e.DeliveredAt, &e.Sequence, &e.Version); err != nil {
		return engine.Event{}, err
	}
	e.Environment, e.EventType, e.Status = engine.Environment(env), engine.EventType(typ), engine.EventStatus(status)
	e.Payload = wholeEventBody(payload, e.ID, e.EventType, e.TenantID, e.Environment, e.CustomerID)
	e.CreatedAt = e.CreatedAt.UTC()
	e.NextRetryAt = eventTimeUTC(e.NextRetryAt)
	e.DeliveredAt = eventTimeUTC(e.DeliveredAt)
	e.Deliveries = []engine.Delivery{}
	return e, nil
}

func eventTimeUTC(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// claimDueSQL leases due events fairly: up to $4 per tenant (tenants in $5
// skipped, and tenants without a webhook URL and secret: their events wait,
// attempts untouched, until one is configured), each tenant's first before any tenant's second, at most $3 in
// all; rows another process holds are skipped, and the due conditions are
// checked again under the row lock so no event is claimed twice. An event
// may be due in any month (a tenant without a webhook URL holds its events
// pending for good), so the candidates are read in every month, by its
// partial due index, which holds the pending and failed rows only (empty
// in a settled month); the lock and the update then name each row's
// instant, one month each (event_partitions_test.go, TestEventPlansPrune).
const claimDueSQL = `WITH cand AS (
	SELECT w.id, w.tenant_id, w.created_at FROM (
		SELECT DISTINCT tenant_id FROM webhook_events
		WHERE status IN ('pending', 'failed') AND next_retry_at <= $1 AND NOT (tenant_id = ANY($5::uuid[]))
			AND tenant_id IN (SELECT id FROM tenants WHERE webhook_url IS NOT NULL AND webhook_secret IS NOT NULL)
	) t
	CROSS JOIN LATERAL (
		SELECT e.id, e.tenant_id, e.created_at, row_number() OVER (ORDER BY e.next_retry_at, e.id) AS rn
		FROM webhook_events e
		WHERE e.tenant_id = t.tenant_id AND e.status IN ('pending', 'failed') AND e.next_retry_at <= $1
			AND (e.locked_until IS NULL OR e.locked_until <= $1)
		ORDER BY e.next_retry_at, e.id
		LIMIT $4
	) w
	ORDER BY w.rn, random()
	LIMIT $3
), locked AS (
	SELECT e.id, e.tenant_id, e.created_at FROM cand c
	JOIN webhook_events e ON e.id = c.id AND e.tenant_id = c.tenant_id AND e.created_at = c.created_at
	WHERE e.status IN ('pending', 'failed') AND e.next_retry_at <= $1
		AND (e.locked_until IS NULL OR e.locked_until <= $1)
	FOR UPDATE OF e SKIP LOCKED
)
UPDATE webhook_events e SET locked_until = $2, lease = $6
FROM locked l
WHERE e.id = l.id AND e.tenant_id = l.tenant_id AND e.created_at = l.created_at
RETURNING ` + eventColumnsE

// ClaimDue implements engine.EventStore.
func (s *Store) ClaimDue(ctx context.Context, now time.Time, lease time.Duration, limit, perTenant int, skip []uuid.UUID) ([]engine.Claim, error) {
	if limit <= 0 {
		return nil, nil
	}
	if skip == nil {
		skip = []uuid.UUID{}
	}
	// Carried events of tenants with a webhook URL become rows first,
	// where their delivery keeps its state (carried.go).
	if err := s.materializeCarried(ctx); err != nil {
		return nil, err
	}
	token := uuid.New()
	rows, err := s.pool.Query(ctx, claimDueSQL, now, now.Add(lease), limit, perTenant, skip, token)
	if err != nil {
		return nil, fmt.Errorf("persist: claim events: %w", err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.Event, error) { return scanEvent(r) })
	if err != nil {
		return nil, fmt.Errorf("persist: claim events: %w", err)
	}
	out := make([]engine.Claim, len(evs))
	for i, e := range evs {
		out[i] = engine.Claim{Event: e, Lease: token}
	}
	return out, nil
}

// recordAttemptSQL moves the event to its new state and stores the attempt,
// only while the claim's lease is still the event's. The event is found by
// its whole key, the claim's instant included, so the update reads one
// month. The attempt is dated no earlier than its event (the delivering
// node's clock may be behind the one that dated the event), so the
// attempts of an event lie in its month or after (attachDeliveries). An
// event dead-lettered has its instant kept by id in webhook_event_dead, so
// redeliver, which knows only the id, reads its month alone (migration
// 036).
const recordAttemptSQL = `WITH upd AS (
	UPDATE webhook_events SET status = $3, attempts = $4, next_retry_at = $5, last_error = $6,
		delivered_at = COALESCE($7, delivered_at), locked_until = NULL, lease = NULL
	WHERE id = $1 AND tenant_id = $14 AND created_at = $15 AND lease = $2
	RETURNING id, tenant_id, created_at
), dead AS (
	INSERT INTO webhook_event_dead (id, tenant_id, created_at)
	SELECT id, tenant_id, created_at FROM upd WHERE $3 = 'dead_letter'
	ON CONFLICT DO NOTHING
)
INSERT INTO webhook_deliveries (id, tenant_id, event_id, status_code, response_body, error, duration_ms, created_at)
SELECT $8, tenant_id, id, $9, $10, $11, $12, GREATEST($13::timestamptz, created_at) FROM upd`

// RecordAttempt implements engine.EventStore.
func (s *Store) RecordAttempt(ctx context.Context, c engine.Claim, a engine.Attempt) (bool, error) {
	tag, err := s.pool.Exec(ctx, recordAttemptSQL, c.Event.ID, c.Lease, string(a.Status), a.Attempts, a.NextRetryAt,
		a.LastError, a.DeliveredAt, uuid.Must(uuid.NewV7()), a.StatusCode, a.ResponseBody, a.Error, a.DurationMS, a.At,
		c.Event.TenantID, c.Event.CreatedAt)
	if err != nil {
		return false, fmt.Errorf("persist: record attempt: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// listEventsSQL is a page of tenant $1's event rows below sequence $4,
// newest first, through the months' (tenant_id, sequence) indexes merged
// newest first. {{months}} is where pageRows bounds it to the months that
// can hold the page (eventmonths.go, TestEventPlansPrune). The first page
// passes the largest sequence as $4 rather than leaving the bound out, so
// the bound is an index condition in the generic plan too, not a filter
// over the rows above the cursor.
const listEventsSQL = `SELECT ` + eventColumns + ` FROM webhook_events
	WHERE tenant_id = $1 AND ($2 = '' OR status = $2) AND ($3 = '' OR event_type = $3)
		AND sequence < $4{{months}}
	ORDER BY sequence DESC LIMIT $5`

// listEventsPage is the events list's page of rows (listEventsSQL).
func listEventsPage(tenant uuid.UUID, status, typ string, before int64, limit int) seqPage {
	below := before
	if below <= 0 {
		below = math.MaxInt64
	}
	return seqPage{from: before, limit: limit, sql: listEventsSQL, args: []any{tenant, status, typ, below, limit}}
}

// ListEvents implements engine.EventStore: newest first by sequence (the
// order the tenant's events were stored in), both environments; an
// unknown status or type simply matches nothing. The rows and the carried
// events (carried.go: pending credit.consumed only) are read by sequence
// and merged.
func (s *Store) ListEvents(ctx context.Context, tenant uuid.UUID, q engine.EventQuery) (engine.Page[engine.Event], error) {
	before, err := decodeSequenceCursor(q.Cursor)
	if err != nil {
		return engine.Page[engine.Event]{}, err
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 20
	}
	stored := listEventsPage(tenant, q.Status, q.EventType, before, limit+1)
	// When only rows can match, the carried read asks for none.
	carriedLimit := limit + 1
	if (q.Status != "" && q.Status != string(engine.EventPending)) ||
		(q.EventType != "" && q.EventType != string(engine.EventCreditConsumed)) {
		carriedLimit = 0
	}
	rows, carried, err := s.readEventPage(ctx, tenant, stored, carriedQuery(tenant, nil, 0, false, before, carriedLimit))
	if err != nil {
		return engine.Page[engine.Event]{}, fmt.Errorf("persist: list events: %w", err)
	}
	evs := mergeBySequence(rows, carried, false, limit+1)
	page := engine.Page[engine.Event]{Data: evs}
	if len(evs) > limit {
		page.Data, page.HasMore = evs[:limit], true
		page.NextCursor = encodeSequenceCursor(*evs[limit-1].Sequence)
	}
	if page.Data == nil {
		page.Data = []engine.Event{}
	}
	if err := s.attachDeliveries(ctx, page.Data); err != nil {
		return engine.Page[engine.Event]{}, err
	}
	return page, nil
}

// sequenceCursorVersion leads an events cursor: the sequence to resume
// below, after it. It is not page.go's cursorVersion, so a cursor of the
// (created_at, id) order the events list had before is refused, not
// misread.
const sequenceCursorVersion byte = 2

// encodeSequenceCursor makes the opaque cursor that resumes below seq.
func encodeSequenceCursor(seq int64) string {
	var b [9]byte
	b[0] = sequenceCursorVersion
	binary.BigEndian.PutUint64(b[1:], uint64(seq))
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// decodeSequenceCursor reads encodeSequenceCursor's cursor; 0 for none.
func decodeSequenceCursor(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != 9 || b[0] != sequenceCursorVersion {
		return 0, errInvalidCursor
	}
	seq := int64(binary.BigEndian.Uint64(b[1:]))
	if seq <= 0 {
		return 0, errInvalidCursor
	}
	return seq, nil
}

// deliveriesSQL reads the attempts of events $1 (of tenants $2), none
// older than $3, the oldest event's instant.
const deliveriesSQL = `SELECT id, event_id, status_code, response_body, error, duration_ms, created_at
	FROM webhook_deliveries WHERE event_id = ANY($1) AND tenant_id = ANY($2) AND created_at >= $3
	ORDER BY created_at, id`

// attachDeliveries fills each event's attempts, oldest first.
func (s *Store) attachDeliveries(ctx context.Context, evs []engine.Event) error {
	if len(evs) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, len(evs))
	index := make(map[uuid.UUID]int, len(evs))
	var tenants []uuid.UUID // the events' tenants (one on every read path), for the shard key
	// An attempt is dated no earlier than its event (recordAttemptSQL;
	// migration 035's contract moved up the older ones), so the months
	// before the oldest event hold none of them.
	oldest := evs[0].CreatedAt
	for i, e := range evs {
		ids[i], index[e.ID] = e.ID, i
		if !slices.Contains(tenants, e.TenantID) {
			tenants = append(tenants, e.TenantID)
		}
		if e.CreatedAt.Before(oldest) {
			oldest = e.CreatedAt
		}
	}
	rows, err := s.pool.Query(ctx, deliveriesSQL, ids, tenants, oldest)
	if err != nil {
		return fmt.Errorf("persist: read deliveries: %w", err)
	}
	ds, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.Delivery, error) {
		var d engine.Delivery
		var code *int32
		err := r.Scan(&d.ID, &d.EventID, &code, &d.ResponseBody, &d.Error, &d.DurationMS, &d.CreatedAt)
		if code != nil {
			c := int(*code)
			d.StatusCode = &c
		}
		d.CreatedAt = d.CreatedAt.UTC()
		return d, err
	})
	if err != nil {
		return fmt.Errorf("persist: read deliveries: %w", err)
	}
	for _, d := range ds {
		i := index[d.EventID]
		evs[i].Deliveries = append(evs[i].Deliveries, d)
	}
	return nil
}

// deadInstantSQL reads the instant of an event that was dead-lettered
// (recordAttemptSQL keeps it; migration 036 took in the older ones), or
// NULL, and whether every dead-lettered event's instant is kept: once
// 036's contract is recorded no node of the release that dead-lettered
// without keeping it runs (a contract runs only then), and the contract
// took in the events it had dead-lettered.
const deadInstantSQL = `SELECT (SELECT created_at FROM webhook_event_dead WHERE id = $1 AND tenant_id = $2),
	EXISTS (SELECT 1 FROM schema_contracts WHERE version = 36)`

// redeliverSQL moves dead-lettered event $1 of tenant $2 back to pending,
// due at $3; {{at}} is where the event's instant, when known, bounds it
// to its month.
const redeliverSQL = `UPDATE webhook_events
	SET status = 'pending', attempts = 0, next_retry_at = $3, locked_until = NULL, lease = NULL
	WHERE id = $1 AND tenant_id = $2 AND status = 'dead_letter'{{at}}
	RETURNING ` + eventColumns

var (
	redeliverAtSQL  = strings.Replace(redeliverSQL, "{{at}}", " AND created_at = $4", 1)
	redeliverAnySQL = strings.Replace(redeliverSQL, "{{at}}", "", 1)
)

// eventExistsSQL tells whether event $1 of tenant $2 is stored, as a row
// or carried by ledger entry $3 (carried.go), in any month of either: an
// event id names no instant (engine.EventID, engine.CarriedEventID: a
// version 5 UUID of the operation and slot, or of the entry, which stays
// so, being the replay fence), so no month can be left out. One statement
// where three ran (an update, then a look-up of the rows, then of the
// ledger); it serves only a redeliver refused (404 or 409).
const eventExistsSQL = `SELECT EXISTS (SELECT 1 FROM webhook_events WHERE id = $1 AND tenant_id = $2)
	OR EXISTS (SELECT 1 FROM ledger_entries WHERE id = $3 AND tenant_id = $2 AND event_sequence IS NOT NULL)`

// Redeliver implements engine.EventStore. An event id carries no time
// (engine.EventID), but only a dead-lettered event can be redelivered and
// each keeps its instant in webhook_event_dead, so the update names its
// month. An id not found there was never dead-lettered once 036's
// contract is recorded: nothing to update, and whether the event exists
// (409) or not (404) is one look-up of every month (eventExistsSQL). Before
// the contract (an event dead-lettered by the previous release is not
// kept there yet) it is looked up as before, in every month.
func (s *Store) Redeliver(ctx context.Context, tenant, id uuid.UUID, now time.Time) (engine.Event, error) {
	var at *time.Time
	var indexed bool
	if err := s.pool.QueryRow(ctx, deadInstantSQL, id, tenant).Scan(&at, &indexed); err != nil {
		return engine.Event{}, fmt.Errorf("persist: redeliver: %w", err)
	}
	if at != nil {
		e, err := scanEvent(s.pool.QueryRow(ctx, redeliverAtSQL, id, tenant, now, *at))
		if err == nil {
			return s.withDeliveries(ctx, e)
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return engine.Event{}, fmt.Errorf("persist: redeliver: %w", err)
		}
		// Redelivered already (a second click): not dead, found in its month.
		var one int
		err = s.pool.QueryRow(ctx, `SELECT 1 FROM webhook_events WHERE id = $1 AND tenant_id = $2 AND created_at = $3`,
			id, tenant, *at).Scan(&one)
		if err == nil {
			return engine.Event{}, engine.ErrNotDeadLetter
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return engine.Event{}, fmt.Errorf("persist: redeliver: %w", err)
		}
	} else if indexed {
		return engine.Event{}, s.notRedelivered(ctx, tenant, id)
	}
	e, err := scanEvent(s.pool.QueryRow(ctx, redeliverAnySQL, id, tenant, now))
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.Event{}, s.notRedelivered(ctx, tenant, id)
	}
	if err != nil {
		return engine.Event{}, fmt.Errorf("persist: redeliver: %w", err)
	}
	return s.withDeliveries(ctx, e)
}

// notRedelivered is why event id of tenant, not dead-lettered, was not
// redelivered: engine.ErrNotDeadLetter when it exists (a carried event is
// pending, never dead_letter), engine.ErrNotFound when it does not.
func (s *Store) notRedelivered(ctx context.Context, tenant, id uuid.UUID) error {
	var exists bool
	if err := s.pool.QueryRow(ctx, eventExistsSQL, id, tenant, engine.EntryOfCarriedEvent(id)).Scan(&exists); err != nil {
		return fmt.Errorf("persist: redeliver: %w", err)
	}
	if exists {
		return engine.ErrNotDeadLetter
	}
	return engine.ErrNotFound
}

// withDeliveries is e with its attempts.
func (s *Store) withDeliveries(ctx context.Context, e engine.Event) (engine.Event, error) {
	evs := []engine.Event{e}
	if err := s.attachDeliveries(ctx, evs); err != nil {
		return engine.Event{}, err
	}
	return evs[0], nil
}

var _ engine.EventLog = (*Store)(nil)

// eventsAfterSQL is the stream's page of tenant $1's event rows after
// sequence $2 (of customer $3 when not NULL), oldest first, bounded by
// pageRows to the months that can hold it ({{months}}). A customer's
// events are the tenant's walk filtered (a tenant's streams read through
// one feed, so this filter serves only a stream's catch-up).
const eventsAfterSQL = `SELECT ` + eventColumns + ` FROM webhook_events
	WHERE tenant_id = $1 AND sequence > $2 AND ($3::uuid IS NULL OR customer_id = $3){{months}}
	ORDER BY sequence LIMIT $4`

// eventsAfterPage is the stream's page of rows (eventsAfterSQL).
func eventsAfterPage(tenant uuid.UUID, customer *uuid.UUID, after int64, limit int) seqPage {
	return seqPage{ascending: true, from: after, limit: limit, sql: eventsAfterSQL,
		args: []any{tenant, after, customer, limit}}
}

// EventsAfter implements engine.EventLog.
func (s *Store) EventsAfter(ctx context.Context, tenant uuid.UUID, customer *uuid.UUID, after int64, limit int) ([]engine.Event, error) {
	rows, carried, err := s.readEventPage(ctx, tenant, eventsAfterPage(tenant, customer, after, limit),
		carriedQuery(tenant, customer, after, true, 0, limit))
	if err != nil {
		return nil, fmt.Errorf("persist: events after: %w", err)
	}
	return mergeBySequence(rows, carried, true, limit), nil
}

// LastSequence implements engine.EventLog.
func (s *Store) LastSequence(ctx context.Context, tenant uuid.UUID) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT COALESCE((SELECT next FROM event_sequences WHERE tenant_id = $1), 0)`, tenant).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("persist: last sequence: %w", err)
	}
	return n, nil
}
