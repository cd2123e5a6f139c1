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

// Consume events carried by the ledger (migration 028, issue 26 item 4).
// A lean consume (ophead.go) owes at most one event of its own that its
// ledger entry does not already hold the figures of: credit.consumed. Its
// data is the entry's metric, units, charge and overage, the op head's
// balances and version, the customer's external id, and the instant and
// key the entry has; a row of webhook_events for it cost some 750 bytes
// and a row written per consume. So the lean write stores no row for it:
// the entry carries its sequence (event_sequence) and every read rebuilds
// the event from the entry (engine.CarriedConsumedEvent), under the id
// engine.CarriedEventID gives the entry, with status pending and no
// attempt, as a row would be before any delivery.
//
// Reads take the rows and the carried events of a tenant and merge them
// by sequence (both are indexed by (tenant, sequence)). Delivery keeps its
// state in rows, so a tenant with a webhook URL has its carried events
// copied into rows (materializeCarried, before each claim), in sequence
// order; event_carried_through records how far, and reads take carried
// events after that point only, so an event is read in one form. A
// tenant without a webhook URL never pays for a row: its consume events
// wait as carried, as its rows would wait, pending, unattempted.
//
// Only the lean write carries (copy.go: a batch with no event completed
// in SQL); a replay (ON CONFLICT) writes the event as a row under its
// usual id unless the entry already carries it (insertMutationEventsSQL).

// carriesConsumed tells whether m's credit.consumed, if it owes one, can
// be carried by its main entry m.Entries[main]: m is a lean consume
// (leanMain) in the lean shape, with a Context (its event needs no
// completing in SQL).
func carriesConsumed(m *engine.Mutation, shape recordShape) (main int, ok bool) {
	if shape != shapeLean || m.Context == nil {
		return 0, false
	}
	return leanMain(m)
}

// carriedColumns are the ledger columns a carried event is rebuilt from:
// headColumns, then the entry id, its event sequence and the customer's
// external id (immutable: docs/spec/interface.md, PATCH /v1/customers).
const carriedColumns = headColumns + `, id, event_sequence,
	(SELECT c.external_id FROM customers c WHERE c.id = customer_id)`

// scanCarried rebuilds the event a carrying entry holds.
func scanCarried(r pgx.CollectableRow) (engine.Event, error) {
	var h headRow
	var entry uuid.UUID
	var seq int64
	var ext *string
	if err := r.Scan(append(h.scan(), &entry, &seq, &ext)...); err != nil {
		return engine.Event{}, err
	}
	m, err := h.mutation()
	if err != nil {
		return engine.Event{}, err
	}
	main := len(m.Entries) - 1
	if engine.EntryID(m.OpID, main) != entry {
		return engine.Event{}, fmt.Errorf("persist: carried event of entry %s: its op head names entry %d", entry, main)
	}
	e := engine.CarriedConsumedEvent(m, main, ext)
	e.Sequence = &seq
	e.Payload = []byte(sequencedPayload(seq, string(e.Payload)))
	e.Deliveries = []engine.Delivery{}
	return e, nil
}

// carriedEventsSQL lists tenant $1's carried events (of customer $2 when
// not NULL) with a sequence above both $3 and the tenant's through, by
// sequence ascending ($5: else descending, below $6 when $7), at most $4.
// A carried event is dated by its consume and numbered when the persister
// writes it, so a lagging persister stores old-dated entries with new
// sequences: no created_at bound follows from a sequence. The months of
// the ledger whose span of carried sequences (migration 037) meets the
// read's bound it: from the first such month to the end of the last.
// The bound is computed in the statement (it runs in the same round trip
// as the page's other reads, so it cannot be a literal), as scalar
// subqueries, whose values Postgres prunes the ledger's months on at
// execution time (TestCarriedPlansPrune). Before 037's contract is
// recorded (the previous release's nodes kept no spans) every month is
// read, as before.
const carriedEventsSQL = `SELECT ` + carriedColumns + ` FROM ledger_entries
	WHERE tenant_id = $1 AND event_sequence IS NOT NULL
		AND event_sequence > GREATEST($3::bigint,
			COALESCE((SELECT through FROM event_carried_through WHERE tenant_id = $1), 0))
		AND ($2::uuid IS NULL OR customer_id = $2)
		AND ($5 OR NOT $7 OR event_sequence < $6)
		AND created_at >= (SELECT CASE WHEN ` + carriedMonthsKept + ` THEN COALESCE(min(m.month), 'infinity')
			ELSE '-infinity'::timestamptz END FROM ledger_event_months m WHERE ` + carriedMonthsMeet + `)
		AND created_at < (SELECT CASE WHEN ` + carriedMonthsKept + `
			THEN COALESCE((max(m.month) AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC', '-infinity')
			ELSE 'infinity'::timestamptz END FROM ledger_event_months m WHERE ` + carriedMonthsMeet + `)
	ORDER BY CASE WHEN $5 THEN event_sequence END, CASE WHEN NOT $5 THEN event_sequence END DESC
	LIMIT $4`

