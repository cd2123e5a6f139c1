package api

import (
	"strings"
	"testing"
)

// TestCustomerCRUD walks a customer through both path forms and checks each
// status code, including 204 deletes and 404 after deletion.
func TestCustomerCRUD(t *testing.T) {
	t.Parallel()
	h := setup(t)
	created := h.do("POST", "/v1/customers", `{"external_id":"acme/42","display_name":"Acme","metadata":{"plan":"pro","n":12345678901234567890}}`, h.idemKey("c-1")...)
	if created.status != 201 {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	c := created.json()
	id := c["id"].(string)
	if c["external_id"] != "acme/42" || c["environment"] != "live" || !strings.Contains(string(created.body), `"n":12345678901234567890`) {
		t.Fatalf("created customer: %s", created.body)
	}
	steps := []struct {
		name, method, uri, body, key string
		status                       int
		typ, field                   string
	}{
		{"get by id", "GET", "/v1/customers/" + id, "", "", 200, "", ""},
		{"get lenient by external id", "GET", "/v1/customers/acme%2F42", "", "", 200, "", ""},
		{"get strict", "GET", "/v1/customer-by-external-id/acme%2F42", "", "", 200, "", ""},
		{"strict does not take the uuid", "GET", "/v1/customer-by-external-id/" + id, "", "", 404, "not-found", ""},
		{"bad escape", "GET", "/v1/customers/%zz", "", "", 404, "not-found", ""},
		{"duplicate", "POST", "/v1/customers", `{"external_id":"acme/42"}`, "c-2", 409, "conflict", "external_id"},
		{"long name", "POST", "/v1/customers", `{"external_id":"x","display_name":"` + strings.Repeat("n", 201) + `"}`, "c-3", 422, "validation-error", "display_name"},
		{"patch", "PATCH", "/v1/customers/" + id, `{"display_name":"Acme Inc","metadata":{"tier":"gold"}}`, "p-1", 200, "", ""},
		{"patch strict", "PATCH", "/v1/customer-by-external-id/acme%2F42", `{"overage_policy":"allow"}`, "p-2", 200, "", ""},
		{"patch bad policy", "PATCH", "/v1/customers/" + id, `{"overage_policy":"sometimes"}`, "p-3", 422, "validation-error", "overage_policy"},
		{"patch unknown", "PATCH", "/v1/customers/nobody", `{"display_name":"x"}`, "p-4", 404, "not-found", ""},
		{"delete strict unknown", "DELETE", "/v1/customer-by-external-id/nobody", "", "", 404, "not-found", ""},
		{"delete", "DELETE", "/v1/customers/" + id, "", "", 204, "", ""},
		{"delete again", "DELETE", "/v1/customers/" + id, "", "", 404, "not-found", ""},
		{"get deleted", "GET", "/v1/customers/" + id, "", "", 404, "not-found", ""},
		{"recreate", "POST", "/v1/customers", `{"external_id":"acme/42"}`, "c-4", 201, "", ""},
		{"delete strict", "DELETE", "/v1/customer-by-external-id/acme%2F42", "", "", 204, "", ""},
	}
	for _, st := range steps {
		hdr := h.key()
		if st.key != "" {
			hdr = h.idemKey(st.key)
		}
		r := h.do(st.method, st.uri, st.body, hdr...)
		if st.typ != "" {
			wantProblem(t, r, st.status, st.typ, st.field)
			continue
		}
		if r.status != st.status {
			t.Fatalf("%s: %d %s", st.name, r.status, r.body)
		}
		if st.status == 204 && len(r.body) != 0 {
			t.Fatalf("%s: 204 with body %q", st.name, r.body)
		}
		if st.name == "patch" {
			m := r.json()
			meta := m["metadata"].(map[string]any)
			if m["display_name"] != "Acme Inc" || meta["plan"] != "pro" || meta["tier"] != "gold" {
				t.Fatalf("patch merged wrong: %s", r.body)
			}
		}
	}
	// Sandbox is another world.
	if r := h.do("GET", "/v1/customers/acme%2F42", "", "X-API-Key", h.sandbox); r.status != 404 {
		t.Fatalf("sandbox sees live customer: %d", r.status)
	}
}

// TestCustomerPages: list pages newest first with the envelope of Common
// rules 2; data is [] and next_cursor null when empty.
func TestCustomerPages(t *testing.T) {
	t.Parallel()
	h := setup(t)
	empty := h.do("GET", "/v1/customers", "", h.key()...)
	if empty.status != 200 || !strings.Contains(string(empty.body), `"data":[]`) || !strings.Contains(string(empty.body), `"next_cursor":null`) {
		t.Fatalf("empty list: %s", empty.body)
	}
	for _, ext := range []string{"a", "b", "c"} {
		if r := h.do("POST", "/v1/customers", `{"external_id":"`+ext+`"}`, h.idemKey("mk-"+ext)...); r.status != 201 {
			t.Fatal(r.status)
		}
	}
	p1 := h.do("GET", "/v1/customers?limit=2", "", h.key()...).json()
	pg := p1["pagination"].(map[string]any)
	data := p1["data"].([]any)
	if len(data) != 2 || pg["has_more"] != true || data[0].(map[string]any)["external_id"] != "c" {
		t.Fatalf("page 1: %v", p1)
	}
	p2 := h.do("GET", "/v1/customers?limit=2&cursor="+pg["next_cursor"].(string), "", h.key()...).json()
	pg2 := p2["pagination"].(map[string]any)
	if len(p2["data"].([]any)) != 1 || pg2["has_more"] != false || pg2["next_cursor"] != nil {
		t.Fatalf("page 2: %v", p2)
	}
	if s := h.do("GET", "/v1/customers?search=b", "", h.key()...).json(); len(s["data"].([]any)) != 1 {
		t.Fatalf("search: %v", s)
	}
}

// TestCredits covers balance, grant, adjust, history and overage statuses.
func TestCredits(t *testing.T) {
	t.Parallel()
	h := setup(t)
	g := h.do("POST", "/v1/customers/new-cust/credits/grant", `{"credits":5000,"source":"promotional","reason":"welcome","priority":3,"duration_seconds":3600}`, h.idemKey("g1")...)
	if g.status != 201 {
		t.Fatalf("grant: %d %s", g.status, g.body)
	}
	gb := g.json()
	if gb["transaction"].(map[string]any)["delta"] != float64(5000) || gb["block"].(map[string]any)["priority"] != float64(3) || gb["account"].(map[string]any)["balance"] != float64(5000) {
		t.Fatalf("grant body: %s", g.body)
	}
	steps := []struct {
		name, method, uri, body, key string
		status                       int
		typ, field                   string
	}{
		{"strict grant unknown", "POST", "/v1/customer-by-external-id/ghost/credits/grant", grantBody, "g2", 404, "not-found", ""},
		{"strict grant", "POST", "/v1/customer-by-external-id/new-cust/credits/grant", grantBody, "g3", 201, "", ""},
		{"grant both expiries", "POST", "/v1/customers/new-cust/credits/grant", `{"credits":1,"source":"manual","reason":"r","duration_seconds":5,"expires_at":"2031-01-01T00:00:00Z"}`, "g4", 422, "validation-error", "expires_at"},
		{"grant bad source", "POST", "/v1/customers/new-cust/credits/grant", `{"credits":1,"source":"gift","reason":"r"}`, "g5", 422, "validation-error", "source"},
		{"adjust up", "POST", "/v1/customers/new-cust/credits/adjust", `{"delta":1000,"source":"compensation","reason":"sorry"}`, "a1", 200, "", ""},
		{"adjust down", "POST", "/v1/customer-by-external-id/new-cust/credits/adjust", `{"delta":-2000,"source":"manual","reason":"fix"}`, "a2", 200, "", ""},
		{"adjust too far", "POST", "/v1/customers/new-cust/credits/adjust", `{"delta":-1000000,"source":"manual","reason":"fix"}`, "a3", 409, "insufficient-credits", ""},
		{"adjust zero", "POST", "/v1/customers/new-cust/credits/adjust", `{"delta":0,"source":"manual","reason":"fix"}`, "a4", 422, "validation-error", "delta"},
		{"adjust unknown", "POST", "/v1/customers/ghost/credits/adjust", `{"delta":5,"source":"manual","reason":"fix"}`, "a5", 404, "not-found", ""},
		{"balance", "GET", "/v1/customers/new-cust/credits", "", "", 200, "", ""},
		{"balance strict unknown", "GET", "/v1/customer-by-external-id/ghost/credits", "", "", 404, "not-found", ""},
		{"history", "GET", "/v1/customers/new-cust/credits/history?limit=2", "", "", 200, "", ""},
		{"history bad from", "GET", "/v1/customers/new-cust/credits/history?from=yesterday", "", "", 400, "bad-request", "from"},
		{"history unknown", "GET", "/v1/customers/ghost/credits/history", "", "", 404, "not-found", ""},
		{"overage", "GET", "/v1/customers/new-cust/overage?from=2030-01-01T00:00:00Z&to=2030-02-01T00:00:00Z", "", "", 200, "", ""},
		{"overage missing from", "GET", "/v1/customers/new-cust/overage?to=2030-02-01T00:00:00Z", "", "", 422, "validation-error", "from"},
		{"overage reversed", "GET", "/v1/customers/new-cust/overage?from=2030-02-01T00:00:00Z&to=2030-01-01T00:00:00Z", "", "", 422, "validation-error", "to"},
	}
	for _, st := range steps {
		hdr := h.key()
		if st.key != "" {
			hdr = h.idemKey(st.key)
		}
		r := h.do(st.method, st.uri, st.body, hdr...)
		if st.typ != "" {
			t.Run(st.name, func(t *testing.T) { wantProblem(t, r, st.status, st.typ, st.field) })
			continue
		}
		if r.status != st.status {
			t.Fatalf("%s: %d %s", st.name, r.status, r.body)
		}
		switch st.name {
		case "adjust down":
			if b := r.json(); b["block"] != nil || len(b["transactions"].([]any)) == 0 {
				t.Fatalf("adjust down body: %s", r.body)
			}
		case "balance":
			b := r.json()
			if b["balance"] != float64(5000+5000+1000-2000) || len(b["blocks"].([]any)) != 0 {
				t.Fatalf("balance body: %s", r.body)
			}
		case "history":
			b := r.json()
			if len(b["data"].([]any)) != 2 || b["pagination"].(map[string]any)["has_more"] != true {
				t.Fatalf("history body: %s", r.body)
			}
		case "overage":
			if b := r.json(); b["total_overage_mc"] != float64(1500) {
				t.Fatalf("overage body: %s", r.body)
			}
		}
	}
	withBlocks := h.do("GET", "/v1/customers/new-cust/credits?include_blocks=true", "", h.key()...).json()
	if n := len(withBlocks["blocks"].([]any)); n != 3 {
		t.Fatalf("include_blocks: %d blocks, want 3", n)
	}
}

// TestTenantConfig: GET and PATCH /v1/tenant with the key's tenant.
func TestTenantConfig(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.do("GET", "/v1/tenant", "", h.key()...)
	if b := r.json(); r.status != 200 || b["id"] != h.tenant.String() || b["default_overage_policy"] != "block" || b["rate_limit_per_second"] != float64(1000) {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	p := h.do("PATCH", "/v1/tenant", `{"default_overage_policy":"notify","default_low_balance_threshold_mc":500}`, h.idemKey("t-1")...)
	if b := p.json(); p.status != 200 || b["default_overage_policy"] != "notify" || b["default_low_balance_threshold_mc"] != float64(500) {
		t.Fatalf("patch: %d %s", p.status, p.body)
	}
	wantProblem(t, h.do("PATCH", "/v1/tenant", `{"default_low_balance_threshold_mc":-1}`, h.idemKey("t-2")...), 422, "validation-error", "default_low_balance_threshold_mc")
	if b := h.do("GET", "/v1/tenant", "", h.key()...).json(); b["default_overage_policy"] != "notify" {
		t.Fatalf("get after patch: %v", b)
	}
}
