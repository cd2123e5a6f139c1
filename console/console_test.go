package console_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/creditd/creditd/console"
	"github.com/creditd/creditd/internal/e2e"
)

// browser is an HTTP client with a cookie jar that does not follow
// redirects, signed in to one stack's console.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
	csrf string
}

var hiddenCSRF = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// signIn signs in with credential and returns the browser, or fails.
func signIn(t *testing.T, base, credential string) *browser {
	t.Helper()
	b := newBrowser(t, base)
	if r := b.signIn(credential); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign in: %d, want 303", r.StatusCode)
	}
	return b
}

func newBrowser(t *testing.T, base string) *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &browser{t: t, base: base, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (b *browser) signIn(credential string) *http.Response {
	b.t.Helper()
	_, body := b.get("/console/login")
	m := hiddenCSRF.FindStringSubmatch(body)
	if m == nil {
		b.t.Fatalf("sign-in form has no csrf field: %s", body)
	}
	r, _ := b.post("/console/login", url.Values{"csrf": {m[1]}, "credential": {credential}})
	return r
}

func (b *browser) get(path string) (*http.Response, string) {
	b.t.Helper()
	r, err := b.c.Get(b.base + path)
	if err != nil {
		b.t.Fatalf("GET %s: %v", path, err)
	}
	defer r.Body.Close()
	raw, _ := io.ReadAll(r.Body)
	if m := hiddenCSRF.FindStringSubmatch(string(raw)); m != nil && !strings.HasPrefix(path, "/console/login") {
		b.csrf = m[1]
	}
	return r, string(raw)
}

func (b *browser) post(path string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	r, err := b.c.PostForm(b.base+path, form)
	if err != nil {
		b.t.Fatalf("POST %s: %v", path, err)
	}
	defer r.Body.Close()
	raw, _ := io.ReadAll(r.Body)
	return r, string(raw)
}

// fixture is a stack with two tenants and one customer of the first.
type fixture struct {
	s        *e2e.Stack
	a, b     e2e.Tenant
	customer string
}

func setup(t *testing.T) fixture {
	s := e2e.NewStack(t)
	f := fixture{s: s, a: s.NewTenant("Acme <b>bold</b>"), b: s.NewTenant("Globex")}
	r := s.Do("POST", "/v1/customers", f.a.Live, "c1", map[string]any{
		"external_id": "cust-1", "display_name": "Ada", "metadata": map[string]any{"note": "<script>alert(1)</script>"}})
	if r.Status != 201 {
		t.Fatalf("create customer: %d %s", r.Status, r.Raw)
	}
	f.customer = r.Body["id"].(string)
	r = s.Do("POST", "/v1/customers/"+f.customer+"/credits/grant", f.a.Live, "g1", map[string]any{"credits": 5000, "source": "promotional", "reason": "welcome"})
	if r.Status != 201 {
		t.Fatalf("grant: %d %s", r.Status, r.Raw)
	}
	return f
}

// TestConsoleAccess checks sign-in, what each principal may open, the
// security headers and that tenant values are escaped.
func TestConsoleAccess(t *testing.T) {
	t.Parallel()
	f := setup(t)
	custA := fmt.Sprintf("/console/t/%s/live/customers/%s", f.a.ID, f.customer)

	anon := newBrowser(t, f.s.URL)
	if r, _ := anon.get(custA); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/console/login" {
		t.Fatalf("signed out: %d %q, want 303 to the sign-in page", r.StatusCode, r.Header.Get("Location"))
	}
	for _, home := range []string{"/console", "/console/"} {
		if r, _ := anon.get(home); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/console/login" {
			t.Errorf("%s signed out: %d %q, want 303 to the sign-in page", home, r.StatusCode, r.Header.Get("Location"))
		}
	}
	if r, body := anon.get("/console/static/console.css"); r.StatusCode != 200 || !strings.Contains(body, "prefers-color-scheme") {
		t.Errorf("stylesheet: %d", r.StatusCode)
	}
	if r, body := anon.get("/console/static/"); r.StatusCode != 404 || strings.Contains(body, `href="console.css"`) {
		t.Errorf("static directory: %d, want 404 without a listing", r.StatusCode)
	}
	if r := anon.signIn("ck_live_not-a-real-key-at-all-xxxxxxxxxxx"); r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("bad key sign-in: %d, want 401", r.StatusCode)
	}

	tenant := signIn(t, f.s.URL, f.a.Live)
	r, body := tenant.get(custA)
	if r.StatusCode != 200 {
		t.Fatalf("own customer: %d %s", r.StatusCode, body)
	}
	for _, want := range []string{"&lt;script&gt;alert(1)&lt;/script&gt;", "5.000", `data-testid="balance-chart"`} {
		if !strings.Contains(body, want) {
			t.Errorf("customer page lacks %q", want)
		}
	}
	if strings.Contains(body, "<script>alert(1)") {
		t.Error("customer page carries the metadata unescaped")
	}
	csp := r.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "unsafe-inline") {
		t.Errorf("CSP = %q", csp)
	}

	tests := []struct {
		name, path string
		want       int
	}{
		{"other tenant's customer under own path", fmt.Sprintf("/console/t/%s/live/customers/%s", f.a.ID, "00000000-0000-7000-8000-000000000000"), 404},
		{"own customer in the other environment", fmt.Sprintf("/console/t/%s/sandbox/customers/%s", f.a.ID, f.customer), 404},
		{"other tenant's scope", fmt.Sprintf("/console/t/%s/live/customers", f.b.ID), 404},
		{"operator page", "/console/tenants", 404},
		{"own customers", fmt.Sprintf("/console/t/%s/live/customers", f.a.ID), 200},
		{"own webhook", fmt.Sprintf("/console/t/%s/live/webhook", f.a.ID), 200},
		{"own plans", fmt.Sprintf("/console/t/%s/live/plans", f.a.ID), 200},
		{"webhook filters", fmt.Sprintf("/console/t/%s/live/webhook?status=bogus&event_type=x.y", f.a.ID), 200},
		{"bad cursor", fmt.Sprintf("/console/t/%s/live/customers?cursor=%%21%%21", f.a.ID), 400},
	}
	for _, tc := range tests {
		if r, _ := tenant.get(tc.path); r.StatusCode != tc.want {
			t.Errorf("tenant: %s: %d, want %d", tc.name, r.StatusCode, tc.want)
		}
	}
	settings := fmt.Sprintf("/console/t/%s/live/settings", f.a.ID)
	tenant.get(settings)
	if r, _ := tenant.post(settings, url.Values{"csrf": {tenant.csrf}, "default_overage_policy": {"notify"}, "default_low_balance_threshold": {"1.5"}}); r.StatusCode != http.StatusSeeOther {
		t.Errorf("settings: %d", r.StatusCode)
	}
	if got := f.s.Do("GET", "/v1/tenant", f.a.Live, "", nil); got.Body["default_overage_policy"] != "notify" || fmt.Sprint(got.Body["default_low_balance_threshold_mc"]) != "1500" {
		t.Errorf("settings after the form = %v", got.Body)
	}
	tenant.post(settings, url.Values{"csrf": {tenant.csrf}, "default_overage_policy": {"sometimes"}})
	if _, body := tenant.get(settings); !strings.Contains(body, "default_overage_policy must be") {
		t.Errorf("a bad policy showed no error")
	}
	other := signIn(t, f.s.URL, f.b.Live)
	if r, _ := other.get(custA); r.StatusCode != 404 {
		t.Errorf("other tenant opening A's customer URL: %d, want 404", r.StatusCode)
	}
	// A grant without the CSRF token is refused and changes nothing.
	if r, _ := tenant.post(custA+"/grant", url.Values{"credits": {"1"}, "grant_key": {"0123456789abcdef0123"}}); r.StatusCode != http.StatusForbidden {
		t.Errorf("grant without csrf: %d, want 403", r.StatusCode)
	}
	form := url.Values{"csrf": {tenant.csrf}, "credits": {"2.5"}, "reason": {"goodwill"}, "grant_key": {"0123456789abcdef0123"}}
	for range 2 { // the form's key makes a double submit grant once
		if r, _ := tenant.post(custA+"/grant", form); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("grant: %d, want 303", r.StatusCode)
		}
	}
	if _, body := tenant.get(custA); !strings.Contains(body, `data-testid="balance">7.500<`) {
		t.Errorf("after granting 2.5 twice with one key the balance is not 7.500")
	}

	op := signIn(t, f.s.URL, e2e.AdminToken)
	r, body = op.get("/console/tenants")
	if r.StatusCode != 200 || !strings.Contains(body, "Acme &lt;b&gt;bold&lt;/b&gt;") || !strings.Contains(body, "Globex") {
		t.Fatalf("operator tenants page: %d", r.StatusCode)
	}
	if r, _ := op.get(custA); r.StatusCode != 200 {
		t.Errorf("operator opening A's customer: %d, want 200", r.StatusCode)
	}
	tenantPage := "/console/tenants/" + f.b.ID
	op.get(tenantPage)
	if r, _ := op.post(tenantPage+"/rate-limit", url.Values{"csrf": {op.csrf}, "rate_limit_per_second": {"42"}, "rate_limit_burst": {"84"}}); r.StatusCode != http.StatusSeeOther {
		t.Errorf("rate limit: %d", r.StatusCode)
	}
	if got := f.s.Do("GET", "/v1/tenant", f.b.Live, "", nil); fmt.Sprint(got.Body["rate_limit_per_second"]) != "42" {
		t.Errorf("rate limit after the form = %v, want 42", got.Body["rate_limit_per_second"])
	}
	if r, body := op.get("/console/overview"); r.StatusCode != 200 || !strings.Contains(body, "Persister lag") {
		t.Errorf("overview: %d", r.StatusCode)
	}
	// A copy of the session cookie taken before the sign-out (issue 31
	// item 3) stops working with it, whatever node it is shown to.
	base, _ := url.Parse(f.s.URL + "/console/")
	copied := newBrowser(t, f.s.URL)
	copied.c.Jar.SetCookies(base, op.c.Jar.Cookies(base))
	if r, _ := copied.get("/console/tenants"); r.StatusCode != 200 {
		t.Fatalf("copied cookie before sign-out: %d, want 200", r.StatusCode)
	}
	if r, _ := op.post("/console/logout", url.Values{"csrf": {op.csrf}}); r.StatusCode != http.StatusSeeOther {
		t.Errorf("logout: %d", r.StatusCode)
	}
	if r, _ := op.get("/console/tenants"); r.StatusCode != http.StatusSeeOther {
		t.Errorf("after logout: %d, want 303", r.StatusCode)
	}
	if r, _ := copied.get("/console/tenants"); r.StatusCode != http.StatusSeeOther {
		t.Errorf("copied cookie after sign-out: %d, want 303 to the sign-in page", r.StatusCode)
	}
	// Another node (its own Console, the same admin token) opens the
	// sessions this one sealed: a fleet needs no sticky sessions.
	a := f.s.App
	node2 := console.New(console.Config{Tenants: a.Tenants, Customers: a.Customers, Credits: a.Credits,
		Reservations: a.Reservations, Webhooks: a.Webhooks, Plans: a.Plans, Directory: a.DB, AdminToken: e2e.AdminToken})
	for _, cred := range []string{e2e.AdminToken, f.a.Live} {
		br := signIn(t, f.s.URL, cred)
		req := httptest.NewRequest(http.MethodGet, custA, nil)
		for _, ck := range br.c.Jar.Cookies(mustURL(t, f.s.URL+"/console/")) {
			req.AddCookie(ck)
		}
		rec := httptest.NewRecorder()
		node2.ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Errorf("a session opened on another node: %d, want 200", rec.Code)
		}
	}
}

