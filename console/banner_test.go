package console_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/creditd/creditd/internal/e2e"
	"github.com/creditd/creditd/persist"
)

// TestDeadLetterBanner: while a dead letter is unresolved every page the
// operator opens carries the alarm banner with the count, a tenant's pages
// never do (the count is fleet-wide, not the tenant's), and the banner is
// gone once the dead letter is resolved (issue 25: a dead letter is an
// alarm, never a readiness failure; invariant 12).
func TestDeadLetterBanner(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	op := signIn(t, f.s.URL, e2e.AdminToken)
	tenant := signIn(t, f.s.URL, f.a.Live)
	scoped := fmt.Sprintf("/console/t/%s/live", f.a.ID)
	pages := []struct {
		who      string
		b        *browser
		path     string
		operator bool
	}{
		{"operator", op, "/console/tenants", true},
		{"operator", op, "/console/overview", true},
		{"operator", op, "/console/tenants/" + f.a.ID, true},
		{"operator", op, scoped + "/customers", true},
		{"operator", op, scoped + "/customers/" + f.customer, true},
		{"tenant", tenant, scoped + "/customers", false},
		{"tenant", tenant, scoped + "/webhook", false},
	}
	check := func(phase string, want string) {
		t.Helper()
		for _, p := range pages {
			r, body := p.b.get(p.path)
			if r.StatusCode != 200 && r.StatusCode != 404 {
				t.Fatalf("%s: %s GET %s: %d", phase, p.who, p.path, r.StatusCode)
			}
			has := strings.Contains(body, `data-testid="dead-letters"`)
			switch {
			case want == "" || !p.operator:
				if has {
					t.Errorf("%s: %s's %s shows the dead letter banner", phase, p.who, p.path)
				}
			case !has || !strings.Contains(body, want):
				t.Errorf("%s: %s's %s lacks the banner %q", phase, p.who, p.path, want)
			}
		}
	}
	check("none", "")

	var ids []int64
	for i := range 2 {
		id, err := f.s.App.DB.DeadLetter(ctx, persist.Letter{Partition: i, EntryID: fmt.Sprintf("1-%d", i),
			Raw: []byte("not a mutation"), Reason: "banner test"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	check("two", "2 unresolved dead letters:")
	if err := f.s.App.DB.DiscardDeadLetter(ctx, ids[0], "banner test"); err != nil {
		t.Fatal(err)
	}
	check("one", "1 unresolved dead letter:")
	if err := f.s.App.DB.DiscardDeadLetter(ctx, ids[1], "banner test"); err != nil {
		t.Fatal(err)
	}
	check("resolved", "")
}