// carriedToCopySQL lists tenant $1's carried events with a sequence in
// ($2, $3], by sequence, at most $4: the ones materializeTenant copies
// into rows. Bounded like carriedEventsSQL, by the ledger months whose
// span meets those sequences, pruned at execution time.
const carriedToCopySQL = `SELECT ` + carriedColumns + ` FROM ledger_entries
	WHERE tenant_id = $1 AND event_sequence > $2 AND event_sequence <= $3
		AND created_at >= (SELECT CASE WHEN ` + carriedMonthsKept + ` THEN COALESCE(min(m.month), 'infinity')
			ELSE '-infinity'::timestamptz END FROM ledger_event_months m WHERE ` + carriedMonthsBetween + `)
		AND created_at < (SELECT CASE WHEN ` + carriedMonthsKept + `
			THEN COALESCE((max(m.month) AT TIME ZONE 'UTC' + interval '1 month') AT TIME ZONE 'UTC', '-infinity')
			ELSE 'infinity'::timestamptz END FROM ledger_event_months m WHERE ` + carriedMonthsBetween + `)
	ORDER BY event_sequence LIMIT $4`

// carriedMonthsBetween picks the spans (m) that meet carriedToCopySQL's
// sequences.
const carriedMonthsBetween = `m.tenant_id = $1 AND m.high > $2 AND m.low <= $3`

// carriedMonthsKept tells whether the spans of carried sequences cover
// every carried entry: 037's contract is recorded.
const carriedMonthsKept = `EXISTS (SELECT 1 FROM schema_contracts WHERE version = 37)`

// carriedMonthsMeet picks the spans (m) that meet carriedEventsSQL's
// sequences.
const carriedMonthsMeet = `m.tenant_id = $1
	AND m.high > GREATEST($3::bigint, COALESCE((SELECT through FROM event_carried_through WHERE tenant_id = $1), 0))
	AND ($5 OR NOT $7 OR m.low < $6)`

// readEvents runs read in one read-only snapshot: the rows and the
// carried events of a read must be of one instant, else an event copied
// into a row between the two statements would be in neither (or in both),
// and one stored meanwhile could be passed over by a stream's cursor.
func (s *Store) readEvents(ctx context.Context, read func(tx pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, read)
}

// collectStored and collectCarried read a query's rows and carried events.
func collectStored(rows pgx.Rows) ([]engine.Event, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.Event, error) { return scanEvent(r) })
}

func collectCarried(rows pgx.Rows) ([]engine.Event, error) { return pgx.CollectRows(rows, scanCarried) }

// carriedQuery is carriedEventsSQL with its arguments (carriedEvents').
func carriedQuery(tenant uuid.UUID, customer *uuid.UUID, after int64, ascending bool, before int64, limit int) *pgx.QueuedQuery {
	return &pgx.QueuedQuery{SQL: carriedEventsSQL, Arguments: []any{tenant, customer, after, limit, ascending, before, before > 0}}
}

