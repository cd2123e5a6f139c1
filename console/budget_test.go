package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestBudgetForms: the customer page lists the budgets; its forms add a
// budget, replace the one of the same metric and period, and remove it, as
// PATCH /v1/customers/{id} with the whole list would; a bad budget or a
// form without the CSRF token changes nothing.
func TestBudgetForms(t *testing.T) {
	t.Parallel()
	f := setup(t)
	page := fmt.Sprintf("/console/t/%s/live/customers/%s", f.a.ID, f.customer)
	tenant := signIn(t, f.s.URL, f.a.Live)
	tenant.get(page) // the page's CSRF token
	budgets := func() []any {
		t.Helper()
		r := f.s.Do("GET", "/v1/customers/"+f.customer, f.a.Live, "", nil)
		list, _ := r.Body["budgets"].([]any)
		return list
	}
	set := func(v url.Values) {
		t.Helper()
		v.Set("csrf", tenant.csrf)
		if r, _ := tenant.post(page+"/budgets", v); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("set budget %v: %d, want 303", v, r.StatusCode)
		}
	}
	if r, _ := tenant.post(page+"/budgets", url.Values{"period": {"day"}, "limit": {"5"}}); r.StatusCode != http.StatusForbidden {
		t.Errorf("without csrf: %d, want 403", r.StatusCode)
	}
	set(url.Values{"period": {"day"}, "time_zone": {"Europe/Paris"}, "limit": {"12.5"}})
	set(url.Values{"period": {"month"}, "metric": {"api"}, "time_zone": {"UTC"}, "limit": {"3"}})
	if got := budgets(); len(got) != 2 {
		t.Fatalf("budgets %v, want 2", got)
	}
	// The same metric and period: replaced, not added.
	set(url.Values{"period": {"day"}, "time_zone": {"Europe/Paris"}, "limit": {"20"}})
	// Bad ones change nothing.
	set(url.Values{"period": {"week"}, "time_zone": {"UTC"}, "limit": {"1"}})
	set(url.Values{"period": {"day"}, "time_zone": {"Mars/Base"}, "limit": {"1"}})
	set(url.Values{"period": {"day"}, "time_zone": {"UTC"}, "limit": {"-1"}})
	got := budgets()
	if len(got) != 2 {
		t.Fatalf("budgets %v, want 2", got)
	}
	limits := map[string]any{}
	for _, b := range got {
		m := b.(map[string]any)
		limits[fmt.Sprint(m["period"])] = m["limit_mc"]
	}
	if fmt.Sprint(limits["day"]) != "20000" || fmt.Sprint(limits["month"]) != "3000" {
		t.Errorf("limits %v, want day 20000 and month 3000", limits)
	}
	if _, body := tenant.get(page); !strings.Contains(body, `data-testid="budgets"`) || !strings.Contains(body, "Europe/Paris") ||
		!strings.Contains(body, "20.000") {
		t.Errorf("the page does not list the daily budget of 20.000 in Europe/Paris")
	}
	if r, _ := tenant.post(page+"/budgets/remove", url.Values{"csrf": {tenant.csrf}, "period": {"day"}, "metric": {""}}); r.StatusCode != http.StatusSeeOther {
		t.Fatalf("remove: %d, want 303", r.StatusCode)
	}
	if got := budgets(); len(got) != 1 || got[0].(map[string]any)["period"] != "month" {
		t.Errorf("after the removal: %v, want the monthly budget alone", got)
	}
}
