package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

// TestConformanceInputBoundary (issue 9): on real Redis and Postgres, input
// at the edge of every text, number and metadata limit is accepted and
// lands in Postgres (no dead letter), and the hostile inputs the issue found
// are refused with a 400 or 422 before anything moves.
func TestConformanceInputBoundary(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("boundary"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	wantStatus(t, a.post("/v1/metering-rules", map[string]any{"billable_metric_key": "tok", "cost_type": "per_unit", "unit_cost": 1}), 201, "rule")

	long := strings.Repeat("é😀\t\n", 125) // 500 characters
	meta := `{"k` + strings.Repeat("x", 39) + `":"` + strings.ReplaceAll(strings.ReplaceAll(long, "\t", `\t`), "\n", `\n`) + `",` +
		`"big":1e300,"small":-1e-300,"exact":1.50,"deep":{"a":{"b":{"c":[1]}}},"u":"\u00e9\ud83d\ude00\u007f<&>"}`
	edge := []struct{ what, path, body string }{
		{"grant", "/v1/customers/" + id + "/credits/grant", `{"credits":1000,"source":"manual","reason":"line one\nline two","metadata":` + meta + `}`},
		{"adjust", "/v1/customers/" + id + "/credits/adjust", `{"delta":-1,"source":"manual","reason":"r","metadata":` + meta + `}`},
		{"consume", "/v1/entitlements/consume", `{"customer_id":"` + id + `","billable_metric_key":"tok","units":2,"metadata":` + meta + `}`},
		{"usage", "/v1/usage", `{"events":[{"event_id":"évt-😀-` + randomID() + `","customer_id":"` + id + `","billable_metric_key":"tok","units":3,"metadata":` + meta + `}]}`},
	}
	for _, e := range edge {
		r := a.do("POST", e.path, idemKey(), e.body)
		if r.Status != 200 && r.Status != 201 {
			t.Fatalf("%s at the limits: %d %s", e.what, r.Status, r.Raw)
		}
	}

	poison := "/v1/customers/poison-" + randomID() + "/credits/grant"
	for i, h := range []struct{ path, body string }{
		{poison, `{"credits":5,"source":"manual","reason":"r","metadata":{"a":"\u0000"}}`},
		{poison, `{"credits":5,"source":"manual","reason":"r","metadata":{"a":"` + "\xff" + `"}}`},
		{poison, `{"credits":5,"source":"manual","reason":"r","metadata":{"a":1e999999}}`},
		{poison, `{"credits":5,"source":"manual","reason":"r\u0000"}`},
		{poison, `{"credits":5,"CREDITS":-100,"source":"manual","reason":"r"}`},
		{"/v1/customers/" + id + "/topups", `{"credits":5,"payment_reference":"p\u0000"}`},
		{"/v1/customers", `{"external_id":"x\u0000"}`},
		{"/v1/usage", `{"events":[{"event_id":"e\u0000","customer_id":"` + id + `","billable_metric_key":"tok","units":1}]}`},
		{"/v1/usage", `{"events":[{"event_id":"e-` + randomID() + `","customer_id":"x\u0000","billable_metric_key":"tok","units":1}]}`},
		{"/v1/entitlements/consume", `{"customer_id":"` + id + `","billable_metric_key":"tok","units":1,"units":100}`},
	} {
		r := a.do("POST", h.path, idemKey(), h.body)
		if r.Status != 400 && r.Status != 422 {
			t.Errorf("hostile body %d: %d %s", i, r.Status, r.Raw)
		}
	}
	for _, p := range []string{"/v1/customers/%00", "/v1/customers/%ff", "/v1/customers?search=%00",
		"/v1/customers/" + id + "/credits/history?type=%00", "/v1/customers/" + id + "/credits/history?from=0000-01-01T00:00:00%2B23:59"} {
		if r := a.get(p); r.Status != 400 {
			t.Errorf("GET %s: %d %s", p, r.Status, r.Raw)
		}
	}

	// Import rows past a metadata limit or year 9999 are reported per row.
	keys := make([]string, 51)
	for i := range keys {
		keys[i] = `"k` + strconv.Itoa(i) + `":1`
	}
	imp := a.do("POST", "/v1/import", idemKey(), `{"customers":[`+
		`{"external_id":"imp-a-`+randomID()+`","metadata":{`+strings.Join(keys, ",")+`}},`+
		`{"external_id":"imp-b-`+randomID()+`","credits":[{"credits":5,"expires_at":"9999-12-31T23:59:59-01:00"}]},`+
		`{"external_id":"imp-c-`+randomID()+`","metadata":{"ok":1.50},"credits":[{"credits":5}]}]}`)
	wantStatus(t, imp, 200, "import")
	if errs := arr(t, imp.Body["errors"], "import errors"); len(errs) != 2 || Int(t, imp.Body["created"]) != 1 {
		t.Fatalf("import: %s", imp.Raw)
	}

	// Clean but unexpected query values never reach Postgres as a 500.
	big := strings.Repeat("z", 5000)
	for _, p := range []string{"/v1/customers/" + id + "/credits/history?type=zzz&source=" + big + "&billable_metric_key=" + big,
		"/v1/customers/" + id + "/credits/history?from=9999-12-31T23:59:59Z&to=0001-01-01T00:00:00Z",
		"/v1/customers/" + id + "/overage?from=0001-01-01T00:00:00Z&to=9999-12-31T23:59:59Z",
		"/v1/customers?search=%25_%5C&cursor=" + big, "/v1/customers/" + big, "/v1/customer-by-external-id/" + big,
		"/v1/entitlements/check?customer_id=" + big + "&billable_metric_key=" + big + "&units=1",
		"/v1/webhooks/events?status=" + big + "&event_type=" + big, "/v1/subscriptions/" + big + "/usage?period_start=" + big,
		"/v1/billable-metrics/" + big, "/v1/metering-rules?billable_metric_key=" + big} {
		if r := a.get(p); r.Status >= 500 {
			t.Errorf("GET %.80s: %d %s", p, r.Status, r.Raw)
		}
	}

	s.Drain()
	var dead int
	if err := s.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_dead_letters").Scan(&dead); err != nil {
		t.Fatal(err)
	}
	if dead != 0 {
		t.Fatalf("%d dead letters: accepted input did not fit Postgres", dead)
	}
	if got := a.balance(id); got != 1000-1-2-3 {
		t.Fatalf("balance = %d, want 994 (hostile input moved credit)", got)
	}
	entries := a.history(id, "")
	if len(entries) != 4 {
		t.Fatalf("history has %d entries, want 4", len(entries))
	}
	for _, e := range entries {
		m := obj(t, obj(t, e, "entry")["metadata"], "metadata")
		if m["u"] != "é😀\u007f<&>" || m["k"+strings.Repeat("x", 39)] != long {
			t.Fatalf("metadata text did not survive Postgres: %v", m)
		}
		if f, err := strconv.ParseFloat(string(m["exact"].(interface{ String() string }).String()), 64); err != nil || f != 1.5 {
			t.Fatalf("metadata number exact = %v", m["exact"])
		}
	}
}
