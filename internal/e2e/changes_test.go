package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/creditd/creditd/client"
	"github.com/creditd/creditd/client/edge"
	"github.com/creditd/creditd/internal/app"
)

// TestEvaluatorFollowsChanges (issue 27 items 1 and 6): an edge.Evaluator
// following GET /v1/changes/stream of a running creditd answers from
// memory, and a grant, a reservation, a plan change (a variant
// entitlement) and an override made over HTTP each reach it within
// seconds; once they have,
// its answers equal the HTTP check's.
func TestEvaluatorFollowsChanges(t *testing.T) {
	t.Parallel()
	s := NewStack(t, SingleNode())
	tn := s.NewTenant(uniq("edge"))
	a := s.as(t, tn.Live)
	api, sso := uniq("api"), uniq("sso")
	a.newMetric(sso, "boolean", map[string]any{"enabled": false})
	a.newRule(api, map[string]any{"cost_type": "per_unit", "unit_cost": 7})
	plan := a.newPlan(map[string]any{"name": "Pro"})
	variant := a.newVariant(plan["id"].(string), map[string]any{"billing_cycle": "monthly"})
	cust, _ := a.newCustomer()
	sub, _ := a.newSubscription(cust, plan, variant)

	e := edge.New(client.New(s.URL, tn.Live), edge.Config{MaxAge: 5 * time.Second})
	e.Start(context.Background())
	t.Cleanup(e.Close)
	deadline := time.Now().Add(10 * time.Second)
	for !e.StreamUp() {
		if time.Now().After(deadline) {
			t.Fatal("the evaluator's stream did not open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	check := func(metric string, units int64) edge.Answer {
		t.Helper()
		ans, err := e.Check(context.Background(), cust, metric, units)
		if err != nil {
			t.Fatalf("check %s: %v", metric, err)
		}
		return ans
	}
	// reaches waits until the evaluator's answer from memory satisfies ok,
	// and says how long that took.
	reaches := func(what, metric string, units int64, ok func(edge.Answer) bool) {
		t.Helper()
		start := time.Now()
		for {
			ans := check(metric, units)
			if ok(ans) && ans.Source == edge.SourceMemory {
				t.Logf("%s reached the evaluator in %v (answer age %v)", what, time.Since(start).Round(time.Millisecond), ans.Age)
				return
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%s did not reach the evaluator in 10 s: last answer %+v", what, ans)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// same fails unless the evaluator answers as the HTTP check does.
	same := func(metric string, units int64) {
		t.Helper()
		ans := check(metric, units)
		r := a.get(fmt.Sprintf("/v1/customers/%s/entitlements/%s?units=%d", cust, metric, units))
		wantStatus(t, r, 200, "HTTP check")
		var want client.CheckResult
		if err := json.Unmarshal(r.Raw, &want); err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(ans.CheckResult)
		exp, _ := json.Marshal(want)
		if string(got) != string(exp) {
			t.Errorf("evaluator answered %s\nHTTP check answered %s", got, exp)
		}
	}

	if ans := check(api, 10); ans.Allowed || ans.Source != edge.SourceMemory || *ans.EffectiveBalance != 0 {
		t.Fatalf("before any grant: %+v", ans)
	}
	first := check(api, 10)
	if first.Source != edge.SourceMemory || first.Age > 5*time.Second {
		t.Errorf("second check: source %s age %v, want memory within MaxAge", first.Source, first.Age)
	}

	a.grant(cust, map[string]any{"credits": 1000, "source": "promotional", "reason": "edge"})
	reaches("a grant", api, 10, func(x edge.Answer) bool { return *x.EffectiveBalance == 1000 && x.Allowed })
	same(api, 10)
	same(api, 200) // 1400 against 1000 under block: refused

	// A reservation moves the effective balance without an event: its notice
	// reaches the evaluator all the same.
	wantStatus(t, a.post("/v1/reservations", map[string]any{"customer_id": cust, "billable_metric_key": api,
		"estimated_units": 100}), 201, "reservation")
	reaches("a reservation", api, 10, func(x edge.Answer) bool { return *x.EffectiveBalance == 300 && *x.ReservedBalance == 700 })
	same(api, 50) // 350 against 300 under block: refused

	if check(sso, 1).Allowed {
		t.Fatal("sso allowed before the plan grants it")
	}
	wantStatus(t, a.post("/v1/plans/"+plan["id"].(string)+"/variants/"+variant["id"].(string)+"/entitlements",
		map[string]any{"billable_metric_key": sso, "value": map[string]any{"enabled": true}}), 201, "variant entitlement")
	reaches("a plan change", sso, 1, func(x edge.Answer) bool { return x.Allowed && *x.Enabled })
	same(sso, 1)

	wantStatus(t, a.post("/v1/subscriptions/"+sub+"/overrides",
		map[string]any{"billable_metric_key": sso, "value": map[string]any{"enabled": false}, "reason": "edge"}), 201, "override")
	reaches("an override", sso, 1, func(x edge.Answer) bool { return !x.Allowed && !*x.Enabled })
	same(sso, 1)
	same(api, 10)
}

// TestChangeStreamCapAndResume (issue 27 item 6): past the tenant's cap of
// open change streams the answer is 429 with Retry-After and the stream's
// place frees when its client leaves; a stream carries balance events and
// config changes (which GET /v1/events does not list) with one cursor;
// reopened with Last-Event-ID it sends exactly what was missed, from both
// sources; a cursor into a change feed Redis no longer holds gets a reset
// first; a malformed cursor is a 400 naming Last-Event-ID.
func TestChangeStreamCapAndResume(t *testing.T) {
	t.Parallel()
	s := NewStack(t, SingleNode(), WithConfig(func(c *app.Config) { c.ChangeStreamsPerTenant = 1 }))
	tn := s.NewTenant(uniq("changes"))
	a := s.as(t, tn.Live)
	cust, _ := a.newCustomer()
	// Creating a plan alters no check (no one is on it); renaming it does
	// change its customers' snapshots.
	plan := a.newPlan(map[string]any{"name": "before"})

	msgs, stop := openSSE(t, s, tn.Live, "/v1/changes/stream", "")
	if m := next(t, msgs); m.typ != "open" || m.id == "" {
		t.Fatalf("first message %+v, want open with a cursor", m)
	}
	r := a.get("/v1/changes/stream")
	checkProblem(t, r, 429, "rate-limited", "", "a second change stream past the cap of 1")
	if r.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}

	a.grant(cust, map[string]any{"credits": 100, "source": "promotional", "reason": "seen"})
	wantStatus(t, a.patch("/v1/plans/"+plan["id"].(string), map[string]any{"name": "after"}), 200, "rename plan")
	seen := map[string]bool{}
	var last string
	for len(seen) < 2 {
		m := next(t, msgs)
		seen[m.typ], last = true, m.id
	}
	if !seen["credit.granted"] || !seen["change.plans"] {
		t.Fatalf("messages %v, want credit.granted and change.plans", seen)
	}
	stop()

	// Missed while no stream was open: a grant and a metering rule.
	a.grant(cust, map[string]any{"credits": 5, "source": "promotional", "reason": "missed"})
	a.newRule(uniq("m"), map[string]any{"cost_type": "per_unit", "unit_cost": 1})
	s.Drain()
	for _, ev := range arr(t, a.get("/v1/events?limit=100").Body["data"], "events") {
		if typ, _ := obj(t, ev, "event")["event_type"].(string); strings.HasPrefix(typ, "change.") {
			t.Errorf("GET /v1/events lists a config change: %v", ev)
		}
	}

	again, stop := openChangesWhenFree(t, s, tn.Live, last)
	if m := next(t, again); m.typ != "open" || m.id != last {
		t.Fatalf("resumed stream opened with %+v, want open at %s", m, last)
	}
	got := map[string]int{}
	for range 2 {
		m := next(t, again)
		got[m.typ]++
		if m.typ == "credit.granted" {
			if d := obj(t, m.data["data"], "data"); Int(t, d["credits"]) != 5 {
				t.Errorf("replayed a grant already seen: %v", m.data)
			}
		}
	}
	if got["credit.granted"] != 1 || got["change.metering"] != 1 {
		t.Errorf("resumed with %v, want the missed grant and metering change", got)
	}
	quiet(t, again, 1500*time.Millisecond) // heartbeats are comments
	stop()

	// Redis lost the tenant's change feed (restarted empty): a cursor into
	// it cannot be trusted, so the stream says reset first.
	if err := s.Redis.Del(context.Background(), "{"+s.Prefix+":t:"+tn.ID+"}:changes").Err(); err != nil {
		t.Fatal(err)
	}
	lostFeed, stop3 := openChangesWhenFree(t, s, tn.Live, last)
	if m := next(t, lostFeed); m.typ != "reset" {
		t.Errorf("a cursor into a lost feed opened with %+v, want reset", m)
	}
	stop3()

	// A zero cursor is a place like any other: everything after it.
	zero, stopZero := openChangesWhenFree(t, s, tn.Live, "0.0-0")
	if m := next(t, zero); m.typ != "open" || m.id != "0.0-0" {
		t.Fatalf("opened at zero with %+v", m)
	}
	grants := 0
	for grants < 2 {
		if m := next(t, zero); m.typ == "credit.granted" {
			grants++
		}
	}
	stopZero()

	for _, bad := range []string{"x", "12", "1.2", "-1.0-0"} {
		checkProblem(t, a.do("GET", "/v1/changes/stream", "", nil, "Last-Event-ID", bad),
			400, "bad-request", "Last-Event-ID", "Last-Event-ID "+bad)
	}
}

// openChangesWhenFree opens a change stream, trying again for 5 s while
// it is refused with a 429 (a closed stream's place frees once the server
// notices its client left).
func openChangesWhenFree(t *testing.T, s *Stack, key, lastID string) (<-chan sseEvent, func()) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		status, msgs, stop := dialSSE(t, s, key, "/v1/changes/stream", lastID)
		switch {
		case status == 200:
			return msgs, stop
		case status != 429:
			t.Fatalf("change stream: status %d", status)
		case time.Now().After(deadline):
			t.Fatal("the cap was not freed after the stream closed")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
