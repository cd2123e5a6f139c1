package e2e

import (
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"
)

// TestConformanceChecks: Entitlement checks for all four types: exactly the
// members the spec lists, units default 1, balance_after may be negative, a
// check never changes the account, 404 only for a metered metric without an
// active rule, lenient ids auto-create, the strict twin 404s.
func TestConformanceChecks(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("checks"))
	a := s.as(t, tn.Live)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 10_000})
	metered := a.perUnit(7)

	// available_mc and credit_limit_mc: the credit line (issue 28 item 2,
	// docs/decisions.md "Credit line"), beyond the spec's members.
	meteredKeys := []string{"type", "allowed", "customer_id", "billable_metric_key", "units", "balance", "reserved_balance",
		"pending_balance", "effective_balance", "estimated_cost", "balance_after", "subscription_status", "overage_policy",
		"available_mc", "credit_limit_mc"}
	before := a.credits(id)
	forms := []string{
		"/v1/entitlements/check?customer_id=" + id + "&billable_metric_key=" + metered,
		"/v1/entitlements/check?customer_id=" + ext + "&billable_metric_key=" + metered,
		"/v1/customers/" + id + "/entitlements/" + metered + "?",
		"/v1/customers/" + ext + "/entitlements/" + metered + "?",
		"/v1/customer-by-external-id/" + ext + "/entitlements/" + metered + "?",
	}
	for _, f := range forms {
		r := a.get(f + "&units=3")
		if !checkStatus(t, r, 200, f) {
			continue
		}
		checkKeys(t, r.Body, f, meteredKeys...)
		b := r.Body
		if b["type"] != "metered" || b["allowed"] != true || b["customer_id"] != id || b["billable_metric_key"] != metered ||
			Int(t, b["units"]) != 3 || Int(t, b["balance"]) != 10_000 || Int(t, b["reserved_balance"]) != 0 ||
			Int(t, b["pending_balance"]) != 0 || Int(t, b["effective_balance"]) != 10_000 || Int(t, b["estimated_cost"]) != 21 ||
			Int(t, b["balance_after"]) != 9_979 || b["subscription_status"] != nil || b["overage_policy"] != "block" ||
			Int(t, b["available_mc"]) != 10_000 || Int(t, b["credit_limit_mc"]) != 0 {
			t.Errorf("%s: %s", f, r.Raw)
		}
		// units defaults to 1.
		if d := a.get(f); checkStatus(t, d, 200, f+" default units") && (Int(t, d.Body["units"]) != 1 || Int(t, d.Body["estimated_cost"]) != 7) {
			t.Errorf("%s without units: %s", f, d.Raw)
		}
		// balance_after goes negative; block says no.
		if n := a.get(f + "&units=2000"); checkStatus(t, n, 200, f+" unaffordable") && (Int(t, n.Body["balance_after"]) != -4_000 || n.Body["allowed"] != false) {
			t.Errorf("%s unaffordable: %s", f, n.Raw)
		}
		for _, bad := range []string{"0", "-1", "abc", "1.5", "99999999999999999999"} {
			checkProblem(t, a.get(f+"&units="+bad), 400, "bad-request", "units", f+" units="+bad)
		}
	}
	// allow and notify customers are allowed past the balance.
	for _, pol := range []string{"allow", "notify"} {
		c := a.createCustomer(map[string]any{"external_id": uniq("pol"), "overage_policy": pol})
		r := a.get("/v1/customers/" + c["id"].(string) + "/entitlements/" + metered + "?units=5")
		if checkStatus(t, r, 200, pol) && (r.Body["allowed"] != true || r.Body["overage_policy"] != pol || Int(t, r.Body["balance_after"]) != -35) {
			t.Errorf("%s check: %s", pol, r.Raw)
		}
	}
	// A check changes nothing.
	after := a.credits(id)
	for _, k := range []string{"balance", "reserved_balance", "effective_balance", "version", "lifetime_earned"} {
		if Int(t, before[k]) != Int(t, after[k]) {
			t.Errorf("%s moved from %v to %v after checks", k, before[k], after[k])
		}
	}

	// Missing parameters name themselves.
	checkProblem(t, a.get("/v1/entitlements/check?billable_metric_key="+metered), 400, "bad-request", "customer_id", "no customer_id")
	checkProblem(t, a.get("/v1/entitlements/check?customer_id="+id), 400, "bad-request", "billable_metric_key", "no billable_metric_key")
	checkProblem(t, a.get("/v1/entitlements/check?customer_id=&billable_metric_key="+metered), 400, "bad-request", "customer_id", "empty customer_id")

	// 404: a metered metric without an active rule, or no metric at all.
	bare := uniq("bare")
	a.newMetric(bare, "metered", nil)
	checkProblem(t, a.get("/v1/entitlements/check?customer_id="+id+"&billable_metric_key="+bare), 404, "not-found", "", "metered without rule")
	checkProblem(t, a.get("/v1/customers/"+id+"/entitlements/"+uniq("none")), 404, "not-found", "", "unknown metric")

	// The other types: their own members, never a 404, units ignored.
	on, off, gauge, static := uniq("on"), uniq("off"), uniq("gauge"), uniq("static")
	a.newMetric(on, "boolean", map[string]any{"enabled": true})
	a.newMetric(off, "boolean", nil)
	a.newMetric(gauge, "gauge", map[string]any{"cap": 5})
	a.newMetric(static, "static", map[string]any{"config": map[string]any{"tier": "gold", "n": 3}})
	base := []string{"type", "allowed", "customer_id", "billable_metric_key", "subscription_status"}
	for _, tc := range []struct {
		key, typ string
		allowed  bool
		extra    map[string]string
	}{
		{on, "boolean", true, map[string]string{"enabled": "true"}},
		{off, "boolean", false, map[string]string{"enabled": "false"}},
		{gauge, "gauge", true, map[string]string{"current": "0", "cap": "5", "headroom": "5"}},
		{static, "static", true, map[string]string{"config": `{"n":3,"tier":"gold"}`}},
	} {
		for _, p := range []string{
			"/v1/entitlements/check?units=4&customer_id=" + ext + "&billable_metric_key=" + tc.key,
			"/v1/customer-by-external-id/" + ext + "/entitlements/" + tc.key,
			"/v1/customers/" + uniq("fresh") + "/entitlements/" + tc.key,
		} {
			r := a.get(p)
			if !checkStatus(t, r, 200, p) {
				continue
			}
			want := append([]string{}, base...)
			for k := range tc.extra {
				want = append(want, k)
			}
			checkKeys(t, r.Body, p, want...)
			if r.Body["type"] != tc.typ || r.Body["allowed"] != tc.allowed || r.Body["subscription_status"] != nil {
				t.Errorf("%s: %s", p, r.Raw)
			}
			for k, v := range tc.extra {
				if got := mustJSON(r.Body[k]); got != v {
					t.Errorf("%s: %s = %s, want %s", p, k, got, v)
				}
			}
		}
	}

	// Lenient ids auto-create (with the value as external_id); the strict twin never does.
	fresh := uniq("auto")
	r := a.get("/v1/entitlements/check?customer_id=" + fresh + "&billable_metric_key=" + metered)
	wantStatus(t, r, 200, "check of an unknown id")
	if Int(t, r.Body["balance"]) != 0 || r.Body["allowed"] != false || Int(t, r.Body["balance_after"]) != -7 {
		t.Errorf("check of a new customer: %s", r.Raw)
	}
	c := a.get("/v1/customers/" + fresh)
	if checkStatus(t, c, 200, "auto-created by check") && (c.Body["external_id"] != fresh || c.Body["id"] != r.Body["customer_id"]) {
		t.Errorf("auto-created customer %s, check %s", c.Raw, r.Raw)
	}
	ghost := uniq("ghost")
	checkProblem(t, a.get("/v1/customer-by-external-id/"+ghost+"/entitlements/"+metered), 404, "not-found", "", "strict unknown")
	checkProblem(t, a.get("/v1/customer-by-external-id/"+ghost+"/entitlements/"+on), 404, "not-found", "", "strict unknown boolean")
	checkProblem(t, a.get("/v1/customers/"+ghost), 404, "not-found", "", "strict check did not create")

	// Another tenant's customer id is a 400.
	other := s.as(t, s.NewTenant(uniq("other")).Live)
	otherID, _ := other.newCustomer()
	checkProblem(t, a.get("/v1/entitlements/check?customer_id="+otherID+"&billable_metric_key="+metered), 400, "bad-request", "", "cross-tenant id")
}

