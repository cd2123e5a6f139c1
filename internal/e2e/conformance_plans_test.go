package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"testing"
)

// Helpers of the catalogue conformance tests (docs/spec/interface.md Plans, docs/spec/addendum.md §5).

// newPlan creates a plan and requires 201.
func (a api) newPlan(body map[string]any) map[string]any {
	a.t.Helper()
	r := a.post("/v1/plans", body)
	wantStatus(a.t, r, 201, "create plan")
	return r.Body
}

// newVariant creates a variant of plan and requires 201.
func (a api) newVariant(plan string, body map[string]any) map[string]any {
	a.t.Helper()
	r := a.post("/v1/plans/"+plan+"/variants", body)
	wantStatus(a.t, r, 201, "create variant")
	return r.Body
}

// jsonInt reads a JSON number member as int64 (-1 when it is not one).
func jsonInt(v any) int64 {
	n, ok := v.(json.Number)
	if !ok {
		return -1
	}
	i, err := n.Int64()
	if err != nil {
		return -1
	}
	return i
}

// TestConformancePlanCreateGetPatch: docs/spec/interface.md Plan and Plans: POST 201
// with status active, defaults and variants []; 422 missing or blank name;
// 400 bad JSON; 422 without Idempotency-Key; 401 without a key; GET 200
// never with variants, 404 unknown, malformed, other tenant or environment;
// PATCH 200 (name, status, is_default, metadata replaced), 404, 409 retiring
// the default plan, 422 bad status or blank name; one default per tenant.
func TestConformancePlanCreateGetPatch(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("plans"))
	a, sb := s.as(t, tn.Live), s.as(t, tn.Sandbox)
	other := s.as(t, s.NewTenant(uniq("other")).Live)

	p := a.newPlan(map[string]any{"name": "Pro", "metadata": map[string]any{"tier": "gold", "seats": 3}})
	// "variants" is a member of GET /v1/plans only (docs/spec/interface.md, Plan).
	checkKeys(t, p, "plan", "id", "tenant_id", "environment", "name", "is_default", "status", "metadata", "created_at", "updated_at")
	checkUUID(t, p["id"], "id")
	if p["tenant_id"] != tn.ID || p["name"] != "Pro" || p["is_default"] != false || p["status"] != "active" || p["environment"] != "live" {
		t.Errorf("created plan %v", p)
	}
	if md := obj(t, p["metadata"], "metadata"); md["tier"] != "gold" || fmt.Sprint(md["seats"]) != "3" {
		t.Errorf("metadata %v", md)
	}
	if vs, ok := p["variants"]; ok {
		t.Errorf("a created plan has variants %v", vs)
	}
	checkTime(t, p["created_at"], "created_at")
	checkTime(t, p["updated_at"], "updated_at")
	id := p["id"].(string)

	minimal := a.newPlan(map[string]any{"name": "Free"})
	if md := obj(t, minimal["metadata"], "metadata"); len(md) != 0 || minimal["is_default"] != false {
		t.Errorf("minimal plan %v", minimal)
	}

	for _, tc := range []struct {
		name string
		body any
	}{
		{"missing name", map[string]any{"is_default": true}},
		{"empty name", map[string]any{"name": ""}},
		{"blank name", map[string]any{"name": "   "}},
		{"name not a string", map[string]any{"name": 5}},
	} {
		checkProblem(t, a.post("/v1/plans", tc.body), 422, "validation-error", "name", tc.name)
	}
	checkProblem(t, a.post("/v1/plans", `{"name":`), 400, "bad-request", "", "unparseable JSON")
	checkProblem(t, a.do("POST", "/v1/plans", "", map[string]any{"name": "x"}), 422, "validation-error", "Idempotency-Key", "no Idempotency-Key")
	checkProblem(t, s.as(t, "").get("/v1/plans"), 401, "unauthorized", "", "no API key")

	r := a.get("/v1/plans/" + id)
	wantStatus(t, r, 200, "get plan")
	if _, nested := r.Body["variants"]; r.Body["name"] != "Pro" || nested {
		t.Errorf("get plan %v", r.Body)
	}
	// GET one plan never nests variants, even when it has some.
	a.newVariant(id, map[string]any{"billing_cycle": "monthly"})
	if vs, ok := a.get("/v1/plans/" + id).Body["variants"]; ok {
		t.Errorf("GET /v1/plans/{id} has variants %v", vs)
	}
	checkProblem(t, a.get("/v1/plans/00000000-0000-4000-8000-000000000000"), 404, "not-found", "", "unknown plan")
	checkProblem(t, a.get("/v1/plans/not-a-uuid"), 404, "not-found", "", "malformed plan id")
	checkProblem(t, sb.get("/v1/plans/"+id), 404, "not-found", "", "plan of the other environment")
	checkProblem(t, other.get("/v1/plans/"+id), 404, "not-found", "", "plan of another tenant")

	// PATCH: metadata is replaced outright, not merged.
	r = a.patch("/v1/plans/"+id, map[string]any{"name": "Pro 2", "metadata": map[string]any{"new": true}})
	wantStatus(t, r, 200, "patch plan")
	if md := obj(t, r.Body["metadata"], "metadata"); len(md) != 1 || md["new"] != true || r.Body["name"] != "Pro 2" {
		t.Errorf("patched plan %v", r.Body)
	}
	if vs, ok := r.Body["variants"]; ok {
		t.Errorf("patched plan has variants %v", vs)
	}
	if checkTime(t, r.Body["updated_at"], "updated_at").Before(checkTime(t, p["updated_at"], "old updated_at")) {
		t.Errorf("updated_at went back")
	}
	r = a.patch("/v1/plans/"+id, map[string]any{"status": "retired"})
	wantStatus(t, r, 200, "retire plan")
	if r.Body["status"] != "retired" || r.Body["name"] != "Pro 2" {
		t.Errorf("retired plan %v", r.Body)
	}
	r = a.patch("/v1/plans/"+id, map[string]any{"status": "active"})
	wantStatus(t, r, 200, "reactivate plan")
	if r.Body["status"] != "active" {
		t.Errorf("reactivated plan %v", r.Body)
	}
	for _, tc := range []struct {
		name, field string
		body        map[string]any
	}{
		{"bad status", "status", map[string]any{"status": "archived"}},
		{"blank name", "name", map[string]any{"name": " "}},
		{"empty name", "name", map[string]any{"name": ""}},
	} {
		checkProblem(t, a.patch("/v1/plans/"+id, tc.body), 422, "validation-error", tc.field, tc.name)
	}
	checkProblem(t, a.patch("/v1/plans/00000000-0000-4000-8000-000000000000", map[string]any{"name": "x"}), 404, "not-found", "", "patch unknown plan")
	checkProblem(t, a.patch("/v1/plans/nope", map[string]any{"name": "x"}), 404, "not-found", "", "patch malformed id")
	checkProblem(t, sb.patch("/v1/plans/"+id, map[string]any{"name": "x"}), 404, "not-found", "", "patch from the other environment")
	if got := a.get("/v1/plans/" + id).Body; got["name"] != "Pro 2" || got["status"] != "active" {
		t.Errorf("refused patches changed the plan: %v", got)
	}

	// One default per tenant: a new default clears the previous one.
	d1 := a.newPlan(map[string]any{"name": "D1", "is_default": true})
	if d1["is_default"] != true {
		t.Fatalf("default plan %v", d1)
	}
	d2 := a.newPlan(map[string]any{"name": "D2", "is_default": true})
	if a.get("/v1/plans/" + d1["id"].(string)).Body["is_default"] != false || d2["is_default"] != true {
		t.Errorf("the previous default was not cleared")
	}
	r = a.patch("/v1/plans/"+id, map[string]any{"is_default": true})
	wantStatus(t, r, 200, "make default by PATCH")
	if a.get("/v1/plans/" + d2["id"].(string)).Body["is_default"] != false {
		t.Errorf("PATCH is_default did not clear the previous default")
	}
	// The sandbox default is separate.
	sd := sb.newPlan(map[string]any{"name": "SD", "is_default": true})
	if a.get("/v1/plans/" + id).Body["is_default"] != true || sd["is_default"] != true {
		t.Errorf("a sandbox default changed the live default")
	}

	// 409 retiring the default plan; nothing changes.
	checkProblem(t, a.patch("/v1/plans/"+id, map[string]any{"status": "retired"}), 409, "conflict", "", "retire the default plan")
	if got := a.get("/v1/plans/" + id).Body; got["status"] != "active" || got["is_default"] != true {
		t.Errorf("after the 409: %v", got)
	}
	// A retired plan cannot become the default either.
	wantStatus(t, a.patch("/v1/plans/"+d1["id"].(string), map[string]any{"status": "retired"}), 200, "retire D1")
	checkProblem(t, a.patch("/v1/plans/"+d1["id"].(string), map[string]any{"is_default": true}), 409, "conflict", "", "retired plan made default")
	// Giving up the flag and retiring in one call works.
	r = a.patch("/v1/plans/"+id, map[string]any{"status": "retired", "is_default": false})
	wantStatus(t, r, 200, "undefault and retire")
	if r.Body["is_default"] != false || r.Body["status"] != "retired" {
		t.Errorf("undefault and retire: %v", r.Body)
	}
}

