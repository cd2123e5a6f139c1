package e2e

import (
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// consoleBrowser is one browser on the console of one node: a cookie jar
// of its own, redirects not followed (their status is the answer).
type consoleBrowser struct {
	t    testing.TB
	base string
	c    *http.Client
}

// postForms finds each POST form of a console page: its action and body.
var postForms = regexp.MustCompile(`(?s)<form method="post" action="([^"]+)"[^>]*>(.*?)</form>`)

// hiddenField finds a hidden input's name and value.
var hiddenField = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)

func newConsoleBrowser(t testing.TB, base string) *consoleBrowser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &consoleBrowser{t: t, base: base, c: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// get loads path and returns its status and page.
func (b *consoleBrowser) get(path string) (int, string) {
	b.t.Helper()
	r, err := b.c.Get(b.base + path)
	if err != nil {
		b.t.Fatalf("GET %s: %v", path, err)
	}
	defer r.Body.Close()
	raw, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(raw)
}

// post sends form to path and returns the status.
func (b *consoleBrowser) post(path string, form url.Values) int {
	b.t.Helper()
	r, err := b.c.PostForm(b.base+path, form)
	if err != nil {
		b.t.Fatalf("POST %s: %v", path, err)
	}
	defer r.Body.Close()
	_, _ = io.Copy(io.Discard, r.Body)
	return r.StatusCode
}

// form is the hidden fields of the POST form of path's page whose action
// is action; the test fails when the page has none.
func (b *consoleBrowser) form(path, action string) url.Values {
	b.t.Helper()
	status, page := b.get(path)
	if status != http.StatusOK {
		b.t.Fatalf("GET %s: %d", path, status)
	}
	for _, m := range postForms.FindAllStringSubmatch(page, -1) {
		if html.UnescapeString(m[1]) != action {
			continue
		}
		v := url.Values{}
		for _, f := range hiddenField.FindAllStringSubmatch(m[2], -1) {
			v.Set(f[1], html.UnescapeString(f[2]))
		}
		return v
	}
	b.t.Fatalf("%s has no form posting to %s", path, action)
	return nil
}

// signIn signs in with credential (the admin token or an API key).
func (b *consoleBrowser) signIn(credential string) {
	b.t.Helper()
	_, page := b.get("/console/login")
	m := hiddenField.FindStringSubmatch(page)
	if m == nil || m[1] != "csrf" {
		b.t.Fatalf("the sign-in form has no csrf field: %s", page)
	}
	if st := b.post("/console/login", url.Values{"csrf": {m[2]}, "credential": {credential}}); st != http.StatusSeeOther {
		b.t.Fatalf("sign in: %d, want 303", st)
	}
}

// copyTo is another browser, on the console at base, holding a copy of
// b's cookies (a stolen or shared session cookie).
func (b *consoleBrowser) copyTo(base string) *consoleBrowser {
	from, _ := url.Parse(b.base + "/console/")
	to, _ := url.Parse(base + "/console/")
	c := newConsoleBrowser(b.t, base)
	c.c.Jar.SetCookies(to, b.c.Jar.Cookies(from))
	return c
}

// TestConsoleSignOutEndsEveryCopy (issue 31 item 3): signing out of the
// console ends the session on the server, so a copy of its cookie taken
// before, shown to this node or another of the fleet, leads to the sign-in
// page; revoking the key a tenant signed in with ends its sessions too.
func TestConsoleSignOutEndsEveryCopy(t *testing.T) {
	s := NewStack(t, SingleNode()) // the test starts its own second node
	other := secondNode(t, s)
	tn := s.NewTenant(uniq("signout"))
	newKey := func() (id, key string) {
		k := adminCall(t, s, AdminToken, "POST", "/admin/v1/tenants/"+tn.ID+"/api-keys", map[string]any{"environment": "live"})
		wantStatus(t, k, 201, "create key")
		return k.Body["id"].(string), k.Body["key"].(string)
	}
	customers := "/console/t/" + tn.ID + "/live/customers"
	tests := []struct {
		name       string
		credential string
		page       string
	}{
		{"operator signs out", AdminToken, "/console/tenants"},
		{"tenant signs out", tn.Live, customers},
		// No credential: the case signs in with a key of its own and
		// revokes it instead of signing out.
		{"tenant's key revoked", "", customers},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			me := newConsoleBrowser(t, s.URL)
			end := func() {
				st, page := me.get(tc.page)
				m := regexp.MustCompile(`<form class="signout" method="post" action="/console/logout">\s*<input type="hidden" name="csrf" value="([^"]+)">`).FindStringSubmatch(page)
				if st != http.StatusOK || m == nil {
					t.Fatalf("%s: %d, no sign-out form", tc.page, st)
				}
				if st := me.post("/console/logout", url.Values{"csrf": {html.UnescapeString(m[1])}}); st != http.StatusSeeOther {
					t.Fatalf("sign out: %d, want 303", st)
				}
			}
			cred := tc.credential
			if cred == "" {
				id, key := newKey()
				cred = key
				end = func() {
					wantStatus(t, adminCall(t, s, AdminToken, "DELETE", "/admin/v1/tenants/"+tn.ID+"/api-keys/"+id, nil), 204, "revoke key")
				}
			}
			me.signIn(cred)
			copies := map[string]*consoleBrowser{"this node": me.copyTo(s.URL), "another node": me.copyTo(other.URL)}
			for where, c := range copies {
				if st, _ := c.get(tc.page); st != http.StatusOK {
					t.Fatalf("a copy of the cookie on %s before the end: %d, want 200", where, st)
				}
			}
			end()
			copies["the browser itself"] = me
			for where, c := range copies {
				if st, _ := c.get(tc.page); st != http.StatusSeeOther {
					t.Errorf("the session on %s after the end: %d, want 303 to the sign-in page", where, st)
				}
				form := url.Values{"csrf": {"x"}, "form_key": {strings.Repeat("k", 20)}, "name": {"after"}}
				if st := c.post("/console/t/"+tn.ID+"/live/plans", form); st != http.StatusUnauthorized {
					t.Errorf("a post with the session on %s after the end: %d, want 401", where, st)
				}
			}
		})
	}
}

