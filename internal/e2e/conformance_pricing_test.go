package e2e

import (
	"net/url"
	"sort"
	"strings"
	"testing"
)

// Helpers of the pricing and hot-path conformance tests.

// newMetric creates a billable metric (docs/spec/addendum.md §4) and requires 201.
func (a api) newMetric(key, typ string, def any) map[string]any {
	a.t.Helper()
	body := map[string]any{"key": key, "type": typ}
	if def != nil {
		body["default_value"] = def
	}
	r := a.post("/v1/billable-metrics", body)
	wantStatus(a.t, r, 201, "create metric "+key)
	return r.Body
}

// newRule creates a metering rule for key with the pricing members of body
// and requires 201.
func (a api) newRule(key string, body map[string]any) map[string]any {
	a.t.Helper()
	b := map[string]any{"billable_metric_key": key}
	for k, v := range body {
		b[k] = v
	}
	r := a.post("/v1/metering-rules", b)
	wantStatus(a.t, r, 201, "create rule "+key)
	return r.Body
}

// perUnit prices key at cost millicredits per unit and returns the key.
func (a api) perUnit(cost int64) string {
	a.t.Helper()
	key := uniq("m")
	a.newRule(key, map[string]any{"cost_type": "per_unit", "unit_cost": cost})
	return key
}

// keysOf lists the members of a JSON object, sorted.
func keysOf(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkKeys asserts a body has exactly the members want.
func checkKeys(t testing.TB, m map[string]any, what string, want ...string) {
	t.Helper()
	sort.Strings(want)
	if got := keysOf(m); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("%s: members %v, want exactly %v", what, got, want)
	}
}

