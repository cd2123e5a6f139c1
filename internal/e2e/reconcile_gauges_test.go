package e2e

import (
	"context"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestReconcileComparesGaugesAndLeases (issue 31 item 5): a gauge counter
// and an active lease live in the account hash beside the blocks, and a
// repair (a reload from Postgres) restores them, so a pass compares them
// too. A counter rewritten and a lease deleted behind creditd's back are
// reported with both sides' values; --repair restores both, after which a
// pass finds nothing and the lease still releases through the API.
func TestReconcileComparesGaugesAndLeases(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	ctx := context.Background()
	tn := s.NewTenant(uniq("reconcile-gauges"))
	a := s.as(t, tn.Live)
	seats := uniq("seats")
	a.newMetric(seats, "gauge", map[string]any{"cap": 10})
	id, _ := a.newCustomer()
	base := "/v1/customers/" + id + "/entitlements/" + seats
	wantStatus(t, a.post(base+"/increment", map[string]any{"amount": 1}), 200, "increment")
	r := a.post(base+"/increment", map[string]any{"amount": 2, "lease_seconds": 600})
	wantStatus(t, r, 200, "leased increment")
	lease := obj(t, r.Body["lease"], "lease")["id"].(string)
	s.Drain()
	scope := engine.ReconcileScope{TenantID: uuid.MustParse(tn.ID)}
	if rep := reconcilePass(t, s, scope, false); rep.Found != 0 || rep.Equal != rep.Checked {
		t.Fatalf("clean pass: %+v %v", rep, rep.First)
	}

	key := accountKeyOf(s, id)
	if err := s.Redis.HSet(ctx, key, "g:"+seats, "7").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Redis.HDel(ctx, key, "L:"+seats).Err(); err != nil {
		t.Fatal(err)
	}
	rep := reconcilePass(t, s, scope, false)
	if rep.Found != 1 || len(rep.First) != 1 {
		t.Fatalf("pass after the change: found %d, want 1: %v", rep.Found, rep.First)
	}
	d := rep.First[0]
	if !slices.Contains(d.Kinds, engine.DivergenceGauges) || !slices.Contains(d.Kinds, engine.DivergenceLeases) {
		t.Errorf("kinds %v, want gauges and leases", d.Kinds)
	}
	if f, ok := fieldOf(d, "gauge:"+seats); !ok || f.Redis != "7" || f.Postgres != "3" {
		t.Errorf("gauge difference %+v (found %v), want redis 7, postgres 3", f, ok)
	}
	if f, ok := fieldOf(d, "lease:"+lease); !ok || f.Redis != "absent" || f.Postgres == "absent" {
		t.Errorf("lease difference %+v (found %v), want absent from redis only", f, ok)
	}

	if rep := reconcilePass(t, s, scope, true); rep.Fixed != 1 {
		t.Fatalf("repair: fixed %d, want 1: %v", rep.Fixed, rep.First)
	}
	if rep := reconcilePass(t, s, scope, false); rep.Found != 0 {
		t.Fatalf("pass after the repair: found %d: %v", rep.Found, rep.First)
	}
	g := a.get(base)
	if !checkStatus(t, g, 200, "gauge after the repair") || Int(t, g.Body["current"]) != 3 {
		t.Errorf("gauge after the repair: %s, want current 3", g.Raw)
	}
	rel := a.post(base+"/leases/"+lease+"/release", nil)
	if !checkStatus(t, rel, 200, "release after the repair") || Int(t, rel.Body["current"]) != 1 {
		t.Errorf("release after the repair: %s, want current 1", rel.Raw)
	}
}
