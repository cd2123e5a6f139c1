package persist

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// TestEventPagesAcrossMonths (issue 30 item 1): with a tenant's events in
// five months (the legacy partition's, three monthly partitions and the
// DEFAULT one) and their sequences interleaved across the months (a
// lagging persister stores old-dated events with new sequences, some of
// them by COPY, as copyCarriedRows does), paging through the whole events
// list and the whole stream catch-up, filtered or not, at page sizes from
// 1 up, gives every event exactly once, in sequence order, as reading
// every month does; and the spans (migration 036's trigger) are each
// month's lowest and highest sequence.
func TestEventPagesAcrossMonths(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	tenant := live.TenantID
	now := time.Now().UTC()
	// legacy (before the partitions made at setup), three made months,
	// and one after them (DEFAULT).
	months := []time.Time{monthStart(now, -1), monthStart(now, 0), monthStart(now, 1), monthStart(now, 2),
		monthStart(now, 5)}
	customers := []uuid.UUID{uuid.New(), uuid.New()}
	insert := func(i int, month time.Time) {
		t.Helper()
		c := customers[i%2]
		e := engine.NewEvent(uuid.New(), engine.EventTestPing, tenant, live.Environment, &c, nil,
			month.Add(time.Hour+time.Duration(i)*time.Minute), "", struct{}{})
		if err := b.store.InsertEvent(b.ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	// 160 events, the writer's month moving forward over the first four;
	// every 7th dated a month back (a persister catching up), every 13th
	// in the month after the made ones.
	for i := range 160 {
		m := i / 40
		switch {
		case i%13 == 5:
			m = 4
		case i%7 == 3 && m > 0:
			m--
		}
		insert(i, months[m])
	}
	// A late batch by COPY, dated in the legacy month, with the next
	// sequences, then more events in the newest made month.
	var next int64
	if err := b.pool.QueryRow(b.ctx, `UPDATE event_sequences SET next = next + 10 WHERE tenant_id = $1
		RETURNING next`, tenant).Scan(&next); err != nil {
		t.Fatal(err)
	}
	copied := make([][]any, 10)
	for i := range copied {
		seq := next - 9 + int64(i)
		copied[i] = []any{uuid.New(), tenant, string(live.Environment), customers[i%2], string(engine.EventTestPing),
			sequencedPayload(seq, `{"data":{}}`), "pending", int32(0), months[0].Add(time.Hour), months[0].Add(time.Hour),
			seq, int64(0)}
	}
	if _, err := b.pool.CopyFrom(b.ctx, pgx.Identifier{"webhook_events"}, eventCopyColumns, pgx.CopyFromRows(copied)); err != nil {
		t.Fatal(err)
	}
	for i := 160; i < 165; i++ {
		insert(i, months[3])
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE webhook_events SET status = 'delivered' WHERE tenant_id = $1 AND sequence % 3 = 0`,
		tenant); err != nil {
		t.Fatal(err)
	}

	// What reading every month gives.
	type stored struct {
		seq      int64
		customer uuid.UUID
		status   string
	}
	rows, err := b.pool.Query(b.ctx, `SELECT sequence, customer_id, status FROM webhook_events WHERE tenant_id = $1
		ORDER BY sequence`, tenant)
	if err != nil {
		t.Fatal(err)
	}
	all, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (stored, error) {
		var s stored
		return s, r.Scan(&s.seq, &s.customer, &s.status)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 175 {
		t.Fatalf("%d events stored, want 175", len(all))
	}
	var where []string
	if err := b.pool.QueryRow(b.ctx, `SELECT array_agg(DISTINCT tableoid::regclass::text) FROM webhook_events
		WHERE tenant_id = $1`, tenant).Scan(&where); err != nil || len(where) != 5 {
		t.Fatalf("events in %v (%v), want five partitions", where, err)
	}

	// The spans are the months' lowest and highest sequences.
	var wrong int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM (
		SELECT date_trunc('month', created_at, 'UTC') AS month, min(sequence) AS low, max(sequence) AS high
		FROM webhook_events WHERE tenant_id = $1 GROUP BY 1) r
		FULL JOIN (SELECT * FROM webhook_event_months WHERE tenant_id = $1) m USING (month)
		WHERE m.low IS DISTINCT FROM r.low OR m.high IS DISTINCT FROM r.high`, tenant).Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d months' spans differ from their rows (%v)", wrong, err)
	}

	want := func(keep func(stored) bool, descending bool) []int64 {
		var out []int64
		for _, s := range all {
			if keep(s) {
				out = append(out, s.seq)
			}
		}
		if descending {
			slices.Reverse(out)
		}
		return out
	}
	everything := func(stored) bool { return true }

	t.Run("list", func(t *testing.T) {
		for _, tc := range []struct {
			status string
			limit  int
		}{{"", 1}, {"", 7}, {"", 50}, {"", 500}, {"delivered", 1}, {"delivered", 9}, {"pending", 40}, {"failed", 5}} {
			t.Run(fmt.Sprintf("%s/%d", tc.status, tc.limit), func(t *testing.T) {
				var got []int64
				q := engine.EventQuery{Status: tc.status, Limit: tc.limit}
				for pages := 0; ; pages++ {
					if pages > len(all)+1 {
						t.Fatal("the list does not end")
					}
					page, err := b.store.ListEvents(b.ctx, tenant, q)
					if err != nil {
						t.Fatal(err)
					}
					for _, e := range page.Data {
						got = append(got, *e.Sequence)
					}
					if !page.HasMore {
						break
					}
					q.Cursor = page.NextCursor
				}
				keep := func(s stored) bool { return tc.status == "" || s.status == tc.status }
				if w := want(keep, true); !slices.Equal(got, w) {
					t.Fatalf("paged %v\nwant   %v", got, w)
				}
			})
		}
	})
	t.Run("stream", func(t *testing.T) {
		for _, tc := range []struct {
			customer *uuid.UUID
			limit    int
		}{{nil, 1}, {nil, 7}, {nil, 64}, {nil, 1000}, {&customers[0], 3}, {&customers[1], 25}} {
			t.Run(fmt.Sprintf("%v/%d", tc.customer != nil, tc.limit), func(t *testing.T) {
				var got []int64
				after := int64(0)
				for pages := 0; ; pages++ {
					if pages > len(all)+1 {
						t.Fatal("the catch-up does not end")
					}
					evs, err := b.store.EventsAfter(b.ctx, tenant, tc.customer, after, tc.limit)
					if err != nil {
						t.Fatal(err)
					}
					if len(evs) == 0 {
						break
					}
					for _, e := range evs {
						got = append(got, *e.Sequence)
					}
					after = *evs[len(evs)-1].Sequence
				}
				keep := everything
				if tc.customer != nil {
					keep = func(s stored) bool { return s.customer == *tc.customer }
				}
				if w := want(keep, false); !slices.Equal(got, w) {
					t.Fatalf("caught up %v\nwant       %v", got, w)
				}
			})
		}
	})
}

// TestPageRowsChecksItsGuess: pageRows' answer over the months it picks
// is the answer over every month, whatever the spans' overlap: cases of
// spans and rows built in Go, each page's result compared with a read of
// every month, and the months it read counted.
func TestPageRowsChecksItsGuess(t *testing.T) {
	month := func(i int) time.Time { return time.Date(2026, time.Month(1+i), 1, 0, 0, 0, 0, time.UTC) }
	// rows: month index of each sequence 1..n.
	for _, tc := range []struct {
		name      string
		rows      []int // rows[i]: the month of sequence i+1, -1 for none (a carried event)
		ascending bool
		from      int64
		limit     int
		edge      int64 // the limit-th carried event's sequence, 0 for none
		reads     int   // statements pageRows runs
		// monthsRead, when set, is how many months those statements read
		// in all (none twice).
		monthsRead int
	}{
		{name: "dense newest page", rows: []int{0, 0, 0, 1, 1, 1, 2, 2, 2}, limit: 3, reads: 1},
		{name: "dense page over two months", rows: []int{0, 0, 0, 1, 1, 1, 2, 2, 2}, from: 6, limit: 3, reads: 1},
		{name: "a late old row in the page", rows: []int{0, 0, 1, 1, 0, 1, 2, 2, 0}, limit: 4, reads: 1},
		{name: "a late old row below the guess", rows: []int{0, 0, 1, 1, 1, 1, 0, 2, 2}, from: 9, limit: 3, reads: 1},
		{name: "sparse rows", rows: []int{0, -1, -1, 1, -1, -1, -1, -1, 2}, from: 9, limit: 3, reads: 2},
		{name: "ascending dense", rows: []int{0, 0, 0, 1, 1, 1, 2, 2, 2}, ascending: true, from: 2, limit: 3, reads: 1},
		{name: "ascending with a late row", rows: []int{0, 0, 1, 1, 1, 0, 2, 2, 2}, ascending: true, limit: 4, reads: 1},
		// A short page adds the months nearest its start, as many as it
		// has read: here one, then one more.
		{name: "ascending sparse", rows: []int{0, -1, -1, -1, -1, 1, -1, 2, 2}, ascending: true, limit: 3, reads: 3},
		// A filtered page that fills in its nearest months reads no other
		// (months 0 to 3 hold no sequence it can take: read 5, 4 then 3
		// and 2, where reading every month at the second read took all six).
		{name: "sparse page filling in its nearest months",
			rows: []int{0, 0, 1, 1, 2, -1, 3, -1, -1, 4, -1, -1, -1, -1, 5}, limit: 4, reads: 3, monthsRead: 4},
		{name: "sparse page reading every month",
			rows: []int{0, -1, 1, -1, 2, -1, 3, -1, 4, -1, 5}, limit: 9, reads: 2, monthsRead: 6},
		{name: "ascending past the end", rows: []int{0, 0, 1}, ascending: true, from: 3, limit: 3, reads: 0},
		{name: "filtered to nothing", rows: []int{-1, -1, -1}, limit: 2, reads: 0},
		// Carried events fill the sequences the rows leave: the rows past
		// the carried edge are not needed, nor the months holding only them.
		{name: "sparse rows up to a carried edge", rows: []int{0, 0, 0, 1, -1, 1, -1, -1, 2}, from: 9, limit: 3, edge: 6,
			reads: 1},
		{name: "no row up to a carried edge", rows: []int{0, 0, 0, 1, -1, -1, -1, -1, 2}, from: 9, limit: 3, edge: 6},
		{name: "ascending sparse up to a carried edge", rows: []int{0, -1, -1, -1, -1, 1, 1, 2, 2}, ascending: true,
			limit: 3, edge: 4, reads: 1},
		{name: "a carried edge past a late row", rows: []int{0, 0, 1, 1, -1, -1, 0, -1, 2}, limit: 4, edge: 5, reads: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spans := map[int]*eventMonth{}
			for i, m := range tc.rows {
				if m < 0 {
					continue
				}
				seq := int64(i + 1)
				if s, ok := spans[m]; ok {
					s.low, s.high = min(s.low, seq), max(s.high, seq)
				} else {
					spans[m] = &eventMonth{start: month(m), low: seq, high: seq}
				}
			}
			var ms []eventMonth
			for i := range 12 {
				if s, ok := spans[i]; ok {
					ms = append(ms, *s)
				}
			}
			// run answers a read of ranges from the rows in them.
			var reads, monthsRead int
			run := func(ranges []monthRange) []engine.Event {
				var out []engine.Event
				for i, m := range tc.rows {
					seq := int64(i + 1)
					if m < 0 || (tc.ascending && seq <= tc.from) || (!tc.ascending && tc.from > 0 && seq >= tc.from) {
						continue
					}
					in := ranges == nil
					for _, r := range ranges {
						in = in || (!month(m).Before(r.from) && month(m).Before(r.to))
					}
					if in {
						out = append(out, engine.Event{Sequence: &seq})
					}
				}
				if !tc.ascending {
					slices.Reverse(out)
				}
				return out[:min(len(out), tc.limit)]
			}
			p := seqPage{ascending: tc.ascending, from: tc.from, limit: tc.limit, sql: "{{months}}", edge: tc.edge,
				edged: tc.edge != 0}
			got, err := pageRows(ms, true, p, func(ranges []monthRange) ([]engine.Event, error) {
				reads++
				if len(ranges) == 0 {
					return nil, errors.New("a statement bounded to no month")
				}
				for _, r := range ranges {
					for m := r.from; m.Before(r.to); m = nextMonth(m) {
						monthsRead++
					}
				}
				return run(ranges), nil
			})
			if err != nil {
				t.Fatal(err)
			}
			// Past the edge the page ends in carried events: rows there
			// are not compared.
			seqs := func(evs []engine.Event) []int64 {
				out := []int64{}
				for _, e := range evs {
					if s := *e.Sequence; tc.edge == 0 || (tc.ascending && s <= tc.edge) || (!tc.ascending && s >= tc.edge) {
						out = append(out, s)
					}
				}
				return out
			}
			if w := seqs(run(nil)); !slices.Equal(seqs(got), w) {
				t.Fatalf("page %v, want %v (every month read)", seqs(got), w)
			}
			if reads != tc.reads {
				t.Errorf("%d reads, want %d", reads, tc.reads)
			}
			if tc.monthsRead != 0 && monthsRead != tc.monthsRead {
				t.Errorf("%d months read, want %d", monthsRead, tc.monthsRead)
			}
		})
	}
}

