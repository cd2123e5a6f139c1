package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// alertEvents pages GET /v1/events from the start and returns every event
// of the tenant, checking the sequences run 1..N with no gap.
func (a api) alertEvents() []map[string]any {
	a.t.Helper()
	var out []map[string]any
	after := "0"
	for {
		r := a.get("/v1/events?limit=100&after_sequence=" + after)
		wantStatus(a.t, r, 200, "events page")
		data, more, next := page(a.t, r)
		for _, d := range data {
			e := obj(a.t, d, "event")
			if seq := Int(a.t, e["sequence"]); seq != int64(len(out)+1) {
				a.t.Fatalf("event %d has sequence %d (gap or duplicate): %v", len(out), seq, e)
			}
			out = append(out, e)
		}
		if !more {
			return out
		}
		after = str(a.t, next, "next_cursor")
	}
}

// ofType keeps the events of typ for customer, in sequence order.
func ofType(events []map[string]any, typ, customer string) []map[string]any {
	var out []map[string]any
	for _, e := range events {
		if e["event_type"] == typ && e["customer_id"] == customer {
			out = append(out, e)
		}
	}
	return out
}

// thresholdsOf is the threshold_mc of each credit.threshold_crossed event.
func thresholdsOf(t testing.TB, events []map[string]any) []int64 {
	out := []int64{}
	for _, e := range events {
		out = append(out, Int(t, obj(t, e["data"], "data")["threshold_mc"]))
	}
	return out
}

func equalInts(a, b []int64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestCreditAlertThresholdsFireOncePerCrossing (issue 15 item 4): a
// customer's absolute and percent-of-last-grant thresholds each fire
// credit.threshold_crossed exactly once on the way down, not again while the
// balance stays below, and again after a grant lifts the balance back above
// (re-armed, the percent one resolved against the new grant). The events are
// in GET /v1/events with gap-free sequences and account versions, and are
// delivered to the webhook like every other event.
func TestCreditAlertThresholdsFireOncePerCrossing(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	tn := s.NewTenant(uniq("alerts"))
	rcv := newHookReceiver(t)
	wantStatus(t, adminCall(t, s, AdminToken, "PUT", "/admin/v1/tenants/"+tn.ID+"/webhook", map[string]any{"url": rcv.srv.URL}), 200, "PUT webhook")
	a := s.as(t, tn.Live)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1000, "source": "promotional", "reason": "seed"})

	r := a.do("PUT", "/v1/customers/"+ext+"/credits/alerts", "", map[string]any{"thresholds": []any{
		map[string]any{"type": "absolute", "amount_mc": 500},
		map[string]any{"type": "percent_of_last_grant", "percent": 20},
	}})
	wantStatus(t, r, 200, "PUT customer alerts")
	if r.Body["source"] != "customer" || r.Body["customer_id"] != id || len(arr(t, r.Body["thresholds"], "thresholds")) != 2 {
		t.Fatalf("PUT customer alerts = %s", r.Raw)
	}
	debit := func(delta int64) {
		t.Helper()
		wantStatus(t, a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": -delta, "source": "manual", "reason": "use"}), 200, "adjust")
	}
	debit(400) // 600: above both
	debit(150) // 450: crosses 500
	debit(100) // 350: still below 500, above 200
	debit(200) // 150: crosses 200 (20% of the 1000 grant)
	debit(50)  // 100: below both, nothing
	// 600: both re-armed; 20% is now 100 (of the 500 grant).
	a.grant(id, map[string]any{"credits": 500, "source": "promotional", "reason": "more"})
	debit(150) // 450: crosses 500 again
	debit(360) // 90: crosses 100
	s.Drain()

	events := a.alertEvents()
	crossed := ofType(events, "credit.threshold_crossed", id)
	if got, want := thresholdsOf(t, crossed), []int64{500, 200, 500, 100}; !equalInts(got, want) {
		t.Fatalf("threshold_crossed threshold_mc %v, want %v", got, want)
	}
	first := obj(t, crossed[0]["data"], "data")
	if Int(t, first["balance_mc"]) != 450 || Int(t, first["previous_balance_mc"]) != 600 ||
		obj(t, first["threshold"], "threshold")["type"] != "absolute" {
		t.Errorf("first crossing data = %v", first)
	}
	if crossed[1]["external_customer_id"] != ext {
		t.Errorf("external_customer_id = %v, want %s", crossed[1]["external_customer_id"], ext)
	}
	// Each crossing carries the version of the adjustment that caused it,
	// right after that adjustment's credit.consumed.
	for _, c := range crossed {
		seq := Int(t, c["sequence"])
		prev := events[seq-2]
		if prev["event_type"] != "credit.consumed" || Int(t, prev["version"]) != Int(t, c["version"]) {
			t.Errorf("crossing %d follows %v (version %v), want the credit.consumed of version %v", seq, prev["event_type"], prev["version"], c["version"])
		}
	}

	// Delivered as webhooks, once each.
	want := len(events)
	hs := waitHooks(t, rcv, want)
	delivered := 0
	for _, h := range hs {
		var body map[string]any
		if err := json.Unmarshal([]byte(h.Body), &body); err != nil {
			t.Fatal(err)
		}
		if body["event_type"] == "credit.threshold_crossed" {
			delivered++
		}
	}
	if delivered != 4 {
		t.Errorf("%d credit.threshold_crossed deliveries, want 4", delivered)
	}
}