// TestConformanceConsume: POST /v1/entitlements/consume: the docs/spec/addendum.md §7 body;
// block refuses with 409 insufficient-credits and charges nothing;
// allow/notify floor at zero and record overage (GET .../overage shows
// it); idempotent replay; non-metered 400; no rule 404; 422 fields.
func TestConformanceConsume(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("consume"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(100)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})

	key := idemKey()
	body := map[string]any{"customer_id": ext, "billable_metric_key": metric, "units": 3, "metadata": map[string]any{"job": "j1"}}
	r := a.do("POST", "/v1/entitlements/consume", key, body)
	wantStatus(t, r, 200, "consume")
	checkKeys(t, r.Body, "consume", "transaction_id", "customer_id", "billable_metric_key", "units", "cost", "charged", "overage_mc",
		"balance_after", "effective_balance", "reason")
	checkUUID(t, r.Body["transaction_id"], "transaction_id")
	if r.Body["customer_id"] != id || r.Body["billable_metric_key"] != metric || Int(t, r.Body["units"]) != 3 || Int(t, r.Body["cost"]) != 300 ||
		Int(t, r.Body["charged"]) != 300 || Int(t, r.Body["overage_mc"]) != 0 || Int(t, r.Body["balance_after"]) != 700 ||
		Int(t, r.Body["effective_balance"]) != 700 || r.Body["reason"] != nil {
		t.Errorf("consume body: %s", r.Raw)
	}
	// Replay: same answer, nothing charged twice.
	rp := a.do("POST", "/v1/entitlements/consume", key, body)
	wantStatus(t, rp, 200, "replay")
	if string(rp.Raw) != string(r.Raw) || rp.Header.Get("X-Idempotent-Replayed") != "true" {
		t.Errorf("replay: %s (replayed %q), first %s", rp.Raw, rp.Header.Get("X-Idempotent-Replayed"), r.Raw)
	}
	checkProblem(t, a.do("POST", "/v1/entitlements/consume", key, map[string]any{"customer_id": ext, "billable_metric_key": metric, "units": 4}),
		409, "conflict", "", "key reused with another body")
	if b := a.balance(id); b != 700 {
		t.Errorf("balance %d after consume and replay, want 700", b)
	}
	// The ledger has one consumption entry carrying the metadata.
	s.Drain()
	h := a.history(id, "?type=consumption")
	if len(h) != 1 {
		t.Fatalf("consumption entries: %d, want 1", len(h))
	}
	e := obj(t, h[0], "entry")
	if e["id"] != r.Body["transaction_id"] || Int(t, e["delta"]) != -300 || e["billable_metric_key"] != metric ||
		Int(t, e["cost_units"]) != 3 || mustJSON(e["metadata"]) != `{"job":"j1"}` {
		t.Errorf("consumption entry: %v", e)
	}

	// block: short balance is a 409 and nothing moves.
	v := Int(t, a.credits(id)["version"])
	checkProblem(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 8}),
		409, "insufficient-credits", "", "block past the balance")
	if c := a.credits(id); Int(t, c["balance"]) != 700 || Int(t, c["version"]) != v {
		t.Errorf("after a refused consume: balance %v version %v (was 700, %d)", c["balance"], c["version"], v)
	}
	s.Drain()
	if h := a.history(id, "?type=consumption"); len(h) != 1 {
		t.Errorf("a refused consume wrote %d consumption entries", len(h)-1)
	}

	// allow and notify: charge what is there, floor at zero, record the rest.
	from := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	for _, pol := range []string{"allow", "notify"} {
		c := a.createCustomer(map[string]any{"external_id": uniq(pol), "overage_policy": pol})
		cid := c["id"].(string)
		a.grant(cid, map[string]any{"credits": 500})
		r := a.post("/v1/entitlements/consume", map[string]any{"customer_id": cid, "billable_metric_key": metric, "units": 8})
		if !checkStatus(t, r, 200, pol+" consume") {
			continue
		}
		if Int(t, r.Body["cost"]) != 800 || Int(t, r.Body["charged"]) != 500 || Int(t, r.Body["overage_mc"]) != 300 ||
			Int(t, r.Body["balance_after"]) != 0 || Int(t, r.Body["effective_balance"]) != 0 || r.Body["reason"] != nil {
			t.Errorf("%s consume: %s", pol, r.Raw)
		}
		// Past zero: everything is overage, the balance stays at zero.
		r2 := a.post("/v1/entitlements/consume", map[string]any{"customer_id": cid, "billable_metric_key": metric, "units": 1})
		if checkStatus(t, r2, 200, pol+" at zero") && (Int(t, r2.Body["charged"]) != 0 || Int(t, r2.Body["overage_mc"]) != 100 || Int(t, r2.Body["balance_after"]) != 0) {
			t.Errorf("%s at zero: %s", pol, r2.Raw)
		}
		if b := a.balance(cid); b != 0 {
			t.Errorf("%s balance %d, want 0", pol, b)
		}
		to := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
		o := a.get("/v1/customers/" + cid + "/overage?from=" + url.QueryEscape(from) + "&to=" + url.QueryEscape(to))
		wantStatus(t, o, 200, "overage")
		if Int(t, o.Body["total_overage_mc"]) != 400 {
			t.Errorf("%s overage report: %s", pol, o.Raw)
		}
		if d := arr(t, o.Body["data"], "data"); len(d) != 1 || obj(t, d[0], "line")["billable_metric_key"] != metric || Int(t, obj(t, d[0], "line")["overage_mc"]) != 400 {
			t.Errorf("%s overage lines: %s", pol, o.Raw)
		}
	}

	// Errors.
	flag := uniq("flag")
	a.newMetric(flag, "boolean", map[string]any{"enabled": true})
	checkProblem(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": flag, "units": 1}), 400, "bad-request", "", "non-metered")
	bare := uniq("bare")
	a.newMetric(bare, "metered", nil)
	checkProblem(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": bare, "units": 1}), 404, "not-found", "", "no rule")
	for _, tc := range []struct {
		name   string
		body   map[string]any
		status int
		typ    string
		field  string
	}{
		{"no customer_id", map[string]any{"billable_metric_key": metric, "units": 1}, 422, "validation-error", "customer_id"},
		{"no metric", map[string]any{"customer_id": id, "units": 1}, 422, "validation-error", "billable_metric_key"},
		{"no units", map[string]any{"customer_id": id, "billable_metric_key": metric}, 422, "validation-error", "units"},
		{"units 0", map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 0}, 400, "bad-request", "units"},
		{"units string", map[string]any{"customer_id": id, "billable_metric_key": metric, "units": "2"}, 422, "validation-error", "units"},
	} {
		checkProblem(t, a.post("/v1/entitlements/consume", tc.body), tc.status, tc.typ, tc.field, tc.name)
	}
	checkProblem(t, a.do("POST", "/v1/entitlements/consume", "", body), 422, "validation-error", "Idempotency-Key", "no Idempotency-Key")
	if b := a.balance(id); b != 700 {
		t.Errorf("balance %d after refused consumes, want 700", b)
	}
}