// TestConformancePlanList: GET /v1/plans: newest first, active plans only
// by default, status=retired adds retired ones, cursor paging, 400 for a
// bad cursor, status or include_variants; include_variants=true nests each
// plan's variants (oldest first) with grants and entitlements, else [].
func TestConformancePlanList(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("planlist"))
	a, sb := s.as(t, tn.Live), s.as(t, tn.Sandbox)
	var ids []string // newest first
	for i := range 5 {
		p := a.newPlan(map[string]any{"name": fmt.Sprintf("P%d", i)})
		ids = append([]string{p["id"].(string)}, ids...)
	}
	retired := ids[1]
	wantStatus(t, a.patch("/v1/plans/"+retired, map[string]any{"status": "retired"}), 200, "retire")
	sb.newPlan(map[string]any{"name": "sandbox only"})

	var active []string
	for _, id := range ids {
		if id != retired {
			active = append(active, id)
		}
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{{"", active}, {"?status=active", active}, {"?status=retired", ids}} {
		r := a.get("/v1/plans" + tc.query)
		wantStatus(t, r, 200, "list "+tc.query)
		data, more, next := page(t, r)
		if got := idsOf(t, data); fmt.Sprint(got) != fmt.Sprint(tc.want) || more || next != nil {
			t.Errorf("list %q: %v more %v next %v, want %v", tc.query, got, more, next, tc.want)
		}
		for _, d := range data {
			if vs := arr(t, obj(t, d, "plan")["variants"], "variants"); len(vs) != 0 {
				t.Errorf("list %q without include_variants nests %v", tc.query, vs)
			}
		}
	}
	// Paging: limit 2 walks all five (retired included) without overlap.
	var seen []string
	q := "/v1/plans?status=retired&limit=2"
	for {
		r := a.get(q)
		wantStatus(t, r, 200, "page")
		data, more, next := page(t, r)
		seen = append(seen, idsOf(t, data)...)
		if !more {
			break
		}
		q = "/v1/plans?status=retired&limit=2&cursor=" + url.QueryEscape(next.(string))
	}
	if fmt.Sprint(seen) != fmt.Sprint(ids) {
		t.Errorf("paged %v, want %v", seen, ids)
	}
	checkProblem(t, a.get("/v1/plans?cursor=bogus"), 400, "bad-request", "", "bad cursor")
	checkProblem(t, a.get("/v1/plans?status=deleted"), 400, "bad-request", "status", "bad status filter")
	checkProblem(t, a.get("/v1/plans?include_variants=maybe"), 400, "bad-request", "include_variants", "bad include_variants")
	checkProblem(t, a.get("/v1/plans?limit=101"), 400, "bad-request", "limit", "limit 101")

	// include_variants nests variants with grants and entitlements.
	a.newMetric("plist-flag", "boolean", nil)
	top := ids[0]
	v1 := a.newVariant(top, map[string]any{"billing_cycle": "monthly"})
	v2 := a.newVariant(top, map[string]any{"billing_cycle": "yearly"})
	wantStatus(t, a.patch("/v1/plans/"+top+"/variants/"+v2["id"].(string), map[string]any{"status": "retired"}), 200, "retire variant")
	g := a.post("/v1/plans/"+top+"/variants/"+v1["id"].(string)+"/grants", map[string]any{"credits": 1000, "grant_interval": "billing_period", "grant_type": "recurring"})
	wantStatus(t, g, 201, "grant")
	e := a.post("/v1/plans/"+top+"/variants/"+v1["id"].(string)+"/entitlements", map[string]any{"billable_metric_key": "plist-flag", "value": map[string]any{"enabled": true}})
	wantStatus(t, e, 201, "entitlement")
	r := a.get("/v1/plans?include_variants=true")
	wantStatus(t, r, 200, "include_variants")
	data, _, _ := page(t, r)
	first := obj(t, data[0], "plan")
	if first["id"] != top {
		t.Fatalf("first plan %v, want %s", first["id"], top)
	}
	vs := arr(t, first["variants"], "variants")
	if len(vs) != 2 {
		t.Fatalf("nested variants %v, want both statuses", vs)
	}
	n1, n2 := obj(t, vs[0], "v1"), obj(t, vs[1], "v2")
	if n1["id"] != v1["id"] || n2["id"] != v2["id"] || n2["status"] != "retired" {
		t.Errorf("nested variants not oldest first: %v", vs)
	}
	if gs := arr(t, n1["grants"], "grants"); len(gs) != 1 || obj(t, gs[0], "grant")["id"] != g.Body["id"] {
		t.Errorf("nested grants %v", gs)
	}
	if es := arr(t, n1["entitlements"], "entitlements"); len(es) != 1 || obj(t, es[0], "ent")["id"] != e.Body["id"] {
		t.Errorf("nested entitlements %v", es)
	}
	if gs := arr(t, n2["grants"], "grants"); len(gs) != 0 {
		t.Errorf("second variant grants %v", gs)
	}
	for _, d := range data[1:] {
		if vs := arr(t, obj(t, d, "plan")["variants"], "variants"); len(vs) != 0 {
			t.Errorf("a plan without variants nests %v", vs)
		}
	}
}

