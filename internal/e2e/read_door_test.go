package e2e

import (
	"strconv"
	"testing"
)

// TestReadDoorRateLimitAndCreate: a check runs under the read door
// (docs/decisions.md "A check's door rides in its read"): its rate take
// rides in the check's own round trip and refuses past the burst with the
// same 429 and headers as any route (docs/spec/addendum.md §10), a 429
// that answered no check; and a check naming a customer not yet known
// still creates it (the read door leaves that to the usual path).
func TestReadDoorRateLimitAndCreate(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("readdoor"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 100})
	metered := a.perUnit(7)
	check := func(customer string) Response {
		return a.get("/v1/entitlements/check?customer_id=" + customer + "&billable_metric_key=" + metered + "&units=1")
	}
	// Warm: this node caches the key and the tenant's stamps.
	wantStatus(t, check(id), 200, "check before the limit")

	// A check for a customer this tenant never named creates it (auto-create).
	fresh := uniq("auto")
	r := check(fresh)
	wantStatus(t, r, 200, "check of a new external id")
	if r.Body["allowed"] != false || Int(t, r.Body["balance"]) != 0 {
		t.Errorf("new customer's check: allowed %v balance %v, want false and 0", r.Body["allowed"], r.Body["balance"])
	}
	wantStatus(t, a.get("/v1/customer-by-external-id/"+fresh+"/credits"), 200, "the auto-created customer")

	wantStatus(t, adminCall(t, s, AdminToken, "PATCH", "/admin/v1/tenants/"+tn.ID,
		map[string]any{"rate_limit_per_second": 1, "rate_limit_burst": 2}), 200, "admin PATCH rate limit")
	// The first check after the change is served; one of the next ones
	// meets the spent budget (exact counts are TestConformanceRateLimit's:
	// three checks may span a refill on a loaded box).
	first := check(id)
	checkStatus(t, first, 200, "check 1 of burst 2")
	if first.Body["allowed"] != true || Int(t, first.Body["estimated_cost"]) != 7 {
		t.Errorf("check 1: allowed %v estimated_cost %v, want true and 7", first.Body["allowed"], first.Body["estimated_cost"])
	}
	got := []Response{first}
	var lim Response
	for range 6 {
		r := check(id)
		if r.Status == 429 {
			lim = r
			break
		}
		got = append(got, r)
	}
	checkProblem(t, lim, 429, "rate-limited", "", "a check past the burst")
	if ra, err := strconv.Atoi(lim.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want a positive number of seconds", lim.Header.Get("Retry-After"))
	}
	if v := lim.Header.Get("RateLimit-Remaining"); v != "0" {
		t.Errorf("429 RateLimit-Remaining %q, want 0", v)
	}
	if _, ok := lim.Body["allowed"]; ok {
		t.Errorf("the 429 carries a check's members: %v", lim.Body)
	}
	for _, r := range got {
		for _, h := range []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
			if r.Header.Get(h) == "" {
				t.Errorf("a check's 200 lacks %s", h)
			}
		}
	}
}
