package persist

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

const entryColumns = `id, tenant_id, customer_id, environment, delta, type, source, credit_block_id,
	billable_metric_key, cost_units, exchange_rate, idempotency_key, reference_id, reason,
	metadata, created_at, draw_block_ids, draw_amounts`

func scanEntry(row pgx.Row, op ...*uuid.UUID) (engine.LedgerEntry, error) {
	var e engine.LedgerEntry
	var env, typ string
	var source *string
	var meta []byte
	var drawBlocks []uuid.UUID
	var drawAmounts []int64
	dest := []any{&e.ID, &e.TenantID, &e.CustomerID, &env, &e.Delta, &typ, &source, &e.CreditBlockID,
		&e.BillableMetricKey, &e.CostUnits, &e.ExchangeRate, &e.IdempotencyKey, &e.ReferenceID, &e.Reason,
		&meta, &e.CreatedAt, &drawBlocks, &drawAmounts}
	for _, o := range op {
		dest = append(dest, o) // the statement's op_id after entryColumns (History)
	}
	if err := row.Scan(dest...); err != nil {
		return engine.LedgerEntry{}, err
	}
	if len(drawBlocks) != len(drawAmounts) {
		return engine.LedgerEntry{}, fmt.Errorf("persist: entry %s has %d draw blocks and %d amounts", e.ID, len(drawBlocks), len(drawAmounts))
	}
	if len(drawBlocks) > 0 {
		e.Draws = make([]engine.LedgerDraw, len(drawBlocks))
		for i := range drawBlocks {
			e.Draws[i] = engine.LedgerDraw{CreditBlockID: drawBlocks[i], Amount: drawAmounts[i]}
		}
	}
	e.Environment = engine.Environment(env)
	e.Type = engine.EntryType(typ)
	if source != nil {
		s := engine.Source(*source)
		e.Source = &s
	}
	m, err := parseMetadata(meta)
	if err != nil {
		return engine.LedgerEntry{}, err
	}
	e.Metadata = m
	e.CreatedAt = e.CreatedAt.UTC()
	return e, nil
}

// History pages customer q.CustomerID's ledger newest first (created_at
// DESC, id DESC), keeping entries that match every filter given: type,
// source, billable_metric_key, From (inclusive) and To (exclusive).
// q.Limit is 1..100 (validated by the caller); a bad cursor is
// engine.BadRequest("cursor").
func (s *Store) History(ctx context.Context, q engine.HistoryQuery) (engine.Page[engine.LedgerEntry], error) {
	after, hasAfter, err := decodeCursor(q.Cursor)
	if err != nil {
		return engine.Page[engine.LedgerEntry]{}, err
	}
	// A first page reads the newest month first: a page found there reads
	// that month's partition (and the ones ahead of it) alone, whatever
	// number of months the ledger keeps; a page it does not fill is
	// completed from the months before it (docs/decisions.md "History pages
	// the newest month first"). A cursor page is one statement: its cursor
	// bound already leaves the newer months out.
	since, split := historyMonth(q, time.Now())
	if hasAfter || !split {
		list, err := s.historyRows(ctx, q, after, hasAfter, nil, nil, q.Limit+1)
		if err != nil {
			return engine.Page[engine.LedgerEntry]{}, err
		}
		return historyPage(list, q.Limit), nil
	}
	list, err := s.historyRows(ctx, q, after, hasAfter, &since, nil, q.Limit+1)
	if err != nil {
		return engine.Page[engine.LedgerEntry]{}, err
	}
	if len(list) < q.Limit+1 && (q.From == nil || q.From.Before(since)) {
		older, err := s.historyRows(ctx, q, after, hasAfter, nil, &since, q.Limit+1-len(list))
		if err != nil {
			return engine.Page[engine.LedgerEntry]{}, err
		}
		list = append(list, older...)
	}
	return historyPage(list, q.Limit), nil
}

// historyPage is the page of limit entries of list (limit+1 at most, the
// one past the page telling whether there are more).
func historyPage(list []historyRow, limit int) engine.Page[engine.LedgerEntry] {
	page := pageOf(list, limit, func(x historyRow) pageKey {
		return pageKey{at: x.e.CreatedAt, id: x.e.ID, op: x.op, withOp: true}
	})
	out := engine.Page[engine.LedgerEntry]{Data: make([]engine.LedgerEntry, len(page.Data)), HasMore: page.HasMore, NextCursor: page.NextCursor}
	for i, x := range page.Data {
		out.Data[i] = x.e
	}
	return out
}

