package e2e

import (
	"fmt"
	"net/url"
	"testing"
	"time"
)

// items is a consume body's items member from metric, units pairs.
func items(pairs ...any) []any {
	out := make([]any, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, map[string]any{"billable_metric_key": pairs[i], "units": pairs[i+1]})
	}
	return out
}

// TestConformanceConsumeItems: the multi-metric consume (issue 15 item 3)
// over HTTP: every item charged in one step with each item's cost in the
// answer and one consumption entry carrying the breakdown; all or none
// under block; the total's overage under allow; 20 items taken, 21
// refused; a bad item refused with its field path; a replay answers the
// same bytes and a reused key with other items is a conflict.
func TestConformanceConsumeItems(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("items"))
	a := s.as(t, tn.Live)
	m1, m2 := a.perUnit(100), a.perUnit(7)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})

	key := idemKey()
	body := map[string]any{"customer_id": ext, "items": items(m1, 3, m2, 10), "metadata": map[string]any{"job": "j2"}}
	r := a.do("POST", "/v1/entitlements/consume", key, body)
	wantStatus(t, r, 200, "multi consume")
	checkKeys(t, r.Body, "multi consume", "transaction_id", "customer_id", "billable_metric_key", "units", "cost", "charged",
		"overage_mc", "balance_after", "effective_balance", "reason", "items")
	wantItems := fmt.Sprintf(`[{"billable_metric_key":%q,"cost":300,"units":3},{"billable_metric_key":%q,"cost":70,"units":10}]`, m1, m2)
	if r.Body["customer_id"] != id || r.Body["billable_metric_key"] != nil || r.Body["units"] != nil ||
		Int(t, r.Body["cost"]) != 370 || Int(t, r.Body["charged"]) != 370 || Int(t, r.Body["overage_mc"]) != 0 ||
		Int(t, r.Body["balance_after"]) != 630 || mustJSON(r.Body["items"]) != wantItems {
		t.Errorf("multi consume body: %s", r.Raw)
	}
	rp := a.do("POST", "/v1/entitlements/consume", key, body)
	wantStatus(t, rp, 200, "replay")
	if string(rp.Raw) != string(r.Raw) || rp.Header.Get("X-Idempotent-Replayed") != "true" {
		t.Errorf("replay: %s, first %s", rp.Raw, r.Raw)
	}
	checkProblem(t, a.do("POST", "/v1/entitlements/consume", key, map[string]any{"customer_id": ext, "items": items(m1, 3, m2, 11),
		"metadata": map[string]any{"job": "j2"}}), 409, "conflict", "", "key reused with other items")
	if b := a.balance(id); b != 630 {
		t.Errorf("balance %d after a multi consume and its replay, want 630", b)
	}
	s.Drain()
	h := a.history(id, "?type=consumption")
	if len(h) != 1 {
		t.Fatalf("consumption entries: %d, want 1", len(h))
	}
	e := obj(t, h[0], "entry")
	if e["id"] != r.Body["transaction_id"] || Int(t, e["delta"]) != -370 || e["billable_metric_key"] != nil ||
		mustJSON(e["metadata"]) != `{"items":`+wantItems+`,"job":"j2"}` {
		t.Errorf("consumption entry: %v", e)
	}

	// block: all or none.
	v := Int(t, a.credits(id)["version"])
	checkProblem(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "items": items(m1, 6, m2, 10)}),
		409, "insufficient-credits", "", "block: the total past the balance")
	if c := a.credits(id); Int(t, c["balance"]) != 630 || Int(t, c["version"]) != v {
		t.Errorf("after a refused multi consume: balance %v version %v (was 630, %d)", c["balance"], c["version"], v)
	}

	// allow: the total's overage, the balance floored at zero.
	al := a.createCustomer(map[string]any{"external_id": uniq("allow"), "overage_policy": "allow"})
	aid := al["id"].(string)
	a.grant(aid, map[string]any{"credits": 150})
	ra := a.post("/v1/entitlements/consume", map[string]any{"customer_id": aid, "items": items(m1, 1, m2, 10)})
	if checkStatus(t, ra, 200, "allow multi") && (Int(t, ra.Body["cost"]) != 170 || Int(t, ra.Body["charged"]) != 150 ||
		Int(t, ra.Body["overage_mc"]) != 20 || Int(t, ra.Body["balance_after"]) != 0) {
		t.Errorf("allow multi: %s", ra.Raw)
	}

	// 20 items are one consume; 21 are refused.
	var twenty []any
	for i := 0; i < 20; i++ {
		twenty = append(twenty, a.perUnit(1), 1)
	}
	r20 := a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "items": items(twenty...)})
	if checkStatus(t, r20, 200, "20 items") && (Int(t, r20.Body["cost"]) != 20 || len(arr(t, r20.Body["items"], "items")) != 20) {
		t.Errorf("20 items: %s", r20.Raw)
	}
	checkProblem(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "items": items(append(twenty, m1, 1)...)}),
		400, "bad-request", "items", "21 items")
	if b := a.balance(id); b != 610 {
		t.Errorf("balance %d, want 610", b)
	}

	flag := uniq("flag")
	a.newMetric(flag, "boolean", map[string]any{"enabled": true})
	for _, tc := range []struct {
		name   string
		body   map[string]any
		status int
		typ    string
		field  string
	}{
		{"both forms", map[string]any{"customer_id": id, "billable_metric_key": m1, "units": 1, "items": items(m1, 1)}, 400, "bad-request", "items"},
		{"empty items", map[string]any{"customer_id": id, "items": []any{}}, 400, "bad-request", "items"},
		{"units 0 in an item", map[string]any{"customer_id": id, "items": items(m1, 1, m2, 0)}, 400, "bad-request", "items[1].units"},
		{"no metric in an item", map[string]any{"customer_id": id, "items": []any{map[string]any{"billable_metric_key": m1, "units": 1},
			map[string]any{"units": 2}}}, 422, "validation-error", "items[1].billable_metric_key"},
		{"non-metered item", map[string]any{"customer_id": id, "items": items(m1, 1, m2, 1, flag, 1)}, 400, "bad-request", "items[2].billable_metric_key"},
		{"metric twice", map[string]any{"customer_id": id, "items": items(m1, 1, m1, 2)}, 400, "bad-request", "items[1].billable_metric_key"},
		// Items are checked in turn, each one's shape then its rule: an
		// earlier item's rule refusal comes before a later one's shape.
		{"non-metered before units 0", map[string]any{"customer_id": id, "items": items(flag, 1, m2, 0)}, 400, "bad-request", "items[0].billable_metric_key"},
		{"units 0 before non-metered", map[string]any{"customer_id": id, "items": items(m1, 0, flag, 1)}, 400, "bad-request", "items[0].units"},
		{"reserved metadata", map[string]any{"customer_id": id, "items": items(m1, 1), "metadata": map[string]any{"items": 1}}, 400, "bad-request", "metadata.items"},
	} {
		checkProblem(t, a.post("/v1/entitlements/consume", tc.body), tc.status, tc.typ, tc.field, tc.name)
	}
	if b := a.balance(id); b != 610 {
		t.Errorf("refused bodies moved credit: balance %d, want 610", b)
	}
}

