package e2e

import (
	"strconv"
	"testing"
)

// TestConformanceOverflowNamesField: units or an amount whose cost or count
// would pass int64 is refused, never wrapped, and the problem names the
// parameter (addendum 3: "A 422 names the field"; the checks' and gauges'
// bad-input errors are 400 naming it, interface.md Entitlement checks).
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
// says what a check of one unit says (interface.md Entitlement checks: the
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
// did not send (addendum 3: the response names the field).
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