// TestConsoleCreateFormsRunOnce (issue 31 item 4): each console form that
// creates something (a plan, a variant, a variant's grant, a customer's
// credit grant) carries a key,
// so a double click (two posts at once, here to two nodes of a fleet) and
// a later resubmit of the same form create one thing; a fresh rendering
// of the form creates another.
func TestConsoleCreateFormsRunOnce(t *testing.T) {
	s := NewStack(t, SingleNode()) // the test starts its own second node
	other := secondNode(t, s)
	tn := s.NewTenant(uniq("forms"))
	a := s.as(t, tn.Live)
	plans := "/console/t/" + tn.ID + "/live/plans"
	me := newConsoleBrowser(t, s.URL)
	me.signIn(tn.Live)
	twin := me.copyTo(other.URL)

	// submit posts form to action three times: twice at once (the double
	// click, one post to each node), then once more (a resubmit).
	submit := func(action string, form url.Values) {
		t.Helper()
		if form.Get("form_key") == "" && form.Get("grant_key") == "" {
			t.Fatalf("the form posting to %s carries no key", action)
		}
		var wg sync.WaitGroup
		statuses := make([]int, 2)
		for i, b := range []*consoleBrowser{me, twin} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				statuses[i] = b.post(action, form)
			}()
		}
		wg.Wait()
		statuses = append(statuses, me.post(action, form))
		for i, st := range statuses {
			if st != http.StatusSeeOther {
				t.Errorf("post %d of the form to %s: %d, want 303", i+1, action, st)
			}
		}
		if _, page := me.get(plans); strings.Contains(page, "sent before with other values") || strings.Contains(page, "has expired") {
			t.Errorf("the resubmit to %s was refused: %s", action, page)
		}
	}
	// count is how many of the list at path's member name hold want in
	// member field.
	count := func(path, list, field, want string) int {
		t.Helper()
		r := a.get(path)
		wantStatus(t, r, 200, "GET "+path)
		n := 0
		for _, v := range arr(t, r.Body[list], list) {
			if o := obj(t, v, list); o[field] == want {
				n++
			}
		}
		return n
	}

	name := uniq("plan")
	f := me.form(plans, plans)
	f.Set("name", name)
	submit(plans, f)
	if n := count("/v1/plans", "data", "name", name); n != 1 {
		t.Fatalf("plans named %s: %d, want 1", name, n)
	}
	var plan string
	for _, v := range arr(t, a.get("/v1/plans").Body["data"], "plans") {
		if o := obj(t, v, "plan"); o["name"] == name {
			plan = o["id"].(string)
		}
	}

	variants := plans + "/" + plan + "/variants"
	f = me.form(plans, variants)
	f.Set("billing_cycle", "monthly")
	f.Set("billing_mode", "prepaid")
	submit(variants, f)
	if n := count("/v1/plans/"+plan+"/variants", "data", "billing_cycle", "monthly"); n != 1 {
		t.Fatalf("variants of the plan: %d, want 1", n)
	}
	variant := obj(t, arr(t, a.get("/v1/plans/" + plan + "/variants").Body["data"], "variants")[0], "variant")["id"].(string)

	grants := variants + "/" + variant + "/grants"
	f = me.form(plans, grants)
	f.Set("credits", "5")
	f.Set("grant_type", "recurring")
	f.Set("grant_interval", "billing_period")
	submit(grants, f)
	if n := count("/v1/plan-variants/"+variant, "grants", "grant_type", "recurring"); n != 1 {
		t.Fatalf("grants of the variant: %d, want 1", n)
	}

	// The customer grant form (a credit grant, idempotent since the
	// console began) keeps one grant under the same double click.
	cust, _ := a.newCustomer()
	page := "/console/t/" + tn.ID + "/live/customers/" + cust
	f = me.form(page, page+"/grant")
	f.Set("credits", "1.5")
	f.Set("source", "manual")
	f.Set("reason", "double click")
	submit(page+"/grant", f)
	if got := a.balance(cust); got != 1500 {
		t.Errorf("balance after a double-clicked grant form: %d, want 1500", got)
	}

	// A fresh rendering of the form is a new key: it creates again.
	f = me.form(plans, grants)
	f.Set("credits", "5")
	f.Set("grant_type", "recurring")
	f.Set("grant_interval", "billing_period")
	if st := me.post(grants, f); st != http.StatusSeeOther {
		t.Fatalf("a second grant form: %d, want 303", st)
	}
	if n := count("/v1/plan-variants/"+variant, "grants", "grant_type", "recurring"); n != 2 {
		t.Errorf("grants after a second form: %d, want 2", n)
	}
}

