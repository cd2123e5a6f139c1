package persist

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

func plan(s engine.Scope, name string, isDefault bool, at time.Time) engine.Plan {
	return engine.Plan{ID: uuid.Must(uuid.NewV7()), TenantID: s.TenantID, Environment: s.Environment, Name: name,
		IsDefault: isDefault, Status: engine.PlanActive, Metadata: engine.Metadata{"tier": json.RawMessage(`"gold"`)},
		CreatedAt: at, UpdatedAt: at}
}

func variant(s engine.Scope, planID uuid.UUID, at time.Time) engine.PlanVariant {
	return engine.PlanVariant{ID: uuid.Must(uuid.NewV7()), PlanID: planID, TenantID: s.TenantID, Environment: s.Environment,
		BillingCycle: engine.CycleMonthly, TrialDays: 14, Status: engine.PlanActive, BillingMode: engine.BillingPostpaid,
		RenewalDueDays: 2, GracePeriodDays: 5, AllowUsageWhileOverdue: false, Metadata: engine.Metadata{},
		CreatedAt: at, UpdatedAt: at}
}

// defaults lists the ids of the scope's default plans.
func (b *bundle) defaults(t *testing.T, s engine.Scope) []uuid.UUID {
	t.Helper()
	page, err := b.store.ListPlans(b.ctx, s, true, "", 100)
	if err != nil {
		t.Fatal(err)
	}
	var out []uuid.UUID
	for _, p := range page.Data {
		if p.IsDefault {
			out = append(out, p.ID)
		}
	}
	return out
}

// TestPlanStore: plans round-trip, a new default clears the previous one in
// its scope only, the update hook runs under a lock and its error writes
// nothing, lists page newest first with the status filter, and another
// scope's plan is not found.
func TestPlanStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)

	a := plan(live, "A", true, now)
	if err := b.store.CreatePlan(b.ctx, a); err != nil {
		t.Fatal(err)
	}
	sb := plan(sandbox, "S", true, now)
	if err := b.store.CreatePlan(b.ctx, sb); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.GetPlan(b.ctx, live, a.ID)
	if err != nil || got.Name != "A" || !got.IsDefault || got.Status != engine.PlanActive ||
		string(got.Metadata["tier"]) != `"gold"` || !got.CreatedAt.Equal(now) || got.Variants != nil {
		t.Fatalf("GetPlan = %+v, %v", got, err)
	}
	if _, err := b.store.GetPlan(b.ctx, sandbox, a.ID); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("plan from the other environment: %v", err)
	}

	bp := plan(live, "B", true, now.Add(time.Millisecond))
	if err := b.store.CreatePlan(b.ctx, bp); err != nil {
		t.Fatal(err)
	}
	if d := b.defaults(t, live); len(d) != 1 || d[0] != bp.ID {
		t.Fatalf("live defaults %v, want only B", d)
	}
	if d := b.defaults(t, sandbox); len(d) != 1 || d[0] != sb.ID {
		t.Fatalf("sandbox defaults %v, want S untouched", d)
	}

	// A failing change writes nothing and comes back as is.
	boom := engine.Conflict("no")
	if _, err := b.store.UpdatePlan(b.ctx, live, bp.ID, func(p *engine.Plan) error { p.Name = "X"; return boom }); err != boom {
		t.Fatalf("failing change: %v", err)
	}
	if p, _ := b.store.GetPlan(b.ctx, live, bp.ID); p.Name != "B" {
		t.Fatalf("a failed change wrote %q", p.Name)
	}
	// Making A the default again moves the flag back.
	later := now.Add(time.Minute)
	up, err := b.store.UpdatePlan(b.ctx, live, a.ID, func(p *engine.Plan) error {
		p.IsDefault, p.Name, p.Metadata, p.UpdatedAt = true, "A2", engine.Metadata{}, later
		return nil
	})
	if err != nil || up.Name != "A2" || !up.IsDefault || len(up.Metadata) != 0 || !up.UpdatedAt.Equal(later) {
		t.Fatalf("UpdatePlan = %+v, %v", up, err)
	}
	if d := b.defaults(t, live); len(d) != 1 || d[0] != a.ID {
		t.Fatalf("live defaults %v, want only A", d)
	}
	if p, _ := b.store.GetPlan(b.ctx, live, bp.ID); p.IsDefault || !p.UpdatedAt.Equal(later) {
		t.Fatalf("previous default %+v, want cleared at %v", p, later)
	}
	if _, err := b.store.UpdatePlan(b.ctx, sandbox, a.ID, func(*engine.Plan) error { return nil }); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("update from the other environment: %v", err)
	}
	// The schema refuses a retired default, whatever the engine does.
	_, err = b.store.UpdatePlan(b.ctx, live, a.ID, func(p *engine.Plan) error { p.Status = engine.PlanRetired; return nil })
	if err == nil {
		t.Fatal("a retired default plan was stored")
	}
	if _, err := b.store.UpdatePlan(b.ctx, live, bp.ID, func(p *engine.Plan) error { p.Status = engine.PlanRetired; return nil }); err != nil {
		t.Fatal(err)
	}

	// Paging newest first; retired plans only when asked.
	var ids []uuid.UUID
	for i := range 3 {
		p := plan(live, "P", false, now.Add(time.Duration(i+2)*time.Millisecond))
		if err := b.store.CreatePlan(b.ctx, p); err != nil {
			t.Fatal(err)
		}
		ids = append([]uuid.UUID{p.ID}, ids...)
	}
	wantActive := append(append([]uuid.UUID{}, ids...), a.ID)
	wantAll := append(append([]uuid.UUID{}, ids...), bp.ID, a.ID)
	for _, tc := range []struct {
		retired bool
		want    []uuid.UUID
	}{{false, wantActive}, {true, wantAll}} {
		var seen []uuid.UUID
		cursor := ""
		for {
			page, err := b.store.ListPlans(b.ctx, live, tc.retired, cursor, 2)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range page.Data {
				seen = append(seen, p.ID)
			}
			if !page.HasMore {
				break
			}
			cursor = page.NextCursor
		}
		if len(seen) != len(tc.want) {
			t.Fatalf("retired=%v: %v, want %v", tc.retired, seen, tc.want)
		}
		for i := range seen {
			if seen[i] != tc.want[i] {
				t.Fatalf("retired=%v: %v, want %v", tc.retired, seen, tc.want)
			}
		}
	}
	if _, err := b.store.ListPlans(b.ctx, live, false, "garbage!", 10); err == nil {
		t.Fatal("bad cursor accepted")
	}
}