// historyRow is an entry of a history page with its operation, the page
// key's tie-breaker.
type historyRow struct {
	e  engine.LedgerEntry
	op uuid.UUID
}

// historyRows reads up to n entries of History's page, newest first, dated
// at or after since and before before when given.
func (s *Store) historyRows(ctx context.Context, q engine.HistoryQuery, after pageKey, hasAfter bool,
	since, before *time.Time, n int) ([]historyRow, error) {
	sql, args := historyWindowSQL(q, after, hasAfter, since, before, n)
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("persist: history: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (historyRow, error) {
		var x historyRow
		var err error
		x.e, err = scanEntry(r, &x.op)
		return x, err
	})
	if err != nil {
		return nil, fmt.Errorf("persist: history: %w", err)
	}
	return list, nil
}

// historyMonth is the start of the UTC month History reads first for a
// first page: the month of its newest possible entry (just before To),
// else of now. Entries dated after it (a clock ahead, the months made
// ahead) are read with it. split is false for a month outside RFC 3339's
// years 1 to 9999 (a To at the very start of year 1), which the
// statement's text cannot name: such a page is one statement.
func historyMonth(q engine.HistoryQuery, now time.Time) (since time.Time, split bool) {
	top := now
	if q.To != nil {
		top = q.To.Add(-time.Microsecond)
	}
	return utcMonth(top, 0)
}

// historySQL is History's statement and arguments over every month: a
// page of limit+1 entries resuming after the cursor's key. Unfiltered, and filtered by
// consumption (most of any ledger, so a page is found at once), it reads
// ledger_entries_history_idx; with another type,
// ledger_entries_history_type_idx (migration 024), so the page costs the
// same whatever the ledger's size (TestHistoryTypeFilterPlan).
func historySQL(q engine.HistoryQuery, after pageKey, hasAfter bool) (string, []any) {
	return historyWindowSQL(q, after, hasAfter, nil, nil, q.Limit+1)
}

// historyWindowSQL is historySQL for n entries dated at or after since and
// before before, when given (History's newest month and the months
// before it).
func historyWindowSQL(q engine.HistoryQuery, after pageKey, hasAfter bool, since, before *time.Time, n int) (string, []any) {
	var sql strings.Builder
	sql.WriteString(`SELECT ` + entryColumns + `, op_id FROM ledger_entries WHERE customer_id = $1 AND tenant_id = $2`)
	args := []any{q.CustomerID, q.TenantID}
	where := func(cond string, v any) {
		args = append(args, v)
		fmt.Fprintf(&sql, cond, len(args))
	}
	// A first page states its type and month in the text (known entry
	// types and a month's start only): its statement then gets a generic
	// plan fit for its values, which the plan cache keeps (see the limit
	// below). A cursor page sends its type as a parameter and is planned
	// for it each time.
	if q.Type != nil {
		if !hasAfter && q.Type.Valid() {
			fmt.Fprintf(&sql, ` AND type = '%s'`, string(*q.Type))
		} else {
			where(` AND type = $%d`, string(*q.Type))
		}
		if *q.Type != engine.EntryConsumption {
			// Stated in the text so that a generic plan may use the
			// partial ledger_entries_history_type_idx (migration 024).
			sql.WriteString(` AND type <> 'consumption'`)
		}
	}
	if q.Source != nil {
		where(` AND source = $%d`, string(*q.Source))
	}
	if q.BillableMetricKey != nil {
		where(` AND billable_metric_key = $%d`, *q.BillableMetricKey)
	}
	if q.From != nil {
		where(` AND created_at >= $%d`, *q.From)
	}
	if q.To != nil {
		where(` AND created_at < $%d`, *q.To)
	}
	// since and before are a first page's (History) month starts.
	if since != nil {
		fmt.Fprintf(&sql, ` AND created_at >= '%s'`, since.UTC().Format(time.RFC3339))
	}
	if before != nil {
		fmt.Fprintf(&sql, ` AND created_at < '%s'`, before.UTC().Format(time.RFC3339))
	}
	switch {
	case hasAfter && after.withOp:
		args = append(args, after.at, after.op, after.id)
		// The row comparison alone prunes no partition of the ledger
		// (docs/scaling.md "Ledger partitioned by month"); the bound on
		// created_at it implies does, so a later page skips the newer
		// months (TestHistoryPrunesPartitions).
		fmt.Fprintf(&sql, ` AND (created_at, op_id, id) < ($%d, $%d, $%d) AND created_at <= $%d`, len(args)-2, len(args)-1, len(args), len(args)-2)
	case hasAfter:
		// A cursor of a page ordered without op_id (before this order).
		args = append(args, after.at, after.id)
		fmt.Fprintf(&sql, ` AND (created_at, id) < ($%d, $%d) AND created_at <= $%d`, len(args)-1, len(args), len(args)-1)
	}
	// Entries of one instant (a millisecond: the scripts' clock) follow
	// their operations: op ids are UUIDv7, ordered within a millisecond on
	// the node that made them (engine.NewCommandHeader), so a burst of
	// grants reads newest first; an index scan of
	// ledger_entries_history_idx gives created_at's order and an
	// incremental sort the rest, only within ties.
	//
	// A first page's limit is written into the text, not sent as a
	// parameter: with LIMIT $n Postgres' plan cache never takes the generic
	// plan (it prices it for an unknown limit) and planned every page again,
	// ~0.4 ms against ~0.05 ms to run it (docs/decisions.md "History pages
	// the newest month first"); at most 101 texts a shape. A cursor page
	// keeps the parameter, so it is always planned for its values: its
	// generic plan, priced for an unknown cursor, can sort a customer's
	// whole ledger (TestHistoryTypeFilterPlan).
	if hasAfter {
		args = append(args, n)
		fmt.Fprintf(&sql, ` ORDER BY created_at DESC, op_id DESC, id DESC LIMIT $%d`, len(args))
	} else {
		fmt.Fprintf(&sql, ` ORDER BY created_at DESC, op_id DESC, id DESC LIMIT %d`, n)
	}
	return sql.String(), args
}