// TestCreditAlertDefaultAllowanceAndTopup (issue 15 item 4): the tenant
// default applies to a customer without settings of its own; a percent of
// the period allowance resolves against the plan's recurring grants; the
// top-up rule fires credit.topup_requested once per crossing with the key
// the answering topup uses, not again within its dedupe window even after a
// topup re-armed it, and again after the window; a customer's own empty
// settings silence the default, and deleting them restores it.
func TestCreditAlertDefaultAllowanceAndTopup(t *testing.T) {
	t.Parallel()
	clock := newSettableClock(time.Now())
	s := NewStack(t, WithClock(clock))
	tn := s.NewTenant(uniq("alerts-default"))
	a := s.as(t, tn.Live)

	r := a.get("/v1/credit-alerts/default")
	wantStatus(t, r, 200, "GET default (none)")
	if r.Body["source"] != "none" || r.Body["updated_at"] != nil {
		t.Fatalf("default before PUT = %s", r.Raw)
	}
	r = a.do("PUT", "/v1/credit-alerts/default", "", map[string]any{
		"thresholds": []any{map[string]any{"type": "percent_of_period_allowance", "percent": 50}},
		"topup":      map[string]any{"below_mc": 100, "amount_mc": 5000, "dedupe_window_seconds": 3600},
	})
	wantStatus(t, r, 200, "PUT default")
	if r.Body["source"] != "default" || r.Body["customer_id"] != nil {
		t.Fatalf("PUT default = %s", r.Raw)
	}
	// The sandbox has its own default: none.
	if r := s.as(t, tn.Sandbox).get("/v1/credit-alerts/default"); r.Body["source"] != "none" {
		t.Fatalf("sandbox default = %s", r.Raw)
	}

	plan := str(t, a.newPlan(map[string]any{"name": "Pro"})["id"], "plan id")
	vid := str(t, a.newVariant(plan, map[string]any{"billing_cycle": "monthly", "billing_mode": "prepaid"})["id"], "variant id")
	a.newGrant(plan, vid, map[string]any{"credits": 1000, "grant_interval": "billing_period", "grant_type": "recurring"})
	id, _ := a.newCustomer()
	wantStatus(t, a.post("/v1/subscriptions", map[string]any{"customer_id": id, "plan_variant_id": vid}), 201, "subscribe")
	if got := a.balance(id); got != 1000 {
		t.Fatalf("balance after subscribing = %d, want 1000", got)
	}
	r = a.get("/v1/customers/" + id + "/credits/alerts")
	wantStatus(t, r, 200, "GET customer alerts")
	if r.Body["source"] != "default" || r.Body["customer_id"] != id {
		t.Fatalf("customer alerts = %s", r.Raw)
	}

	adjust := func(delta int64) {
		t.Helper()
		wantStatus(t, a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": delta, "source": "manual", "reason": "r"}), 200, "adjust")
	}
	adjust(-600) // 400: crosses 500 (50% of the 1000 allowance)
	adjust(-350) // 50: crosses the top-up rule's 100
	s.Drain()
	events := a.alertEvents()
	if got := thresholdsOf(t, ofType(events, "credit.threshold_crossed", id)); !equalInts(got, []int64{500}) {
		t.Fatalf("threshold_crossed %v, want [500]", got)
	}
	topups := ofType(events, "credit.topup_requested", id)
	if len(topups) != 1 {
		t.Fatalf("%d topup requests, want 1", len(topups))
	}
	data := obj(t, topups[0]["data"], "data")
	key := str(t, data["idempotency_key"], "idempotency_key")
	if Int(t, data["requested_mc"]) != 5000 || Int(t, data["balance_mc"]) != 50 || !strings.HasSuffix(key, topups[0]["event_id"].(string)) {
		t.Fatalf("topup request data = %v", data)
	}
	// The integration answers with a topup under the given key (twice: once applied).
	for range 2 {
		r = a.do("POST", "/v1/customers/"+id+"/topups", key, map[string]any{"credits": 5000, "payment_reference": "pi_1"})
		wantStatus(t, r, 201, "answering topup")
	}
	if got := a.balance(id); got != 5050 {
		t.Fatalf("balance after the topup = %d, want 5050", got)
	}

	clock.Set(clock.Now().Add(10 * time.Minute))
	adjust(-5000) // 50: crosses 500 and 100 again; the rule is within its window
	clock.Set(clock.Now().Add(time.Hour))
	adjust(1000)  // 1050
	adjust(-1000) // 50: crosses both; the window has passed
	s.Drain()
	events = a.alertEvents()
	if got := thresholdsOf(t, ofType(events, "credit.threshold_crossed", id)); !equalInts(got, []int64{500, 500, 500}) {
		t.Fatalf("threshold_crossed %v, want [500 500 500]", got)
	}
	if n := len(ofType(events, "credit.topup_requested", id)); n != 2 {
		t.Fatalf("%d topup requests, want 2 (one deduplicated)", n)
	}

	// A customer's own empty settings silence the default.
	quiet, _ := a.newCustomer()
	a.grant(quiet, map[string]any{"credits": 1000, "source": "promotional", "reason": "seed"})
	r = a.do("PUT", "/v1/customers/"+quiet+"/credits/alerts", "", map[string]any{"thresholds": []any{}})
	wantStatus(t, r, 200, "PUT empty")
	wantStatus(t, a.post("/v1/customers/"+quiet+"/credits/adjust", map[string]any{"delta": -990, "source": "manual", "reason": "r"}), 200, "adjust quiet")
	s.Drain()
	events = a.alertEvents()
	if n := len(ofType(events, "credit.topup_requested", quiet)); n != 0 {
		t.Fatalf("silenced customer got %d topup requests", n)
	}
	wantStatus(t, a.do("DELETE", "/v1/customers/"+quiet+"/credits/alerts", "", nil), 204, "DELETE own")
	checkProblem(t, a.do("DELETE", "/v1/customers/"+quiet+"/credits/alerts", "", nil), 404, "not-found", "", "DELETE again")
	if r := a.get("/v1/customers/" + quiet + "/credits/alerts"); r.Body["source"] != "default" {
		t.Fatalf("after DELETE = %s", r.Raw)
	}
}

// TestCreditAlertBadInput: bad alert settings are 400 or 422 naming the
// field and change nothing; an unknown customer is 404.
func TestCreditAlertBadInput(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	tn := s.NewTenant(uniq("alerts-bad"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	path := "/v1/customers/" + id + "/credits/alerts"
	abs := func(v any) map[string]any { return map[string]any{"type": "absolute", "amount_mc": v} }
	many := []any{}
	for i := range 11 {
		many = append(many, abs(i+1))
	}
	for _, tc := range []struct {
		name   string
		body   any
		status int
		field  string
	}{
		{"not an object", []any{1}, 400, ""},
		{"thresholds missing", map[string]any{}, 422, "thresholds"},
		{"thresholds not an array", map[string]any{"thresholds": "x"}, 422, "thresholds"},
		{"eleven thresholds", map[string]any{"thresholds": many}, 422, "thresholds"},
		{"unknown type", map[string]any{"thresholds": []any{map[string]any{"type": "ratio"}}}, 422, "thresholds[0].type"},
		{"absolute without amount", map[string]any{"thresholds": []any{map[string]any{"type": "absolute"}}}, 422, "thresholds[0].amount_mc"},
		{"negative amount", map[string]any{"thresholds": []any{abs(5), abs(-1)}}, 422, "thresholds[1].amount_mc"},
		{"percent 0", map[string]any{"thresholds": []any{map[string]any{"type": "percent_of_last_grant", "percent": 0}}}, 422, "thresholds[0].percent"},
		{"percent 101", map[string]any{"thresholds": []any{map[string]any{"type": "percent_of_period_allowance", "percent": 101}}}, 422, "thresholds[0].percent"},
		{"duplicate", map[string]any{"thresholds": []any{abs(5), abs(5)}}, 422, "thresholds[1]"},
		{"topup without amount", map[string]any{"thresholds": []any{}, "topup": map[string]any{"below_mc": 5}}, 422, "topup.amount_mc"},
		{"topup window too short", map[string]any{"thresholds": []any{}, "topup": map[string]any{"below_mc": 5, "amount_mc": 5, "dedupe_window_seconds": 10}}, 422, "topup.dedupe_window_seconds"},
	} {
		for _, p := range []string{path, "/v1/credit-alerts/default"} {
			r := a.do("PUT", p, "", tc.body)
			if tc.status == 400 {
				checkProblem(t, r, 400, "bad-request", "", tc.name)
			} else {
				checkProblem(t, r, 422, "validation-error", tc.field, tc.name+" "+p)
			}
		}
	}
	if r := a.get(path); r.Body["source"] != "none" {
		t.Fatalf("bad input changed the settings: %s", r.Raw)
	}
	checkProblem(t, a.do("PUT", "/v1/customers/nobody-"+uniq("x")+"/credits/alerts", "", map[string]any{"thresholds": []any{}}), 404, "not-found", "", "unknown customer")
	checkProblem(t, a.get("/v1/customers/nobody-"+uniq("x")+"/credits/alerts"), 404, "not-found", "", "unknown customer GET")
	// Another tenant cannot see this customer's settings (invariant 8).
	other := s.NewTenant(uniq("alerts-other"))
	checkProblem(t, s.as(t, other.Live).get(path), 404, "not-found", "", "other tenant")
}

// TestExpiryCrossingAlertsFiresEveryEvent (issue 24): an operation that
// expires blocks and crosses the top-up rule and a threshold owes every
// one of its events, each under its own id. Two shapes the shared ids lost:
// a sweep that expires one funded block across the top-up rule (its
// credit.topup_requested had the id of the credit.expired), and six blocks
// expiring at one instant across an absolute threshold (the sixth
// credit.expired had the id of the credit.threshold_crossed).
func TestExpiryCrossingAlertsFiresEveryEvent(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	tn := s.NewTenant(uniq("expiry-alerts"))
	a := s.as(t, tn.Live)
	tests := []struct {
		name   string
		blocks int
		each   int64
	}{
		{"one block across the top-up rule", 1, 100},
		{"six blocks across a threshold", 6, 10},
	}
	// Far enough ahead that the set-up (two customers, their alerts, seven
	// grants) lands before it on a loaded box (3 s did not, once).
	expiresAt := time.Now().Add(8 * time.Second).UTC().Format(time.RFC3339Nano)
	customers := make([]string, len(tests))
	for i, tt := range tests {
		id, ext := a.newCustomer()
		customers[i] = id
		a.grant(id, map[string]any{"credits": 1000})
		wantStatus(t, a.do("PUT", "/v1/customers/"+ext+"/credits/alerts", "", map[string]any{
			"thresholds": []any{map[string]any{"type": "absolute", "amount_mc": 1030}},
			"topup":      map[string]any{"below_mc": 1050, "amount_mc": 500, "dedupe_window_seconds": 3600},
		}), 200, tt.name+": PUT alerts")
		for range tt.blocks {
			a.grant(id, map[string]any{"credits": tt.each, "expires_at": expiresAt})
		}
	}
	for i, tt := range tests {
		id := customers[i]
		var events []map[string]any
		deadline := time.Now().Add(30 * time.Second)
		for {
			events = a.alertEvents()
			if len(ofType(events, "credit.expired", id)) >= tt.blocks &&
				len(ofType(events, "credit.topup_requested", id)) > 0 && len(ofType(events, "credit.threshold_crossed", id)) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: after 30 s: %d credit.expired (want %d), %d credit.topup_requested, %d credit.threshold_crossed (want 1 each)",
					tt.name, len(ofType(events, "credit.expired", id)), tt.blocks,
					len(ofType(events, "credit.topup_requested", id)), len(ofType(events, "credit.threshold_crossed", id)))
			}
			time.Sleep(200 * time.Millisecond)
		}
		s.Drain()
		events = a.alertEvents()
		ids := map[any]bool{}
		for _, typ := range []string{"credit.expired", "credit.topup_requested", "credit.threshold_crossed"} {
			want := 1
			if typ == "credit.expired" {
				want = tt.blocks
			}
			got := ofType(events, typ, id)
			if len(got) != want {
				t.Errorf("%s: %d %s, want %d", tt.name, len(got), typ, want)
			}
			for _, e := range got {
				if ids[e["event_id"]] {
					t.Errorf("%s: event id %v given twice", tt.name, e["event_id"])
				}
				ids[e["event_id"]] = true
			}
		}
		topup := obj(t, ofType(events, "credit.topup_requested", id)[0]["data"], "data")
		if Int(t, topup["balance_mc"]) != 1000 || Int(t, topup["below_mc"]) != 1050 {
			t.Errorf("%s: topup request data %v, want balance_mc 1000 below 1050", tt.name, topup)
		}
	}
}