// TestPlanDefaultRace: plans made default at once from many goroutines
// leave exactly one default (the partial unique index and the retry).
func TestPlanDefaultRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs <- b.store.CreatePlan(b.ctx, plan(live, "new", true, now.Add(time.Duration(i)*time.Millisecond)))
		}()
		go func() {
			defer wg.Done()
			p := plan(live, "later", false, now)
			if err := b.store.CreatePlan(b.ctx, p); err != nil {
				errs <- err
				return
			}
			_, err := b.store.UpdatePlan(b.ctx, live, p.ID, func(p *engine.Plan) error { p.IsDefault = true; return nil })
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if d := b.defaults(t, live); len(d) != 1 {
		t.Fatalf("%d default plans, want 1", len(d))
	}
}

// TestVariantGrantEntitlementStore: variants, grants and entitlements hang
// under their plan and variant in scope only; an entitlement put twice
// keeps one row, the latest.
func TestVariantGrantEntitlementStore(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	p := plan(live, "P", false, now)
	other := plan(live, "Q", false, now)
	for _, x := range []engine.Plan{p, other} {
		if err := b.store.CreatePlan(b.ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	v1, v2 := variant(live, p.ID, now), variant(live, p.ID, now.Add(time.Millisecond))
	for _, v := range []engine.PlanVariant{v2, v1} {
		if err := b.store.CreateVariant(b.ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.store.CreateVariant(b.ctx, variant(sandbox, p.ID, now)); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("variant under another environment's plan: %v", err)
	}
	if err := b.store.CreateVariant(b.ctx, variant(live, uuid.New(), now)); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("variant under no plan: %v", err)
	}
	vs, err := b.store.ListVariants(b.ctx, live, []uuid.UUID{p.ID, other.ID})
	if err != nil || len(vs) != 2 || vs[0].ID != v1.ID || vs[1].ID != v2.ID {
		t.Fatalf("ListVariants = %+v, %v", vs, err)
	}
	got := vs[0]
	if got.BillingCycle != engine.CycleMonthly || got.TrialDays != 14 || got.BillingMode != engine.BillingPostpaid ||
		got.RenewalDueDays != 2 || got.GracePeriodDays != 5 || got.AllowUsageWhileOverdue || got.PlanID != p.ID {
		t.Fatalf("variant = %+v", got)
	}
	if vs, err := b.store.ListVariants(b.ctx, sandbox, []uuid.UUID{p.ID}); err != nil || len(vs) != 0 {
		t.Fatalf("other environment's variants = %v, %v", vs, err)
	}
	if _, err := b.store.GetVariant(b.ctx, sandbox, v1.ID); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("GetVariant other environment: %v", err)
	}
	later := now.Add(time.Minute)
	up, err := b.store.UpdateVariant(b.ctx, live, p.ID, v1.ID, func(v *engine.PlanVariant) error {
		v.Status, v.TrialDays, v.UpdatedAt = engine.PlanRetired, 0, later
		v.BillingCycle = engine.CycleDaily // fixed: never written
		return nil
	})
	if err != nil || up.Status != engine.PlanRetired {
		t.Fatalf("UpdateVariant = %+v, %v", up, err)
	}
	if v, _ := b.store.GetVariant(b.ctx, live, v1.ID); v.Status != engine.PlanRetired || v.TrialDays != 0 ||
		v.BillingCycle != engine.CycleMonthly || !v.UpdatedAt.Equal(later) {
		t.Fatalf("after update %+v", v)
	}
	if _, err := b.store.UpdateVariant(b.ctx, live, other.ID, v1.ID, func(*engine.PlanVariant) error { return nil }); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("variant under the wrong plan: %v", err)
	}

	g := engine.PlanGrant{ID: uuid.Must(uuid.NewV7()), PlanVariantID: v1.ID, TenantID: live.TenantID, Environment: live.Environment,
		Credits: 5000, GrantInterval: "PT5H", ExpiresAfterSeconds: ptr[int64](3600), AccumulationCap: ptr[int64](9000),
		RolloverPercentage: 50, MaxRolloverCycles: ptr(2), GrantType: engine.GrantRecurring, Source: engine.SourcePromotional,
		CreatedAt: now, UpdatedAt: now}
	if err := b.store.CreateGrant(b.ctx, p.ID, g); err != nil {
		t.Fatal(err)
	}
	g2 := g
	g2.ID, g2.ExpiresAfterSeconds, g2.AccumulationCap, g2.MaxRolloverCycles = uuid.Must(uuid.NewV7()), nil, nil, nil
	if err := b.store.CreateGrant(b.ctx, other.ID, g2); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("grant under the wrong plan: %v", err)
	}
	if err := b.store.CreateGrant(b.ctx, p.ID, g2); err != nil {
		t.Fatal(err)
	}
	gs, err := b.store.ListGrants(b.ctx, live, []uuid.UUID{v1.ID, v2.ID})
	if err != nil || len(gs) != 2 || gs[0].ID != g.ID || gs[1].ID != g2.ID {
		t.Fatalf("ListGrants = %+v, %v", gs, err)
	}
	if x := gs[0]; x.Credits != 5000 || x.GrantInterval != "PT5H" || *x.ExpiresAfterSeconds != 3600 || *x.AccumulationCap != 9000 ||
		x.RolloverPercentage != 50 || *x.MaxRolloverCycles != 2 || x.GrantType != engine.GrantRecurring ||
		x.Source != engine.SourcePromotional || x.Interval().Every != 5*time.Hour {
		t.Fatalf("grant = %+v", x)
	}
	if x := gs[1]; x.ExpiresAfterSeconds != nil || x.AccumulationCap != nil || x.MaxRolloverCycles != nil {
		t.Fatalf("nullable grant fields = %+v", x)
	}

	if err := b.store.CreateMetric(b.ctx, metric(live, "seats", engine.MetricGauge, now)); err != nil {
		t.Fatal(err)
	}
	e := engine.VariantEntitlement{ID: uuid.Must(uuid.NewV7()), PlanVariantID: v1.ID, TenantID: live.TenantID,
		Environment: live.Environment, BillableMetricKey: "seats", Type: engine.MetricGauge, Value: json.RawMessage(`{"cap":5}`), CreatedAt: now}
	if err := b.store.PutEntitlement(b.ctx, p.ID, e); err != nil {
		t.Fatal(err)
	}
	e2 := e
	e2.ID, e2.Value, e2.CreatedAt = uuid.Must(uuid.NewV7()), json.RawMessage(`{"cap":7}`), later
	if err := b.store.PutEntitlement(b.ctx, p.ID, e2); err != nil {
		t.Fatal(err)
	}
	if err := b.store.PutEntitlement(b.ctx, other.ID, e2); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("entitlement under the wrong plan: %v", err)
	}
	es, err := b.store.ListEntitlements(b.ctx, live, []uuid.UUID{v1.ID})
	if err != nil || len(es) != 1 || es[0].ID != e2.ID || string(es[0].Value) != `{"cap": 7}` || es[0].Type != engine.MetricGauge {
		t.Fatalf("ListEntitlements = %+v, %v", es, err)
	}
	// An entitlement names a metric of its own scope (foreign key).
	e3 := e2
	e3.ID, e3.BillableMetricKey = uuid.Must(uuid.NewV7()), "nope"
	if err := b.store.PutEntitlement(b.ctx, p.ID, e3); err == nil {
		t.Fatal("an entitlement for a missing metric was stored")
	}
}