// TestConformancePlanVariants: POST 201 with the resource defaults, every
// field, under a retired plan too; 404 missing plan; 422 bad billing_cycle
// and other fields. GET list oldest first, both statuses, no grants, 200
// empty for an unknown plan. PATCH 200 status, trial_days, metadata
// (replaced); 422 bad status and a changed fixed field; 404.
func TestConformancePlanVariants(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("variants"))
	a, sb := s.as(t, tn.Live), s.as(t, tn.Sandbox)
	plan := a.newPlan(map[string]any{"name": "Team"})["id"].(string)

	v := a.newVariant(plan, map[string]any{"billing_cycle": "monthly"})
	checkKeys(t, v, "variant", "id", "plan_id", "tenant_id", "environment", "billing_cycle", "trial_days", "status", "billing_mode",
		"renewal_due_days", "grace_period_days", "allow_usage_while_overdue", "metadata", "created_at", "updated_at")
	checkUUID(t, v["id"], "id")
	if v["plan_id"] != plan || v["tenant_id"] != tn.ID || v["billing_cycle"] != "monthly" || jsonInt(v["trial_days"]) != 0 ||
		v["status"] != "active" || v["billing_mode"] != "prepaid" || jsonInt(v["renewal_due_days"]) != 3 ||
		jsonInt(v["grace_period_days"]) != 3 || v["allow_usage_while_overdue"] != true || len(obj(t, v["metadata"], "metadata")) != 0 {
		t.Errorf("variant defaults %v", v)
	}
	full := a.newVariant(plan, map[string]any{"billing_cycle": "one_time", "trial_days": 14, "billing_mode": "postpaid",
		"renewal_due_days": 0, "grace_period_days": 7, "allow_usage_while_overdue": false, "metadata": map[string]any{"k": "v"}})
	if full["billing_cycle"] != "one_time" || jsonInt(full["trial_days"]) != 14 || full["billing_mode"] != "postpaid" ||
		jsonInt(full["renewal_due_days"]) != 0 || jsonInt(full["grace_period_days"]) != 7 || full["allow_usage_while_overdue"] != false ||
		obj(t, full["metadata"], "metadata")["k"] != "v" {
		t.Errorf("full variant %v", full)
	}
	for _, c := range []string{"daily", "weekly", "yearly"} {
		a.newVariant(plan, map[string]any{"billing_cycle": c})
	}

	for _, tc := range []struct {
		name, field string
		body        map[string]any
	}{
		{"missing billing_cycle", "billing_cycle", map[string]any{"trial_days": 1}},
		{"bad billing_cycle", "billing_cycle", map[string]any{"billing_cycle": "hourly"}},
		{"negative trial_days", "trial_days", map[string]any{"billing_cycle": "daily", "trial_days": -1}},
		{"bad billing_mode", "billing_mode", map[string]any{"billing_cycle": "daily", "billing_mode": "free"}},
		{"negative renewal_due_days", "renewal_due_days", map[string]any{"billing_cycle": "daily", "renewal_due_days": -1}},
		{"negative grace_period_days", "grace_period_days", map[string]any{"billing_cycle": "daily", "grace_period_days": -1}},
		{"allow_usage not boolean", "allow_usage_while_overdue", map[string]any{"billing_cycle": "daily", "allow_usage_while_overdue": "yes"}},
	} {
		checkProblem(t, a.post("/v1/plans/"+plan+"/variants", tc.body), 422, "validation-error", tc.field, tc.name)
	}
	checkProblem(t, a.post("/v1/plans/00000000-0000-4000-8000-000000000000/variants", map[string]any{"billing_cycle": "daily"}), 404, "not-found", "", "missing plan")
	checkProblem(t, a.post("/v1/plans/xyz/variants", map[string]any{"billing_cycle": "daily"}), 404, "not-found", "", "malformed plan id")
	checkProblem(t, sb.post("/v1/plans/"+plan+"/variants", map[string]any{"billing_cycle": "daily"}), 404, "not-found", "", "plan of the other environment")

	// Creating a variant under a retired plan still works.
	wantStatus(t, a.patch("/v1/plans/"+plan, map[string]any{"status": "retired"}), 200, "retire plan")
	late := a.newVariant(plan, map[string]any{"billing_cycle": "weekly"})

	// PATCH the mutable fields; metadata replaced.
	vid := v["id"].(string)
	r := a.patch("/v1/plans/"+plan+"/variants/"+vid, map[string]any{"status": "retired", "trial_days": 30, "metadata": map[string]any{"x": 1}})
	wantStatus(t, r, 200, "patch variant")
	if r.Body["status"] != "retired" || jsonInt(r.Body["trial_days"]) != 30 || fmt.Sprint(obj(t, r.Body["metadata"], "md")["x"]) != "1" {
		t.Errorf("patched variant %v", r.Body)
	}
	r = a.patch("/v1/plans/"+plan+"/variants/"+full["id"].(string), map[string]any{"metadata": map[string]any{"only": "this"}})
	wantStatus(t, r, 200, "patch metadata")
	if md := obj(t, r.Body["metadata"], "md"); len(md) != 1 || md["only"] != "this" {
		t.Errorf("metadata not replaced: %v", md)
	}
	// Fixed fields: the same value is accepted, another is 422 naming it.
	wantStatus(t, a.patch("/v1/plans/"+plan+"/variants/"+vid, map[string]any{"billing_cycle": "monthly", "billing_mode": "prepaid"}), 200, "fixed fields repeated")
	for _, tc := range []struct {
		field string
		value any
	}{
		{"billing_cycle", "yearly"}, {"billing_mode", "postpaid"}, {"renewal_due_days", 9},
		{"grace_period_days", 9}, {"allow_usage_while_overdue", false},
	} {
		checkProblem(t, a.patch("/v1/plans/"+plan+"/variants/"+vid, map[string]any{tc.field: tc.value, "trial_days": 1}), 422, "validation-error", tc.field, "change "+tc.field)
	}
	checkProblem(t, a.patch("/v1/plans/"+plan+"/variants/"+vid, map[string]any{"status": "gone"}), 422, "validation-error", "status", "bad variant status")
	checkProblem(t, a.patch("/v1/plans/"+plan+"/variants/"+vid, map[string]any{"trial_days": -1}), 422, "validation-error", "trial_days", "negative trial_days")
	if got := a.get("/v1/plan-variants/" + vid).Body; jsonInt(got["trial_days"]) != 30 || got["billing_cycle"] != "monthly" {
		t.Errorf("refused patches changed the variant: %v", got)
	}
	otherPlan := a.newPlan(map[string]any{"name": "Other"})["id"].(string)
	checkProblem(t, a.patch("/v1/plans/"+otherPlan+"/variants/"+vid, map[string]any{"trial_days": 1}), 404, "not-found", "", "variant under another plan")
	checkProblem(t, a.patch("/v1/plans/"+plan+"/variants/00000000-0000-4000-8000-000000000000", map[string]any{"trial_days": 1}), 404, "not-found", "", "unknown variant")
	checkProblem(t, a.patch("/v1/plans/"+plan+"/variants/nope", map[string]any{"trial_days": 1}), 404, "not-found", "", "malformed variant id")
	checkProblem(t, sb.patch("/v1/plans/"+plan+"/variants/"+vid, map[string]any{"trial_days": 1}), 404, "not-found", "", "variant of the other environment")

	// The list: oldest first, both statuses, no grants, no paging.
	r = a.get("/v1/plans/" + plan + "/variants")
	wantStatus(t, r, 200, "list variants")
	checkKeys(t, r.Body, "variant list", "data")
	data := arr(t, r.Body["data"], "data")
	if len(data) != 6 || obj(t, data[0], "first")["id"] != vid || obj(t, data[5], "last")["id"] != late["id"] {
		t.Errorf("variants %v", idsOf(t, data))
	}
	for _, d := range data {
		m := obj(t, d, "variant")
		if _, ok := m["grants"]; ok {
			t.Errorf("listed variant has grants: %v", m)
		}
	}
	for _, path := range []string{"/v1/plans/00000000-0000-4000-8000-000000000000/variants", "/v1/plans/" + otherPlan + "/variants"} {
		r = a.get(path)
		wantStatus(t, r, 200, "variants of "+path)
		if d := arr(t, r.Body["data"], "data"); len(d) != 0 {
			t.Errorf("%s: %v", path, d)
		}
	}
	if d := arr(t, sb.get("/v1/plans/" + plan + "/variants").Body["data"], "data"); len(d) != 0 {
		t.Errorf("the other environment sees variants %v", d)
	}
}

