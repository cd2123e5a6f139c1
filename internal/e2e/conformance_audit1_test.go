package e2e

import (
	"strconv"
	"testing"
	"time"
)

// TestConformanceOverflowNamesField: units or an amount whose cost or count
// would pass int64 is refused, never wrapped, and the problem names the
// parameter (docs/spec/addendum.md §3: "A 422 names the field"; the checks' and gauges'
// bad-input errors are 400 naming it, docs/spec/interface.md Entitlement checks).
func TestConformanceOverflowNamesField(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("overflow"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	metered := a.perUnit(7)
	// 2e18 units at 7 millicredits each is past int64; 2e18 itself parses.
	huge := strconv.FormatInt(2_000_000_000_000_000_000, 10)
	for _, f := range []string{
		"/v1/entitlements/check?customer_id=" + id + "&billable_metric_key=" + metered + "&units=" + huge,
		"/v1/customers/" + id + "/entitlements/" + metered + "?units=" + huge,
	} {
		checkProblem(t, a.get(f), 400, "bad-request", "units", f)
	}

	seats := uniq("seats")
	a.newMetric(seats, "gauge", map[string]any{"cap": 3})
	inc := "/v1/customers/" + id + "/entitlements/" + seats + "/increment"
	wantStatus(t, a.post(inc, map[string]any{"amount": 1}), 200, "first increment")
	for _, pol := range []string{"block", "allow"} {
		r := a.post(inc, map[string]any{"amount": int64(9_223_372_036_854_775_807), "policy": pol})
		checkProblem(t, r, 400, "bad-request", "amount", "increment past int64 under "+pol)
	}
	if r := a.get("/v1/entitlements/check?customer_id=" + id + "&billable_metric_key=" + seats); checkStatus(t, r, 200, "gauge after") && Int(t, r.Body["current"]) != 1 {
		t.Errorf("a refused increment moved the gauge: %s", r.Raw)
	}
}

// TestConformanceSnapshotAllowedFollowsPolicy: a snapshot's metered `allowed`
// says what a check of one unit says (docs/spec/interface.md Entitlement checks: the
// snapshot's entries carry `allowed` like the check result): under `allow`
// and `notify` usage goes on past the balance (the rest is overage), so an
// empty account is still allowed; under `block` it is not.
func TestConformanceSnapshotAllowedFollowsPolicy(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("snappol"))
	a := s.as(t, tn.Live)
	metered := a.perUnit(7)
	for _, pol := range []string{"block", "allow", "notify"} {
		c := a.createCustomer(map[string]any{"external_id": uniq("pol"), "overage_policy": pol})
		id := c["id"].(string)
		chk := a.get("/v1/customers/" + id + "/entitlements/" + metered)
		snap := a.snapshot("/v1/customers/"+id+"/entitlements", true)
		if !checkStatus(t, chk, 200, pol+" check") || !checkStatus(t, snap, 200, pol+" snapshot") {
			continue
		}
		e := obj(t, obj(t, snap.Body["entitlements"], pol+" entitlements")[metered], pol+" entry")
		if want := pol != "block"; chk.Body["allowed"] != want || e["allowed"] != want {
			t.Errorf("%s with no credit: check allowed %v, snapshot allowed %v, want %v; snapshot %s",
				pol, chk.Body["allowed"], e["allowed"], want, snap.Raw)
		}
	}
}

// TestConformanceBlankCustomerID: a lenient customer id of spaces names no
// customer and cannot become one (an external_id must not be blank), so the
// routes that would auto-create one refuse it as a 400 naming `customer_id`,
// the parameter the caller sent, never a problem about an `external_id` it
// did not send (docs/spec/addendum.md §3: the response names the field).
func TestConformanceBlankCustomerID(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("blankid"))
	a := s.as(t, tn.Live)
	metered := a.perUnit(7)
	seats := uniq("seats")
	a.newMetric(seats, "gauge", map[string]any{"cap": 3})
	checkProblem(t, a.get("/v1/entitlements/check?customer_id=%20%20&billable_metric_key="+metered), 400, "bad-request", "customer_id", "check")
	checkProblem(t, a.get("/v1/customers/%20/entitlements/"+metered), 400, "bad-request", "customer_id", "check by path")
	checkProblem(t, a.get("/v1/customers/%20/entitlements"), 400, "bad-request", "customer_id", "snapshot")
	checkProblem(t, a.post("/v1/reservations", map[string]any{"customer_id": "  ", "billable_metric_key": metered, "estimated_units": 1}),
		400, "bad-request", "customer_id", "reserve")
	checkProblem(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": " ", "billable_metric_key": metered, "units": 1}),
		400, "bad-request", "customer_id", "consume")
	checkProblem(t, a.post("/v1/customers/%20/entitlements/"+seats+"/increment", map[string]any{"amount": 1}),
		400, "bad-request", "customer_id", "increment")
	if r := a.get("/v1/customers?limit=100"); checkStatus(t, r, 200, "list") && len(arr(t, r.Body["data"], "customers")) != 0 {
		t.Errorf("a refused blank id created a customer: %s", r.Raw)
	}
}