// TestConformanceUsage: POST /v1/usage: one result per event in order; one
// bad event never fails the others; a re-sent event_id is charged once.
func TestConformanceUsage(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("usage"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})
	e1, e4 := uniq("ev"), uniq("ev")
	events := []any{
		map[string]any{"event_id": e1, "customer_id": id, "billable_metric_key": metric, "units": 2},
		map[string]any{"event_id": uniq("ev"), "customer_id": id, "billable_metric_key": uniq("norule"), "units": 1},
		map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 1},
		map[string]any{"event_id": e4, "customer_id": id, "billable_metric_key": metric, "units": 5, "metadata": map[string]any{"k": "v"}},
		map[string]any{"event_id": uniq("ev"), "customer_id": id, "billable_metric_key": metric, "units": 1000},
	}
	r := a.post("/v1/usage", map[string]any{"events": events})
	wantStatus(t, r, 200, "usage")
	checkKeys(t, r.Body, "usage", "results")
	res := arr(t, r.Body["results"], "results")
	if len(res) != len(events) {
		t.Fatalf("results %d, want %d: %s", len(res), len(events), r.Raw)
	}
	want := []struct {
		status  string
		charged int64
	}{{"charged", 20}, {"failed", 0}, {"failed", 0}, {"charged", 50}, {"refused", 0}}
	var tx1 any
	for i, w := range want {
		e := obj(t, res[i], "result")
		for _, k := range []string{"event_id", "status", "transaction_id", "charged", "error"} {
			if _, ok := e[k]; !ok {
				t.Errorf("result %d lacks %s: %v", i, k, e)
			}
		}
		if e["status"] != w.status || Int(t, e["charged"]) != w.charged {
			t.Errorf("result %d: %v, want status %s charged %d", i, e, w.status, w.charged)
		}
		if w.status == "charged" {
			checkUUID(t, e["transaction_id"], "transaction_id")
			if e["error"] != nil {
				t.Errorf("result %d error %v, want null", i, e["error"])
			}
		} else if s, _ := e["error"].(string); s == "" {
			t.Errorf("result %d has no error message: %v", i, e)
		}
		if i == 0 {
			tx1 = e["transaction_id"]
		}
	}
	if obj(t, res[0], "r")["event_id"] != e1 || obj(t, res[3], "r")["event_id"] != e4 {
		t.Errorf("event ids not echoed: %s", r.Raw)
	}
	if b := a.balance(id); b != 930 {
		t.Errorf("balance %d, want 930", b)
	}
	// The same events under a new Idempotency-Key: each charged once.
	r2 := a.post("/v1/usage", map[string]any{"events": events[:1]})
	wantStatus(t, r2, 200, "re-sent event")
	again := obj(t, arr(t, r2.Body["results"], "results")[0], "result")
	if st := again["status"]; (st != "charged" && st != "duplicate") || again["transaction_id"] != tx1 {
		t.Errorf("re-sent event: %v (first transaction %v)", again, tx1)
	}
	if b := a.balance(id); b != 930 {
		t.Errorf("balance %d after a re-sent event, want 930", b)
	}
	// The same event_id with other content is refused, the batch is not.
	r3 := a.post("/v1/usage", map[string]any{"events": []any{map[string]any{"event_id": e1, "customer_id": id, "billable_metric_key": metric, "units": 3}}})
	wantStatus(t, r3, 200, "event id reused")
	if e := obj(t, arr(t, r3.Body["results"], "results")[0], "result"); e["status"] != "failed" {
		t.Errorf("reused event_id with other content: %v", e)
	}
	if b := a.balance(id); b != 930 {
		t.Errorf("balance %d after a reused event_id, want 930", b)
	}

	// Whole-batch errors.
	checkProblem(t, a.post("/v1/usage", map[string]any{}), 422, "validation-error", "events", "no events")
	big := make([]any, 1001)
	for i := range big {
		big[i] = map[string]any{"event_id": fmt.Sprint(i), "customer_id": id, "billable_metric_key": metric, "units": 1}
	}
	checkProblem(t, a.post("/v1/usage", map[string]any{"events": big}), 422, "validation-error", "events", "1001 events")
	e := a.post("/v1/usage", map[string]any{"events": []any{}})
	if checkStatus(t, e, 200, "empty batch") && len(arr(t, e.Body["results"], "results")) != 0 {
		t.Errorf("empty batch: %s", e.Raw)
	}
}