func mustURL(t *testing.T, raw string) *url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// unescapeHref undoes the HTML escaping of an href attribute.
func unescapeHref(h string) string { return strings.ReplaceAll(h, "&amp;", "&") }

// TestLedgerFilters checks the customer page's ledger filters and that a
// bad date is a 400 page, never a 500.
func TestLedgerFilters(t *testing.T) {
	t.Parallel()
	f := setup(t)
	if r := f.s.Do("POST", "/v1/customers/cust-1/credits/adjust", f.a.Live, "adj", map[string]any{"delta": -1000, "source": "manual", "reason": "support"}); r.Status != 200 {
		t.Fatalf("adjust: %d %s", r.Status, r.Raw)
	}
	b := signIn(t, f.s.URL, f.a.Live)
	page := fmt.Sprintf("/console/t/%s/live/customers/%s", f.a.ID, f.customer)
	rows := regexp.MustCompile(`<td class="num (pos|neg)">`)
	today := time.Now().UTC().Format(time.DateOnly)
	for _, tc := range []struct {
		name, query  string
		status, rows int
	}{
		{"no filter", "", 200, 2},
		{"source manual", "?source=manual", 200, 1},
		{"source promotional", "?source=promotional", 200, 1},
		{"today", "?from=" + today + "&to=" + today, 200, 2},
		{"before today", "?to=2020-01-01", 200, 0},
		{"bad date", "?from=yesterday", 400, 0},
	} {
		r, body := b.get(page + tc.query)
		if r.StatusCode != tc.status {
			t.Errorf("%s: %d, want %d", tc.name, r.StatusCode, tc.status)
			continue
		}
		ledger := body[strings.Index(body, `data-testid="ledger"`)+1:]
		if got := len(rows.FindAllString(ledger, -1)); tc.status == 200 && got != tc.rows {
			t.Errorf("%s: %d ledger rows, want %d", tc.name, got, tc.rows)
		}
	}
}

