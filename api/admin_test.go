package api

import (
	"strings"
	"testing"
)

// TestAdminAuth: the operator API wants the exact bearer token and is
// absent (404) when no token is configured; tenant keys do not open it.
func TestAdminAuth(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for _, tc := range []struct {
		name    string
		headers []string
	}{
		{"no header", nil},
		{"wrong token", []string{"Authorization", "Bearer wrong"}},
		{"prefix of token", []string{"Authorization", "Bearer " + testAdminToken[:5]}},
		{"basic scheme", []string{"Authorization", "Basic " + testAdminToken}},
		{"api key", []string{"X-API-Key", h.live}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do("GET", "/admin/v1/tenants/"+h.tenant.String(), "", tc.headers...)
			wantProblem(t, r, 401, "unauthorized", "")
			if r.get("WWW-Authenticate") == "" {
				t.Fatal("401 without WWW-Authenticate")
			}
		})
	}
	off := setup(t, func(c *Config) { c.AdminToken = "" })
	wantProblem(t, off.do("POST", "/admin/v1/tenants", `{"name":"x"}`, admin()...), 404, "not-found", "")
	for _, rt := range off.srv.Routes() {
		if strings.Contains(rt, "/admin/") {
			t.Fatalf("admin route %s registered without a token", rt)
		}
	}
}

// TestAdminOperations walks the operator surface of docs/spec/addendum.md §1.
func TestAdminOperations(t *testing.T) {
	t.Parallel()
	h := setup(t)
	created := h.do("POST", "/admin/v1/tenants", `{"name":"Globex"}`, admin()...)
	if created.status != 201 {
		t.Fatalf("create tenant: %d %s", created.status, created.body)
	}
	body := created.json()
	tenantID := body["tenant"].(map[string]any)["id"].(string)
	keys := body["api_keys"].(map[string]any)
	if !strings.HasPrefix(keys["live"].(string), "ck_live_") || !strings.HasPrefix(keys["sandbox"].(string), "ck_test_") {
		t.Fatalf("keys: %v", keys)
	}
	if r := h.do("GET", "/v1/tenant", "", "X-API-Key", keys["live"].(string)); r.status != 200 || r.json()["name"] != "Globex" {
		t.Fatalf("new key does not authenticate: %d %s", r.status, r.body)
	}
	base := "/admin/v1/tenants/" + tenantID

	key := h.do("POST", base+"/api-keys", `{"environment":"sandbox"}`, admin()...)
	kb := key.json()
	if key.status != 201 || kb["environment"] != "sandbox" || !strings.HasPrefix(kb["key"].(string), "ck_test_") || kb["id"] == nil || kb["created_at"] == nil || len(kb) != 4 {
		t.Fatalf("create key: %d %s", key.status, key.body)
	}
	if r := h.do("GET", "/v1/tenant", "", "X-API-Key", kb["key"].(string)); r.status != 200 {
		t.Fatalf("issued key: %d", r.status)
	}
	if r := h.do("DELETE", base+"/api-keys/"+kb["id"].(string), "", admin()...); r.status != 204 || len(r.body) != 0 {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	wantProblem(t, h.do("GET", "/v1/tenant", "", "X-API-Key", kb["key"].(string)), 401, "unauthorized", "")

	wh := h.do("PUT", base+"/webhook", `{"url":"http://127.0.0.1:9/hook"}`, admin()...)
	whb := wh.json()
	if wh.status != 200 || whb["url"] != "http://127.0.0.1:9/hook" || !strings.HasPrefix(whb["secret"].(string), "whsec_") {
		t.Fatalf("set webhook: %d %s", wh.status, wh.body)
	}
	rot := h.do("POST", base+"/webhook/rotate-secret", "", admin()...)
	if rot.status != 200 || rot.json()["secret"] == whb["secret"] {
		t.Fatalf("rotate: %d %s", rot.status, rot.body)
	}
	if r := h.do("DELETE", base+"/webhook", "", admin()...); r.status != 204 {
		t.Fatalf("delete webhook: %d %s", r.status, r.body)
	}
	patched := h.do("PATCH", base, `{"rate_limit_per_second":5,"rate_limit_burst":7}`, admin()...)
	if pb := patched.json(); patched.status != 200 || pb["rate_limit_per_second"] != float64(5) || pb["rate_limit_burst"] != float64(7) || pb["webhook_url"] != nil {
		t.Fatalf("patch: %d %s", patched.status, patched.body)
	}
	if g := h.do("GET", base, "", admin()...); g.status != 200 || g.json()["rate_limit_burst"] != float64(7) {
		t.Fatalf("get: %d %s", g.status, g.body)
	}

	for _, tc := range []struct {
		name, method, uri, body string
		status                  int
		typ, field              string
	}{
		{"missing name", "POST", "/admin/v1/tenants", `{}`, 422, "validation-error", "name"},
		{"name wrong type", "POST", "/admin/v1/tenants", `{"name":1}`, 422, "validation-error", "name"},
		{"unparseable", "POST", "/admin/v1/tenants", `{`, 400, "bad-request", ""},
		{"bad uuid", "GET", "/admin/v1/tenants/not-a-uuid", "", 404, "not-found", ""},
		{"unknown tenant", "GET", "/admin/v1/tenants/00000000-0000-7000-8000-000000000000", "", 404, "not-found", ""},
		{"bad key uuid", "DELETE", base + "/api-keys/nope", "", 404, "not-found", ""},
		{"unknown key", "DELETE", base + "/api-keys/00000000-0000-7000-8000-000000000000", "", 404, "not-found", ""},
		{"bad environment", "POST", base + "/api-keys", `{"environment":"prod"}`, 422, "validation-error", "environment"},
		{"missing environment", "POST", base + "/api-keys", `{}`, 422, "validation-error", "environment"},
		{"missing url", "PUT", base + "/webhook", `{}`, 422, "validation-error", "url"},
		{"bad url", "PUT", base + "/webhook", `{"url":"ftp://x"}`, 422, "validation-error", "url"},
		{"rate too low", "PATCH", base, `{"rate_limit_per_second":0}`, 422, "validation-error", "rate_limit_per_second"},
		{"rate not int", "PATCH", base, `{"rate_limit_burst":"many"}`, 422, "validation-error", "rate_limit_burst"},
		{"rotate unknown", "POST", "/admin/v1/tenants/00000000-0000-7000-8000-000000000000/webhook/rotate-secret", "", 404, "not-found", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantProblem(t, h.do(tc.method, tc.uri, tc.body, admin()...), tc.status, tc.typ, tc.field)
		})
	}
}

