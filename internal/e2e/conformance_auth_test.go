package e2e

import (
	"encoding/base64"
	"regexp"
	"strings"
	"testing"
)

var (
	liveKeyRE    = regexp.MustCompile(`^ck_live_[0-9A-Za-z]{32,}$`)
	sandboxKeyRE = regexp.MustCompile(`^ck_test_[0-9A-Za-z]{32,}$`)
)

// TestConformanceAuthRejects: docs/spec/interface.md Authentication 3 "Missing or
// invalid authentication returns 401", as an docs/spec/addendum.md §3 problem of type
// `unauthorized`, on reads and writes alike, with X-Request-Id.
func TestConformanceAuthRejects(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("auth"))
	id, _ := s.as(t, tn.Live).newCustomer()

	cases := []struct {
		name, key, method, path string
	}{
		{"missing key, list", "", "GET", "/v1/customers"},
		{"missing key, create", "", "POST", "/v1/customers"},
		{"garbage key", "not-a-key", "GET", "/v1/customers"},
		{"well-formed unknown live key", "ck_live_" + strings.Repeat("A", 40), "GET", "/v1/customers/" + id},
		{"well-formed unknown test key", "ck_test_" + strings.Repeat("z", 32), "GET", "/v1/tenant"},
		{"key of right tenant with a suffix", tn.Live + "x", "GET", "/v1/customers/" + id},
		{"bearer instead of X-API-Key", "", "GET", "/v1/tenant"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			extra := []string{}
			if tc.name == "bearer instead of X-API-Key" {
				extra = append(extra, "Authorization", "Bearer "+tn.Live)
			}
			var body any
			if tc.method == "POST" {
				body = map[string]any{"external_id": uniq("x")}
			}
			r := s.as(t, tc.key).do(tc.method, tc.path, idemKey(), body, extra...)
			checkProblem(t, r, 401, "unauthorized", "", tc.name)
			if r.Header.Get("X-Request-Id") == "" {
				t.Errorf("%s: no X-Request-Id", tc.name)
			}
		})
	}
	// Nothing was created by the refused POST.
	r := s.as(t, tn.Live).get("/v1/customers")
	wantStatus(t, r, 200, "list")
	if data, _, _ := page(t, r); len(data) != 1 {
		t.Errorf("refused POSTs created customers: %d in list, want 1", len(data))
	}
}

// TestConformanceRequestID: docs/spec/addendum.md §3 "Every response carries X-Request-Id",
// whatever its status, and two requests get two ids.
func TestConformanceRequestID(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("reqid"))
	a := s.as(t, tn.Live)
	seen := map[string]bool{}
	for _, tc := range []struct {
		name string
		r    Response
	}{
		{"200", a.get("/v1/customers")},
		{"201", a.post("/v1/customers", map[string]any{"external_id": uniq("c")})},
		{"400", a.post("/v1/customers", "{not json")},
		{"401", s.as(t, "").get("/v1/customers")},
		{"404", a.get("/v1/customers/nobody-here")},
		{"422", a.post("/v1/customers", map[string]any{})},
		{"admin 401", adminCall(t, s, "wrong", "POST", "/admin/v1/tenants", map[string]any{"name": "x"})},
		{"healthz", s.as(t, "").get("/healthz")},
		{"unknown path", a.get("/v1/no-such-thing")},
	} {
		id := tc.r.Header.Get("X-Request-Id")
		if id == "" {
			t.Errorf("%s (status %d): no X-Request-Id header", tc.name, tc.r.Status)
			continue
		}
		if seen[id] {
			t.Errorf("%s: X-Request-Id %q repeated", tc.name, id)
		}
		seen[id] = true
	}
}