// Overage sums the overage of customer's entries created in [from, to) per
// billable metric key, sorted by key (byte order); metrics without overage
// are left out and an empty window gives an empty, non-nil slice. A
// multi-metric consume's one entry counts per item (itemShares): its
// overage falls on its last items. A sum beyond int64 is an error rather
// than a wrapped number (invariant 7).
func (s *Store) Overage(ctx context.Context, c engine.CustomerKey, from, to time.Time) ([]engine.OverageLine, error) {
	rows, err := s.pool.Query(ctx, `SELECT key, SUM(overage)::bigint
		FROM (SELECT billable_metric_key AS key, overage_mc::numeric AS overage
				FROM ledger_entries
				WHERE customer_id = $1 AND tenant_id = $4 AND overage_mc > 0 AND created_at >= $2 AND created_at < $3
					AND billable_metric_key IS NOT NULL`+monthsCovering(from, to, "")+`
			UNION ALL
			SELECT key, overage FROM (`+itemSharesSQL+`
				WHERE e.customer_id = $1 AND e.tenant_id = $4 AND e.overage_mc > 0 AND e.created_at >= $2 AND e.created_at < $3
					AND e.type = 'consumption'`+monthsCovering(from, to, "e.")+itemSharesTail+`) items
			WHERE overage > 0) lines
		GROUP BY key
		ORDER BY key COLLATE "C"`, c.CustomerID, from, to, c.TenantID)
	if err != nil {
		return nil, fmt.Errorf("persist: overage: %w", err)
	}
	lines, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.OverageLine, error) {
		var l engine.OverageLine
		err := r.Scan(&l.BillableMetricKey, &l.OverageMC)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("persist: overage: %w", err)
	}
	if lines == nil {
		lines = []engine.OverageLine{}
	}
	return lines, nil
}

// utcMonth is the start of t's UTC month plus months, and whether its
// year is one RFC 3339 can write (1 to 9999), so a statement's text can
// name it.
func utcMonth(t time.Time, months int) (time.Time, bool) {
	t = t.UTC()
	m := time.Date(t.Year(), t.Month()+time.Month(months), 1, 0, 0, 0, 0, time.UTC)
	return m, m.Year() >= 1 && m.Year() <= 9999
}

