package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestCreditLineForm: the customer page shows the credit line and the
// debt, and its form sets the line (credits, up to three decimals; 0
// removes it) as PATCH /v1/customers/{id} would; a bad amount or a form
// without the CSRF token changes nothing.
func TestCreditLineForm(t *testing.T) {
	t.Parallel()
	f := setup(t)
	page := fmt.Sprintf("/console/t/%s/live/customers/%s", f.a.ID, f.customer)
	tenant := signIn(t, f.s.URL, f.a.Live)
	tenant.get(page) // the page's CSRF token
	limit := func() string {
		t.Helper()
		r := f.s.Do("GET", "/v1/customers/"+f.customer, f.a.Live, "", nil)
		return fmt.Sprint(r.Body["credit_limit_mc"])
	}
	if r, _ := tenant.post(page+"/credit-line", url.Values{"credit_limit": {"5"}}); r.StatusCode != http.StatusForbidden {
		t.Errorf("without csrf: %d, want 403", r.StatusCode)
	}
	for _, tc := range []struct{ value, want string }{{"12.5", "12500"}, {"-1", "12500"}, {"abc", "12500"}, {"0", "0"}} {
		if r, _ := tenant.post(page+"/credit-line", url.Values{"csrf": {tenant.csrf}, "credit_limit": {tc.value}}); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("credit line %q: %d, want 303", tc.value, r.StatusCode)
		}
		if got := limit(); got != tc.want {
			t.Errorf("after %q the credit line is %s, want %s", tc.value, got, tc.want)
		}
	}
	tenant.post(page+"/credit-line", url.Values{"csrf": {tenant.csrf}, "credit_limit": {"3"}})
	if _, body := tenant.get(page); !strings.Contains(body, `data-testid="credit-line">3.000<`) || !strings.Contains(body, `data-testid="debt">0.000<`) {
		t.Errorf("the page does not show the line of 3.000 and no debt")
	}
}
