package e2e

import (
	"net/url"
	"testing"
)

// snapshot reads a customer's entitlement snapshot through path, with
// Cache-Control: no-cache when fresh.
func (a api) snapshot(path string, fresh bool) Response {
	a.t.Helper()
	var extra []string
	if fresh {
		extra = []string{"Cache-Control", "no-cache"}
	}
	return a.do("GET", path, "", nil, extra...)
}

// TestConformanceSnapshot: docs/spec/interface.md Entitlement checks, snapshot: every
// listed field, one entry per metric the tenant defines (typed members per
// type), served from a cache up to 30 s old (a grant does not show) until
// Cache-Control: no-cache; the lenient form creates an unknown customer, the
// strict one is 404; 401.
func TestConformanceSnapshot(t *testing.T) {
	// One node: the test pins that node's cached snapshot; each node of a
	// fleet caches its own (docs/decisions.md "The e2e suite runs through a
	// fleet").
	s := NewStack(t, SingleNode())
	tn := s.NewTenant(uniq("snap"))
	a := s.as(t, tn.Live)
	p := uniq("k")
	metered, norule, flag, seats, limits := p+"-api", p+"-norule", p+"-sso", p+"-seats", p+"-limits"
	a.newMetric(metered, "metered", nil)
	a.newRule(metered, map[string]any{"cost_type": "per_unit", "unit_cost": 300})
	a.newMetric(norule, "metered", nil)
	a.newMetric(flag, "boolean", map[string]any{"enabled": true})
	a.newMetric(seats, "gauge", map[string]any{"cap": 5})
	a.newMetric(limits, "static", map[string]any{"config": map[string]any{"max_projects": 3}})
	// Another environment's metric is not in this environment's snapshot.
	s.as(t, tn.Sandbox).newMetric(p+"-sandbox-only", "boolean", nil)

	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1000})
	path := "/v1/customers/" + id + "/entitlements"
	r := a.snapshot(path, false)
	wantStatus(t, r, 200, "snapshot")
	snap := r.Body
	checkKeys(t, snap, "snapshot", "customer_id", "environment", "balance", "reserved_balance", "pending_balance", "effective_balance",
		"credit_limit_mc", "debt_mc", "available_mc", "subscription_status", "plan_name", "entitlements", "cached_at")
	if snap["customer_id"] != id || snap["environment"] != "live" || jsonInt(snap["balance"]) != 1000 || jsonInt(snap["effective_balance"]) != 1000 ||
		jsonInt(snap["reserved_balance"]) != 0 || jsonInt(snap["pending_balance"]) != 0 || snap["subscription_status"] != nil || snap["plan_name"] != nil {
		t.Errorf("snapshot %s", r.Raw)
	}
	cachedAt := checkTime(t, snap["cached_at"], "cached_at")
	ents := obj(t, snap["entitlements"], "entitlements")
	if len(ents) != 5 {
		t.Fatalf("entitlements %v, want one per metric of the environment (5)", ents)
	}
	e := obj(t, ents[metered], "metered entry")
	checkKeys(t, e, "metered entry", "type", "billable_metric_key", "allowed", "estimated_cost_per_unit", "affordable_units", "cost_type")
	if e["type"] != "metered" || e["billable_metric_key"] != metered || e["allowed"] != true || jsonInt(e["estimated_cost_per_unit"]) != 300 ||
		jsonInt(e["affordable_units"]) != 3 || e["cost_type"] != "per_unit" {
		t.Errorf("metered entry %v", e)
	}
	if e := obj(t, ents[norule], "metered entry without a rule"); e["type"] != "metered" || e["allowed"] != false {
		t.Errorf("metered entry without a rule %v", e)
	}
	e = obj(t, ents[flag], "boolean entry")
	checkKeys(t, e, "boolean entry", "type", "billable_metric_key", "allowed", "enabled")
	if e["type"] != "boolean" || e["enabled"] != true || e["allowed"] != true || e["billable_metric_key"] != flag {
		t.Errorf("boolean entry %v", e)
	}
	e = obj(t, ents[seats], "gauge entry")
	checkKeys(t, e, "gauge entry", "type", "billable_metric_key", "allowed", "current", "cap", "headroom")
	if e["type"] != "gauge" || jsonInt(e["cap"]) != 5 || jsonInt(e["current"]) != 0 || jsonInt(e["headroom"]) != 5 || e["allowed"] != true {
		t.Errorf("gauge entry %v", e)
	}
	e = obj(t, ents[limits], "static entry")
	checkKeys(t, e, "static entry", "type", "billable_metric_key", "allowed", "config")
	if e["type"] != "static" || jsonInt(obj(t, e["config"], "config")["max_projects"]) != 3 || e["allowed"] != true {
		t.Errorf("static entry %v", e)
	}

	// Cached: a grant does not show until Cache-Control: no-cache.
	a.grant(id, map[string]any{"credits": 500})
	r = a.snapshot(path, false)
	wantStatus(t, r, 200, "cached snapshot")
	if jsonInt(r.Body["balance"]) != 1000 || !checkTime(t, r.Body["cached_at"], "cached_at").Equal(cachedAt) {
		t.Errorf("the cached snapshot changed: %s", r.Raw)
	}
	r = a.snapshot(path, true)
	wantStatus(t, r, 200, "fresh snapshot")
	if jsonInt(r.Body["balance"]) != 1500 || checkTime(t, r.Body["cached_at"], "cached_at").Before(cachedAt) {
		t.Errorf("no-cache snapshot %s", r.Raw)
	}
	if e := obj(t, obj(t, r.Body["entitlements"], "entitlements")[metered], "metered"); jsonInt(e["affordable_units"]) != 5 {
		t.Errorf("fresh metered entry %v", e)
	}

	// The strict form: the same picture by external id; unknown is 404.
	r = a.snapshot("/v1/customer-by-external-id/"+url.PathEscape(ext)+"/entitlements", true)
	wantStatus(t, r, 200, "snapshot by external id")
	if r.Body["customer_id"] != id || jsonInt(r.Body["balance"]) != 1500 {
		t.Errorf("snapshot by external id %s", r.Raw)
	}
	unknown := uniq("nobody")
	checkProblem(t, a.get("/v1/customer-by-external-id/"+unknown+"/entitlements"), 404, "not-found", "", "strict unknown external id")
	checkStatus(t, a.get("/v1/customers/"+unknown), 404, "the strict snapshot created nothing")

	// The lenient form creates an unknown customer (404 unreachable).
	r = a.get("/v1/customers/" + unknown + "/entitlements")
	wantStatus(t, r, 200, "lenient snapshot of an unknown id")
	if jsonInt(r.Body["balance"]) != 0 || len(obj(t, r.Body["entitlements"], "entitlements")) != 5 {
		t.Errorf("new customer's snapshot %s", r.Raw)
	}
	c := a.get("/v1/customers/" + unknown)
	wantStatus(t, c, 200, "auto-created customer")
	if c.Body["id"] != r.Body["customer_id"] {
		t.Errorf("auto-created %v, snapshot of %v", c.Body["id"], r.Body["customer_id"])
	}
	// The check route next to it still answers (no route clash).
	wantStatus(t, a.get("/v1/customers/"+id+"/entitlements/"+flag), 200, "check beside the snapshot")
	checkProblem(t, s.as(t, "").get(path), 401, "unauthorized", "", "no API key")
	checkProblem(t, s.as(t, "").get("/v1/customer-by-external-id/"+ext+"/entitlements"), 401, "unauthorized", "", "strict, no API key")
}