// TestPlansForms creates a plan, a variant and a grant through the
// console's forms and reads them back on the plans page.
func TestPlansForms(t *testing.T) {
	t.Parallel()
	f := setup(t)
	b := signIn(t, f.s.URL, f.a.Sandbox)
	base := fmt.Sprintf("/console/t/%s/sandbox/plans", f.a.ID)
	b.get(base)
	// Each create form carries its own key (issue 31 item 4): sent twice
	// (a double click), it creates once and shows the first message.
	_, body := b.get(base)
	if !strings.Contains(body, `name="form_key"`) {
		t.Fatalf("the create plan form has no form_key")
	}
	for range 2 {
		if r, _ := b.post(base, url.Values{"csrf": {b.csrf}, "form_key": {"plan-form-key-0001"}, "name": {"Pro <x>"}, "is_default": {"on"}}); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("create plan: %d", r.StatusCode)
		}
	}
	_, body = b.get(base)
	planID := regexp.MustCompile(`/plans/([0-9a-f-]{36})/variants"`).FindStringSubmatch(body)
	if planID == nil || !strings.Contains(body, "Pro &lt;x&gt;") || !strings.Contains(body, ">default<") {
		t.Fatalf("plan not listed: %s", body)
	}
	if n := strings.Count(body, "<h2>Pro &lt;x&gt;"); n != 1 {
		t.Errorf("a plan form sent twice made %d plans, want 1", n)
	}
	if r, _ := b.post(base, url.Values{"csrf": {b.csrf}, "name": {"No key"}}); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("create plan without a form key: %d", r.StatusCode)
	}
	if _, body = b.get(base); strings.Contains(body, "<h2>No key") || !strings.Contains(body, "flash-error") {
		t.Errorf("a create form without its key was not refused as expired")
	}
	for range 2 {
		if r, _ := b.post(base+"/"+planID[1]+"/variants", url.Values{"csrf": {b.csrf}, "form_key": {"variant-form-key-01"}, "billing_cycle": {"monthly"}, "billing_mode": {"prepaid"}, "trial_days": {"14"}}); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("create variant: %d", r.StatusCode)
		}
	}
	_, body = b.get(base)
	variantID := regexp.MustCompile(`/variants/([0-9a-f-]{36})/grants"`).FindStringSubmatch(body)
	if variantID == nil || !strings.Contains(body, "14-day trial") {
		t.Fatalf("variant not listed")
	}
	if n := strings.Count(body, "14-day trial"); n != 1 {
		t.Errorf("a variant form sent twice made %d variants, want 1", n)
	}
	for range 2 {
		if r, _ := b.post(base+"/"+planID[1]+"/variants/"+variantID[1]+"/grants", url.Values{"csrf": {b.csrf}, "form_key": {"grant-form-key-0001"}, "credits": {"100"}, "grant_type": {"recurring"}, "grant_interval": {"billing_period"}}); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("create grant: %d", r.StatusCode)
		}
	}
	if _, body = b.get(base); !strings.Contains(body, "100.000") || !strings.Contains(body, "Grant of 100.000 credits added.") {
		t.Errorf("grant not listed")
	}
	if n := strings.Count(body, `<td class="num">100.000</td>`); n != 1 {
		t.Errorf("a grant form sent twice made %d grants, want 1", n)
	}
	// A grant scoped to metrics (docs/rules.md "Credits scoped to metrics").
	if r, _ := b.post(base+"/"+planID[1]+"/variants/"+variantID[1]+"/grants", url.Values{"csrf": {b.csrf}, "form_key": {"grant-form-key-0002"}, "credits": {"7"}, "grant_type": {"recurring"}, "grant_interval": {"billing_period"}, "applies_to": {"tokens, api.calls"}}); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("create scoped grant: %d", r.StatusCode)
	}
	if _, body = b.get(base); !strings.Contains(body, `<td data-testid="grant-applies-to"><code>api.calls</code>, <code>tokens</code></td>`) {
		t.Errorf("the scoped grant's applies_to is not listed")
	}
	if r, _ := b.post(base+"/"+planID[1], url.Values{"csrf": {b.csrf}, "name": {"Pro 2"}, "status": {"retired"}}); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("update plan: %d", r.StatusCode)
	}
	if _, body = b.get(base); !strings.Contains(body, "Plan Pro 2 saved.") || !strings.Contains(body, `<option value="retired" selected>`) {
		t.Errorf("plan edit not shown")
	}
	if r, _ := b.post(base+"/"+planID[1]+"/variants/"+variantID[1], url.Values{"csrf": {b.csrf}, "status": {"retired"}, "trial_days": {"30"}}); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("update variant: %d", r.StatusCode)
	}
	if _, body = b.get(base); !strings.Contains(body, "Variant saved.") || !strings.Contains(body, "30-day trial") {
		t.Errorf("variant edit not shown")
	}
	// A bad cycle comes back as a message, not a 500.
	b.post(base+"/"+planID[1]+"/variants", url.Values{"csrf": {b.csrf}, "form_key": {"variant-form-key-02"}, "billing_cycle": {"hourly"}, "billing_mode": {"prepaid"}})
	if _, body = b.get(base); !strings.Contains(body, "flash-error") {
		t.Errorf("a bad cycle showed no error")
	}
}

