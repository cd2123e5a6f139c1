package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestScopedGrantForm: the grant form's "Applies to" scopes the block to
// the metrics it names (docs/rules.md "Credits scoped to metrics"); the
// blocks table names each block's scope, the page breaks the credit down by
// scope, and a bad key grants nothing.
func TestScopedGrantForm(t *testing.T) {
	t.Parallel()
	f := setup(t)
	page := fmt.Sprintf("/console/t/%s/live/customers/%s", f.a.ID, f.customer)
	tenant := signIn(t, f.s.URL, f.a.Live)
	tenant.get(page) // the page's CSRF token
	balance := func() string {
		t.Helper()
		r := f.s.Do("GET", "/v1/customers/"+f.customer+"/credits", f.a.Live, "", nil)
		return fmt.Sprint(r.Body["balance"])
	}
	before := balance()
	bad := url.Values{"csrf": {tenant.csrf}, "credits": {"1"}, "reason": {"scoped"}, "applies_to": {"bad key!"},
		"grant_key": {"scopedbad0123456789abc"}}
	if r, _ := tenant.post(page+"/grant", bad); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("bad scope: %d, want 303", r.StatusCode)
	}
	if got := balance(); got != before {
		t.Errorf("a bad scope granted: balance %s, was %s", got, before)
	}
	form := url.Values{"csrf": {tenant.csrf}, "credits": {"2"}, "reason": {"scoped"}, "applies_to": {"gpu.seconds, api.calls"},
		"grant_key": {"scoped0123456789abcdef"}}
	if r, _ := tenant.post(page+"/grant", form); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("scoped grant: %d, want 303", r.StatusCode)
	}
	_, body := tenant.get(page)
	if !strings.Contains(body, `<td data-testid="block-applies-to"><code>api.calls</code>, <code>gpu.seconds</code></td>`) {
		t.Errorf("the blocks table does not show the scope api.calls, gpu.seconds")
	}
	if !strings.Contains(body, `data-testid="by-scope"`) || !strings.Contains(body, "every metric") {
		t.Errorf("the page does not break the credit down by scope")
	}
}