// monthsCovering is a condition on column prefix+created_at, stated in the
// text, that holds for every instant of [from, to): from the start of
// from's UTC month to the start of the month after to's. It changes no
// answer; it lets the generic plan of a windowed read prune the ledger's
// other months when it is planned, not when it runs: a generic plan pruned
// at run time still locks every month's partition and indexes first (Postgres
// 15), and with six months kept an overage read cost up to 1.15x its
// one-month cost (docs/decisions.md "History pages the newest month
// first"). The text changes with the months named, not with the window.
// A window whose months cannot be written names none.
func monthsCovering(from, to time.Time, prefix string) string {
	if !from.Before(to) {
		return ""
	}
	lo, loOK := utcMonth(from, 0)
	hi, hiOK := utcMonth(to.Add(-time.Microsecond), 1)
	if !loOK || !hiOK {
		return ""
	}
	return fmt.Sprintf(` AND %[1]screated_at >= '%[2]s' AND %[1]screated_at < '%[3]s'`, prefix,
		lo.Format(time.RFC3339), hi.Format(time.RFC3339))
}

// itemSharesSQL, closed by a WHERE on e and itemSharesTail, lists the
// items of multi-metric consumption entries (one entry per call, its items
// in metadata.items, its metric null: lua/consume_multi.lua), one row per
// item: key, units, credits (what the balance paid for it) and overage.
// The charge pays the items in the order the call listed them, so the
// overage falls on the last ones: item i's overage is its cost, less what
// the charge has left after items 1..i-1, at least 0 (docs/decisions.md
// "Multi-metric usage in reports").
const itemSharesSQL = `SELECT key, units, cost - over AS credits, over AS overage
	FROM (SELECT i.item->>'billable_metric_key' AS key, (i.item->>'units')::numeric AS units,
			(i.item->>'cost')::numeric AS cost,
			GREATEST(0, LEAST((i.item->>'cost')::numeric,
				SUM((i.item->>'cost')::numeric) OVER (PARTITION BY e.id ORDER BY i.n) + e.delta)) AS over
		FROM ledger_entries e
			CROSS JOIN LATERAL jsonb_array_elements(e.metadata->'items') WITH ORDINALITY AS i(item, n)`

const itemSharesTail = `
			AND e.billable_metric_key IS NULL AND jsonb_typeof(e.metadata->'items') = 'array') shares`

const accountColumns = `customer_id, COALESCE(id::text, ''), tenant_id, environment, reserved_balance,
	lifetime_earned, version, updated_at, debt`

func scanAccount(row pgx.Row) (engine.AccountState, error) {
	var st engine.AccountState
	var env string
	var updated time.Time
	if err := row.Scan(&st.CustomerID, &st.AccountID, &st.TenantID, &env, &st.Reserved,
		&st.LifetimeEarned, &st.Version, &updated, &st.Debt); err != nil {
		return engine.AccountState{}, err
	}
	st.Environment = engine.Environment(env)
	st.UpdatedAtMS = updated.UnixMilli()
	st.Blocks = []engine.MutationBlock{}
	st.Applied = []engine.Mutation{}
	st.Reservations = []engine.MutationReservation{}
	st.Gauges = map[string]int64{}
	return st, nil
}

// AccountState reads what a rebuild of customer c needs: the account row,
// every block with credit left (whether or not past expires_at: the Load
// script and the expiry sweep judge time), the operations with an
// idempotency key applied at or after appliedSince, oldest first, the
// reservations still active or finalized within FinalizedReservationWindow (see
// finalizedSince), and every gauge counter. ok is false when the customer
// has no account row.
func (s *Store) AccountState(ctx context.Context, c engine.CustomerKey, appliedSince time.Time) (engine.AccountState, bool, error) {
	states, err := s.accountStates(ctx, `SELECT `+accountColumns+` FROM credit_accounts WHERE customer_id = $1 AND tenant_id = $2`,
		[]any{c.CustomerID, c.TenantID}, appliedSince)
	if err != nil {
		return engine.AccountState{}, false, fmt.Errorf("persist: account state: %w", err)
	}
	if len(states) == 0 {
		return engine.AccountState{}, false, nil
	}
	return states[0], true, nil
}

