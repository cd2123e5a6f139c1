package api

import (
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
)

// TestHostileInput drives each hostile input of issue 9 through the real
// handlers: every one is a 400 or 422 naming the field, never a 500, and
// none of them creates a customer or moves credit.
func TestHostileInput(t *testing.T) {
	t.Parallel()
	h := setupPricing(t)
	if r := h.do("POST", "/v1/customers", `{"external_id":"c1"}`, h.idemKey("setup-c1")...); r.status != 201 {
		t.Fatalf("create c1: %d %s", r.status, r.body)
	}
	if r := h.do("POST", "/v1/metering-rules", `{"billable_metric_key":"tok","cost_type":"per_unit","unit_cost":3}`, h.idemKey("setup-rule")...); r.status != 201 {
		t.Fatalf("rule: %d %s", r.status, r.body)
	}
	grant := func(extra string) string { return `{"credits":100,"source":"manual","reason":"r"` + extra + `}` }
	deepMatch := `{"credits":1,"source":"manual","reason":"r","duration_seconds":60,"stack_after":{"metadata_match":` +
		strings.Repeat(`{"a":`, 1000) + "1" + strings.Repeat("}", 1000) + `}}`
	manyKeys := make([]string, 51)
	for i := range manyKeys {
		manyKeys[i] = `"k` + strconv.Itoa(i) + `":1`
	}
	reservation := "/v1/reservations/" + uuid.NewString() + "/commit"
	for i, tc := range []struct {
		name, method, uri, body string
		headers                 []string
		status                  int
		field                   string
	}{
		{"path NUL", "GET", "/v1/customers/%00", "", nil, 400, "id"},
		{"path bad UTF-8", "GET", "/v1/customers/%ff", "", nil, 400, "id"},
		{"path line feed", "GET", "/v1/customer-by-external-id/a%0Ab", "", nil, 400, "external_id"},
		{"path NUL on a write", "POST", "/v1/customers/%00/credits/grant", grant(""), nil, 400, "id"},
		{"search NUL", "GET", "/v1/customers?search=%00", "", nil, 400, "search"},
		{"search bad UTF-8", "GET", "/v1/customers?search=%ff", "", nil, 400, "search"},
		{"unknown query parameter NUL", "GET", "/v1/customers?zzz=%00", "", nil, 400, "zzz"},
		{"history type NUL", "GET", "/v1/customers/c1/credits/history?type=%00", "", nil, 400, "type"},
		{"history from year 0", "GET", "/v1/customers/c1/credits/history?from=0000-01-01T00:00:00%2B23:59", "", nil, 400, "from"},
		{"history to year 10000", "GET", "/v1/customers/c1/credits/history?to=9999-12-31T23:59:59-01:00", "", nil, 400, "to"},
		{"overage from year 0", "GET", "/v1/customers/c1/overage?from=0000-01-01T00:00:00%2B23:59&to=2030-01-01T00:00:00Z", "", nil, 400, "from"},
		{"check customer NUL", "GET", "/v1/entitlements/check?customer_id=x%00&billable_metric_key=tok&units=1", "", nil, 400, "customer_id"},
		{"check path metric bad UTF-8", "GET", "/v1/customers/c1/entitlements/%fe", "", nil, 400, "metric"},
		{"Idempotency-Key bad UTF-8", "POST", "/v1/customers", `{"external_id":"k1"}`, []string{"Idempotency-Key", "k\xff"}, 400, "Idempotency-Key"},

		{"external_id NUL", "POST", "/v1/customers", `{"external_id":"x\u0000"}`, nil, 400, "external_id"},
		{"external_id line feed", "POST", "/v1/customers", `{"external_id":"x\ny"}`, nil, 400, "external_id"},
		{"customer metadata NUL", "POST", "/v1/customers", `{"external_id":"m1","metadata":{"a":"\u0000"}}`, nil, 400, "metadata.a"},
		{"customer metadata 51 keys", "POST", "/v1/customers", `{"external_id":"m2","metadata":{` + strings.Join(manyKeys, ",") + `}}`, nil, 422, "metadata"},
		{"grant metadata NUL", "POST", "/v1/customers/poison1/credits/grant", grant(`,"metadata":{"a":"\u0000"}`), nil, 400, "metadata.a"},
		{"grant metadata bad UTF-8", "POST", "/v1/customers/poison1/credits/grant", grant(`,"metadata":{"a":"` + "\xff" + `"}`), nil, 400, "metadata.a"},
		{"grant metadata lone surrogate", "POST", "/v1/customers/poison1/credits/grant", grant(`,"metadata":{"a":"\ud800"}`), nil, 400, "metadata.a"},
		{"grant metadata huge number", "POST", "/v1/customers/poison1/credits/grant", grant(`,"metadata":{"a":1e999999}`), nil, 422, "metadata.a"},
		{"grant metadata tiny number", "POST", "/v1/customers/poison1/credits/grant", grant(`,"metadata":{"a":1e-999999}`), nil, 422, "metadata.a"},
		{"grant metadata long string", "POST", "/v1/customers/poison1/credits/grant", grant(`,"metadata":{"a":"` + strings.Repeat("x", 501) + `"}`), nil, 422, "metadata.a"},
		{"grant reason NUL", "POST", "/v1/customers/poison1/credits/grant", `{"credits":1,"source":"manual","reason":"r\u0000"}`, nil, 400, "reason"},
		{"grant duplicate key", "POST", "/v1/customers/poison1/credits/grant", `{"credits":1,"credits":2,"source":"manual","reason":"r"}`, nil, 400, "credits"},
		{"grant case-folded key", "POST", "/v1/customers/poison1/credits/grant", grant(`,"CREDITS":-100`), nil, 400, "CREDITS"},
		{"grant expires year 10000", "POST", "/v1/customers/poison1/credits/grant", grant(`,"expires_at":"9999-12-31T23:59:59-01:00"`), nil, 400, "expires_at"},
		{"grant metadata_match 1000 deep", "POST", "/v1/customers/poison1/credits/grant", deepMatch, nil, 400, "stack_after.metadata_match" + strings.Repeat(".a", 30)},
		{"grant metadata_match too deep for metadata", "POST", "/v1/customers/poison1/credits/grant",
			`{"credits":1,"source":"manual","reason":"r","duration_seconds":60,"stack_after":{"metadata_match":{"a":{"b":{"c":{"d":{"e":{}}}}}}}}`, nil, 400, "stack_after.metadata_match.a.b.c.d.e"},
		{"adjust metadata NUL", "POST", "/v1/customers/c1/credits/adjust", `{"delta":5,"source":"manual","reason":"r","metadata":{"a":"\u0000"}}`, nil, 400, "metadata.a"},
		{"topup payment_reference NUL", "POST", "/v1/customers/c1/topups", `{"credits":5,"payment_reference":"p\u0000"}`, nil, 400, "payment_reference"},
		{"consume customer NUL", "POST", "/v1/entitlements/consume", `{"customer_id":"x\u0000","billable_metric_key":"tok","units":1}`, nil, 400, "customer_id"},
		{"consume case-folded units", "POST", "/v1/entitlements/consume", `{"customer_id":"c1","billable_metric_key":"tok","units":1,"UNITS":-100}`, nil, 400, "UNITS"},
		{"usage event_id NUL", "POST", "/v1/usage", `{"events":[{"event_id":"e\u0000","customer_id":"c1","billable_metric_key":"tok","units":1}]}`, nil, 400, "events[0].event_id"},
		{"usage customer NUL", "POST", "/v1/usage", `{"events":[{"event_id":"e1","customer_id":"c1","billable_metric_key":"tok","units":1},{"event_id":"e2","customer_id":"x\u0000","billable_metric_key":"tok","units":1}]}`, nil, 400, "events[1].customer_id"},
		{"commit metadata NUL", "POST", reservation, `{"actual_units":1,"metadata":{"a":"\u0000"}}`, nil, 400, "metadata.a"},
		{"reserve metadata duplicate", "POST", "/v1/reservations", `{"customer_id":"c1","billable_metric_key":"tok","estimated_units":1,"metadata":{"a":1,"a":2}}`, nil, 400, "metadata.a"},
		{"tenant body NUL", "PATCH", "/v1/tenant", `{"default_overage_policy":"block\u0000"}`, nil, 400, "default_overage_policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			headers := h.key()
			if tc.method != "GET" {
				headers = h.idemKey("hostile-" + strconv.Itoa(i))
			}
			headers = append(headers, tc.headers...)
			r := h.do(tc.method, tc.uri, tc.body, headers...)
			typ := "bad-request"
			if tc.status == 422 {
				typ = "validation-error"
			}
			wantProblem(t, r, tc.status, typ, tc.field)
		})
	}
	if n := len(h.dir.customers); n != 1 {
		t.Fatalf("hostile input created customers: %d, want only c1", n)
	}
	if n := h.blocks.grants.Load(); n != 0 {
		t.Fatalf("hostile input reached the block store %d times", n)
	}
}