// TestConformanceGauges: Gauge operations: the five-member body, caps under
// block (409 with current, cap, shortfall) and allow, never below zero, 404
// for an unknown metric, 400 for a non-gauge metric or bad amount/policy.
func TestConformanceGauges(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("gauges"))
	a := s.as(t, tn.Live)
	seats := uniq("seats")
	a.newMetric(seats, "gauge", map[string]any{"cap": 3})
	id, ext := a.newCustomer()
	inc := "/v1/customers/" + id + "/entitlements/" + seats + "/increment"
	dec := "/v1/customers/" + id + "/entitlements/" + seats + "/decrement"

	gauge := func(r Response, what string, current, headroom int64) {
		t.Helper()
		if !checkStatus(t, r, 200, what) {
			return
		}
		checkKeys(t, r.Body, what, "billable_metric_key", "current", "cap", "allowed", "headroom")
		if r.Body["billable_metric_key"] != seats || Int(t, r.Body["current"]) != current || Int(t, r.Body["cap"]) != 3 ||
			Int(t, r.Body["headroom"]) != headroom {
			t.Errorf("%s: %s, want current %d headroom %d", what, r.Raw, current, headroom)
		}
	}
	key := idemKey()
	r := a.do("POST", inc, key, map[string]any{"amount": 2, "metadata": map[string]any{"x": 1}})
	gauge(r, "first increment", 2, 1)
	if r.Body["allowed"] != true {
		t.Errorf("allowed %v under the cap", r.Body["allowed"])
	}
	rp := a.do("POST", inc, key, map[string]any{"amount": 2, "metadata": map[string]any{"x": 1}})
	if string(rp.Raw) != string(r.Raw) || rp.Header.Get("X-Idempotent-Replayed") != "true" {
		t.Errorf("replayed increment: %s", rp.Raw)
	}

	// Past the cap under block: 409 with current, cap, shortfall; nothing moves.
	for _, b := range []map[string]any{{"amount": 2}, {"amount": 2, "policy": "block"}} {
		p := a.post(inc, b)
		checkProblem(t, p, 409, "conflict", "", "past the cap")
		if p.Body != nil && (Int(t, p.Body["current"]) != 2 || Int(t, p.Body["cap"]) != 3 || Int(t, p.Body["shortfall"]) != 1) {
			t.Errorf("cap problem members: %s", p.Raw)
		}
	}
	chk := a.get("/v1/customers/" + id + "/entitlements/" + seats)
	if Int(t, chk.Body["current"]) != 2 || Int(t, chk.Body["headroom"]) != 1 {
		t.Errorf("check after refused increments: %s", chk.Raw)
	}
	// allow lets it through; headroom goes negative.
	gauge(a.post(inc, map[string]any{"amount": 2, "policy": "allow"}), "allow past the cap", 4, -1)
	chk = a.get("/v1/customer-by-external-id/" + ext + "/entitlements/" + seats)
	if Int(t, chk.Body["current"]) != 4 || Int(t, chk.Body["headroom"]) != -1 || chk.Body["allowed"] != false {
		t.Errorf("check over the cap: %s", chk.Raw)
	}
	// Decrement: policy accepted and ignored; never below zero.
	gauge(a.post(dec, map[string]any{"amount": 3, "policy": "whatever"}), "decrement", 1, 2)
	checkProblem(t, a.post(dec, map[string]any{"amount": 2}), 409, "conflict", "", "below zero")
	gauge(a.post(dec, map[string]any{"amount": 1}), "decrement to zero", 0, 3)
	// The strict twin moves the same counter; an unknown external id is a 404.
	gauge(a.post("/v1/customer-by-external-id/"+ext+"/entitlements/"+seats+"/increment", map[string]any{"amount": 1}), "strict increment", 1, 2)
	ghost := uniq("ghost")
	checkProblem(t, a.post("/v1/customer-by-external-id/"+ghost+"/entitlements/"+seats+"/increment", map[string]any{"amount": 1}), 404, "not-found", "", "strict unknown")
	// The lenient form creates the customer, counter starting at zero.
	fresh := uniq("fresh")
	r = a.post("/v1/customers/"+fresh+"/entitlements/"+seats+"/increment", map[string]any{"amount": 3})
	if checkStatus(t, r, 200, "auto-create") && Int(t, r.Body["current"]) != 3 {
		t.Errorf("new customer's counter: %s", r.Raw)
	}
	wantStatus(t, a.get("/v1/customer-by-external-id/"+fresh), 200, "auto-created by increment")

	// Errors.
	flag := uniq("flag")
	a.newMetric(flag, "boolean", nil)
	metered := a.perUnit(1)
	for _, tc := range []struct {
		name, path string
		body       any
		status     int
		typ, field string
	}{
		{"amount 0", inc, map[string]any{"amount": 0}, 400, "bad-request", "amount"},
		{"amount negative", dec, map[string]any{"amount": -1}, 400, "bad-request", "amount"},
		{"no amount", inc, map[string]any{}, 400, "bad-request", "amount"},
		{"bad policy", inc, map[string]any{"amount": 1, "policy": "maybe"}, 400, "bad-request", "policy"},
		{"unknown metric", "/v1/customers/" + id + "/entitlements/" + uniq("nope") + "/increment", map[string]any{"amount": 1}, 404, "not-found", ""},
		{"boolean metric", "/v1/customers/" + id + "/entitlements/" + flag + "/increment", map[string]any{"amount": 1}, 400, "bad-request", ""},
		{"metered metric", "/v1/customers/" + id + "/entitlements/" + metered + "/decrement", map[string]any{"amount": 1}, 400, "bad-request", ""},
		{"no body", inc, nil, 400, "bad-request", ""},
	} {
		checkProblem(t, a.post(tc.path, tc.body), tc.status, tc.typ, tc.field, tc.name)
	}
	if c := a.get("/v1/customers/" + id + "/entitlements/" + seats); Int(t, c.Body["current"]) != 1 {
		t.Errorf("counter after refused calls: %s", c.Raw)
	}
}