// TestConformanceEnvironmentsSeparate: Authentication 2 (the key decides the
// environment) and invariant 8 (sandbox and live never see each other);
// docs/spec/addendum.md §12: external_id is unique per tenant and environment.
func TestConformanceEnvironmentsSeparate(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("envs"))
	live, sandbox := s.as(t, tn.Live), s.as(t, tn.Sandbox)
	ext := uniq("shared")
	lc := live.createCustomer(map[string]any{"external_id": ext})
	if lc["environment"] != "live" {
		t.Errorf("live key created a customer in environment %v", lc["environment"])
	}
	lid := lc["id"].(string)

	checkProblem(t, sandbox.get("/v1/customers/"+lid), 404, "not-found", "", "sandbox GET live customer by UUID")
	checkProblem(t, sandbox.get("/v1/customers/"+ext), 404, "not-found", "", "sandbox GET live customer by external id")
	checkProblem(t, sandbox.get("/v1/customers/"+lid+"/credits"), 404, "not-found", "", "sandbox GET live customer's credits")
	r := sandbox.get("/v1/customers")
	wantStatus(t, r, 200, "sandbox list")
	if data, _, _ := page(t, r); len(data) != 0 {
		t.Errorf("sandbox list shows %d customers, want 0: %s", len(data), r.Raw)
	}

	sc := sandbox.createCustomer(map[string]any{"external_id": ext})
	if sc["environment"] != "sandbox" {
		t.Errorf("sandbox key created a customer in environment %v", sc["environment"])
	}
	if sc["id"] == lid {
		t.Errorf("sandbox and live customers share id %v", lid)
	}
	// Money in one environment is invisible in the other.
	live.grant(ext, map[string]any{"credits": 5000})
	if got := sandbox.balance(ext); got != 0 {
		t.Errorf("sandbox balance after a live grant = %d, want 0", got)
	}
	if got := live.balance(ext); got != 5000 {
		t.Errorf("live balance = %d, want 5000", got)
	}
	// docs/decisions.md: a UUID of the other environment is treated like
	// another tenant's: 400 where auto-create applies.
	checkProblem(t, sandbox.post("/v1/customers/"+lid+"/credits/grant",
		map[string]any{"credits": 1, "source": "manual", "reason": "x"}), 400, "bad-request", "", "sandbox grant by live UUID")
	if got := live.balance(lid); got != 5000 {
		t.Errorf("live balance after refused cross-env grant = %d, want 5000", got)
	}
}

// TestConformanceTenantIsolation: invariant 8 and Common rules 5: tenant A's
// key never sees tenant B's customer (404), and a grant naming B's customer
// UUID with A's key is a 400 that creates nothing anywhere.
func TestConformanceTenantIsolation(t *testing.T) {
	s := NewStack(t)
	ta, tb := s.NewTenant(uniq("a")), s.NewTenant(uniq("b"))
	a, b := s.as(t, ta.Live), s.as(t, tb.Live)
	bid, bext := b.newCustomer()
	b.grant(bid, map[string]any{"credits": 7000})

	for _, tc := range []struct{ name, method, path string }{
		{"get by UUID", "GET", "/v1/customers/" + bid},
		{"get by external id", "GET", "/v1/customers/" + bext},
		{"strict get", "GET", "/v1/customer-by-external-id/" + bext},
		{"credits", "GET", "/v1/customers/" + bid + "/credits"},
		{"history", "GET", "/v1/customers/" + bid + "/credits/history"},
		{"overage", "GET", "/v1/customers/" + bid + "/overage?from=2020-01-01T00:00:00Z&to=2030-01-01T00:00:00Z"},
		{"delete", "DELETE", "/v1/customers/" + bid},
	} {
		checkProblem(t, a.do(tc.method, tc.path, "", nil), 404, "not-found", "", "tenant A "+tc.name)
	}
	checkProblem(t, a.patch("/v1/customers/"+bid, map[string]any{"display_name": "hijack"}), 404, "not-found", "", "tenant A patch")
	// docs/spec/interface.md lists "400 cross-tenant customer_id" for adjust as for grant.
	checkProblem(t, a.post("/v1/customers/"+bid+"/credits/adjust",
		map[string]any{"delta": -1000, "source": "manual", "reason": "x"}), 400, "bad-request", "customer_id", "tenant A adjust")

	r := a.post("/v1/customers/"+bid+"/credits/grant", map[string]any{"credits": 1000, "source": "manual", "reason": "x"})
	checkProblem(t, r, 400, "bad-request", "", "tenant A grant by tenant B's UUID")

	// Nothing was created in A, nothing changed in B.
	lr := a.get("/v1/customers")
	wantStatus(t, lr, 200, "A list")
	if data, _, _ := page(t, lr); len(data) != 0 {
		t.Errorf("tenant A has %d customers after refused requests, want 0: %s", len(data), lr.Raw)
	}
	got := b.get("/v1/customers/" + bid)
	wantStatus(t, got, 200, "B get")
	if got.Body["display_name"] != nil {
		t.Errorf("tenant A's PATCH changed B's customer: %s", got.Raw)
	}
	if bal := b.balance(bid); bal != 7000 {
		t.Errorf("B balance %d, want 7000", bal)
	}
}