// TestConformancePlanGrants: POST .../grants 201 with every field and the
// defaults (source plan_grant, rollover 0, nulls, metadata null); 422 for
// bad credits, interval (PT4M59S, months), type, recurring + on_activation
// and the other fields; 404 missing variant or variant under another plan.
func TestConformancePlanGrants(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("grants"))
	a, sb := s.as(t, tn.Live), s.as(t, tn.Sandbox)
	plan := a.newPlan(map[string]any{"name": "G"})["id"].(string)
	vid := a.newVariant(plan, map[string]any{"billing_cycle": "monthly"})["id"].(string)
	path := "/v1/plans/" + plan + "/variants/" + vid + "/grants"

	r := a.post(path, map[string]any{"credits": 5000, "grant_interval": "monthly", "grant_type": "recurring"})
	wantStatus(t, r, 201, "minimal grant")
	g := r.Body
	checkKeys(t, g, "grant", "id", "plan_variant_id", "tenant_id", "environment", "credits", "grant_interval", "expires_after_seconds",
		"accumulation_cap", "rollover_percentage", "max_rollover_cycles", "grant_type", "source", "applies_to", "metadata",
		"created_at", "updated_at")
	if g["plan_variant_id"] != vid || g["tenant_id"] != tn.ID || jsonInt(g["credits"]) != 5000 || g["grant_interval"] != "monthly" ||
		g["grant_type"] != "recurring" || g["source"] != "plan_grant" || jsonInt(g["rollover_percentage"]) != 0 ||
		g["expires_after_seconds"] != nil || g["accumulation_cap"] != nil || g["max_rollover_cycles"] != nil || g["metadata"] != nil ||
		g["applies_to"] != nil {
		t.Errorf("minimal grant %v", g)
	}
	r = a.post(path, map[string]any{"credits": 9223372036854775807, "grant_interval": "PT5H", "grant_type": "recurring", "source": "promotional",
		"expires_after_seconds": 3600, "accumulation_cap": 20000, "rollover_percentage": 100, "max_rollover_cycles": 0})
	wantStatus(t, r, 201, "full grant")
	if b := r.Body; b["credits"].(json.Number).String() != "9223372036854775807" || b["grant_interval"] != "PT5H" || b["source"] != "promotional" ||
		jsonInt(b["expires_after_seconds"]) != 3600 || jsonInt(b["accumulation_cap"]) != 20000 || jsonInt(b["rollover_percentage"]) != 100 ||
		jsonInt(b["max_rollover_cycles"]) != 0 || b["metadata"] != nil {
		t.Errorf("full grant %v", b)
	}
	for _, tc := range []struct{ interval, typ string }{
		{"on_activation", "one_time"}, {"on_activation", "trial"}, {"billing_period", "recurring"}, {"daily", "recurring"},
		{"weekly", "one_time"}, {"PT5M", "recurring"}, {"P1D", "recurring"}, {"P2W", "recurring"}, {"P1DT2H30M", "trial"},
	} {
		checkStatus(t, a.post(path, map[string]any{"credits": 1, "grant_interval": tc.interval, "grant_type": tc.typ}), 201, tc.interval+" "+tc.typ)
	}
	for _, src := range []string{"compensation", "referral", "manual", "migration", "plan_grant"} {
		checkStatus(t, a.post(path, map[string]any{"credits": 1, "grant_interval": "daily", "grant_type": "recurring", "source": src}), 201, "source "+src)
	}

	base := func(extra map[string]any) map[string]any {
		b := map[string]any{"credits": 1000, "grant_interval": "monthly", "grant_type": "recurring"}
		for k, v := range extra {
			if v == nil {
				delete(b, k)
			} else {
				b[k] = v
			}
		}
		return b
	}
	for _, tc := range []struct {
		name, field string
		extra       map[string]any
	}{
		{"credits missing", "credits", map[string]any{"credits": nil}},
		{"credits 0", "credits", map[string]any{"credits": 0}},
		{"credits negative", "credits", map[string]any{"credits": -1}},
		{"credits fraction", "credits", map[string]any{"credits": 1.5}},
		{"credits past int64", "credits", map[string]any{"credits": json.Number("9223372036854775808")}},
		{"interval missing", "grant_interval", map[string]any{"grant_interval": nil}},
		{"interval unknown", "grant_interval", map[string]any{"grant_interval": "fortnightly"}},
		{"interval PT4M59S", "grant_interval", map[string]any{"grant_interval": "PT4M59S"}},
		{"interval PT1M", "grant_interval", map[string]any{"grant_interval": "PT1M"}},
		{"interval months", "grant_interval", map[string]any{"grant_interval": "P1M"}},
		{"interval years", "grant_interval", map[string]any{"grant_interval": "P1Y"}},
		{"interval garbage", "grant_interval", map[string]any{"grant_interval": "PTXM"}},
		{"type missing", "grant_type", map[string]any{"grant_type": nil}},
		{"type unknown", "grant_type", map[string]any{"grant_type": "forever"}},
		{"recurring on_activation", "grant_type", map[string]any{"grant_interval": "on_activation"}},
		{"source unknown", "source", map[string]any{"source": "topup"}},
		{"expires 0", "expires_after_seconds", map[string]any{"expires_after_seconds": 0}},
		{"cap 0", "accumulation_cap", map[string]any{"accumulation_cap": 0}},
		{"rollover 101", "rollover_percentage", map[string]any{"rollover_percentage": 101}},
		{"rollover -1", "rollover_percentage", map[string]any{"rollover_percentage": -1}},
		{"max cycles -1", "max_rollover_cycles", map[string]any{"max_rollover_cycles": -1}},
	} {
		checkProblem(t, a.post(path, base(tc.extra)), 422, "validation-error", tc.field, tc.name)
	}

	otherPlan := a.newPlan(map[string]any{"name": "other"})["id"].(string)
	for _, tc := range []struct{ name, path string }{
		{"unknown variant", "/v1/plans/" + plan + "/variants/00000000-0000-4000-8000-000000000000/grants"},
		{"variant under another plan", "/v1/plans/" + otherPlan + "/variants/" + vid + "/grants"},
		{"unknown plan", "/v1/plans/00000000-0000-4000-8000-000000000000/variants/" + vid + "/grants"},
		{"malformed variant id", "/v1/plans/" + plan + "/variants/v1/grants"},
	} {
		checkProblem(t, a.post(tc.path, base(nil)), 404, "not-found", "", tc.name)
	}
	checkProblem(t, sb.post(path, base(nil)), 404, "not-found", "", "variant of the other environment")

	// Only the 201s were stored, oldest first.
	gs := arr(t, a.get("/v1/plan-variants/" + vid).Body["grants"], "grants")
	if len(gs) != 16 || obj(t, gs[0], "first")["id"] != g["id"] {
		t.Errorf("stored grants: %d, want 16 with the minimal one first", len(gs))
	}
}