// TestConformanceBillableMetrics: docs/spec/addendum.md §4: POST 201 with every field and
// the documented defaults per type; 409 for a taken key (per environment);
// 422 for a bad type or default_value; GET by key, 404 unknown; PATCH 200
// changes name, default_value, metadata, refuses a type change (422); the
// list pages oldest first.
func TestConformanceBillableMetrics(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("metrics"))
	a := s.as(t, tn.Live)
	sb := s.as(t, tn.Sandbox)

	defaults := map[string]string{
		"metered": `null`, "boolean": `{"enabled":false}`, "gauge": `{"cap":0}`, "static": `{"config":{}}`,
	}
	prefix := uniq("bm")
	var created []string
	for _, typ := range []string{"metered", "boolean", "gauge", "static"} {
		key := prefix + "-" + typ
		m := a.newMetric(key, typ, nil)
		created = append(created, key)
		checkKeys(t, m, "metric "+typ, "id", "tenant_id", "environment", "key", "name", "type", "default_value", "metadata", "created_at", "updated_at")
		checkUUID(t, m["id"], "metric.id")
		if m["tenant_id"] != tn.ID || m["key"] != key || m["type"] != typ || m["name"] != key {
			t.Errorf("metric %s: %v", typ, m)
		}
		if got := mustJSON(m["default_value"]); got != defaults[typ] {
			t.Errorf("metric %s default_value %s, want %s (docs/spec/addendum.md §4)", typ, got, defaults[typ])
		}
		if md, ok := m["metadata"].(map[string]any); !ok || len(md) != 0 {
			t.Errorf("metric %s metadata %v, want {}", typ, m["metadata"])
		}
		checkTime(t, m["created_at"], "created_at")
		checkTime(t, m["updated_at"], "updated_at")
	}

	// Explicit defaults and name.
	g := a.post("/v1/billable-metrics", map[string]any{"key": prefix + "-seats", "name": "Seats", "type": "gauge",
		"default_value": map[string]any{"cap": 5}, "metadata": map[string]any{"team": "core"}})
	wantStatus(t, g, 201, "gauge with cap")
	created = append(created, prefix+"-seats")
	if g.Body["name"] != "Seats" || mustJSON(g.Body["default_value"]) != `{"cap":5}` || mustJSON(g.Body["metadata"]) != `{"team":"core"}` {
		t.Errorf("gauge with cap: %s", g.Raw)
	}

	// 409: key taken in this environment; the other environment may use it.
	checkProblem(t, a.post("/v1/billable-metrics", map[string]any{"key": prefix + "-boolean", "type": "boolean"}), 409, "conflict", "", "taken key")
	wantStatus(t, sb.post("/v1/billable-metrics", map[string]any{"key": prefix + "-boolean", "type": "static"}), 201, "same key in sandbox")

	// 422 naming the field.
	for _, tc := range []struct {
		name  string
		body  map[string]any
		field string
	}{
		{"bad type", map[string]any{"key": uniq("x"), "type": "counter"}, "type"},
		{"missing type", map[string]any{"key": uniq("x")}, "type"},
		{"missing key", map[string]any{"type": "boolean"}, "key"},
		{"bad key", map[string]any{"key": "has space", "type": "boolean"}, "key"},
		{"wrong type of type", map[string]any{"key": uniq("x"), "type": 7}, "type"},
	} {
		checkProblem(t, a.post("/v1/billable-metrics", tc.body), 422, "validation-error", tc.field, tc.name)
	}
	r := a.post("/v1/billable-metrics", map[string]any{"key": uniq("x"), "type": "gauge", "default_value": map[string]any{"cap": -1}})
	checkStatus(t, r, 422, "negative cap")
	if !strings.HasPrefix(str(t, r.Body["field"], "field"), "default_value") {
		t.Errorf("negative cap names %v, want default_value...", r.Body["field"])
	}
	checkProblem(t, a.post("/v1/billable-metrics", "not json"), 400, "bad-request", "", "unparseable body")

	// GET by key; 404 unknown; another environment does not see it.
	gr := a.get("/v1/billable-metrics/" + prefix + "-seats")
	wantStatus(t, gr, 200, "get metric")
	if gr.Body["id"] != g.Body["id"] || gr.Body["type"] != "gauge" {
		t.Errorf("get metric: %s", gr.Raw)
	}
	checkProblem(t, a.get("/v1/billable-metrics/"+uniq("nope")), 404, "not-found", "", "unknown metric")
	checkProblem(t, sb.get("/v1/billable-metrics/"+prefix+"-seats"), 404, "not-found", "", "metric of the other environment")

	// PATCH: name, default_value and metadata (replaced); type immutable.
	p := a.patch("/v1/billable-metrics/"+prefix+"-seats", map[string]any{"name": "Seat count",
		"default_value": map[string]any{"cap": 9}, "metadata": map[string]any{"owner": "ops"}})
	wantStatus(t, p, 200, "patch metric")
	if p.Body["name"] != "Seat count" || mustJSON(p.Body["default_value"]) != `{"cap":9}` || mustJSON(p.Body["metadata"]) != `{"owner":"ops"}` ||
		p.Body["type"] != "gauge" || p.Body["id"] != g.Body["id"] {
		t.Errorf("patched metric: %s", p.Raw)
	}
	if !checkTime(t, p.Body["updated_at"], "updated_at").After(checkTime(t, g.Body["updated_at"], "created updated_at")) &&
		p.Body["updated_at"] == g.Body["updated_at"] {
		t.Errorf("updated_at did not move: %v", p.Body["updated_at"])
	}
	checkProblem(t, a.patch("/v1/billable-metrics/"+prefix+"-seats", map[string]any{"type": "metered"}), 422, "validation-error", "type", "type change")
	wantStatus(t, a.patch("/v1/billable-metrics/"+prefix+"-seats", map[string]any{"type": "gauge"}), 200, "same type is no change")
	checkProblem(t, a.patch("/v1/billable-metrics/"+uniq("nope"), map[string]any{"name": "x"}), 404, "not-found", "", "patch unknown")
	if got := a.get("/v1/billable-metrics/" + prefix + "-seats"); got.Body["type"] != "gauge" || mustJSON(got.Body["default_value"]) != `{"cap":9}` {
		t.Errorf("after patches: %s", got.Raw)
	}

	// The list pages oldest first with no repeats.
	var seen []string
	cursor := ""
	for i := 0; i < 10; i++ {
		q := "/v1/billable-metrics?limit=2"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		lr := a.get(q)
		wantStatus(t, lr, 200, "list metrics")
		data, more, next := page(t, lr)
		if len(data) > 2 {
			t.Fatalf("page of %d with limit 2", len(data))
		}
		for _, d := range data {
			seen = append(seen, obj(t, d, "metric")["key"].(string))
		}
		if !more {
			if next != nil {
				t.Errorf("last page next_cursor %v, want null", next)
			}
			break
		}
		cursor = str(t, next, "next_cursor")
	}
	if strings.Join(seen, ",") != strings.Join(created, ",") {
		t.Errorf("listed %v, want oldest first %v", seen, created)
	}
	checkProblem(t, a.get("/v1/billable-metrics?limit=0"), 400, "bad-request", "limit", "limit 0")
	checkProblem(t, a.get("/v1/billable-metrics?cursor=garbage!"), 400, "bad-request", "", "bad cursor")
}