// TestConformanceAdminTenantsAndKeys: docs/spec/addendum.md §1 operator API: tenant and
// key shapes and formats, revocation at once, and the bearer token.
func TestConformanceAdminTenantsAndKeys(t *testing.T) {
	s := NewStack(t)
	name := uniq("admin")
	r := adminCall(t, s, AdminToken, "POST", "/admin/v1/tenants", map[string]any{"name": name})
	wantStatus(t, r, 201, "create tenant")
	tn := obj(t, r.Body["tenant"], "tenant")
	checkUUID(t, tn["id"], "tenant.id")
	if tn["name"] != name {
		t.Errorf("tenant.name %v, want %q", tn["name"], name)
	}
	checkTime(t, tn["created_at"], "tenant.created_at")
	keys := obj(t, r.Body["api_keys"], "api_keys")
	live, _ := keys["live"].(string)
	sandbox, _ := keys["sandbox"].(string)
	if !liveKeyRE.MatchString(live) {
		t.Errorf("live key %q does not match ck_live_ + 32+ base62", live)
	}
	if !sandboxKeyRE.MatchString(sandbox) {
		t.Errorf("sandbox key %q does not match ck_test_ + 32+ base62", sandbox)
	}
	tid := tn["id"].(string)
	wantStatus(t, s.as(t, live).get("/v1/tenant"), 200, "live key works")
	wantStatus(t, s.as(t, sandbox).get("/v1/tenant"), 200, "sandbox key works")

	// A second tenant's keys differ.
	r2 := adminCall(t, s, AdminToken, "POST", "/admin/v1/tenants", map[string]any{"name": uniq("admin2")})
	wantStatus(t, r2, 201, "second tenant")
	if obj(t, r2.Body["api_keys"], "keys")["live"] == live {
		t.Error("two tenants got the same live key")
	}

	g := adminCall(t, s, AdminToken, "GET", "/admin/v1/tenants/"+tid, nil)
	wantStatus(t, g, 200, "admin get tenant")
	if g.Body["id"] != tid && obj(t, g.Body["tenant"], "tenant")["id"] != tid {
		t.Errorf("admin get tenant does not show id %s: %s", tid, g.Raw)
	}

	for _, env := range []struct {
		env string
		re  *regexp.Regexp
	}{{"live", liveKeyRE}, {"sandbox", sandboxKeyRE}} {
		k := adminCall(t, s, AdminToken, "POST", "/admin/v1/tenants/"+tid+"/api-keys", map[string]any{"environment": env.env})
		wantStatus(t, k, 201, "create "+env.env+" key")
		checkUUID(t, k.Body["id"], "key id")
		checkTime(t, k.Body["created_at"], "key created_at")
		if k.Body["environment"] != env.env {
			t.Errorf("key environment %v, want %s", k.Body["environment"], env.env)
		}
		plain, _ := k.Body["key"].(string)
		if !env.re.MatchString(plain) {
			t.Errorf("new %s key %q has the wrong format", env.env, plain)
		}
		if plain == live || plain == sandbox {
			t.Errorf("new key repeats an old one")
		}
		// The new key works and reaches the same tenant.
		tr := s.as(t, plain).get("/v1/tenant")
		wantStatus(t, tr, 200, "new key GET /v1/tenant")
		if tr.Body["id"] != tid {
			t.Errorf("new key sees tenant %v, want %s", tr.Body["id"], tid)
		}
		// Revoke: 204, then 401 at once; the other keys keep working.
		wantStatus(t, adminCall(t, s, AdminToken, "DELETE", "/admin/v1/tenants/"+tid+"/api-keys/"+k.Body["id"].(string), nil), 204, "revoke")
		checkProblem(t, s.as(t, plain).get("/v1/tenant"), 401, "unauthorized", "", "revoked "+env.env+" key")
		wantStatus(t, s.as(t, live).get("/v1/tenant"), 200, "original live key after revoking another")
	}

	// Revoking a key in use right now (it is cached) also takes effect at once.
	wantStatus(t, s.as(t, sandbox).get("/v1/customers"), 200, "sandbox warm")
	lk := adminCall(t, s, AdminToken, "POST", "/admin/v1/tenants/"+tid+"/api-keys", map[string]any{"environment": "live"})
	wantStatus(t, lk, 201, "key to revoke warm")
	warm := lk.Body["key"].(string)
	wantStatus(t, s.as(t, warm).get("/v1/customers"), 200, "warm key used")
	wantStatus(t, adminCall(t, s, AdminToken, "DELETE", "/admin/v1/tenants/"+tid+"/api-keys/"+lk.Body["id"].(string), nil), 204, "revoke warm")
	checkProblem(t, s.as(t, warm).get("/v1/customers"), 401, "unauthorized", "", "revoked warm key")

	bad := adminCall(t, s, AdminToken, "POST", "/admin/v1/tenants/"+tid+"/api-keys", map[string]any{"environment": "staging"})
	checkProblem(t, bad, 422, "validation-error", "environment", "key with bad environment")

	ghost := "0190a5c4-0000-7000-8000-000000000001"
	checkProblem(t, adminCall(t, s, AdminToken, "POST", "/admin/v1/tenants/"+ghost+"/api-keys", map[string]any{"environment": "live"}), 404, "not-found", "", "key for unknown tenant")
	checkProblem(t, adminCall(t, s, AdminToken, "GET", "/admin/v1/tenants/"+ghost, nil), 404, "not-found", "", "get unknown tenant")
	checkProblem(t, adminCall(t, s, AdminToken, "POST", "/admin/v1/tenants", map[string]any{"name": ""}), 422, "validation-error", "name", "tenant without name")

	// Operator auth.
	for _, tc := range []struct{ name, token string }{{"wrong token", "not-the-token"}, {"no token", ""}, {"tenant key as token", live}} {
		r := adminCall(t, s, tc.token, "POST", "/admin/v1/tenants", map[string]any{"name": "nope"})
		checkProblem(t, r, 401, "unauthorized", "", "admin "+tc.name)
		r = adminCall(t, s, tc.token, "GET", "/admin/v1/tenants/"+tid, nil)
		checkProblem(t, r, 401, "unauthorized", "", "admin get "+tc.name)
	}
}