// TestRedeliverByInstant (issue 30 item 1): redeliver finds an event
// dead-lettered by RecordAttempt by its kept instant, answers a second
// redeliver, an unknown id and an event never dead-lettered (in an older
// month) as before, and, while 036's contract is not recorded, still
// finds an event dead-lettered without a kept instant (by the previous
// release) in every month.
func TestRedeliverByInstant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	tenant := live.TenantID
	if _, err := b.pool.Exec(b.ctx, `UPDATE tenants SET webhook_url = 'http://127.0.0.1:1/hook', webhook_secret = 's'
		WHERE id = $1`, tenant); err != nil {
		t.Fatal(err)
	}
	at := monthStart(time.Now(), 1).Add(time.Minute)
	dead := engine.NewEvent(uuid.New(), engine.EventTestPing, tenant, live.Environment, nil, nil, at, "", struct{}{})
	old := engine.NewEvent(uuid.New(), engine.EventTestPing, tenant, live.Environment, nil, nil, at.Add(-40*24*time.Hour),
		"", struct{}{})
	for _, e := range []engine.Event{dead, old} {
		if err := b.store.InsertEvent(b.ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	claims, err := b.store.ClaimDue(b.ctx, at.Add(time.Hour), time.Minute, 10, 10, nil)
	if err != nil || len(claims) != 2 {
		t.Fatalf("ClaimDue = %d claims, %v", len(claims), err)
	}
	gone := "gone"
	for _, c := range claims {
		if c.Event.ID != dead.ID {
			continue
		}
		if ok, err := b.store.RecordAttempt(b.ctx, c, engine.Attempt{At: at.Add(time.Hour), DurationMS: 5,
			Status: engine.EventDeadLetter, Attempts: 1, Error: &gone}); err != nil || !ok {
			t.Fatalf("RecordAttempt = %v, %v", ok, err)
		}
	}
	var kept *time.Time
	var indexed bool
	if err := b.pool.QueryRow(b.ctx, deadInstantSQL, dead.ID, tenant).Scan(&kept, &indexed); err != nil || kept == nil ||
		!kept.Equal(at) || !indexed {
		t.Fatalf("kept instant %v, every one kept %v (%v), want %v and true", kept, indexed, err, at)
	}
	// A pending event two months back, never dead-lettered.
	pending := engine.NewEvent(uuid.New(), engine.EventTestPing, tenant, live.Environment, nil, nil,
		monthStart(at, -2).Add(time.Minute), "", struct{}{})
	if err := b.store.InsertEvent(b.ctx, pending); err != nil {
		t.Fatal(err)
	}
	contracted := func(yes bool) {
		t.Helper()
		sql := `DELETE FROM schema_contracts WHERE version = 36`
		if yes {
			sql = `INSERT INTO schema_contracts (version, name) VALUES (36, '036_event_months') ON CONFLICT DO NOTHING`
		}
		if _, err := b.pool.Exec(b.ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	// The previous release dead-letters without keeping the instant.
	if _, err := b.pool.Exec(b.ctx, `UPDATE webhook_events SET status = 'dead_letter', locked_until = NULL, lease = NULL
		WHERE id = $1`, old.ID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		id         uuid.UUID
		contracted bool // 036's contract recorded
		want       error
	}{
		{"dead-lettered", dead.ID, true, nil},
		{"again", dead.ID, true, engine.ErrNotDeadLetter},
		{"never dead-lettered, in an older month", pending.ID, true, engine.ErrNotDeadLetter},
		{"unknown", uuid.New(), true, engine.ErrNotFound},
		{"dead-lettered by the previous release", old.ID, false, nil},
		{"again, without a kept instant", old.ID, false, engine.ErrNotDeadLetter},
		{"never dead-lettered, before the contract", pending.ID, false, engine.ErrNotDeadLetter},
		{"unknown, before the contract", uuid.New(), false, engine.ErrNotFound},
	} {
		contracted(tc.contracted)
		e, err := b.store.Redeliver(b.ctx, tenant, tc.id, at.Add(2*time.Hour))
		if !errors.Is(err, tc.want) {
			t.Fatalf("%s: Redeliver = %v, want %v", tc.name, err, tc.want)
		}
		if err == nil && (e.ID != tc.id || e.Status != engine.EventPending || e.Attempts != 0) {
			t.Fatalf("%s: redelivered %+v, want it pending, unattempted", tc.name, e)
		}
	}
}

// spansMatchRows fails t unless every month's span in
// webhook_event_months is its rows' lowest and highest sequence, for
// every tenant.
func spansMatchRows(t *testing.T, b *bundle, ctx context.Context, when string) {
	t.Helper()
	var wrong int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM (
		SELECT tenant_id, date_trunc('month', created_at, 'UTC') AS month, min(sequence) AS low, max(sequence) AS high
		FROM webhook_events GROUP BY 1, 2) r
		FULL JOIN webhook_event_months m USING (tenant_id, month)
		WHERE m.low IS DISTINCT FROM r.low OR m.high IS DISTINCT FROM r.high`).Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%s: %d months' spans differ from their rows (%v)", when, wrong, err)
	}
}

// TestEventMonthsMigrateOnline (issue 30 item 1): a database at 035's
// expand (events not yet partitioned) takes 036's expand and then the
// contracts (035's switch, 036's trigger on the new table) while a writer
// keeps storing events dated over three months: no write fails, after
// each step the spans are every month's sequences and readers trust them
// (the trigger is on webhook_events, not left on webhook_events_legacy),
// the events dead-lettered before 036 or by the previous release after
// its expand are indexed by the contract, and the list pages through
// every event.
func TestEventMonthsMigrateOnline(t *testing.T) {
	t.Parallel()
	b := setupAt(t, 35)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	live, _ := b.tenant(t)
	tenant := live.TenantID
	now := time.Now().UTC()
	if _, err := b.pool.Exec(ctx, `INSERT INTO webhook_events (id, tenant_id, environment, event_type, payload, status,
			attempts, created_at, sequence)
		SELECT gen_random_uuid(), $1, 'live', 'test.ping', '{"sequence":' || g || '}',
			CASE WHEN g % 50 = 0 THEN 'dead_letter' ELSE 'delivered' END, 1,
			now() - make_interval(days => (g * 7) % 90), g
		FROM generate_series(1, 2000) AS g`, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO event_sequences (tenant_id, next) VALUES ($1, 2000)`, tenant); err != nil {
		t.Fatal(err)
	}

	stop := make(chan struct{})
	var writeErr error
	var written int
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			at := now.Add(-time.Duration(i%3) * 31 * 24 * time.Hour)
			e := engine.NewEvent(uuid.New(), engine.EventTestPing, tenant, live.Environment, nil, nil, at, "", struct{}{})
			if err := b.store.InsertEvent(ctx, e); err != nil {
				writeErr = err
				return
			}
			written++
			time.Sleep(time.Millisecond)
		}
	}()
	ready := func(when string) {
		t.Helper()
		var known bool
		var onLegacy int
		if err := b.pool.QueryRow(ctx, eventMonthsReadySQL).Scan(&known); err != nil || !known {
			t.Fatalf("%s: spans trusted %v (%v)", when, known, err)
		}
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_trigger WHERE tgname = 'webhook_events_months'`).
			Scan(&onLegacy); err != nil || onLegacy != 1 {
			t.Fatalf("%s: the spans' trigger is on %d tables (%v), want one", when, onLegacy, err)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if err := Migrate(ctx, b.pool); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	ready("after 036's expand")
	// The previous release, still running, dead-letters an event.
	if _, err := b.pool.Exec(ctx, `UPDATE webhook_events SET status = 'dead_letter' WHERE tenant_id = $1 AND sequence = 7`,
		tenant); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := MigrateContract(ctx, b.pool); err != nil {
		t.Fatalf("MigrateContract: %v", err)
	}
	ready("after the contracts")
	time.Sleep(50 * time.Millisecond)
	close(stop)
	<-done
	if writeErr != nil {
		t.Fatalf("a write during the migrations failed: %v", writeErr)
	}
	if written == 0 {
		t.Fatal("the writer stored nothing")
	}
	spansMatchRows(t, b, ctx, "after the contracts")

	var unindexed int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_events e WHERE status = 'dead_letter'
		AND NOT EXISTS (SELECT 1 FROM webhook_event_dead d WHERE d.id = e.id AND d.tenant_id = e.tenant_id
			AND d.created_at = e.created_at)`).Scan(&unindexed); err != nil || unindexed != 0 {
		t.Fatalf("%d dead-lettered events without their instant (%v)", unindexed, err)
	}

	var got []int64
	q := engine.EventQuery{Limit: 100}
	for {
		page, err := b.store.ListEvents(ctx, tenant, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Data {
			got = append(got, *e.Sequence)
		}
		if !page.HasMore {
			break
		}
		q.Cursor = page.NextCursor
	}
	if len(got) != 2000+written || got[0] != int64(2000+written) || got[len(got)-1] != 1 ||
		!slices.IsSortedFunc(got, func(a, b int64) int { return int(b - a) }) {
		t.Fatalf("listed %d events (%d..%d), want %d from the newest down to 1", len(got), got[0], got[len(got)-1],
			2000+written)
	}
}

// TestEventPageRoundTrips (issue 30 item 1): a page of a tenant whose
// spans the store has seen takes one round trip (the snapshot begun,
// read and committed in one batch), and its snapshot's spans catch a
// guess they do not answer (a late row in a month the guess left out,
// the trigger gone), which is read again the long way: every page equals
// a read of every month, whatever the trips.
func TestEventPageRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	tenant := live.TenantID
	now := time.Now().UTC()
	m0, m1 := monthStart(now, 0), monthStart(now, 1)
	insert := func(at time.Time, n int) {
		t.Helper()
		for i := range n {
			e := engine.NewEvent(uuid.New(), engine.EventTestPing, tenant, live.Environment, nil, nil,
				at.Add(time.Duration(i)*time.Minute), "", struct{}{})
			if err := b.store.InsertEvent(b.ctx, e); err != nil {
				t.Fatal(err)
			}
		}
	}
	insert(m0.Add(time.Hour), 30)
	insert(m1.Add(time.Hour), 30)
	// want is the page read from every month, as before migration 036.
	want := func(p seqPage) []int64 {
		t.Helper()
		rows, err := b.pool.Query(b.ctx, p.statement(nil), p.args...)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := collectStored(rows)
		if err != nil {
			t.Fatal(err)
		}
		return sequencesOf(evs)
	}
	list := func(before int64, limit int) (seqPage, *pgx.QueuedQuery) {
		return listEventsPage(tenant, "", "", before, limit), carriedQuery(tenant, nil, 0, false, before, limit)
	}
	stream := func(after int64, limit int) (seqPage, *pgx.QueuedQuery) {
		return eventsAfterPage(tenant, nil, after, limit), carriedQuery(tenant, nil, after, true, 0, limit)
	}
	for _, tc := range []struct {
		name  string
		page  func() (seqPage, *pgx.QueuedQuery)
		trips int
		first []int64 // the page's first sequences, when set
		then  func()
	}{
		{name: "first page, spans not seen", page: func() (seqPage, *pgx.QueuedQuery) { return list(0, 11) }, trips: 3,
			first: []int64{60}},
		{name: "first page again", page: func() (seqPage, *pgx.QueuedQuery) { return list(0, 11) }, trips: 1},
		{name: "cursor page across the months", page: func() (seqPage, *pgx.QueuedQuery) { return list(35, 11) },
			trips: 1, first: []int64{34}},
		{name: "stream at the head, new rows in the head month",
			page: func() (seqPage, *pgx.QueuedQuery) { return stream(60, 10) }, trips: 1, first: []int64{61},
			then: func() { insert(m1.Add(2*time.Hour), 3) }},
		// Rows sparse under a filter: the guess (the head month) is short,
		// the long way reads the head month, then the older one.
		{name: "a filtered page spanning the months",
			page: func() (seqPage, *pgx.QueuedQuery) {
				return listEventsPage(tenant, "delivered", "", 0, 4), carriedQuery(tenant, nil, 0, false, 0, 0)
			}, trips: 5, first: []int64{62},
			then: func() {
				if _, err := b.pool.Exec(b.ctx, `UPDATE webhook_events SET status = 'delivered'
					WHERE tenant_id = $1 AND sequence IN (3, 7, 31, 62)`, tenant); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "the filtered page again", page: func() (seqPage, *pgx.QueuedQuery) {
			return listEventsPage(tenant, "delivered", "", 0, 4), carriedQuery(tenant, nil, 0, false, 0, 0)
		}, trips: 5},
		// A late row dated in the older month takes sequence 64: the guess
		// (the head month) misses it, the snapshot's spans say so.
		{name: "stream with a late row in an older month",
			page: func() (seqPage, *pgx.QueuedQuery) { return stream(63, 10) }, trips: 4, first: []int64{64},
			then: func() { insert(m0.Add(3*time.Hour), 1) }},
		// An old database without the trigger: the spans seen are not
		// trusted, every month is read, then in one trip.
		{name: "the trigger gone", page: func() (seqPage, *pgx.QueuedQuery) { return list(0, 11) }, trips: 4,
			first: []int64{64},
			then: func() {
				if _, err := b.pool.Exec(b.ctx, `ALTER TABLE webhook_events DISABLE TRIGGER webhook_events_months`); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "the trigger gone, seen", page: func() (seqPage, *pgx.QueuedQuery) { return list(20, 11) }, trips: 1,
			first: []int64{19}},
	} {
		if tc.then != nil {
			tc.then()
		}
		p, carried := tc.page()
		rows, _, trips, err := b.store.readEventPageTrips(b.ctx, tenant, p, carried)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, w := sequencesOf(rows), want(p)
		if !slices.Equal(got, w) {
			t.Fatalf("%s: page %v, want %v (every month read)", tc.name, got, w)
		}
		if tc.first != nil && (len(got) == 0 || got[0] != tc.first[0]) {
			t.Fatalf("%s: page %v, want it to start at %d", tc.name, got, tc.first[0])
		}
		if trips != tc.trips {
			t.Errorf("%s: %d round trips, want %d", tc.name, trips, tc.trips)
		}
	}
}

// sequencesOf lists evs' sequences.
func sequencesOf(evs []engine.Event) []int64 {
	out := []int64{}
	for _, e := range evs {
		out = append(out, *e.Sequence)
	}
	return out
}

// TestInsertEventFindsStoredID (issue 30 item 1): a subscription event
// written again under its id, dated in another month (a tag does not fix
// the instant), is found in its older month and stored once, taking no
// second sequence; a test.ping written again (a retry: the same instant)
// is found in its month and stored once.
func TestInsertEventFindsStoredID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	tenant := live.TenantID
	now := time.Now().UTC()
	old, later := monthStart(now, -1).Add(time.Hour), monthStart(now, 2).Add(time.Hour)
	customer := uuid.New()
	sub := func(at time.Time) engine.Event {
		return engine.NewEvent(uuid.NewSHA1(uuid.NameSpaceURL, []byte("subscription-event:"+tenant.String())),
			engine.EventSubscriptionRenewed, tenant, live.Environment, &customer, nil, at, "", struct{}{})
	}
	ping := engine.NewEvent(uuid.Must(uuid.NewV7()), engine.EventTestPing, tenant, live.Environment, nil, nil, old, "",
		struct{}{})
	writeSub := func(e engine.Event) {
		t.Helper()
		if err := pgx.BeginFunc(b.ctx, b.pool, func(tx pgx.Tx) error { return insertEvents(b.ctx, tx, []engine.Event{e}) }); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		write func()
		id    uuid.UUID
		at    time.Time // the stored row's instant
		next  int64     // the tenant's counter after
	}{
		{"subscription event", func() { writeSub(sub(old)) }, sub(old).ID, old, 1},
		{"subscription event again, dated months later", func() { writeSub(sub(later)) }, sub(old).ID, old, 1},
		{"ping", func() {
			if err := b.store.InsertEvent(b.ctx, ping); err != nil {
				t.Fatal(err)
			}
		}, ping.ID, old, 2},
		{"ping retried", func() {
			if err := b.store.InsertEvent(b.ctx, ping); err != nil {
				t.Fatal(err)
			}
		}, ping.ID, old, 2},
	} {
		tc.write()
		var n int
		var at time.Time
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*), min(created_at) FROM webhook_events WHERE id = $1 AND tenant_id = $2`,
			tc.id, tenant).Scan(&n, &at); err != nil {
			t.Fatal(err)
		}
		if n != 1 || !at.Equal(tc.at) {
			t.Fatalf("%s: %d rows, dated %v; want one, dated %v", tc.name, n, at, tc.at)
		}
		if next, err := b.store.LastSequence(b.ctx, tenant); err != nil || next != tc.next {
			t.Fatalf("%s: counter %d (%v), want %d", tc.name, next, err, tc.next)
		}
	}
}

// TestLateCarriedEventsFound (issue 30 item 1): consume events carried
// by the ledger, dated in an older month than rows stored before them
// (a lagging persister), are found by every page, carried and then as
// rows (copied at the next claim, with their old instants and the
// sequences they had): through pages whose guessed months (the spans a
// page saw before) do not hold them, by the stream's catch-up, and by
// redeliver (409: pending).
func TestLateCarriedEventsFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	tenant := live.TenantID
	now := time.Now().UTC()
	m0, m1 := monthStart(now, 0), monthStart(now, 1)
	for i := range 6 {
		e := engine.NewEvent(uuid.New(), engine.EventTestPing, tenant, live.Environment, nil, nil,
			m1.Add(time.Hour+time.Duration(i)*time.Minute), "", struct{}{})
		if err := b.store.InsertEvent(b.ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	listAll := func(when string, limit int) []int64 {
		t.Helper()
		var got []int64
		q := engine.EventQuery{Limit: limit}
		for range 20 {
			page, err := b.store.ListEvents(b.ctx, tenant, q)
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			got = append(got, sequencesOf(page.Data)...)
			if !page.HasMore {
				return got
			}
			q.Cursor = page.NextCursor
		}
		t.Fatalf("%s: the list does not end", when)
		return nil
	}
	if got := listAll("before the consumes", 3); !slices.Equal(got, []int64{6, 5, 4, 3, 2, 1}) {
		t.Fatalf("listed %v", got)
	}

	c := &profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 1, balance: 2_000_000}
	grant := c.grant(tenant)
	grant.AtMS = m0.Add(time.Hour).UnixMilli()
	ms := []engine.Mutation{grant}
	for i := range 3 {
		m := c.consume(tenant, true)
		m.AtMS = m0.Add(2*time.Hour + time.Duration(i)*time.Minute).UnixMilli()
		ms = append(ms, m)
	}
	customerRows(t, b, ms)
	if err := b.store.Apply(b.ctx, ms[:1]); err != nil {
		t.Fatal(err)
	}
	if err := b.store.insertApply(b.ctx, ms[1:], nil); err != nil {
		t.Fatal(err)
	}
	var carried int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM ledger_entries WHERE tenant_id = $1 AND event_sequence IS NOT NULL
		AND created_at < $2`, tenant, m1).Scan(&carried); err != nil || carried != 3 {
		t.Fatalf("%d consume events carried in the older month (%v), want 3", carried, err)
	}
	want := []int64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}
	check := func(when string) {
		t.Helper()
		for _, limit := range []int{1, 3, 20} {
			if got := listAll(when, limit); !slices.Equal(got, want) {
				t.Fatalf("%s, pages of %d: listed %v, want %v", when, limit, got, want)
			}
		}
		evs, err := b.store.EventsAfter(b.ctx, tenant, nil, 6, 10)
		if err != nil {
			t.Fatal(err)
		}
		if got := sequencesOf(evs); !slices.Equal(got, []int64{7, 8, 9, 10}) {
			t.Fatalf("%s: caught up %v after 6, want 7..10", when, got)
		}
		for _, e := range evs {
			if e.EventType != engine.EventCreditConsumed {
				continue
			}
			if _, err := b.store.Redeliver(b.ctx, tenant, e.ID, now); !errors.Is(err, engine.ErrNotDeadLetter) {
				t.Fatalf("%s: redeliver of consume event %d: %v, want ErrNotDeadLetter", when, *e.Sequence, err)
			}
		}
	}
	check("carried")
	// A webhook URL: the next claim copies the carried events into rows,
	// dated in the older month, under the sequences they had.
	if _, err := b.pool.Exec(b.ctx, `UPDATE tenants SET webhook_url = 'http://127.0.0.1:1/hook', webhook_secret = 's'
		WHERE id = $1`, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.ClaimDue(b.ctx, now.Add(-365*24*time.Hour), time.Minute, 1, 1, nil); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM webhook_events WHERE tenant_id = $1 AND created_at < $2
		AND event_type = 'credit.consumed'`, tenant, m1).Scan(&rows); err != nil || rows != 3 {
		t.Fatalf("%d consume events copied into rows of the older month (%v), want 3", rows, err)
	}
	check("copied into rows")
}

// TestCarriedPlansPrune (issue 30 item 1, migration 037): the lean write,
// by COPY or by INSERT, keeps each month's span of carried sequences (the
// spans equal the entries'), and the carried events' read (carriedEventsSQL) executes
// only the ledger months from the first to the last whose span meets its
// sequences: a stream's catch-up past the older months reads the newest,
// a list page below a cursor leaves the newer months out, a tenant whose
// carried events were copied into rows up to the newest month reads that
// one, and so does the claim's copy of the events after that point
// (carriedToCopySQL). The other months are pruned at execution time (the bounds are
// scalar subqueries), custom and generic plans alike. Before 037's
// contract is recorded every month is read.
func TestCarriedPlansPrune(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	tenant := live.TenantID
	now := time.Now().UTC()
	months := []time.Time{monthStart(now, 0), monthStart(now, 1), monthStart(now, 2)}
	c := &profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 1, balance: 2_000_000_000}
	grant := c.grant(tenant)
	grant.AtMS = months[0].UnixMilli()
	customerRows(t, b, []engine.Mutation{grant, c.consume(tenant, true)})
	if err := b.store.Apply(b.ctx, []engine.Mutation{grant}); err != nil {
		t.Fatal(err)
	}
	// The middle month's consumes by COPY (Apply's large batches), the
	// others by the small batches' INSERTs: both keep the spans.
	const perMonth = 200
	for k, m := range months {
		var ms []engine.Mutation
		for i := range perMonth {
			cm := c.consume(tenant, true)
			cm.AtMS = m.Add(time.Hour + time.Duration(i)*time.Second).UnixMilli()
			ms = append(ms, cm)
		}
		if k == 1 {
			if err := b.store.Apply(b.ctx, ms); err != nil {
				t.Fatal(err)
			}
			continue
		}
		for i := 0; i < len(ms); i += 50 {
			if err := b.store.insertApply(b.ctx, ms[i:i+50], nil); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := b.pool.Exec(b.ctx, "ANALYZE ledger_entries"); err != nil {
		t.Fatal(err)
	}
	var carriedMonths int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(DISTINCT date_trunc('month', created_at, 'UTC')) FROM ledger_entries
		WHERE tenant_id = $1 AND event_sequence IS NOT NULL`, tenant).Scan(&carriedMonths); err != nil || carriedMonths != 3 {
		t.Fatalf("carried events in %d months (%v), want 3", carriedMonths, err)
	}
	var wrong int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM (
		SELECT date_trunc('month', created_at, 'UTC') AS month, min(event_sequence) AS low, max(event_sequence) AS high
		FROM ledger_entries WHERE tenant_id = $1 AND event_sequence IS NOT NULL GROUP BY 1) r
		FULL JOIN (SELECT * FROM ledger_event_months WHERE tenant_id = $1) m USING (month)
		WHERE m.low IS DISTINCT FROM r.low OR m.high IS DISTINCT FROM r.high`, tenant).Scan(&wrong); err != nil || wrong != 0 {
		t.Fatalf("%d months' carried spans differ from their entries (%v)", wrong, err)
	}
	// The grant's event is a row (sequence 1); the consumes' are carried,
	// 2..601, 200 a month.
	all := []string{partitionOf(months[0]), partitionOf(months[1]), partitionOf(months[2]), "ledger_entries_legacy",
		"ledger_entries_default"}
	args := func(q *pgx.QueuedQuery) []any { return q.Arguments }
	for _, tc := range []struct {
		name       string
		query      *pgx.QueuedQuery
		through    int64
		contracted bool
		read       []string
	}{
		{"stream past the older months", carriedQuery(tenant, nil, 2*perMonth+10, true, 0, 100), 0, true,
			[]string{partitionOf(months[2])}},
		{"list page below a cursor", carriedQuery(tenant, nil, 0, false, perMonth+10, 21), 0, true,
			[]string{partitionOf(months[0]), partitionOf(months[1])}},
		{"list first page, copied up to the newest month", carriedQuery(tenant, nil, 0, false, 0, 21), 2*perMonth + 5, true,
			[]string{partitionOf(months[2])}},
		{"stream before 037's contract", carriedQuery(tenant, nil, 2*perMonth+10, true, 0, 100), 0, false, all},
		{"the claim's copy after through", &pgx.QueuedQuery{SQL: carriedToCopySQL,
			Arguments: []any{tenant, int64(2*perMonth + 5), int64(3*perMonth + 1), materializeBatch}}, 0, true,
			[]string{partitionOf(months[2])}},
	} {
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO event_carried_through (tenant_id, through) VALUES ($1, $2)
			ON CONFLICT (tenant_id) DO UPDATE SET through = EXCLUDED.through`, tenant, tc.through); err != nil {
			t.Fatal(err)
		}
		sql := `INSERT INTO schema_contracts (version, name) VALUES (37, '037_carried_months') ON CONFLICT DO NOTHING`
		if !tc.contracted {
			sql = `DELETE FROM schema_contracts WHERE version = 37`
		}
		if _, err := b.pool.Exec(b.ctx, sql); err != nil {
			t.Fatal(err)
		}
		for _, generic := range []bool{false, true} {
			plan := explain(t, b, tc.query.SQL, args(tc.query), generic)
			ran := executed(plan)
			if testing.Verbose() {
				fmt.Printf("%s (generic %v): reads %v\n", tc.name, generic, keys(ran))
			}
			for _, p := range all {
				if want := slices.Contains(tc.read, p); ran[p] != want && (want || tc.contracted) {
					t.Errorf("%s (generic %v): %s read %v, want %v; reads %v", tc.name, generic, p, ran[p], want, keys(ran))
				}
			}
		}
		// The read gives what a read of every month gives.
		rows, err := b.pool.Query(b.ctx, tc.query.SQL, args(tc.query)...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := collectCarried(rows)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.pool.Exec(b.ctx, `DELETE FROM schema_contracts WHERE version = 37`); err != nil {
			t.Fatal(err)
		}
		rows, err = b.pool.Query(b.ctx, tc.query.SQL, args(tc.query)...)
		if err != nil {
			t.Fatal(err)
		}
		want, err := collectCarried(rows)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(sequencesOf(got), sequencesOf(want)) || len(got) == 0 {
			t.Fatalf("%s: read %v, want %v (every month read)", tc.name, sequencesOf(got), sequencesOf(want))
		}
	}
}

