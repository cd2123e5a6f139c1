package persist

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
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
// first limit sequences, then checks its answer (exact): a full page is
// exact when every month that can hold a sequence between the page's
// start and its last row has been read; a short one when every month that
// can hold a sequence of the page has (up to its edge, when edged). Else
// it reads the months still needed, merging their rows with the rows it
// has (the months are disjoint, so the page is the first limit rows of
// the merge). A short page (a filter, or rows sparse among carried
// events) does not read every remaining month at once: it adds them
// nearest its start first, as many as it has read so far (at least the
// ones its last rows need), so a filtered page that fills within a few
// months reads those months only, and one that fills nowhere reads every
// month in a number of statements logarithmic in them. run reads the page
// from ranges (nil: every month) with p.statement (the store's
// transaction; tests record it).
func pageRows(months []eventMonth, known bool, p seqPage,
	run func(ranges []monthRange) ([]engine.Event, error)) ([]engine.Event, error) {
	if p.limit <= 0 {
		return nil, nil
	}
	if !known {
		return run(nil)
	}
	cand := candidates(months, p)
	if len(cand) == 0 {
		return nil, nil
	}
	picked := firstPick(cand, p)
	read := make([]bool, len(cand))
	var evs []engine.Event
	for {
		var sel []eventMonth
		for i, m := range cand {
			if picked[i] && !read[i] {
				sel, read[i] = append(sel, m), true
			}
		}
		if len(sel) > 0 {
			more, err := run(rangesOf(sel))
			if err != nil {
				return nil, err
			}
			evs = mergeBySequence(evs, more, p.ascending, p.limit)
		}
		need := needed(cand, p, evs, read)
		if len(need) == 0 {
			return evs, nil
		}
		picked = grow(cand, p, read, need, len(evs) >= p.limit)
	}
}

// candidates are the months whose span meets p's bounds.
func candidates(months []eventMonth, p seqPage) []eventMonth {
	lo, hi := p.bounds()
	var cand []eventMonth
	for _, m := range months {
		if m.meets(lo, hi) {
			cand = append(cand, m)
		}
	}
	return cand
}

// firstPick marks the candidates that meet the limit sequences next to
// the page's start, or next to the nearest candidate's span when that
// starts further off: a page the rows fill densely lies in them.
func firstPick(cand []eventMonth, p seqPage) []bool {
	lo, hi := p.bounds()
	var wlo, whi int64
	if p.ascending {
		start := max(lo, minLow(cand))
		wlo, whi = start, addClamped(start, int64(p.limit)-1)
	} else {
		end := min(hi, maxHigh(cand))
		wlo, whi = addClamped(end, 1-int64(p.limit)), end
	}
	picked := make([]bool, len(cand))
	for i, m := range cand {
		picked[i] = m.meets(wlo, whi)
	}
	return picked
}

// needed lists the candidates not read that can hold a row of the page
// evs (the rows read from the others) would be: every one meeting the
// page's bounds when evs is short, only those between its start and its
// last row when full. None: evs is the page.
func needed(cand []eventMonth, p seqPage, evs []engine.Event, read []bool) []int {
	wlo, whi := p.bounds()
	if len(evs) >= p.limit {
		if edge := *evs[len(evs)-1].Sequence; p.ascending {
			whi = edge
		} else {
			wlo = edge
		}
	}
	var out []int
	for i, m := range cand {
		if !read[i] && m.meets(wlo, whi) {
			out = append(out, i)
		}
	}
	return out
}