// TestConformanceAdminWebhook: docs/spec/addendum.md §1 webhook PUT/rotate/DELETE shapes;
// the secret is whsec_ + base64 of 32 bytes; docs/spec/addendum.md §2: /v1/tenant shows the
// URL read-only.
func TestConformanceAdminWebhook(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("hook"))
	base := "/admin/v1/tenants/" + tn.ID + "/webhook"
	hook := "http://127.0.0.1:9/hooks/creditd"

	checkSecret := func(v any) string {
		t.Helper()
		sec, _ := v.(string)
		if !strings.HasPrefix(sec, "whsec_") {
			t.Fatalf("secret %q lacks whsec_", sec)
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sec, "whsec_"))
		if err != nil || len(raw) != 32 {
			t.Errorf("secret %q is not base64 of 32 bytes (err %v, %d bytes)", sec, err, len(raw))
		}
		return sec
	}

	r := adminCall(t, s, AdminToken, "PUT", base, map[string]any{"url": hook})
	wantStatus(t, r, 200, "PUT webhook")
	if r.Body["url"] != hook {
		t.Errorf("webhook url %v, want %s", r.Body["url"], hook)
	}
	sec1 := checkSecret(r.Body["secret"])

	cfg := s.as(t, tn.Live).get("/v1/tenant")
	wantStatus(t, cfg, 200, "GET /v1/tenant")
	if cfg.Body["webhook_url"] != hook {
		t.Errorf("/v1/tenant webhook_url %v, want %s", cfg.Body["webhook_url"], hook)
	}
	if _, leaked := cfg.Body["webhook_secret"]; leaked {
		t.Error("/v1/tenant shows the webhook secret")
	}

	rot := adminCall(t, s, AdminToken, "POST", base+"/rotate-secret", nil)
	wantStatus(t, rot, 200, "rotate")
	sec2 := checkSecret(rot.Body["secret"])
	if sec2 == sec1 {
		t.Error("rotate-secret returned the same secret")
	}
	if rot.Body["url"] != hook {
		t.Errorf("rotate changed url to %v", rot.Body["url"])
	}

	checkProblem(t, adminCall(t, s, AdminToken, "PUT", base, map[string]any{"url": "not a url"}), 422, "validation-error", "url", "PUT bad url")
	checkProblem(t, adminCall(t, s, "wrong", "PUT", base, map[string]any{"url": hook}), 401, "unauthorized", "", "PUT wrong token")

	wantStatus(t, adminCall(t, s, AdminToken, "DELETE", base, nil), 204, "DELETE webhook")
	cfg = s.as(t, tn.Live).get("/v1/tenant")
	wantStatus(t, cfg, 200, "GET /v1/tenant after delete")
	if v, ok := cfg.Body["webhook_url"]; !ok || v != nil {
		t.Errorf("webhook_url after DELETE = %v (present %v), want null", v, ok)
	}
}

