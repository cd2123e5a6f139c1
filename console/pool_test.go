package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// TestParentForm: the customer page's shared-pool form sets the parent
// and a draw limit as PATCH /v1/customers/{id} would, refuses a parent
// that breaks the pool rules with the API's message and changes nothing,
// and removes the parent when left empty; the page shows the parent and
// what the child drew.
func TestParentForm(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tenant := signIn(t, f.s.URL, f.a.Live)
	parent := f.s.Do("POST", "/v1/customers", f.a.Live, "parent-"+f.customer, map[string]any{"external_id": "org-" + f.customer})
	if parent.Status != 201 {
		t.Fatalf("create parent: %d %s", parent.Status, parent.Raw)
	}
	pid := parent.Body["id"].(string)
	child := f.s.Do("POST", "/v1/customers", f.a.Live, "child-"+f.customer, map[string]any{"external_id": "member-" + f.customer, "parent_id": pid})
	if child.Status != 201 {
		t.Fatalf("create child: %d %s", child.Status, child.Raw)
	}
	cid := child.Body["id"].(string)
	page := fmt.Sprintf("/console/t/%s/live/customers/%s", f.a.ID, cid)
	tenant.get(page) // the page's CSRF token
	state := func() (any, any) {
		t.Helper()
		r := f.s.Do("GET", "/v1/customers/"+cid, f.a.Live, "", nil)
		return r.Body["parent_id"], r.Body["parent_draw_limit"]
	}
	post := func(v url.Values) {
		t.Helper()
		v.Set("csrf", tenant.csrf)
		if r, _ := tenant.post(page+"/parent", v); r.StatusCode != http.StatusSeeOther {
			t.Fatalf("parent form %v: %d, want 303", v, r.StatusCode)
		}
	}
	post(url.Values{"parent": {pid}, "period": {"day"}, "limit": {"2.5"}})
	if p, d := state(); p != pid || d == nil || fmt.Sprint(d.(map[string]any)["limit_mc"]) != "2500" {
		t.Errorf("after setting: parent %v limit %v, want %s and 2500", p, d, pid)
	}
	if _, body := tenant.get(page); !strings.Contains(body, pid) || !strings.Contains(body, `data-testid="pool-drawn">0.000<`) {
		t.Errorf("the page does not show the parent and what was drawn")
	}
	// The child cannot be its own parent: refused, nothing changes.
	post(url.Values{"parent": {cid}, "period": {"day"}})
	if p, _ := state(); p != pid {
		t.Errorf("a refused form changed the parent to %v", p)
	}
	post(url.Values{"parent": {""}})
	if p, d := state(); p != nil || d != nil {
		t.Errorf("after removing: parent %v limit %v, want none", p, d)
	}
}