// TestOverageCountsEveryItem (issue 31 item 1): a multi-metric consume's
// overage is in the overage report under each metric it fell on, not left
// out: the charge pays the items in the order given, so the overage falls
// on the last ones (docs/decisions.md "Multi-metric usage in reports").
// Under allow with 50 of credit, items a x3 and b x4 at 10 each (70) charge
// 50 with 20 of overage, on b; then a single consume of a x2 is all
// overage (20, on a): the report says a 20, b 20, total 40.
func TestOverageCountsEveryItem(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("overitems"))
	a := s.as(t, tn.Live)
	ma, mb := a.perUnit(10), a.perUnit(10)
	c := a.createCustomer(map[string]any{"external_id": uniq("allow"), "overage_policy": "allow"})
	id := c["id"].(string)
	from := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	a.grant(id, map[string]any{"credits": 50})
	multi := a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "items": items(ma, 3, mb, 4)})
	if !checkStatus(t, multi, 200, "multi consume") || Int(t, multi.Body["overage_mc"]) != 20 {
		t.Fatalf("multi consume: %s", multi.Raw)
	}
	single := a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": ma, "units": 2})
	if !checkStatus(t, single, 200, "single consume") || Int(t, single.Body["overage_mc"]) != 20 {
		t.Fatalf("single consume: %s", single.Raw)
	}
	to := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	o := a.get("/v1/customers/" + id + "/overage?from=" + url.QueryEscape(from) + "&to=" + url.QueryEscape(to))
	wantStatus(t, o, 200, "overage")
	if Int(t, o.Body["total_overage_mc"]) != 40 {
		t.Errorf("total_overage_mc %v, want 40: %s", o.Body["total_overage_mc"], o.Raw)
	}
	got := map[string]int64{}
	for _, l := range arr(t, o.Body["data"], "data") {
		line := obj(t, l, "line")
		got[line["billable_metric_key"].(string)] = Int(t, line["overage_mc"])
	}
	if len(got) != 2 || got[ma] != 20 || got[mb] != 20 {
		t.Errorf("overage lines %v, want %s: 20 and %s: 20", got, ma, mb)
	}
}

// TestPeriodUsageCountsEveryItem (issue 31 item 1): a subscription's
// period usage counts each item of a multi-metric consume under its own
// metric (units, credits paid and overage), beside single consumes.
func TestPeriodUsageCountsEveryItem(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("useitems"))
	a := s.as(t, tn.Live)
	ma, mb := a.perUnit(10), a.perUnit(10)
	plan := str(t, a.newPlan(map[string]any{"name": "Items"})["id"], "plan id")
	vid := str(t, a.newVariant(plan, map[string]any{"billing_cycle": "monthly"})["id"], "variant")
	c := a.createCustomer(map[string]any{"external_id": uniq("allow"), "overage_policy": "allow"})
	cust := c["id"].(string)
	r := a.post("/v1/subscriptions", map[string]any{"customer_id": cust, "plan_variant_id": vid})
	wantStatus(t, r, 201, "subscribe")
	sub := str(t, r.Body["id"], "subscription id")
	a.grant(cust, map[string]any{"credits": 50})
	wantStatus(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": cust, "items": items(ma, 3, mb, 4)}), 200, "multi consume")
	wantStatus(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": cust, "billable_metric_key": ma, "units": 2}), 200, "single consume")
	u := a.get("/v1/subscriptions/" + sub + "/usage")
	wantStatus(t, u, 200, "usage")
	type line struct{ units, credits, overage int64 }
	got := map[string]line{}
	for _, l := range arr(t, u.Body["data"], "usage data") {
		o := obj(t, l, "line")
		got[o["billable_metric_key"].(string)] = line{Int(t, o["units"]), Int(t, o["credits"]), Int(t, o["overage_mc"])}
	}
	// a: 3 units paid 30, then 2 units all overage (20); b: 4 units, 20 paid, 20 overage.
	want := map[string]line{ma: {5, 30, 20}, mb: {4, 20, 20}}
	if len(got) != 2 || got[ma] != want[ma] || got[mb] != want[mb] {
		t.Errorf("period usage %v, want %v (%s)", got, want, u.Raw)
	}
}