// TestCarriedMonthsContract (migration 037): carried entries the previous
// release stored (no spans kept: here the spans are dropped and the
// contract unrecorded) are read from every month, and 037's contract
// fills their spans and records itself, after which the carried read
// trusts them and gives the same events.
func TestCarriedMonthsContract(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	tenant := live.TenantID
	now := time.Now().UTC()
	c := &profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 1, balance: 2_000_000}
	grant := c.grant(tenant)
	var ms []engine.Mutation
	for i := range 6 {
		m := c.consume(tenant, true)
		m.AtMS = monthStart(now, i%3).Add(time.Hour + time.Duration(i)*time.Minute).UnixMilli()
		ms = append(ms, m)
	}
	customerRows(t, b, append([]engine.Mutation{grant}, ms...))
	if err := b.store.Apply(b.ctx, []engine.Mutation{grant}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.insertApply(b.ctx, ms, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `DELETE FROM ledger_event_months; DELETE FROM schema_contracts WHERE version = 37`); err != nil {
		t.Fatal(err)
	}
	read := func(when string) []int64 {
		t.Helper()
		q := carriedQuery(tenant, nil, 0, true, 0, 100)
		rows, err := b.pool.Query(b.ctx, q.SQL, q.Arguments...)
		if err != nil {
			t.Fatal(err)
		}
		evs, err := collectCarried(rows)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		return sequencesOf(evs)
	}
	want := []int64{2, 3, 4, 5, 6, 7}
	if got := read("before the contract"); !slices.Equal(got, want) {
		t.Fatalf("before the contract: read %v, want %v", got, want)
	}
	if err := MigrateContract(b.ctx, b.pool); err != nil {
		t.Fatal(err)
	}
	var spans, kept int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM ledger_event_months WHERE tenant_id = $1),
		(SELECT count(*) FROM schema_contracts WHERE version = 37)`, tenant).Scan(&spans, &kept); err != nil ||
		spans != 3 || kept != 1 {
		t.Fatalf("after the contract: %d months' spans, contract recorded %d times (%v); want 3 and 1", spans, kept, err)
	}
	if got := read("after the contract"); !slices.Equal(got, want) {
		t.Fatalf("after the contract: read %v, want %v", got, want)
	}
}