// TestMetadataStoredCanonically: accepted metadata comes back in canonical
// form (sorted, compact, numbers as written, line breaks kept), and a
// merge past the key limit is a 422 that changes nothing.
func TestMetadataStoredCanonically(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.do("POST", "/v1/customers", `{"external_id":"m","metadata":{ "z" : [ 1.50 , {"y":"a\nb","x":null} ], "a":"<&>" }}`, h.idemKey("m1")...)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	if want := `"metadata":{"a":"\u003c\u0026\u003e","z":[1.50,{"x":null,"y":"a\nb"}]}`; !strings.Contains(string(r.body), want) {
		t.Fatalf("body %s does not hold %s", r.body, want)
	}
	half := func(from int) string {
		parts := make([]string, 30)
		for i := range parts {
			parts[i] = `"k` + strconv.Itoa(from+i) + `":1`
		}
		return `{"metadata":{` + strings.Join(parts, ",") + `}}`
	}
	if r := h.do("PATCH", "/v1/customers/m", half(0), h.idemKey("m2")...); r.status != 200 {
		t.Fatalf("first patch: %d %s", r.status, r.body)
	}
	wantProblem(t, h.do("PATCH", "/v1/customers/m", half(30), h.idemKey("m3")...), 422, "validation-error", "metadata")
	got := h.do("GET", "/v1/customers/m", "", h.key()...).json()
	if n := len(got["metadata"].(map[string]any)); n != 32 {
		t.Fatalf("metadata keys after a refused merge = %d, want 32", n)
	}
}
