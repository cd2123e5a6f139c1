package persist

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// eventPartitionOf names the webhook_events partition of t's month
// (migration 035).
func eventPartitionOf(t time.Time) string { return "webhook_events_p" + t.UTC().Format("200601") }

// deliveryPartitionOf names the webhook_deliveries partition of t's month.
func deliveryPartitionOf(t time.Time) string {
	return "webhook_deliveries_p" + t.UTC().Format("200601")
}

// TestEventPlansPrune (issue 30 item 1): the reads and writes the API and
// the delivery runner make of the month-partitioned events (migration 035)
// touch the months they need. A tenant with 2,000 events in each of three
// months, every one delivered once, 10 of the middle month's still due:
//   - the events list and the stream's catch-up (listEventsSQL,
//     eventsAfterSQL, as pageRows bounds them by the months' spans of
//     sequences, migration 036) name only the months whose span meets the
//     page: the newest for the first page, the middle one for a cursor in
//     it, the two a catch-up straddles; each page takes one statement,
//     and reads no row its bounds then throw away;
//   - the runner's claim (claimDueSQL) reads each month through its
//     partial due index, so the settled months give no row, and locks and
//     leases its events in their month;
//   - an attempt (recordAttemptSQL) updates its event in its month only;
//   - the attempts of a page of events (deliveriesSQL) leave out the
//     months before the page's oldest event;
//   - redeliver (redeliverAtSQL) updates its event in its month, found by
//     id in webhook_event_dead; one refused (eventExistsSQL) probes each
//     month's index once, for no row (an id names no instant);
//   - test.ping's insert (insertEventAtSQL) looks its id up in its month.
//
// "Only" is checked on the plan's relations, not just on what ran: the
// other months are pruned at plan time (redeliver's, a parameter, at
// executor start in the generic plan), not merely never executed. A
// page's plan, custom or generic, reads no row its bounds throw away.
func TestEventPlansPrune(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	tenant := live.TenantID
	if _, err := b.pool.Exec(b.ctx, `UPDATE tenants SET webhook_url = 'http://127.0.0.1:1/hook', webhook_secret = 's'
		WHERE id = $1`, tenant); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	m0, m1, m2 := monthStart(now, 0), monthStart(now, 1), monthStart(now, 2)
	const perMonth = 2000
	for i, m := range []time.Time{m0, m1, m2} {
		// Sequences rise with the months; the middle month's first 10
		// events are still due.
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO webhook_events (id, tenant_id, environment, event_type, payload,
			status, attempts, next_retry_at, created_at, delivered_at, sequence)
			SELECT gen_random_uuid(), $1, 'live', 'credit.granted', '{}',
				CASE WHEN $4 AND g <= 10 THEN 'pending' ELSE 'delivered' END, 1,
				$2::timestamptz + make_interval(mins => g), $2::timestamptz + make_interval(mins => g),
				$2::timestamptz + make_interval(secs => g), $3 + g
			FROM generate_series(1, $5) AS g`, tenant, m.Add(time.Hour), i*perMonth, i == 1, perMonth); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO webhook_deliveries (id, tenant_id, event_id, status_code, duration_ms, created_at)
		SELECT gen_random_uuid(), tenant_id, id, 200, 5, created_at + interval '1 second' FROM webhook_events`); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"webhook_events", "webhook_deliveries"} {
		if _, err := b.pool.Exec(b.ctx, "ANALYZE "+table); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := b.store.PartitionAlarm(b.ctx); err != nil || n != 0 {
		t.Fatalf("PartitionAlarm = %d, %v: the months' rows went to DEFAULT", n, err)
	}
	view := readPartitions(t, b.ctx, b.pool)

	// A page of m2's events, for the deliveries read.
	var pageIDs []string
	var oldest time.Time
	rows, err := b.pool.Query(b.ctx, `SELECT id, created_at FROM webhook_events WHERE tenant_id = $1 AND sequence > $2
		ORDER BY sequence`, tenant, 3*perMonth-20)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id uuid.UUID
		var at time.Time
		if err := rows.Scan(&id, &at); err != nil {
			t.Fatal(err)
		}
		pageIDs = append(pageIDs, id.String())
		if oldest.IsZero() || at.Before(oldest) {
			oldest = at
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	// Arrays as Postgres literals: explain's generic form quotes each
	// argument as text.
	idArray, tenantArray := "{"+strings.Join(pageIDs, ",")+"}", "{"+tenant.String()+"}"

	// A dead-lettered event of m0, its instant kept as recordAttemptSQL
	// keeps it, for redeliver.
	var deadID uuid.UUID
	var deadAt time.Time
	if err := b.pool.QueryRow(b.ctx, `WITH d AS (
		UPDATE webhook_events SET status = 'dead_letter' WHERE tenant_id = $1 AND sequence = 5 RETURNING id, tenant_id, created_at
	) INSERT INTO webhook_event_dead SELECT id, tenant_id, created_at FROM d RETURNING id, created_at`, tenant).
		Scan(&deadID, &deadAt); err != nil {
		t.Fatal(err)
	}

	// The statements a page runs, as the store runs them.
	pageSQL := func(p seqPage) []recorded { return pageStatements(t, b, tenant, p) }
	allEvents := []string{eventPartitionOf(m0), eventPartitionOf(m1), eventPartitionOf(m2), "webhook_events_legacy",
		"webhook_events_default"}
	claimAt := m2.Add(200 * time.Hour)
	tests := []eventPlanCase{
		{name: "events first page", pages: pageSQL(listEventsPage(tenant, "", "", 0, 21)),
			read: []string{eventPartitionOf(m2)}, only: []string{eventPartitionOf(m2)}},
		{name: "events cursor page in the middle month",
			pages: pageSQL(listEventsPage(tenant, "", "", perMonth+perMonth/2, 21)),
			read:  []string{eventPartitionOf(m1)}, only: []string{eventPartitionOf(m1)}},
		{name: "events cursor page across two months", pages: pageSQL(listEventsPage(tenant, "", "", perMonth+5, 21)),
			read: []string{eventPartitionOf(m0), eventPartitionOf(m1)},
			only: []string{eventPartitionOf(m0), eventPartitionOf(m1)}},
		{name: "stream catch-up in the middle month", pages: pageSQL(eventsAfterPage(tenant, nil, perMonth+perMonth/2, 100)),
			read: []string{eventPartitionOf(m1)}, only: []string{eventPartitionOf(m1)}},
		{name: "stream catch-up across two months", pages: pageSQL(eventsAfterPage(tenant, nil, 2*perMonth-10, 100)),
			read: []string{eventPartitionOf(m1), eventPartitionOf(m2)},
			only: []string{eventPartitionOf(m1), eventPartitionOf(m2)}},
		{name: "stream catch-up at the head", pages: pageSQL(eventsAfterPage(tenant, nil, 3*perMonth, 100)),
			only: []string{}},
		// A filtered page the newest month holds no row of reads the next
		// month, where it fills, and never the oldest (its span is below
		// the page's last row).
		{name: "filtered page, sparse over two months", pages: pageSQL(listEventsPage(tenant, "pending", "", 0, 5)),
			statements: 2, filtered: true, read: []string{eventPartitionOf(m1)},
			only: []string{eventPartitionOf(m1), eventPartitionOf(m2)}},
		{name: "claim", sql: claimDueSQL,
			args:    []any{claimAt, claimAt.Add(time.Minute), 100, 100, "{}", uuid.New()},
			read:    []string{eventPartitionOf(m1)},
			settled: []string{eventPartitionOf(m0), eventPartitionOf(m2)}},
		{name: "attempt", sql: recordAttemptSQL,
			args: []any{uuid.New(), uuid.New(), "failed", 1, claimAt, "x", claimAt, uuid.New(), 500, "", "x", 5, claimAt,
				tenant, m1.Add(time.Hour + time.Second)},
			read:    []string{eventPartitionOf(m1)},
			notRead: []string{eventPartitionOf(m0), eventPartitionOf(m2), "webhook_events_legacy", "webhook_events_default"}},
		{name: "deliveries of a page", sql: deliveriesSQL, args: []any{idArray, tenantArray, oldest},
			read:    []string{deliveryPartitionOf(m2)},
			notRead: []string{deliveryPartitionOf(m0), deliveryPartitionOf(m1), "webhook_deliveries_legacy"}, bySeqScan: true},
		// test.ping's insert looks for its id in its month only
		// (insertEventAtSQL); no counter row here, so it inserts nothing.
		{name: "ping insert", sql: insertEventAtSQL,
			args: []any{uuid.New(), tenant, "live", nil, "test.ping", `{"data":{}}`, m1.Add(time.Hour), m1.Add(time.Hour), nil},
			only: []string{eventPartitionOf(m1)}},
		// A redeliver refused (the id never dead-lettered) looks the id up
		// in every month, one index probe each: an id names no instant.
		{name: "redeliver refused", sql: eventExistsSQL, args: []any{uuid.New(), tenant, uuid.New()},
			probed: allEvents},
		// Last: it moves the event back to pending (due long after the claim).
		{name: "redeliver", sql: redeliverAtSQL, args: []any{deadID, tenant, m2.Add(2000 * time.Hour), deadAt},
			read: []string{eventPartitionOf(m0)}, only: []string{eventPartitionOf(m0)}},
	}
	for _, tc := range tests {
		stmts := tc.pages
		if tc.sql != "" {
			stmts = []recorded{{tc.sql, tc.args}}
		} else if want := max(tc.statements, 1); len(stmts) > want {
			t.Errorf("%s: %d statements, want %d (the months of the first guess hold the page)", tc.name, len(stmts), want)
		}
		if tc.only != nil && len(stmts) == 0 && len(tc.only) > 0 {
			t.Errorf("%s: no statement ran, want one reading %v", tc.name, tc.only)
		}
		for _, generic := range []bool{false, true} {
			ran := map[string]bool{}
			for _, st := range stmts {
				for p := range checkEventPlan(t, b, view, tc, st, generic, allEvents) {
					ran[p] = true
				}
			}
			for _, p := range tc.read {
				if tc.statements > 1 && !ran[p] {
					t.Errorf("%s (generic %v): %s not read; the statements read %v", tc.name, generic, p, ran)
				}
			}
		}
	}
	// Before migration 036 a page named every month: the statement
	// unbounded, shown for the record.
	if testing.Verbose() {
		for _, p := range []seqPage{listEventsPage(tenant, "", "", 0, 21), eventsAfterPage(tenant, nil, perMonth+perMonth/2, 100)} {
			sql, args := p.statement(nil), p.args
			fmt.Printf("unbounded %s: reads %v\n", strings.Fields(sql)[len(strings.Fields(sql))-4:], relations(explain(t, b, sql, args, false)))
		}
	}
}

// eventPlanCase is a case of TestEventPlansPrune.
type eventPlanCase struct {
	name          string
	sql           string
	args          []any
	pages         []recorded // a page's statements (pageStatements), in place of sql and args
	statements    int        // how many the page may take, when more than one (read: by any of them)
	filtered      bool       // a page under a status filter: its rows of another status are read and left
	only          []string   // the events' partitions the plan may name, when set
	read, notRead []string   // partitions executed / absent or never executed
	probed        []string   // partitions read for at most one row
	settled       []string   // partitions the plan reads no row of
	// bySeqScan allows a Seq Scan of a month it reads (deliveries: the
	// page's month is small here, the plan's choice is fair).
	bySeqScan bool
}

// checkEventPlan explains st (of case tc), checks its plan and returns
// the relations it read; all are the events' partitions.
func checkEventPlan(t *testing.T, b *bundle, view partitionView, tc eventPlanCase, st recorded, generic bool,
	all []string) map[string]bool {
	t.Helper()
	plan := explain(t, b, st.sql, st.args, generic)
	got, ran := relations(plan), executed(plan)
	if testing.Verbose() {
		fmt.Printf("%s (generic %v): names %v, reads %v\n", tc.name, generic, keys(got), keys(ran))
	}
	if tc.only != nil {
		for _, p := range all {
			if got[p] && !slices.Contains(tc.only, p) {
				t.Errorf("%s (generic %v): plan names %s, want only %v: %+v", tc.name, generic, p, tc.only, plan)
			}
		}
	}
	if tc.pages != nil && !tc.filtered {
		// A page's bounds are index conditions: no row of the months it
		// reads is read and thrown away.
		plan.walk(func(n planNode) {
			if strings.HasPrefix(n.RelationName, "webhook_events") && n.FilterRemoved > 0 {
				t.Errorf("%s (generic %v): %d rows of %s read and filtered out (%s %s)", tc.name, generic, n.FilterRemoved,
					n.RelationName, n.NodeType, n.IndexName)
			}
		})
	}
	for _, p := range tc.read {
		if tc.statements <= 1 && !ran[p] {
			t.Errorf("%s (generic %v): %s not read; plan reads %v", tc.name, generic, p, ran)
		}
	}
	for _, p := range tc.probed {
		if n := rowsFrom(plan, p); n > 1 {
			t.Errorf("%s (generic %v): %d rows read from %s, want at most one: %+v", tc.name, generic, n, p, plan)
		}
	}
	for _, p := range tc.settled {
		if n := rowsFrom(plan, p); n > 0 {
			t.Errorf("%s (generic %v): %d rows read from settled %s, want none: %+v", tc.name, generic, n, p, plan)
		}
	}
	for _, p := range tc.notRead {
		if ran[p] {
			t.Errorf("%s (generic %v): %s read (in plan: %v); want it pruned or never executed: %+v",
				tc.name, generic, p, got[p], plan)
		}
	}
	plan.walk(func(n planNode) {
		if n.NodeType == "Seq Scan" && !view.emptyScan(n) && !tc.bySeqScan &&
			(strings.HasPrefix(n.RelationName, "webhook_events") || strings.HasPrefix(n.RelationName, "webhook_deliveries")) {
			t.Errorf("%s (generic %v): Seq Scan of %s", tc.name, generic, n.RelationName)
		}
	})
	return ran
}

// recorded is a statement a page ran.
type recorded struct {
	sql  string
	args []any
}

// pageStatements runs page p of tenant's event rows as readEventPage
// does (the spans, then pageRows) and returns the statements it ran.
func pageStatements(t *testing.T, b *bundle, tenant uuid.UUID, p seqPage) []recorded {
	t.Helper()
	var known bool
	if err := b.pool.QueryRow(b.ctx, eventMonthsReadySQL).Scan(&known); err != nil || !known {
		t.Fatalf("spans kept: %v, %v", known, err)
	}
	rows, err := b.pool.Query(b.ctx, eventMonthsSQL, tenant)
	if err != nil {
		t.Fatal(err)
	}
	months, err := scanEventMonths(rows)
	if err != nil {
		t.Fatal(err)
	}
	var out []recorded
	if _, err := pageRows(months, known, p, func(ranges []monthRange) ([]engine.Event, error) {
		sql := p.statement(ranges)
		out = append(out, recorded{sql, p.args})
		rows, err := b.pool.Query(b.ctx, sql, p.args...)
		if err != nil {
			return nil, err
		}
		return collectStored(rows)
	}); err != nil {
		t.Fatal(err)
	}
	// The one-trip page (readEventPageTrips, these spans seen) reads by
	// the same statement as pageRows' first read: its plan is checked too.
	if g := guessMonths(spansSeen{months, known}, p); len(out) > 0 && (g.all || p.statement(g.ranges) != out[0].sql) {
		t.Errorf("the guessed page reads %v, pageRows first %q", g, out[0].sql)
	}
	return out
}

// keys lists m's keys, sorted.
func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestAttemptDatedAfterEvent: an attempt recorded by a node whose clock is
// behind the one that dated its event is dated at the event (so an
// event's attempts lie in its month or later, which deliveriesSQL's bound
// relies on), and the event, read back with its attempts, has it.
func TestAttemptDatedAfterEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	if _, err := b.pool.Exec(b.ctx, `UPDATE tenants SET webhook_url = 'http://127.0.0.1:1/hook', webhook_secret = 's'
		WHERE id = $1`, live.TenantID); err != nil {
		t.Fatal(err)
	}
	// An event dated early next month, an attempt dated late this month.
	at := monthStart(time.Now(), 1).Add(time.Minute)
	e := engine.NewEvent(uuid.New(), engine.EventTestPing, live.TenantID, live.Environment, nil, nil, at, "", struct{}{})
	if err := b.store.InsertEvent(b.ctx, e); err != nil {
		t.Fatal(err)
	}
	claims, err := b.store.ClaimDue(b.ctx, at.Add(time.Hour), time.Minute, 10, 10, nil)
	if err != nil || len(claims) != 1 {
		t.Fatalf("ClaimDue = %d claims, %v", len(claims), err)
	}
	delivered := at.Add(time.Hour)
	code := 200
	ok, err := b.store.RecordAttempt(b.ctx, claims[0], engine.Attempt{At: at.Add(-2 * time.Hour), StatusCode: &code,
		DurationMS: 5, Status: engine.EventDelivered, Attempts: 1, DeliveredAt: &delivered})
	if err != nil || !ok {
		t.Fatalf("RecordAttempt = %v, %v", ok, err)
	}
	var where string
	var dated time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT tableoid::regclass::text, created_at FROM webhook_deliveries
		WHERE event_id = $1`, e.ID).Scan(&where, &dated); err != nil {
		t.Fatal(err)
	}
	if !dated.Equal(at) || where != deliveryPartitionOf(at) {
		t.Fatalf("attempt dated %v in %s, want %v in %s", dated, where, at, deliveryPartitionOf(at))
	}
	page, err := b.store.ListEvents(b.ctx, live.TenantID, engine.EventQuery{Limit: 5})
	if err != nil || len(page.Data) != 1 || len(page.Data[0].Deliveries) != 1 ||
		page.Data[0].Status != engine.EventDelivered {
		t.Fatalf("ListEvents = %+v, %v; want the event delivered with its attempt", page, err)
	}
}

// TestEventSwitchOnline (issue 30 item 1): existing events and attempts
// move to the partitioned tables online, as the ledger does
// (TestLedgerSwitchOnline). A database at 035's expand with 100,000 events
// over the last 90 days, each with an attempt, takes `creditd migrate
// contract` while a writer keeps storing events the persister's way
// (ON CONFLICT (id, tenant_id, created_at)) and an attempt for each: no
// write fails, every row is there after the switch, and a replayed event
// inserts nothing.
func TestEventSwitchOnline(t *testing.T) {
	t.Parallel()
	const rows = 100_000
	b := setupAt(t, 35)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	live, _ := b.tenant(t)
	if err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL statement_timeout = 0"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO webhook_events (id, tenant_id, environment, event_type, payload, status,
			attempts, created_at, delivered_at, sequence)
			SELECT gen_random_uuid(), $1, 'live', 'credit.granted', '{"sequence":' || g || '}', 'delivered', 1,
				now() - interval '90 days' + g * (interval '90 days' / $2), now(), g
			FROM generate_series(1, $2::int) AS g`, live.TenantID, rows); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries (id, tenant_id, event_id, status_code, duration_ms, created_at)
			SELECT gen_random_uuid(), tenant_id, id, 200, 5, created_at + interval '1 second' FROM webhook_events`)
		return err
	}); err != nil {
		t.Fatal(err)
	}

	insert := func(id uuid.UUID, seq int64, at time.Time) error {
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO webhook_events (id, tenant_id, environment, event_type, payload,
				created_at, sequence) VALUES ($1, $2, 'live', 'credit.granted', '{}', $3, $4)
				ON CONFLICT (id, tenant_id, created_at) DO NOTHING`, id, live.TenantID, at, seq); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO webhook_deliveries (id, tenant_id, event_id, status_code, duration_ms,
				created_at) VALUES (gen_random_uuid(), $1, $2, 200, 5, $3)`, live.TenantID, id, at)
			return err
		})
	}
	stop := make(chan struct{})
	type write struct {
		id uuid.UUID
		at time.Time
	}
	var written []write
	var writeErr error
	var longest time.Duration
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for seq := int64(rows + 1); ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			w := write{uuid.New(), time.Now().UTC().Truncate(time.Microsecond)}
			began := time.Now()
			if err := insert(w.id, seq, w.at); err != nil {
				writeErr = err
				return
			}
			longest = max(longest, time.Since(began))
			written = append(written, w)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	switchStart := time.Now()
	if err := MigrateContract(ctx, b.pool); err != nil {
		t.Fatalf("MigrateContract: %v", err)
	}
	took := time.Since(switchStart)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	<-writerDone
	if writeErr != nil {
		t.Fatalf("a write during the switch failed: %v", writeErr)
	}
	t.Logf("switch (036's expand, the contracts of 031 to 036) of %d events and attempts: %v; the writer's longest write %v (%d writes)",
		rows, took.Round(time.Millisecond), longest.Round(time.Millisecond), len(written))

	for _, table := range []string{"webhook_events", "webhook_deliveries"} {
		var total, legacy int64
		var partitioned bool
		if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+table+`), (SELECT count(*) FROM `+table+`_legacy),
			EXISTS (SELECT 1 FROM pg_partitioned_table WHERE partrelid = $1::regclass)`, table).
			Scan(&total, &legacy, &partitioned); err != nil {
			t.Fatal(err)
		}
		if !partitioned || total != int64(rows+len(written)) || legacy < rows {
			t.Fatalf("%s after the switch: partitioned %v, %d rows (want %d), %d in the legacy partition (want >= %d)",
				table, partitioned, total, rows+len(written), legacy, rows)
		}
	}
	// A replay of the first event inserts nothing (its attempt, a new
	// row, goes in).
	if err := insert(written[0].id, 1, written[0].at); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_events WHERE id = $1`, written[0].id).Scan(&n); err != nil || n != 1 {
		t.Fatalf("replayed event stored %d times (%v)", n, err)
	}
}