// AccountStates returns up to limit account states with customer id
// greater than after, in customer id order, for creditd rebuild: five
// queries per page whatever its size (accounts, their live blocks, their
// recent operations, their reservations, their gauges), so walking a million
// accounts stays cheap.
func (s *Store) AccountStates(ctx context.Context, after uuid.UUID, limit int, appliedSince time.Time) ([]engine.AccountState, error) {
	states, err := s.accountStates(ctx, `SELECT `+accountColumns+` FROM credit_accounts
		WHERE customer_id > $1 ORDER BY customer_id LIMIT $2`, []any{after, limit}, appliedSince)
	if err != nil {
		return nil, fmt.Errorf("persist: account states: %w", err)
	}
	return states, nil
}

// AccountIDCuts picks the ids at every count/parts-th account (index-only
// OFFSET probes: a few hundred ms for a million accounts, small next to the
// rebuild they balance). The nil id is never a cut.
func (s *Store) AccountIDCuts(ctx context.Context, parts int) ([]uuid.UUID, error) {
	n, err := s.CountAccounts(ctx)
	if err != nil || parts < 2 || n < int64(parts) {
		return nil, err
	}
	cuts := make([]uuid.UUID, 0, parts-1)
	for k := 1; k < parts; k++ {
		var id uuid.UUID
		if err := s.pool.QueryRow(ctx, `SELECT customer_id FROM credit_accounts ORDER BY customer_id OFFSET $1 LIMIT 1`,
			n*int64(k)/int64(parts)).Scan(&id); err != nil {
			return nil, fmt.Errorf("persist: account id cuts: %w", err)
		}
		if id != uuid.Nil && (len(cuts) == 0 || id != cuts[len(cuts)-1]) {
			cuts = append(cuts, id)
		}
	}
	return cuts, nil
}