// grow picks the candidates the next read takes: the needed ones of a
// full page (its last row bounds them); for a short page, the needed ones
// nearest the page's start (the highest spans first descending, the
// lowest ascending), as many as were read so far, at least one.
func grow(cand []eventMonth, p seqPage, read []bool, need []int, full bool) []bool {
	picked := slices.Clone(read)
	if !full {
		n := 0
		for _, r := range read {
			if r {
				n++
			}
		}
		slices.SortStableFunc(need, func(a, b int) int {
			if p.ascending {
				return cmp.Compare(cand[a].low, cand[b].low)
			}
			return cmp.Compare(cand[b].high, cand[a].high)
		})
		need = need[:min(len(need), max(n, 1))]
	}
	for _, i := range need {
		picked[i] = true
	}
	return picked
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

// eventMonthsGuessTenants bounds the tenants whose spans a Store keeps as
// the guess of their next page's months (docs/limits.md): past it the
// guesses are dropped and learnt again, one page each.
const eventMonthsGuessTenants = 4096

// monthGuesses keeps, per tenant, the spans its last page read: the next
// page reads the months they point to in its first round trip, and its
// own snapshot's spans then tell whether that was the page (issue 30 item
// 1). A stale guess costs a page its second try, never a wrong answer.
type monthGuesses struct {
	mu sync.Mutex
	by map[uuid.UUID]spansSeen
}

// spansSeen is a tenant's spans as a page read them, and whether they
// were kept (eventMonthsReadySQL).
type spansSeen struct {
	months []eventMonth
	known  bool
}

func (g *monthGuesses) get(tenant uuid.UUID) (spansSeen, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.by[tenant]
	return s, ok
}

func (g *monthGuesses) put(tenant uuid.UUID, s spansSeen) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.by[tenant]; !ok && len(g.by) >= eventMonthsGuessTenants {
		g.by = nil
	}
	if g.by == nil {
		g.by = make(map[uuid.UUID]spansSeen)
	}
	g.by[tenant] = s
}

// monthsGuess is the months a page reads before it has its snapshot's
// spans: every month (all) or ranges (none: no statement).
type monthsGuess struct {
	all    bool
	ranges []monthRange
}

// guessMonths is what page p reads first by the spans seen: the months
// pageRows would first read by them, or, when none of them meets the
// page (a stream at the head, past the spans seen), the month holding
// the highest sequence seen, where the head most likely still is.
func guessMonths(seen spansSeen, p seqPage) monthsGuess {
	if !seen.known {
		return monthsGuess{all: true}
	}
	cand := candidates(seen.months, p)
	if len(cand) == 0 {
		if len(seen.months) == 0 {
			return monthsGuess{}
		}
		head := seen.months[0]
		for _, m := range seen.months {
			if m.high > head.high {
				head = m
			}
		}
		return monthsGuess{ranges: rangesOf([]eventMonth{head})}
	}
	var sel []eventMonth
	for i, ok := range firstPick(cand, p) {
		if ok {
			sel = append(sel, cand[i])
		}
	}
	return monthsGuess{ranges: rangesOf(sel)}
}

// answers tells whether evs, read from the months of guess, is page p
// (edged) by the spans of the same snapshot: pageRows' check.
func (g monthsGuess) answers(months []eventMonth, known bool, p seqPage, evs []engine.Event) bool {
	if g.all || p.limit <= 0 {
		return true
	}
	if !known {
		return false
	}
	cand := candidates(months, p)
	read := make([]bool, len(cand))
	for i, m := range cand {
		for _, r := range g.ranges {
			read[i] = read[i] || (!m.start.Before(r.from) && m.start.Before(r.to))
		}
	}
	return len(needed(cand, p, evs, read)) == 0
}

// readEventPage reads page p of tenant's event rows and the carried
// events of carried in one read-only snapshot (readEvents' reasons; the
// spans must be of the rows' snapshot too, else a row stored between
// them could be in a month left out).
func (s *Store) readEventPage(ctx context.Context, tenant uuid.UUID, p seqPage, carried *pgx.QueuedQuery) (rows, carriedEvs []engine.Event, err error) {
	rows, carriedEvs, _, err = s.readEventPageTrips(ctx, tenant, p, carried)
	return rows, carriedEvs, err
}

// readEventPageTrips is readEventPage, with the round trips it took. With
// the tenant's spans seen by an earlier page, the whole snapshot is one
// round trip: BEGIN, the spans, the carried events, the rows of the
// months the spans seen point to, and COMMIT, pipelined; the snapshot's
// own spans then check the rows (as pageRows checks its first read), and
// a page they do not answer (the spans moved: a new month, a late row in
// another, a sparse page) is read again the long way in a new snapshot.
// The long way, for a tenant not seen yet, is BEGIN with the spans and
// carried events, the rows (pageRows: one statement or more), COMMIT.
func (s *Store) readEventPageTrips(ctx context.Context, tenant uuid.UUID, p seqPage, carried *pgx.QueuedQuery) (rows, carriedEvs []engine.Event, trips int, err error) {
	seen, ok := s.monthGuesses.get(tenant)
	if ok {
		guess := guessMonths(seen, p)
		var now spansSeen
		rows, carriedEvs, now, err = s.readGuessedPage(ctx, tenant, p, carried, guess)
		if err != nil {
			return nil, nil, 1, err
		}
		s.monthGuesses.put(tenant, now)
		if guess.answers(now.months, now.known, p.edgedBy(carriedEvs), rows) {
			return rows, carriedEvs, 1, nil
		}
		trips = 1
	}
	rows, carriedEvs, more, err := s.readPageLong(ctx, tenant, p, carried)
	return rows, carriedEvs, trips + more, err
}

