package e2e

import (
	"bytes"
	"testing"
)

// TestConsumeItemsAnswerNull (issue 31 item 2): the items form of a consume
// answers billable_metric_key and units null, whether it lists two metrics
// (whose units do not add up) or one, like its credit.consumed event; the
// single form answers its metric and units as before. A retry re-run from
// the op key and one answered from Postgres give the same bytes.
func TestConsumeItemsAnswerNull(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("itemsnull"))
	a := s.as(t, tn.Live)
	m1, m2 := a.perUnit(10), a.perUnit(10)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})

	single := a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": m1, "units": 2})
	if checkStatus(t, single, 200, "single consume") && (single.Body["billable_metric_key"] != m1 ||
		Int(t, single.Body["units"]) != 2 || Int(t, single.Body["cost"]) != 20 || single.Body["items"] != nil) {
		t.Errorf("single consume: %s", single.Raw)
	}

	type call struct {
		name  string
		body  map[string]any
		cost  int64
		items string
	}
	calls := []call{
		{"two metrics", map[string]any{"customer_id": id, "items": items(m1, 3, m2, 4)}, 70,
			`[{"billable_metric_key":"` + m1 + `","cost":30,"units":3},{"billable_metric_key":"` + m2 + `","cost":40,"units":4}]`},
		{"one metric", map[string]any{"customer_id": id, "items": items(m2, 5)}, 50,
			`[{"billable_metric_key":"` + m2 + `","cost":50,"units":5}]`},
	}
	keys := make([]string, len(calls))
	firsts := make([]Response, len(calls))
	for i, c := range calls {
		keys[i] = idemKey()
		r := a.do("POST", "/v1/entitlements/consume", keys[i], c.body)
		firsts[i] = r
		if !checkStatus(t, r, 200, c.name) {
			continue
		}
		checkKeys(t, r.Body, c.name, "transaction_id", "customer_id", "billable_metric_key", "units", "cost", "charged",
			"overage_mc", "balance_after", "effective_balance", "reason", "items")
		if !bytes.Contains(r.Raw, []byte(`"billable_metric_key":null,"units":null,`)) || Int(t, r.Body["cost"]) != c.cost ||
			Int(t, r.Body["charged"]) != c.cost || mustJSON(r.Body["items"]) != c.items {
			t.Errorf("%s: %s, want billable_metric_key and units null, cost %d, items %s", c.name, r.Raw, c.cost, c.items)
		}
		again := a.do("POST", "/v1/entitlements/consume", keys[i], c.body)
		if again.Status != 200 || !bytes.Equal(again.Raw, r.Raw) {
			t.Errorf("%s, retry: %d %s, want %s", c.name, again.Status, again.Raw, r.Raw)
		}
	}

	// Once the persister committed them, Postgres answers the retries.
	s.Drain()
	dropKeys(t, s, redisKeys(t, s, ":p*}:op:*"))
	for i, c := range calls {
		again := a.do("POST", "/v1/entitlements/consume", keys[i], c.body)
		if again.Status != 200 || !bytes.Equal(again.Raw, firsts[i].Raw) {
			t.Errorf("%s, op key gone: %d %s, want %s", c.name, again.Status, again.Raw, firsts[i].Raw)
		}
	}
	if b := a.balance(id); b != 1_000-20-70-50 {
		t.Errorf("balance %d, want %d", b, 1_000-20-70-50)
	}

	// The events say the same: a metric and units for the single form
	// only (newest first: one item, two items, single).
	ev := a.eventsOfType("credit.consumed", id)
	if len(ev) != 3 {
		t.Fatalf("%d credit.consumed events, want 3", len(ev))
	}
	for i, want := range []any{nil, nil, m1} {
		d := obj(t, ev[i]["data"], "data")
		if d["billable_metric_key"] != want || (want == nil) != (d["units"] == nil) {
			t.Errorf("credit.consumed %d: data %v, want billable_metric_key %v", i, d, want)
		}
	}
}