// TestRevokedKeySignsOut checks a tenant browser is signed out the moment
// its key is revoked: the key in the session is authenticated per request.
func TestRevokedKeySignsOut(t *testing.T) {
	t.Parallel()
	s := e2e.NewStack(t)
	tn := s.NewTenant("revoke")
	k := e2e.Call(t, s.HTTP, s.URL, "POST", "/admin/v1/tenants/"+tn.ID+"/api-keys", map[string]any{"environment": "live"},
		"Authorization", "Bearer "+e2e.AdminToken)
	if k.Status != 201 {
		t.Fatalf("create key: %d %s", k.Status, k.Raw)
	}
	b := signIn(t, s.URL, k.Body["key"].(string))
	page := "/console/t/" + tn.ID + "/live/customers"
	if r, _ := b.get(page); r.StatusCode != 200 {
		t.Fatalf("before revoke: %d", r.StatusCode)
	}
	if r := e2e.Call(t, s.HTTP, s.URL, "DELETE", "/admin/v1/tenants/"+tn.ID+"/api-keys/"+k.Body["id"].(string), nil,
		"Authorization", "Bearer "+e2e.AdminToken); r.Status != 204 {
		t.Fatalf("revoke: %d %s", r.Status, r.Raw)
	}
	if r, _ := b.get(page); r.StatusCode != http.StatusSeeOther || r.Header.Get("Location") != "/console/login" {
		t.Errorf("after revoke: %d %q, want 303 to the sign-in page", r.StatusCode, r.Header.Get("Location"))
	}
}

