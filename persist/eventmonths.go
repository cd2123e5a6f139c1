package persist

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// Reads of a tenant's events by sequence, pruned to the months that can
// hold them (issue 30 item 1, migration 036). A page by sequence knows no
// instant: the persister's lag (and carried events copied into rows late,
// carried.go) stores old-dated events with new sequences. So
// webhook_event_months keeps each month's span of sequences per tenant,
// widened by a trigger in every inserting transaction, and a page reads
// only the months whose span meets the sequences it can hold, each named
// by a created_at range, which Postgres prunes on at plan time
// (TestEventPlansPrune).

// eventMonthsReadySQL tells whether the spans are kept: the trigger that
// keeps them is on webhook_events. Migration 035's contract replaces that
// table and 036's contract puts the trigger back, in the transaction that
// takes in the rows stored meanwhile, so in any snapshot the trigger's
// presence means the spans cover every row. Without it a page reads every
// month, as before 036.
const eventMonthsReadySQL = `SELECT EXISTS (SELECT 1 FROM pg_trigger
	WHERE tgrelid = 'webhook_events'::regclass AND tgname = 'webhook_events_months' AND tgenabled <> 'D')`

// eventMonthsSQL lists a tenant's months with their spans of sequences.
const eventMonthsSQL = `SELECT month, low, high FROM webhook_event_months WHERE tenant_id = $1 ORDER BY month`

// eventMonth is one month (its first instant, UTC) of a tenant's event
// rows, with the lowest and highest sequence stored in it.
type eventMonth struct {
	start     time.Time
	low, high int64
}

// meets tells whether the month holds a sequence in [lo, hi] by its span.
func (m eventMonth) meets(lo, hi int64) bool { return m.low <= hi && m.high >= lo }

// monthRange is the instants [from, to) of one or more adjacent months.
type monthRange struct{ from, to time.Time }

// nextMonth is the first instant of the month after start's.
func nextMonth(start time.Time) time.Time {
	return time.Date(start.Year(), start.Month()+1, 1, 0, 0, 0, 0, time.UTC)
}

// rangesOf merges months (ascending) into ranges, adjacent months into one.
func rangesOf(months []eventMonth) []monthRange {
	out := make([]monthRange, 0, len(months))
	for _, m := range months {
		end := nextMonth(m.start)
		if n := len(out); n > 0 && out[n-1].to.Equal(m.start) {
			out[n-1].to = end
			continue
		}
		out = append(out, monthRange{from: m.start, to: end})
	}
	return out
}

// monthsClause bounds created_at to ranges, as literals: Postgres prunes
// the other months at plan time and estimates the clause on the months'
// real bounds. As parameters, the generic plan (which Postgres settles on
// for a statement run often) guessed the range to keep 0.5% of the rows
// and read the whole range through the (tenant_id, created_at) index,
// sorting it, where the (tenant_id, sequence) index reads the page alone
// (TestEventPlansPrune). The literals are times Go formats, never input,
// and the statements they make are few: a tenant's months, alone or
// adjacent.
func monthsClause(ranges []monthRange) string {
	parts := make([]string, len(ranges))
	for i, r := range ranges {
		parts[i] = "(created_at >= '" + r.from.UTC().Format(time.RFC3339) + "' AND created_at < '" +
			r.to.UTC().Format(time.RFC3339) + "')"
	}
	return " AND (" + strings.Join(parts, " OR ") + ")"
}

// seqPage is a page of a tenant's event rows in sequence order: ascending
// after from, or descending below from (0: from the newest), at most limit.
type seqPage struct {
	ascending bool
	from      int64
	limit     int
	// sql is the page's statement, with {{months}} where the months'
	// clause goes, and args its parameters.
	sql  string
	args []any
	// edge, when edged, is the sequence of the page's limit-th carried
	// event: the page merged with the carried events ends there, so the
	// rows past it are not needed, and the months that hold only such
	// rows are not read (the rows of a tenant whose consume events are
	// carried lie sparse among its sequences).
	edge  int64
	edged bool
}

// statement is the page's statement over ranges (nil: every month).
func (p seqPage) statement(ranges []monthRange) string {
	if ranges == nil {
		return strings.Replace(p.sql, "{{months}}", "", 1)
	}
	return strings.Replace(p.sql, "{{months}}", monthsClause(ranges), 1)
}

// bounds are the sequences the page can hold, [lo, hi].
func (p seqPage) bounds() (lo, hi int64) {
	lo, hi = math.MinInt64, math.MaxInt64
	if p.ascending {
		lo = p.from + 1
		if p.edged {
			hi = p.edge
		}
		return lo, hi
	}
	if p.from > 0 {
		hi = p.from - 1
	}
	if p.edged {
		lo = p.edge
	}
	return lo, hi
}

// edgedBy is p bounded by carried, the carried events of the page's
// snapshot in its order, when they fill it.
func (p seqPage) edgedBy(carried []engine.Event) seqPage {
	if p.limit > 0 && len(carried) >= p.limit {
		p.edge, p.edged = *carried[p.limit-1].Sequence, true
	}
	return p
}