// exhaustedEvents lists the tenant's credit.exhausted events of customer id,
// waiting up to 10 s for want of them (the persister writes events after
// the answer).
func (a api) exhaustedEvents(customer string, want int) []map[string]any {
	a.t.Helper()
	var out []map[string]any
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out = out[:0]
		for _, e := range arr(a.t, a.get("/v1/webhooks/events?limit=100&event_type=credit.exhausted").Body["data"], "events") {
			ev := obj(a.t, e, "event")
			if body, ok := ev["payload"].(map[string]any); ok && body["customer_id"] == customer {
				out = append(out, body)
			}
		}
		if len(out) >= want || time.Now().After(deadline) {
			return out
		}
	}
}

// TestConformanceReservationRefusalExhausted: credit.exhausted fires when a
// `block` customer is refused for credit (docs/spec/addendum.md §8), and reservation create
// and commit are among its emitters (docs/spec/interface.md Events: "the same
// operations as credit.low_balance"), as a refused consume already does.
func TestConformanceReservationRefusalExhausted(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("holdrefusal"))
	a := s.as(t, tn.Live)
	metered := a.perUnit(100)

	// Create: 5 units (500) against 300 is refused.
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 300})
	checkProblem(t, a.post("/v1/reservations", map[string]any{"customer_id": id, "billable_metric_key": metered, "estimated_units": 5}),
		409, "insufficient-credits", "", "short reserve")
	got := a.exhaustedEvents(id, 1)
	if len(got) != 1 {
		t.Fatalf("refused reserve: %d credit.exhausted events, want 1: %v", len(got), got)
	}
	if d := obj(t, got[0]["data"], "data"); Int(t, d["balance_mc"]) != 0 || d["billable_metric_key"] != metered {
		t.Errorf("refused reserve: exhausted data %v", d)
	}

	// Commit: 10 units (1000) past the reservation (100) plus the free balance (200).
	id2, _ := a.newCustomer()
	a.grant(id2, map[string]any{"credits": 300})
	h := a.reserve(map[string]any{"customer_id": id2, "billable_metric_key": metered, "estimated_units": 1})
	checkProblem(t, a.post("/v1/reservations/"+h["id"].(string)+"/commit", map[string]any{"actual_units": 10}),
		409, "insufficient-credits", "", "short commit")
	if got := a.exhaustedEvents(id2, 1); len(got) != 1 {
		t.Errorf("refused commit: %d credit.exhausted events, want 1: %v", len(got), got)
	}

	// The multi-metric form (decisions.md "Multi-metric reservations") too,
	// with no metric, as a refused multi-metric consume.
	other := a.perUnit(1)
	id4, _ := a.newCustomer()
	a.grant(id4, map[string]any{"credits": 300})
	checkProblem(t, a.post("/v1/reservations", map[string]any{"customer_id": id4, "items": []map[string]any{
		{"billable_metric_key": metered, "estimated_units": 3}, {"billable_metric_key": other, "estimated_units": 1}}}),
		409, "insufficient-credits", "", "short multi reserve")
	if got := a.exhaustedEvents(id4, 1); len(got) != 1 || obj(t, got[0]["data"], "data")["billable_metric_key"] != nil {
		t.Errorf("refused multi reserve: credit.exhausted events %v, want one with a null metric", got)
	}

	// An allow customer's refused reservation is no `block` refusal: nothing fires.
	c := a.createCustomer(map[string]any{"external_id": uniq("allow"), "overage_policy": "allow"})
	id3 := c["id"].(string)
	a.grant(id3, map[string]any{"credits": 300})
	checkProblem(t, a.post("/v1/reservations", map[string]any{"customer_id": id3, "billable_metric_key": metered, "estimated_units": 5}),
		409, "insufficient-credits", "", "allow reserve")
	// A later grant read back through the history has been persisted, and
	// the outbox is in order, so a refusal record before it would be too.
	a.grant(id3, map[string]any{"credits": 1})
	a.history(id3, "")
	if got := a.exhaustedEvents(id3, 0); len(got) != 0 {
		t.Errorf("allow customer's refused reserve fired credit.exhausted: %v", got)
	}
}
