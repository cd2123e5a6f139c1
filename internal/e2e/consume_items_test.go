package e2e

import (
	"fmt"
	"testing"
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
	if r.Body["customer_id"] != id || r.Body["billable_metric_key"] != "" || Int(t, r.Body["units"]) != 13 ||
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
		{"reserved metadata", map[string]any{"customer_id": id, "items": items(m1, 1), "metadata": map[string]any{"items": 1}}, 400, "bad-request", "metadata.items"},
	} {
		checkProblem(t, a.post("/v1/entitlements/consume", tc.body), tc.status, tc.typ, tc.field, tc.name)
	}
	if b := a.balance(id); b != 610 {
		t.Errorf("refused bodies moved credit: balance %d, want 610", b)
	}
}