// CountAccounts is the number of account rows, for rebuild progress.
func (s *Store) CountAccounts(ctx context.Context) (int64, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM credit_accounts`).Scan(&n); err != nil {
		return 0, fmt.Errorf("persist: count accounts: %w", err)
	}
	return n, nil
}

// readStatesWithBlocks runs accountSQL in tx and reads each account's live
// blocks (with their metadata when withMeta); index finds a customer's
// state and ids lists the customers, in accountSQL's order.
func readStatesWithBlocks(ctx context.Context, tx pgx.Tx, accountSQL string, args []any, withMeta bool) (
	states []engine.AccountState, index map[uuid.UUID]*engine.AccountState, ids []uuid.UUID, err error) {
	rows, err := tx.Query(ctx, accountSQL, args...)
	if err != nil {
		return nil, nil, nil, err
	}
	states, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.AccountState, error) { return scanAccount(r) })
	if err != nil || len(states) == 0 {
		return states, nil, nil, err
	}
	index = make(map[uuid.UUID]*engine.AccountState, len(states))
	ids = make([]uuid.UUID, len(states))
	for i := range states {
		index[states[i].CustomerID] = &states[i]
		ids[i] = states[i].CustomerID
	}
	metaColumn := "NULL::jsonb"
	if withMeta {
		metaColumn = "metadata"
	}
	rows, err = tx.Query(ctx, `SELECT customer_id, id, original_amount, remaining_amount, priority, source,
			starts_at, expires_at, created_at, `+metaColumn+`, applies_to
		FROM credit_blocks WHERE customer_id = ANY($1) AND tenant_id = ANY($2) AND remaining_amount > 0
		ORDER BY customer_id, created_at, id`, ids, stateTenants(index))
	if err != nil {
		return nil, nil, nil, err
	}
	var customer uuid.UUID
	var b engine.MutationBlock
	var source string
	var starts, created time.Time
	var expires *time.Time
	var meta []byte
	var scope []string
	_, err = pgx.ForEachRow(rows, []any{&customer, &b.ID, &b.Original, &b.Remaining, &b.Priority, &source,
		&starts, &expires, &created, &meta, &scope}, func() error {
		blk := b
		blk.Scope = nil
		if len(scope) > 0 {
			blk.Scope = append([]string(nil), scope...)
		}
		blk.Source = engine.Source(source)
		blk.StartsMS, blk.CreatedMS, blk.ExpiresMS, blk.Metadata = starts.UnixMilli(), created.UnixMilli(), nil, nil
		if expires != nil {
			ms := expires.UnixMilli()
			blk.ExpiresMS = &ms
		}
		if len(meta) > 0 && string(meta) != "{}" {
			blk.Metadata = json.RawMessage(append([]byte(nil), meta...))
		}
		st := index[customer]
		st.Blocks = append(st.Blocks, blk)
		return nil
	})
	if err != nil {
		return states, index, ids, err
	}
	return states, index, ids, fillBudgets(ctx, tx, index, ids, time.Now())
}

// budgetSpentSQL sums what consumption entries of customer $1 created in
// [$3, $4) cost ($2 "": every metric; else that metric, whose part of a
// multi-metric entry is its items' costs): each entry's cost is minus its
// delta (what the blocks and the credit line paid) plus its overage, the
// cost lua/prelude/budgets.lua budget_take counted, plus what its parent $5 (NULL:
// none) paid of its charges in the window, the parent's pool_draw entries
// that name it (docs/rules.md "Shared pools"); $6 is their tenant (a
// parent is of its child's tenant).
const budgetSpentSQL = `SELECT (SELECT COALESCE(SUM(CASE
		WHEN $2 = '' OR e.billable_metric_key = $2 THEN -e.delta + e.overage_mc
		ELSE (SELECT COALESCE(SUM((i->>'cost')::bigint), 0) FROM jsonb_array_elements(e.metadata->'items') i
			WHERE i->>'billable_metric_key' = $2) END), 0)::bigint
	FROM ledger_entries e
	WHERE e.customer_id = $1 AND e.tenant_id = $6 AND e.type = 'consumption' AND e.created_at >= $3 AND e.created_at < $4
		AND ($2 = '' OR e.billable_metric_key = $2
			OR (e.billable_metric_key IS NULL AND jsonb_typeof(e.metadata->'items') = 'array')))
	+ (SELECT COALESCE(SUM(-p.delta), 0)::bigint FROM ledger_entries p
	WHERE $5::uuid IS NOT NULL AND p.customer_id = $5 AND p.tenant_id = $6 AND p.type = 'pool_draw' AND p.reference_id = $1
		AND p.created_at >= $3 AND p.created_at < $4 AND ($2 = '' OR p.billable_metric_key = $2))`

// poolDrawnSQL sums what child $2 drew from parent $1 (of tenant $5) in [$3, $4): the
// parent's pool_draw entries that name it, the draw limit's count
// (lua/prelude/pools.lua pool_take).
const poolDrawnSQL = `SELECT COALESCE(SUM(-delta), 0)::bigint FROM ledger_entries
	WHERE customer_id = $1 AND tenant_id = $5 AND type = 'pool_draw' AND reference_id = $2
		AND created_at >= $3 AND created_at < $4`

// fillBudgets sets the budget counters of the customers of index that have
// budgets, and the draw counter of those with a parent and a draw limit,
// for the periods holding now: one query for the customers, then one sum
// per counter through the history index's (customer_id, created_at)
// prefix, bounded by a period of entries.
func fillBudgets(ctx context.Context, tx pgx.Tx, index map[uuid.UUID]*engine.AccountState, ids []uuid.UUID, now time.Time) error {
	if len(ids) == 0 {
		return nil
	}
	rows, err := tx.Query(ctx, `SELECT id, tenant_id, budgets, parent_id, parent_draw_limit FROM customers
		WHERE id = ANY($1) AND tenant_id = ANY($2) AND (budgets <> '[]'::jsonb OR parent_draw_limit IS NOT NULL)`,
		ids, stateTenants(index))
	if err != nil {
		return err
	}
	type owner struct {
		id, tenant uuid.UUID
		budgets    []engine.Budget
		parent     *uuid.UUID
		limit      *engine.DrawLimit
	}
	var owners []owner
	var id, tenant uuid.UUID
	var parent *uuid.UUID
	var doc, limitDoc []byte
	if _, err := pgx.ForEachRow(rows, []any{&id, &tenant, &doc, &parent, &limitDoc}, func() error {
		o := owner{id: id, tenant: tenant, parent: parent}
		if err := json.Unmarshal(doc, &o.budgets); err != nil {
			return fmt.Errorf("budgets of customer %s: %w", id, err)
		}
		if limitDoc != nil {
			o.limit = &engine.DrawLimit{}
			if err := json.Unmarshal(limitDoc, o.limit); err != nil {
				return fmt.Errorf("parent_draw_limit of customer %s: %w", id, err)
			}
		}
		owners = append(owners, o)
		return nil
	}); err != nil {
		return err
	}
	for _, o := range owners {
		st := index[o.id]
		st.Budgets = make(map[string]engine.BudgetCounter, len(o.budgets)+1)
		for _, b := range o.budgets {
			from, end := b.CountingFrom(now)
			// The scripts count from the millisecond (engine.BudgetArg).
			fromMS := from.UnixMilli()
			var spent int64
			if err := tx.QueryRow(ctx, budgetSpentSQL, o.id, b.Metric(), time.UnixMilli(fromMS), end, o.parent, o.tenant).Scan(&spent); err != nil {
				return fmt.Errorf("budget %s of customer %s: %w", b.Field(), o.id, err)
			}
			st.Budgets[b.Field()] = engine.BudgetCounter{FromMS: fromMS, SpentMC: spent, Reached: spent >= b.LimitMC && spent > 0}
		}
		if o.limit != nil && o.parent != nil {
			from, end := o.limit.CountingFrom(now)
			fromMS := from.UnixMilli()
			var drawn int64
			if err := tx.QueryRow(ctx, poolDrawnSQL, *o.parent, o.id, time.UnixMilli(fromMS), end, o.tenant).Scan(&drawn); err != nil {
				return fmt.Errorf("draw limit of customer %s: %w", o.id, err)
			}
			st.Budgets[o.limit.Field()] = engine.BudgetCounter{FromMS: fromMS, SpentMC: drawn}
		}
	}
	return nil
}

// stateTenants lists the tenants of the states in index, once each: the
// follow-up reads of a page of accounts filter on them as well as on the
// customers, so each reads only its tenants' rows (one tenant for a
// customer's rebuild: one shard of a tenant-sharded Postgres).
func stateTenants(index map[uuid.UUID]*engine.AccountState) []uuid.UUID {
	var out []uuid.UUID
	for _, st := range index {
		if !slices.Contains(out, st.TenantID) {
			out = append(out, st.TenantID)
		}
	}
	return out
}

// accountStates runs accountSQL and fills each account's blocks, applied
// operations, reservations and gauges, all in one repeatable-read snapshot so the
// reads agree with each other.
func (s *Store) accountStates(ctx context.Context, accountSQL string, args []any, appliedSince time.Time) ([]engine.AccountState, error) {
	var states []engine.AccountState
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var index map[uuid.UUID]*engine.AccountState
		var ids []uuid.UUID
		var err error
		states, index, ids, err = readStatesWithBlocks(ctx, tx, accountSQL, args, true)
		if err != nil || len(states) == 0 {
			return err
		}

		// The page's customers are one id range (rebuild pages are in id
		// order): a range scan of operations_customer_idx, not one probe per
		// id; a row of a customer outside the page is skipped.
		lo, hi := ids[0], ids[0]
		for _, id := range ids[1:] {
			if bytes.Compare(id[:], lo[:]) < 0 {
				lo = id
			}
			if bytes.Compare(id[:], hi[:]) > 0 {
				hi = id
			}
		}
		rows, err := tx.Query(ctx, `SELECT customer_id, mutation FROM operations
			WHERE customer_id BETWEEN $1 AND $2 AND tenant_id = ANY($4) AND created_at >= $3
			ORDER BY customer_id, account_version, created_at, op_id`, lo, hi, appliedSince, stateTenants(index))
		if err != nil {
			return err
		}
		var customer uuid.UUID
		var doc []byte
		_, err = pgx.ForEachRow(rows, []any{&customer, &doc}, func() error {
			st := index[customer]
			if st == nil {
				return nil
			}
			var m engine.Mutation
			if err := engine.DecodeMutation(doc, &m); err != nil {
				return fmt.Errorf("decode operation of customer %s: %w", customer, err)
			}
			st.Applied = append(st.Applied, m)
			return nil
		})
		if err != nil {
			return err
		}
		if err := fillReservations(ctx, tx, index, ids, finalizedSince(appliedSince)); err != nil {
			return err
		}
		return fillLeases(ctx, tx, index, ids)
	})
	if err != nil {
		return nil, err
	}
	if states == nil {
		states = []engine.AccountState{}
	}
	return states, nil
}