// mergeBySequence merges a and b, each ordered by sequence (ascending or
// not), into one such order, at most limit.
func mergeBySequence(a, b []engine.Event, ascending bool, limit int) []engine.Event {
	out := make([]engine.Event, 0, min(limit, len(a)+len(b)))
	for len(out) < limit && (len(a) > 0 || len(b) > 0) {
		takeA := len(b) == 0
		if len(a) > 0 && len(b) > 0 {
			takeA = (*a[0].Sequence < *b[0].Sequence) == ascending
		}
		if takeA {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return out
}

// materializeBatch bounds the carried events one tenant copies into rows
// per claim, and materializeTenants the tenants per claim.
const (
	materializeBatch   = 500
	materializeTenants = 64
)

// behindTenantsSQL lists the tenants with a webhook URL and secret whose
// events have gone past their through: those that may have carried events
// to copy.
const behindTenantsSQL = `SELECT s.tenant_id FROM event_sequences s
	JOIN tenants t ON t.id = s.tenant_id AND t.webhook_url IS NOT NULL AND t.webhook_secret IS NOT NULL
	LEFT JOIN event_carried_through m ON m.tenant_id = s.tenant_id
	WHERE s.next > COALESCE(m.through, 0)
	LIMIT $1`

// materializeCarried copies the carried events of every tenant with a
// webhook URL into webhook_events, where delivery keeps its state.
func (s *Store) materializeCarried(ctx context.Context) error {
	rows, err := s.pool.Query(ctx, behindTenantsSQL, materializeTenants)
	if err != nil {
		return fmt.Errorf("persist: tenants behind: %w", err)
	}
	tenants, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		return fmt.Errorf("persist: tenants behind: %w", err)
	}
	for _, t := range tenants {
		if err := s.materializeTenant(ctx, t); err != nil {
			return err
		}
	}
	return nil
}

// materializeTenant copies up to materializeBatch of tenant's carried
// events after its through into rows and moves through past them, in one
// transaction holding the tenant's through row (two nodes copy a tenant
// one at a time). The counter is read first: every event numbered up to it
// has committed (its writer held the counter until it did), so after
// copying the carried ones up to it nothing before through is left out.
func (s *Store) materializeTenant(ctx context.Context, tenant uuid.UUID) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("persist: materialize events: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var through, next int64
	err = tx.QueryRow(ctx, `INSERT INTO event_carried_through AS m (tenant_id, through) VALUES ($1, 0)
		ON CONFLICT (tenant_id) DO UPDATE SET through = m.through
		RETURNING through, COALESCE((SELECT next FROM event_sequences WHERE tenant_id = $1), 0)`, tenant).Scan(&through, &next)
	if err != nil {
		return fmt.Errorf("persist: materialize events: %w", err)
	}
	if next <= through {
		return tx.Commit(ctx)
	}
	rows, err := tx.Query(ctx, carriedToCopySQL, tenant, through, next, materializeBatch)
	if err != nil {
		return fmt.Errorf("persist: materialize events: %w", err)
	}
	evs, err := pgx.CollectRows(rows, scanCarried)
	if err != nil {
		return fmt.Errorf("persist: materialize events: %w", err)
	}
	upTo := next
	if len(evs) == materializeBatch {
		upTo = *evs[len(evs)-1].Sequence
	}
	if len(evs) > 0 {
		if err := copyCarriedRows(ctx, tx, evs); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE event_carried_through SET through = $2 WHERE tenant_id = $1`, tenant, upTo); err != nil {
		return fmt.Errorf("persist: materialize events: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("persist: materialize events: %w", err)
	}
	return nil
}

// copyCarriedRows inserts evs (rebuilt carried events, their payloads
// sequenced) as pending rows, lean bodies as the persister stores them.
func copyCarriedRows(ctx context.Context, tx pgx.Tx, evs []engine.Event) error {
	slices.SortFunc(evs, func(a, b engine.Event) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	n := len(evs)
	ids, tenants := make([]uuid.UUID, n), make([]uuid.UUID, n)
	customers := make([]*uuid.UUID, n)
	envs, types, bodies := make([]string, n), make([]string, n), make([]string, n)
	ats := make([]time.Time, n)
	seqs, versions := make([]int64, n), make([]*int64, n)
	for i, e := range evs {
		ids[i], tenants[i], customers[i] = e.ID, e.TenantID, e.CustomerID
		envs[i], types[i], ats[i], seqs[i], versions[i] = string(e.Environment), string(e.EventType), e.CreatedAt, *e.Sequence, e.Version
		// The payload opens with its sequence (a number: no comma in it);
		// the row stores the lean body of the rest after it, as copyIn does.
		p := string(e.Payload)
		whole := "{" + p[strings.IndexByte(p, ',')+1:]
		bodies[i] = sequencedPayload(seqs[i], leanEventBody(whole, e.ID, e.EventType, e.TenantID, e.Environment, e.CustomerID))
	}
	_, err := tx.Exec(ctx, `INSERT INTO webhook_events
		(id, tenant_id, environment, customer_id, event_type, payload, status, attempts, next_retry_at, created_at,
		sequence, account_version)
		SELECT id, tenant, env, customer, type, body, 'pending', 0, at, at, seq, version
		FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::uuid[], $5::text[], $6::text[], $7::timestamptz[],
			$8::bigint[], $9::bigint[]) AS p(id, tenant, env, customer, type, body, at, seq, version)
		ON CONFLICT (id, tenant_id, created_at) DO NOTHING`, ids, tenants, envs, customers, types, bodies, ats, seqs, versions)
	if err != nil {
		return fmt.Errorf("persist: materialize events: %w", err)
	}
	return nil
}