// TestReservationSettlements: the customer page's reservations show what an active
// reservation still holds and what its partial commits settled (issue 27).
func TestReservationSettlements(t *testing.T) {
	t.Parallel()
	f := setup(t)
	if r := f.s.Do("POST", "/v1/metering-rules", f.a.Live, "rule", map[string]any{"billable_metric_key": "gpu", "cost_type": "per_unit", "unit_cost": 10}); r.Status != 201 {
		t.Fatalf("rule: %d %s", r.Status, r.Raw)
	}
	r := f.s.Do("POST", "/v1/reservations", f.a.Live, "hold", map[string]any{"customer_id": f.customer, "billable_metric_key": "gpu", "estimated_units": 30})
	if r.Status != 201 {
		t.Fatalf("reserve: %d %s", r.Status, r.Raw)
	}
	id := r.Body["id"].(string)
	if r := f.s.Do("POST", "/v1/reservations/"+id+"/commit", f.a.Live, "part", map[string]any{"actual_units": 12, "final": false}); r.Status != 200 {
		t.Fatalf("partial commit: %d %s", r.Status, r.Raw)
	}
	b := signIn(t, f.s.URL, f.a.Live)
	_, body := b.get(fmt.Sprintf("/console/t/%s/live/customers/%s", f.a.ID, f.customer))
	for _, want := range []string{
		`data-testid="reservation-held">0.180<`,
		`data-testid="reservation-settled-units">12<`,
		`data-testid="reservation-settled">0.120<`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("customer page lacks %s", want)
		}
	}
}