// TestConformanceVariantEntitlements: docs/spec/addendum.md §5: POST .../entitlements 201
// {id, plan_variant_id, billable_metric_key, type, value, created_at} for
// each metric type; the same key again replaces it with a new id; 400 value
// not shaped for the type; 404 unknown metric (naming billable_metric_key)
// or variant; 422 missing field. GET /v1/plan-variants/{id} 200 with grants
// and entitlements, 404 unknown, malformed or other environment.
func TestConformanceVariantEntitlements(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("ents"))
	a, sb := s.as(t, tn.Live), s.as(t, tn.Sandbox)
	a.newMetric("feat", "boolean", nil)
	a.newMetric("seats", "gauge", map[string]any{"cap": 2})
	a.newMetric("model", "static", nil)
	a.newRule("calls", map[string]any{"cost_type": "per_unit", "unit_cost": 10})
	plan := a.newPlan(map[string]any{"name": "E"})["id"].(string)
	vid := a.newVariant(plan, map[string]any{"billing_cycle": "monthly"})["id"].(string)
	path := "/v1/plans/" + plan + "/variants/" + vid + "/entitlements"

	made := map[string]map[string]any{}
	for _, tc := range []struct {
		key, typ, want string
		value          any
	}{
		{"feat", "boolean", `{"enabled":true}`, map[string]any{"enabled": true}},
		{"seats", "gauge", `{"cap":10}`, map[string]any{"cap": 10}},
		{"model", "static", `{"config":{"name":"large","n":2}}`, map[string]any{"config": map[string]any{"name": "large", "n": 2}}},
		{"calls", "metered", `{"enabled":false}`, map[string]any{"enabled": false}},
	} {
		r := a.post(path, map[string]any{"billable_metric_key": tc.key, "value": tc.value})
		wantStatus(t, r, 201, "entitlement "+tc.key)
		checkKeys(t, r.Body, "entitlement", "id", "plan_variant_id", "billable_metric_key", "type", "value", "created_at")
		checkUUID(t, r.Body["id"], "id")
		got, _ := json.Marshal(r.Body["value"])
		if r.Body["plan_variant_id"] != vid || r.Body["billable_metric_key"] != tc.key || r.Body["type"] != tc.typ || !jsonEqual(got, []byte(tc.want)) {
			t.Errorf("entitlement %s: %v (value %s)", tc.key, r.Body, got)
		}
		made[tc.key] = r.Body
	}

	// The same key again replaces the entitlement with a new id.
	r := a.post(path, map[string]any{"billable_metric_key": "seats", "value": map[string]any{"cap": 25}})
	wantStatus(t, r, 201, "replace seats")
	if r.Body["id"] == made["seats"]["id"] || jsonInt(obj(t, r.Body["value"], "value")["cap"]) != 25 {
		t.Errorf("replacement %v", r.Body)
	}
	replaced := r.Body["id"]

	for _, tc := range []struct {
		name, key string
		value     any
		field     string
	}{
		{"boolean without enabled", "feat", map[string]any{"cap": 1}, "value.enabled"},
		{"boolean enabled not a boolean", "feat", map[string]any{"enabled": "yes"}, "value.enabled"},
		{"gauge without cap", "seats", map[string]any{"enabled": true}, "value.cap"},
		{"gauge negative cap", "seats", map[string]any{"cap": -1}, "value.cap"},
		{"static config not an object", "model", map[string]any{"config": "large"}, "value.config"},
		{"metered without enabled", "calls", map[string]any{}, "value.enabled"},
		{"value not an object", "seats", 5, "value"},
	} {
		checkProblem(t, a.post(path, map[string]any{"billable_metric_key": tc.key, "value": tc.value}), 400, "bad-request", tc.field, tc.name)
	}
	checkProblem(t, a.post(path, map[string]any{"billable_metric_key": "nope", "value": map[string]any{"enabled": true}}), 404, "not-found", "billable_metric_key", "unknown metric")
	checkProblem(t, sb.post("/v1/plans/"+plan+"/variants/"+vid+"/entitlements", map[string]any{"billable_metric_key": "feat", "value": map[string]any{"enabled": true}}), 404, "not-found", "", "other environment")
	checkProblem(t, a.post(path, map[string]any{"value": map[string]any{"enabled": true}}), 422, "validation-error", "billable_metric_key", "missing key")
	checkProblem(t, a.post(path, map[string]any{"billable_metric_key": "feat"}), 422, "validation-error", "value", "missing value")
	otherPlan := a.newPlan(map[string]any{"name": "other"})["id"].(string)
	checkProblem(t, a.post("/v1/plans/"+otherPlan+"/variants/"+vid+"/entitlements", map[string]any{"billable_metric_key": "feat", "value": map[string]any{"enabled": true}}), 404, "not-found", "", "variant under another plan")
	checkProblem(t, a.post("/v1/plans/"+plan+"/variants/00000000-0000-4000-8000-000000000000/entitlements", map[string]any{"billable_metric_key": "feat", "value": map[string]any{"enabled": true}}), 404, "not-found", "", "unknown variant")

	// GET /v1/plan-variants/{id}: the variant, its grants and entitlements.
	g := a.post("/v1/plans/"+plan+"/variants/"+vid+"/grants", map[string]any{"credits": 100, "grant_interval": "on_activation", "grant_type": "one_time"})
	wantStatus(t, g, 201, "grant")
	r = a.get("/v1/plan-variants/" + vid)
	wantStatus(t, r, 200, "get variant")
	checkKeys(t, r.Body, "variant detail", "id", "plan_id", "tenant_id", "environment", "billing_cycle", "trial_days", "status", "billing_mode",
		"renewal_due_days", "grace_period_days", "allow_usage_while_overdue", "metadata", "created_at", "updated_at", "grants", "entitlements")
	if gs := arr(t, r.Body["grants"], "grants"); len(gs) != 1 || obj(t, gs[0], "g")["id"] != g.Body["id"] {
		t.Errorf("variant grants %v", gs)
	}
	es := arr(t, r.Body["entitlements"], "entitlements")
	byKey := map[string]map[string]any{}
	for _, e := range es {
		m := obj(t, e, "entitlement")
		byKey[m["billable_metric_key"].(string)] = m
	}
	if len(es) != 4 || byKey["seats"]["id"] != replaced || byKey["feat"]["id"] != made["feat"]["id"] {
		t.Errorf("variant entitlements %v", es)
	}
	// A fresh variant has [] for both.
	fresh := a.newVariant(plan, map[string]any{"billing_cycle": "daily"})["id"].(string)
	r = a.get("/v1/plan-variants/" + fresh)
	if len(arr(t, r.Body["grants"], "grants")) != 0 || len(arr(t, r.Body["entitlements"], "entitlements")) != 0 {
		t.Errorf("fresh variant %v", r.Body)
	}
	checkProblem(t, a.get("/v1/plan-variants/00000000-0000-4000-8000-000000000000"), 404, "not-found", "", "unknown variant")
	checkProblem(t, a.get("/v1/plan-variants/abc"), 404, "not-found", "", "malformed variant id")
	checkProblem(t, sb.get("/v1/plan-variants/"+vid), 404, "not-found", "", "variant of the other environment")
}