// TestConsoleUsageCountsEveryItem (issue 31 item 1): the console's usage
// chart of a customer counts each item of a multi-metric consume under its
// own metric, with the credits that item paid (the overage on the last
// items), beside single consumes.
func TestConsoleUsageCountsEveryItem(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("chartitems"))
	a := s.as(t, tn.Live)
	ma, mb := a.perUnit(10), a.perUnit(10)
	id := a.createCustomer(map[string]any{"external_id": uniq("allow"), "overage_policy": "allow"})["id"].(string)
	a.grant(id, map[string]any{"credits": 60})
	wantStatus(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": ma, "units": 1}), 200, "single consume")
	wantStatus(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "items": items(ma, 3, mb, 4)}), 200, "multi consume")
	me := newConsoleBrowser(t, s.URL)
	me.signIn(tn.Live)
	st, page := me.get("/console/t/" + tn.ID + "/live/customers/" + id)
	if st != http.StatusOK {
		t.Fatalf("customer page: %d", st)
	}
	// a: 10 (single) + 30 (its item); b: the 20 the charge had left of 40.
	for _, want := range []string{ma + ": 0.040", mb + ": 0.020"} {
		if !strings.Contains(page, want) {
			t.Errorf("the usage chart's legend lacks %q", want)
		}
	}
}