// pageRows reads page p from the months (known: the spans are kept; else
// every month is read). It reads the months whose span meets the page's
// first limit sequences, then checks its answer: a full page is exact
// when every month that can hold a sequence between the page's start and
// its last row has been read; a short one when every month that can hold
// a sequence of the page has (up to its edge, when edged). Else it reads
// again with those months too. A page the rows fill densely, or up to its
// carried edge, takes one read of the months its sequences lie in; a
// sparse one (a filter) a second, of every month that meets its bounds.
// run reads the page from ranges (nil: every month) with p.statement (the
// store's transaction; tests record it).
func pageRows(months []eventMonth, known bool, p seqPage,
	run func(ranges []monthRange) ([]engine.Event, error)) ([]engine.Event, error) {
	if p.limit <= 0 {
		return nil, nil
	}
	if !known {
		return run(nil)
	}
	lo, hi := p.bounds()
	var cand []eventMonth
	for _, m := range months {
		if m.meets(lo, hi) {
			cand = append(cand, m)
		}
	}
	if len(cand) == 0 {
		return nil, nil
	}
	// The first guess: the limit sequences next to the page's start, or
	// next to the nearest month's span when that starts further off.
	wlo, whi := lo, hi
	if p.ascending {
		start := lo
		if m := minLow(cand); m > start {
			start = m
		}
		wlo, whi = start, addClamped(start, int64(p.limit)-1)
	} else {
		end := hi
		if m := maxHigh(cand); m < end {
			end = m
		}
		wlo, whi = addClamped(end, 1-int64(p.limit)), end
	}
	picked := make([]bool, len(cand))
	for i, m := range cand {
		picked[i] = m.meets(wlo, whi)
	}
	for {
		var sel []eventMonth
		for i, m := range cand {
			if picked[i] {
				sel = append(sel, m)
			}
		}
		var evs []engine.Event
		if len(sel) > 0 {
			var err error
			if evs, err = run(rangesOf(sel)); err != nil {
				return nil, err
			}
		}
		wlo, whi = lo, hi
		if len(evs) >= p.limit {
			if edge := *evs[len(evs)-1].Sequence; p.ascending {
				whi = edge
			} else {
				wlo = edge
			}
		}
		grew := false
		for i, m := range cand {
			if !picked[i] && m.meets(wlo, whi) {
				picked[i], grew = true, true
			}
		}
		if !grew {
			return evs, nil
		}
	}
}

func minLow(ms []eventMonth) int64 {
	out := int64(math.MaxInt64)
	for _, m := range ms {
		out = min(out, m.low)
	}
	return out
}

func maxHigh(ms []eventMonth) int64 {
	out := int64(math.MinInt64)
	for _, m := range ms {
		out = max(out, m.high)
	}
	return out
}

// addClamped is a+b, held within int64 (b's sign says which end).
func addClamped(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	if b < 0 && a < math.MinInt64-b {
		return math.MinInt64
	}
	return a + b
}

// scanEventMonths reads eventMonthsSQL's rows.
func scanEventMonths(rows pgx.Rows) ([]eventMonth, error) {
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (eventMonth, error) {
		var m eventMonth
		err := r.Scan(&m.start, &m.low, &m.high)
		m.start = m.start.UTC()
		return m, err
	})
}

// readEventPage reads page p of tenant's event rows and the carried
// events of carried in one read-only snapshot (readEvents' reasons; the
// spans must be of the rows' snapshot too, else a row stored between
// them could be in a month left out). The snapshot's first statements,
// the spans and the carried events go in one round trip.
func (s *Store) readEventPage(ctx context.Context, tenant uuid.UUID, p seqPage, carried *pgx.QueuedQuery) (rows, carriedEvs []engine.Event, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	// The pool closes a connection handed back inside a transaction, so an
	// error before COMMIT leaves no open snapshot behind.
	defer conn.Release()
	batch := &pgx.Batch{}
	batch.Queue("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
	batch.Queue(eventMonthsReadySQL)
	batch.Queue(eventMonthsSQL, tenant)
	batch.Queue(carried.SQL, carried.Arguments...)
	res := conn.SendBatch(ctx, batch)
	var known bool
	var months []eventMonth
	err = func() error {
		if _, err := res.Exec(); err != nil {
			return err
		}
		if err := res.QueryRow().Scan(&known); err != nil {
			return err
		}
		r, err := res.Query()
		if err != nil {
			return err
		}
		if months, err = scanEventMonths(r); err != nil {
			return err
		}
		if r, err = res.Query(); err != nil {
			return err
		}
		carriedEvs, err = collectCarried(r)
		return err
	}()
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, err
	}
	rows, err = pageRows(months, known, p.edgedBy(carriedEvs), func(ranges []monthRange) ([]engine.Event, error) {
		r, err := conn.Query(ctx, p.statement(ranges), p.args...)
		if err != nil {
			return nil, err
		}
		return collectStored(r)
	})
	if err != nil {
		return nil, nil, err
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		return nil, nil, fmt.Errorf("commit: %w", err)
	}
	return rows, carriedEvs, nil
}