// TestConformanceTenantConfig: docs/spec/addendum.md §2 GET/PATCH /v1/tenant, defaults,
// validation naming the field, webhook_url read-only.
func TestConformanceTenantConfig(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("cfg"))
	a := s.as(t, tn.Live)

	g := a.get("/v1/tenant")
	wantStatus(t, g, 200, "GET /v1/tenant")
	if g.Body["id"] != tn.ID {
		t.Errorf("tenant id %v, want %s", g.Body["id"], tn.ID)
	}
	if g.Body["default_overage_policy"] != "block" {
		t.Errorf("default_overage_policy %v, want block", g.Body["default_overage_policy"])
	}
	if Int(t, g.Body["default_low_balance_threshold_mc"]) != 0 {
		t.Errorf("default_low_balance_threshold_mc %v, want 0", g.Body["default_low_balance_threshold_mc"])
	}
	if v, ok := g.Body["webhook_url"]; !ok || v != nil {
		t.Errorf("webhook_url %v (present %v), want null", v, ok)
	}
	if Int(t, g.Body["rate_limit_per_second"]) != 1000 {
		t.Errorf("rate_limit_per_second %v, want 1000 (docs/spec/addendum.md §10)", g.Body["rate_limit_per_second"])
	}

	checkProblem(t, a.do("PATCH", "/v1/tenant", "", map[string]any{"default_overage_policy": "allow"}), 422, "validation-error", "Idempotency-Key", "PATCH without key")

	p := a.patch("/v1/tenant", map[string]any{"default_overage_policy": "allow", "default_low_balance_threshold_mc": 2500})
	wantStatus(t, p, 200, "PATCH /v1/tenant")
	if p.Body["default_overage_policy"] != "allow" || Int(t, p.Body["default_low_balance_threshold_mc"]) != 2500 {
		t.Errorf("PATCH answer %s", p.Raw)
	}
	// The sandbox key of the same tenant sees the same configuration.
	g = s.as(t, tn.Sandbox).get("/v1/tenant")
	wantStatus(t, g, 200, "GET after PATCH")
	if g.Body["default_overage_policy"] != "allow" || Int(t, g.Body["default_low_balance_threshold_mc"]) != 2500 {
		t.Errorf("GET after PATCH %s", g.Raw)
	}
	// Omitted fields keep their values.
	p = a.patch("/v1/tenant", map[string]any{"default_overage_policy": "notify"})
	wantStatus(t, p, 200, "PATCH policy only")
	if Int(t, p.Body["default_low_balance_threshold_mc"]) != 2500 {
		t.Errorf("omitted threshold changed: %s", p.Raw)
	}

	for _, tc := range []struct {
		name  string
		body  map[string]any
		field string
	}{
		{"bad policy", map[string]any{"default_overage_policy": "sometimes"}, "default_overage_policy"},
		{"negative threshold", map[string]any{"default_low_balance_threshold_mc": -1}, "default_low_balance_threshold_mc"},
	} {
		checkProblem(t, a.patch("/v1/tenant", tc.body), 422, "validation-error", tc.field, tc.name)
	}
	g = a.get("/v1/tenant")
	if g.Body["default_overage_policy"] != "notify" || Int(t, g.Body["default_low_balance_threshold_mc"]) != 2500 {
		t.Errorf("refused PATCHes changed the tenant: %s", g.Raw)
	}

	// webhook_url is read-only here: whatever the answer, it does not change.
	hook := "http://127.0.0.1:9/admin-set"
	wantStatus(t, adminCall(t, s, AdminToken, "PUT", "/admin/v1/tenants/"+tn.ID+"/webhook", map[string]any{"url": hook}), 200, "admin PUT webhook")
	r := a.patch("/v1/tenant", map[string]any{"webhook_url": "http://127.0.0.1:9/tenant-set"})
	if r.Status >= 500 {
		t.Errorf("PATCH webhook_url: %d %s", r.Status, r.Raw)
	}
	g = a.get("/v1/tenant")
	if g.Body["webhook_url"] != hook {
		t.Errorf("webhook_url %v after tenant PATCH, want the admin-set %s", g.Body["webhook_url"], hook)
	}
}