// TestAdminLists: GET /admin/v1/tenants pages every tenant oldest first
// with the tenant API's envelope, and GET .../api-keys lists a tenant's
// keys without their text, revoked ones with revoked_at.
func TestAdminLists(t *testing.T) {
	t.Parallel()
	h := setup(t)
	var ids []string
	for _, name := range []string{"One", "Two", "Three"} {
		r := h.do("POST", "/admin/v1/tenants", `{"name":"`+name+`"}`, admin()...)
		if r.status != 201 {
			t.Fatalf("create tenant: %d %s", r.status, r.body)
		}
		ids = append(ids, r.json()["tenant"].(map[string]any)["id"].(string))
	}
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		r := h.do("GET", "/admin/v1/tenants?limit=2"+cursor, "", admin()...)
		if r.status != 200 {
			t.Fatalf("list: %d %s", r.status, r.body)
		}
		b := r.json()
		for _, d := range b["data"].([]any) {
			seen[d.(map[string]any)["id"].(string)] = true
		}
		pg := b["pagination"].(map[string]any)
		if pg["has_more"] != true {
			if pg["next_cursor"] != nil {
				t.Errorf("last page has a next_cursor: %v", pg["next_cursor"])
			}
			break
		}
		if pages > 3 {
			t.Fatal("the list does not end")
		}
		cursor = "&cursor=" + pg["next_cursor"].(string)
	}
	for _, id := range ids {
		if !seen[id] {
			t.Errorf("tenant %s missing from the list", id)
		}
	}
	base := "/admin/v1/tenants/" + ids[0]
	key := h.do("POST", base+"/api-keys", `{"environment":"sandbox"}`, admin()...).json()
	h.do("DELETE", base+"/api-keys/"+key["id"].(string), "", admin()...)
	r := h.do("GET", base+"/api-keys", "", admin()...)
	if r.status != 200 {
		t.Fatalf("list keys: %d %s", r.status, r.body)
	}
	keys := r.json()["data"].([]any)
	if len(keys) != 3 {
		t.Fatalf("%d keys, want the 2 of the tenant's creation and the revoked one", len(keys))
	}
	revoked := 0
	for _, k := range keys {
		m := k.(map[string]any)
		if _, ok := m["key"]; ok {
			t.Errorf("a listed key shows its text: %v", m)
		}
		if m["revoked_at"] != nil {
			revoked++
		}
	}
	if revoked != 1 {
		t.Errorf("%d revoked keys listed, want 1", revoked)
	}
	wantProblem(t, h.do("GET", "/admin/v1/tenants?cursor=nope", "", admin()...), 400, "bad-request", "cursor")
	wantProblem(t, h.do("GET", "/admin/v1/tenants?limit=0", "", admin()...), 400, "bad-request", "limit")
	wantProblem(t, h.do("GET", "/admin/v1/tenants/00000000-0000-7000-8000-000000000000/api-keys", "", admin()...), 404, "not-found", "")
	wantProblem(t, h.do("GET", "/admin/v1/tenants", ""), 401, "unauthorized", "")
}