// TestConformanceConsumeDoubleSpend: credit for exactly K consumes, 100
// concurrent consumes under block: exactly K succeed, the balance ends at 0
// and the ledger in Postgres sums to it.
func TestConformanceConsumeDoubleSpend(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("dspend"))
	raiseRateLimit(t, s.HTTP, s.URL, tn.ID)
	a := s.as(t, tn.Live)
	metric := a.perUnit(100)
	id, _ := a.newCustomer()
	const k, n = 37, 100
	a.grant(id, map[string]any{"credits": k * 100})
	client := loadClient()
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := TryCall(client, s.URL, "POST", "/v1/entitlements/consume",
				map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 1},
				"X-API-Key", tn.Live, "Idempotency-Key", idemKey())
			if err != nil {
				t.Errorf("consume %d: %v", i, err)
				return
			}
			statuses[i] = r.Status
			if r.Status == 409 && problemType(r) != "insufficient-credits" {
				t.Errorf("consume %d: 409 of type %s", i, problemType(r))
			}
		}(i)
	}
	wg.Wait()
	ok, refused := 0, 0
	for _, st := range statuses {
		switch st {
		case 200:
			ok++
		case 409:
			refused++
		default:
			t.Errorf("unexpected status %d", st)
		}
	}
	if ok != k || refused != n-k {
		t.Errorf("%d succeeded and %d were refused, want %d and %d", ok, refused, k, n-k)
	}
	c := a.credits(id)
	if Int(t, c["balance"]) != 0 || Int(t, c["effective_balance"]) != 0 {
		t.Errorf("balance after the race: %v", c)
	}
	s.Drain()
	if sum := ledgerSum(a, id); sum != 0 {
		t.Errorf("ledger deltas sum to %d, balance is 0", sum)
	}
}

// ledgerSum pages a customer's whole history and adds its deltas.
func ledgerSum(a api, id string) int64 {
	a.t.Helper()
	var sum int64
	cursor := ""
	for {
		q := "?limit=100"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		r := a.get("/v1/customers/" + id + "/credits/history" + q)
		wantStatus(a.t, r, 200, "history")
		data, more, next := page(a.t, r)
		for _, d := range data {
			sum += Int(a.t, obj(a.t, d, "entry")["delta"])
		}
		if !more {
			return sum
		}
		cursor = str(a.t, next, "next_cursor")
	}
}