// TestConformanceMeteringRules: POST /v1/metering-rules: 201 with every
// field for each cost type; 422 naming the field (tier_config... for tiers);
// a new rule supersedes the active one (effective_until set, active_only
// shows one); a missing metric is created as metered; a non-metered metric
// is refused; GET pages oldest first and filters by metric.
func TestConformanceMeteringRules(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("rules"))
	a := s.as(t, tn.Live)

	key := uniq("tokens")
	flat := a.newRule(key, map[string]any{"cost_type": "flat", "base_cost": 500, "metadata": map[string]any{"v": 1}})
	checkKeys(t, flat, "rule", "id", "tenant_id", "environment", "billable_metric_key", "cost_type", "base_cost", "unit_cost",
		"tier_config", "effective_from", "effective_until", "metadata", "created_at", "updated_at")
	checkUUID(t, flat["id"], "rule.id")
	if flat["tenant_id"] != tn.ID || flat["billable_metric_key"] != key || flat["cost_type"] != "flat" ||
		Int(t, flat["base_cost"]) != 500 || Int(t, flat["unit_cost"]) != 0 || flat["tier_config"] != nil || flat["effective_until"] != nil {
		t.Errorf("flat rule: %v", flat)
	}
	checkTime(t, flat["effective_from"], "effective_from")

	// A missing metric was created: metered, named after the key.
	m := a.get("/v1/billable-metrics/" + key)
	wantStatus(t, m, 200, "auto-created metric")
	if m.Body["type"] != "metered" || m.Body["name"] != key || m.Body["default_value"] != nil {
		t.Errorf("auto-created metric: %s", m.Raw)
	}

	// per_unit supersedes flat.
	pu := a.newRule(key, map[string]any{"cost_type": "per_unit", "unit_cost": 7})
	if Int(t, pu["unit_cost"]) != 7 || Int(t, pu["base_cost"]) != 0 || pu["effective_until"] != nil {
		t.Errorf("per_unit rule: %v", pu)
	}
	tiers := []any{
		map[string]any{"up_to": 10, "unit_cost": 5, "flat_cost": 0},
		map[string]any{"up_to": nil, "unit_cost": 2, "flat_cost": 100},
	}
	tr := a.newRule(key, map[string]any{"cost_type": "tiered", "tier_config": map[string]any{"mode": "graduated", "tiers": tiers}})
	tc := obj(t, tr["tier_config"], "tier_config")
	if tc["mode"] != "graduated" || len(arr(t, tc["tiers"], "tiers")) != 2 {
		t.Errorf("tiered rule: %v", tr)
	}
	last := obj(t, arr(t, tc["tiers"], "tiers")[1], "last tier")
	if v, present := last["up_to"]; !present || v != nil {
		t.Errorf("last tier up_to %v (present %v), want null", v, present)
	}

	all := a.get("/v1/metering-rules?billable_metric_key=" + key)
	wantStatus(t, all, 200, "list rules")
	data, _, _ := page(t, all)
	if len(data) != 3 {
		t.Fatalf("rules of %s: %d, want 3: %s", key, len(data), all.Raw)
	}
	ids := []any{flat["id"], pu["id"], tr["id"]}
	for i, d := range data {
		r := obj(t, d, "rule")
		if r["id"] != ids[i] {
			t.Errorf("rule %d id %v, want %v (oldest first)", i, r["id"], ids[i])
		}
		if i < 2 {
			until := checkTime(t, r["effective_until"], "superseded effective_until")
			from := checkTime(t, r["effective_from"], "effective_from")
			if until.Before(from) {
				t.Errorf("rule %d effective_until %v before effective_from %v", i, until, from)
			}
		} else if r["effective_until"] != nil {
			t.Errorf("active rule effective_until %v, want null", r["effective_until"])
		}
	}
	act := a.get("/v1/metering-rules?active_only=true&billable_metric_key=" + key)
	wantStatus(t, act, 200, "active_only")
	if data, _, _ := page(t, act); len(data) != 1 || obj(t, data[0], "rule")["id"] != tr["id"] {
		t.Errorf("active_only: %s", act.Raw)
	}
	// Without a key filter the other metrics' rules show too, oldest first.
	other := a.perUnit(3)
	every := a.get("/v1/metering-rules?active_only=1")
	wantStatus(t, every, 200, "active_only all metrics")
	if data, _, _ := page(t, every); len(data) != 2 || obj(t, data[1], "rule")["billable_metric_key"] != other {
		t.Errorf("active rules of the tenant: %s", every.Raw)
	}
	checkProblem(t, a.get("/v1/metering-rules?active_only=maybe"), 400, "bad-request", "active_only", "bad active_only")
	checkProblem(t, a.get("/v1/metering-rules?limit=101"), 400, "bad-request", "limit", "limit 101")
	// Rules are per environment.
	if data, _, _ := page(t, s.as(t, tn.Sandbox).get("/v1/metering-rules")); len(data) != 0 {
		t.Errorf("sandbox sees %d live rules", len(data))
	}

	// Volume tiers with flat_cost on every tier are accepted.
	vol := a.newRule(uniq("vol"), map[string]any{"cost_type": "tiered", "base_cost": 3, "tier_config": map[string]any{"mode": "volume",
		"tiers": []any{map[string]any{"up_to": 100, "unit_cost": 3, "flat_cost": 10}, map[string]any{"up_to": nil, "unit_cost": 1, "flat_cost": 20}}}})
	if Int(t, vol["base_cost"]) != 3 {
		t.Errorf("base_cost is stored for tiered rules: %v", vol["base_cost"])
	}

	// 422 naming the field.
	k := uniq("bad")
	g := []any{map[string]any{"up_to": 10, "unit_cost": 1}, map[string]any{"up_to": nil, "unit_cost": 1}}
	for _, tc := range []struct {
		name  string
		body  map[string]any
		field string
	}{
		{"missing key", map[string]any{"cost_type": "flat", "base_cost": 1}, "billable_metric_key"},
		{"missing cost_type", map[string]any{"billable_metric_key": k, "base_cost": 1}, "cost_type"},
		{"bad cost_type", map[string]any{"billable_metric_key": k, "cost_type": "free"}, "cost_type"},
		{"flat without base_cost", map[string]any{"billable_metric_key": k, "cost_type": "flat"}, "base_cost"},
		{"negative base_cost", map[string]any{"billable_metric_key": k, "cost_type": "flat", "base_cost": -1}, "base_cost"},
		{"per_unit without unit_cost", map[string]any{"billable_metric_key": k, "cost_type": "per_unit"}, "unit_cost"},
		{"per_unit zero unit_cost", map[string]any{"billable_metric_key": k, "cost_type": "per_unit", "unit_cost": 0}, "unit_cost"},
		{"tiered without config", map[string]any{"billable_metric_key": k, "cost_type": "tiered"}, "tier_config"},
		{"bad mode", map[string]any{"billable_metric_key": k, "cost_type": "tiered", "tier_config": map[string]any{"mode": "stairs", "tiers": g}}, "tier_config.mode"},
		{"no tiers", map[string]any{"billable_metric_key": k, "cost_type": "tiered", "tier_config": map[string]any{"mode": "volume", "tiers": []any{}}}, "tier_config.tiers"},
		{"last tier bounded", map[string]any{"billable_metric_key": k, "cost_type": "tiered", "tier_config": map[string]any{"mode": "volume",
			"tiers": []any{map[string]any{"up_to": 10, "unit_cost": 1}}}}, "tier_config.tiers.up_to"},
		{"middle tier open", map[string]any{"billable_metric_key": k, "cost_type": "tiered", "tier_config": map[string]any{"mode": "graduated",
			"tiers": []any{map[string]any{"up_to": nil, "unit_cost": 1}, map[string]any{"up_to": nil, "unit_cost": 1}}}}, "tier_config.tiers.up_to"},
		{"tiers not increasing", map[string]any{"billable_metric_key": k, "cost_type": "tiered", "tier_config": map[string]any{"mode": "graduated",
			"tiers": []any{map[string]any{"up_to": 10, "unit_cost": 1}, map[string]any{"up_to": 10, "unit_cost": 1}, map[string]any{"up_to": nil, "unit_cost": 1}}}}, "tier_config.tiers.up_to"},
		{"negative tier unit_cost", map[string]any{"billable_metric_key": k, "cost_type": "tiered", "tier_config": map[string]any{"mode": "graduated",
			"tiers": []any{map[string]any{"up_to": nil, "unit_cost": -1}}}}, "tier_config.tiers.unit_cost"},
		{"negative flat_cost", map[string]any{"billable_metric_key": k, "cost_type": "tiered", "tier_config": map[string]any{"mode": "graduated",
			"tiers": []any{map[string]any{"up_to": nil, "unit_cost": 1, "flat_cost": -5}}}}, "tier_config.tiers.flat_cost"},
	} {
		checkProblem(t, a.post("/v1/metering-rules", tc.body), 422, "validation-error", tc.field, tc.name)
	}
	// Nothing was created by the refusals.
	checkProblem(t, a.get("/v1/billable-metrics/"+k), 404, "not-found", "", "refused rules create no metric")

	// A metric that is not metered takes no rule.
	b := uniq("flag")
	a.newMetric(b, "boolean", map[string]any{"enabled": true})
	checkProblem(t, a.post("/v1/metering-rules", map[string]any{"billable_metric_key": b, "cost_type": "flat", "base_cost": 1}), 400, "bad-request", "", "rule on a boolean metric")
}
