package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/persist"
	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// Subscription crash workload size.
const (
	subCrashWorkers = 24
	subCrashKills   = 5
)

// TestSubscriptionEventsSurviveKill9 (issue 12 item 5, "Done when"): a
// subscription transition and its event are stored together or not at
// all. 24 clients create prepaid daily subscriptions (created, and the
// scheduler's renewal_due), renew them (renewed) and cancel them
// (canceled) while creditd is killed with -9 at random moments, five
// times, and restarted; the last kill stops it for good. Then, in
// Postgres: every subscription row has its subscription.created event, no
// event names a subscription that was never stored, each subscription's
// latest event reports the row's state (status, period, canceled_at), it
// has one subscription.renewed event per period its row moved on, and the
// tenant's sequences have no gap.
func TestSubscriptionEventsSurviveKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test")
	}
	t.Parallel()
	rig := newCrashRig(t)
	client := loadClient()
	key := rig.tenant.Live
	call := func(method, path string, body any) (Response, error) {
		return TryCall(client, rig.proc.URL, method, path, body, "X-API-Key", key, "Idempotency-Key", randomID())
	}
	r := Call(t, client, rig.proc.URL, "POST", "/v1/plans", map[string]any{"name": "Crash daily"}, "X-API-Key", key,
		"Idempotency-Key", randomID())
	wantStatus(t, r, 201, "create plan")
	plan := str(t, r.Body["id"], "plan")
	r = Call(t, client, rig.proc.URL, "POST", "/v1/plans/"+plan+"/variants", map[string]any{"billing_cycle": "daily",
		"billing_mode": "prepaid", "renewal_due_days": 1}, "X-API-Key", key, "Idempotency-Key", randomID())
	wantStatus(t, r, 201, "create variant")
	variant := str(t, r.Body["id"], "variant")

	var stop atomic.Bool
	var ok, failed atomic.Int64
	count := func(r Response, err error) (Response, bool) {
		if err != nil || r.Status >= 500 {
			// creditd is down or going down: wait for the restart.
			failed.Add(1)
			time.Sleep(20 * time.Millisecond)
			return r, false
		}
		ok.Add(1)
		return r, r.Status < 300
	}
	var wg sync.WaitGroup
	for w := range subCrashWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; !stop.Load(); i++ {
				c, good := count(call("POST", "/v1/customers", map[string]any{"external_id": fmt.Sprintf("sub-crash-%d-%d-%s", w, i, randomID())}))
				if !good {
					continue
				}
				s, good := count(call("POST", "/v1/subscriptions", map[string]any{"customer_id": c.Body["id"], "plan_variant_id": variant}))
				if !good {
					continue
				}
				id, _ := s.Body["id"].(string)
				for range 1 + rnd.IntN(6) {
					count(call("POST", "/v1/subscriptions/"+id+"/renew", nil))
				}
				if rnd.IntN(2) == 0 {
					count(call("POST", "/v1/subscriptions/"+id+"/cancel", map[string]any{}))
				}
			}
		}()
	}
	for k := range subCrashKills {
		time.Sleep(time.Duration(1000+rand.IntN(1500)) * time.Millisecond)
		rig.proc.Kill()
		if k < subCrashKills-1 {
			rig.proc.Restart()
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d requests answered, %d cut by a kill or answered 5xx", ok.Load(), failed.Load())
	if failed.Load() == 0 {
		t.Fatal("no request was in flight at a kill: the crash tested nothing")
	}
	verifySubscriptionEvents(t, rig)
}

// subRow is a subscription row's state as its events report it.
type subRow struct {
	Status      string     `json:"status"`
	PeriodStart time.Time  `json:"period_start"`
	PeriodEnd   *time.Time `json:"period_end"`
	CanceledAt  *time.Time `json:"canceled_at"`
}

func (s subRow) String() string {
	return fmt.Sprintf("%s from %s to %v canceled %v", s.Status, s.PeriodStart.UTC().Format(time.RFC3339Nano),
		s.PeriodEnd, s.CanceledAt)
}

func (s subRow) equal(o subRow) bool {
	same := func(a, b *time.Time) bool { return (a == nil) == (b == nil) && (a == nil || a.Equal(*b)) }
	return s.Status == o.Status && s.PeriodStart.Equal(o.PeriodStart) && same(s.PeriodEnd, o.PeriodEnd) &&
		same(s.CanceledAt, o.CanceledAt)
}

// verifySubscriptionEvents checks the stored subscriptions of the rig's
// tenant against their stored events (see TestSubscriptionEventsSurviveKill9).
func verifySubscriptionEvents(t *testing.T, rig *crashRig) {
	t.Helper()
	ctx := t.Context()
	rows := map[string]subRow{}
	q, err := rig.pool.Query(ctx, `SELECT id::text, status, current_period_start, current_period_end, canceled_at
		FROM subscriptions WHERE tenant_id = $1`, rig.tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	for q.Next() {
		var id string
		var s subRow
		if err := q.Scan(&id, &s.Status, &s.PeriodStart, &s.PeriodEnd, &s.CanceledAt); err != nil {
			t.Fatal(err)
		}
		rows[id] = s
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}
	type event struct {
		typ string
		seq int64
		sub subRow
	}
	events := map[string][]event{}
	q, err = rig.pool.Query(ctx, `SELECT event_type, sequence, payload FROM webhook_events
		WHERE tenant_id = $1 AND event_type LIKE 'subscription.%' ORDER BY sequence`, rig.tenant.ID)
	if err != nil {
		t.Fatal(err)
	}
	for q.Next() {
		var e event
		var payload string
		if err := q.Scan(&e.typ, &e.seq, &payload); err != nil {
			t.Fatal(err)
		}
		var body struct {
			Data struct {
				SubscriptionID string `json:"subscription_id"`
				subRow
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(payload), &body); err != nil {
			t.Fatalf("event payload %s: %v", payload, err)
		}
		e.sub = body.Data.subRow
		events[body.Data.SubscriptionID] = append(events[body.Data.SubscriptionID], e)
	}
	if err := q.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rows) == 0 {
		t.Fatal("no subscription was stored")
	}
	bad := 0
	fail := func(format string, args ...any) {
		if bad++; bad <= 20 {
			t.Errorf(format, args...)
		}
	}
	for id := range events {
		if _, ok := rows[id]; !ok {
			fail("subscription %s has %d events but no row (%s first)", id, len(events[id]), events[id][0].typ)
		}
	}
	canceled, renewed := 0, 0
	for id, row := range rows {
		evs := events[id]
		if len(evs) == 0 || evs[0].typ != "subscription.created" {
			fail("subscription %s (%s) is stored without its subscription.created event", id, row)
			continue
		}
		if last := evs[len(evs)-1]; !last.sub.equal(row) {
			fail("subscription %s: row is %s, its latest event (%s) says %s", id, row, last.typ, last.sub)
		}
		periods := 0
		for _, e := range evs {
			if e.typ == "subscription.renewed" {
				periods++
			}
		}
		if want := int(row.PeriodStart.Sub(evs[0].sub.PeriodStart) / (24 * time.Hour)); periods != want {
			fail("subscription %s: %d subscription.renewed events for %d periods moved on", id, periods, want)
		}
		hasCancel := evs[len(evs)-1].typ == "subscription.canceled"
		if (row.Status == "canceled") != hasCancel {
			fail("subscription %s is %s; its last event is %s", id, row.Status, evs[len(evs)-1].typ)
		}
		if hasCancel {
			canceled++
		}
		renewed += periods
	}
	var n, distinct, top, counter int64
	if err := rig.pool.QueryRow(ctx, `SELECT count(*), count(DISTINCT sequence), COALESCE(max(sequence), 0),
		COALESCE((SELECT next FROM event_sequences WHERE tenant_id = $1), 0)
		FROM `+storedEventsSQL+` WHERE tenant_id = $1`, rig.tenant.ID).Scan(&n, &distinct, &top, &counter); err != nil {
		t.Fatal(err)
	}
	if n != distinct || n != top || n != counter {
		t.Errorf("%d events, %d distinct sequences, highest %d, counter %d: want all equal", n, distinct, top, counter)
	}
	t.Logf("%d subscriptions (%d canceled, %d renewals) checked against their events; %d mismatches",
		len(rows), canceled, renewed, bad)
}

// dyingWriter is a node's subscription store that runs each change and
// then dies before its commit (errKilled rolls the transaction back), as
// kill -9 between a transition and its commit would.
type dyingWriter struct {
	*persist.Store
}

// UpdateSubscription implements engine.SubscriptionStore.
func (d dyingWriter) UpdateSubscription(ctx context.Context, sc engine.Scope, id uuid.UUID,
	change func(*engine.SubscriptionRecord) error) (engine.SubscriptionRecord, error) {
	return d.Store.UpdateSubscription(ctx, sc, id, func(r *engine.SubscriptionRecord) error {
		if err := change(r); err != nil {
			return err
		}
		return errKilled
	})
}

// TestSubscriptionTransitionRolledBackLeavesNoEvent (issue 12 item 5): a
// renew and a cancel that die after the transition was decided but before
// the row's commit leave the subscription as it was and no event; done
// again on a live node, each stores its row and one event.
func TestSubscriptionTransitionRolledBackLeavesNoEvent(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("rolled-back"))
	a := s.as(t, tn.Live)
	plan := str(t, a.newPlan(map[string]any{"name": "Monthly"})["id"], "plan")
	vid := str(t, a.newVariant(plan, map[string]any{"billing_cycle": "monthly", "billing_mode": "prepaid"})["id"], "variant")
	cust, _ := a.newCustomer()
	r := a.post("/v1/subscriptions", map[string]any{"customer_id": cust, "plan_variant_id": vid})
	wantStatus(t, r, 201, "create")
	sub := str(t, r.Body["id"], "id")
	if n := len(a.subEvents("subscription.created", cust)); n != 1 {
		t.Fatalf("%d subscription.created events, want 1", n)
	}
	app1 := s.App
	dying := engine.NewSubscriptions(dyingWriter{app1.DB}, app1.Plans, app1.Customers, app1.Credits, app1.Store, app1.Store,
		engine.SystemClock{}, zerolog.New(io.Discard))
	scope := engine.Scope{TenantID: uuid.MustParse(tn.ID), Environment: engine.EnvironmentLive}
	steps := []struct {
		event  string
		status string
		run    func(*engine.Subscriptions) error
	}{
		{"subscription.renewed", "active", func(x *engine.Subscriptions) error {
			_, err := x.Renew(context.Background(), scope, sub)
			return err
		}},
		{"subscription.canceled", "canceled", func(x *engine.Subscriptions) error {
			_, err := x.Cancel(context.Background(), scope, sub, engine.CancelSubscription{})
			return err
		}},
	}
	for _, st := range steps {
		before := a.subscription(sub)
		if err := st.run(dying); !errors.Is(err, errKilled) {
			t.Fatalf("%s on the dying node: %v, want errKilled", st.event, err)
		}
		if after := a.subscription(sub); after["status"] != before["status"] ||
			after["current_period_start"] != before["current_period_start"] {
			t.Fatalf("%s rolled back, yet the subscription moved: %v -> %v", st.event, before, after)
		}
		if n := len(a.subEvents(st.event, cust)); n != 0 {
			t.Fatalf("%s rolled back, yet %d of its events are stored", st.event, n)
		}
		if err := st.run(s.App.Subscriptions); err != nil {
			t.Fatalf("%s on the live node: %v", st.event, err)
		}
		if got := a.subscription(sub)["status"]; got != st.status {
			t.Fatalf("status after %s %v, want %s", st.event, got, st.status)
		}
		if n := len(a.subEvents(st.event, cust)); n != 1 {
			t.Fatalf("%d %s events after the live transition, want 1", n, st.event)
		}
	}
}