// beginEventPage queues a page's snapshot and its first statements: the
// spans, whether they are kept, and the carried events.
func beginEventPage(batch *pgx.Batch, tenant uuid.UUID, carried *pgx.QueuedQuery) {
	batch.Queue("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
	batch.Queue(eventMonthsReadySQL)
	batch.Queue(eventMonthsSQL, tenant)
	batch.Queue(carried.SQL, carried.Arguments...)
}

// readBegun reads beginEventPage's answers.
func readBegun(res pgx.BatchResults) (seen spansSeen, carriedEvs []engine.Event, err error) {
	if _, err := res.Exec(); err != nil {
		return spansSeen{}, nil, err
	}
	if err := res.QueryRow().Scan(&seen.known); err != nil {
		return spansSeen{}, nil, err
	}
	r, err := res.Query()
	if err != nil {
		return spansSeen{}, nil, err
	}
	if seen.months, err = scanEventMonths(r); err != nil {
		return spansSeen{}, nil, err
	}
	if r, err = res.Query(); err != nil {
		return spansSeen{}, nil, err
	}
	carriedEvs, err = collectCarried(r)
	return seen, carriedEvs, err
}

// readGuessedPage is the one round trip of readEventPageTrips: the
// snapshot, begun and committed in one batch, with the rows of guess.
func (s *Store) readGuessedPage(ctx context.Context, tenant uuid.UUID, p seqPage, carried *pgx.QueuedQuery,
	guess monthsGuess) (rows, carriedEvs []engine.Event, seen spansSeen, err error) {
	batch := &pgx.Batch{}
	beginEventPage(batch, tenant, carried)
	read := p.limit > 0 && (guess.all || len(guess.ranges) > 0)
	if read {
		var ranges []monthRange
		if !guess.all {
			ranges = guess.ranges
		}
		batch.Queue(p.statement(ranges), p.args...)
	}
	batch.Queue("COMMIT")
	// A batch that fails leaves its connection inside the transaction, and
	// the pool closes such a connection (readPageLong).
	res := s.pool.SendBatch(ctx, batch)
	err = func() error {
		var err error
		if seen, carriedEvs, err = readBegun(res); err != nil {
			return err
		}
		if read {
			r, err := res.Query()
			if err != nil {
				return err
			}
			if rows, err = collectStored(r); err != nil {
				return err
			}
		}
		_, err = res.Exec()
		return err
	}()
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, spansSeen{}, err
	}
	return rows, carriedEvs, seen, nil
}

// readPageLong reads the page in a snapshot held over pageRows' reads:
// BEGIN with the spans and carried events, the rows, COMMIT.
func (s *Store) readPageLong(ctx context.Context, tenant uuid.UUID, p seqPage, carried *pgx.QueuedQuery) (rows, carriedEvs []engine.Event, trips int, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, 0, err
	}
	// The pool closes a connection handed back inside a transaction, so an
	// error before COMMIT leaves no open snapshot behind.
	defer conn.Release()
	batch := &pgx.Batch{}
	beginEventPage(batch, tenant, carried)
	res := conn.SendBatch(ctx, batch)
	trips = 1
	seen, carriedEvs, err := readBegun(res)
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, nil, trips, err
	}
	s.monthGuesses.put(tenant, seen)
	rows, err = pageRows(seen.months, seen.known, p.edgedBy(carriedEvs), func(ranges []monthRange) ([]engine.Event, error) {
		trips++
		r, err := conn.Query(ctx, p.statement(ranges), p.args...)
		if err != nil {
			return nil, err
		}
		return collectStored(r)
	})
	if err != nil {
		return nil, nil, trips, err
	}
	trips++
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		return nil, nil, trips, fmt.Errorf("commit: %w", err)
	}
	return rows, carriedEvs, trips, nil
}
