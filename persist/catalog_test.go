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

func metric(s engine.Scope, key string, typ engine.MetricType, at time.Time) engine.BillableMetric {
	def := json.RawMessage("null")
	if typ == engine.MetricGauge {
		def = json.RawMessage(`{"cap": 5}`)
	}
	return engine.BillableMetric{ID: uuid.New(), TenantID: s.TenantID, Environment: s.Environment, Key: key,
		Name: "Metric " + key, Type: typ, DefaultValue: def, Metadata: engine.Metadata{"team": json.RawMessage(`"core"`)},
		CreatedAt: at, UpdatedAt: at}
}

func rule(s engine.Scope, key string, unitCost int64, at time.Time) engine.MeteringRule {
	return engine.MeteringRule{ID: uuid.New(), TenantID: s.TenantID, Environment: s.Environment, BillableMetricKey: key,
		CostType: engine.CostPerUnit, UnitCost: unitCost, EffectiveFrom: at, Metadata: engine.Metadata{},
		CreatedAt: at, UpdatedAt: at}
}

func TestMetricCRUD(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	other, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)

	m := metric(live, "api_call", engine.MetricMetered, now)
	if err := b.store.CreateMetric(b.ctx, m); err != nil {
		t.Fatal(err)
	}
	// The key is unique per tenant and environment, and only there.
	err := b.store.CreateMetric(b.ctx, metric(live, "api_call", engine.MetricGauge, now))
	if e, ok := engine.AsError(err); !ok || e.Kind != engine.KindConflict || !errors.Is(err, ErrMetricKeyTaken) {
		t.Fatalf("second metric with the key: %v, want a conflict", err)
	}
	for _, sc := range []engine.Scope{sandbox, other} {
		if err := b.store.CreateMetric(b.ctx, metric(sc, "api_call", engine.MetricGauge, now)); err != nil {
			t.Fatalf("same key in %+v: %v", sc, err)
		}
	}

	got, err := b.store.GetMetric(b.ctx, live, "api_call")
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != m.ID || got.Name != m.Name || got.Type != engine.MetricMetered || string(got.DefaultValue) != "null" ||
		string(got.Metadata["team"]) != `"core"` || !got.CreatedAt.Equal(now) || got.Environment != engine.EnvironmentLive {
		t.Fatalf("GetMetric = %+v", got)
	}
	g, err := b.store.GetMetric(b.ctx, sandbox, "api_call")
	if err != nil || g.Type != engine.MetricGauge || string(g.DefaultValue) != `{"cap": 5}` {
		t.Fatalf("sandbox metric = %+v, %v", g, err)
	}
	if _, err := b.store.GetMetric(b.ctx, live, "nope"); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("unknown key: %v", err)
	}

	later := now.Add(time.Minute)
	got.Name, got.Metadata, got.UpdatedAt = "API calls", engine.Metadata{}, later
	got.Type = engine.MetricBoolean // immutable: ignored
	if err := b.store.UpdateMetric(b.ctx, got); err != nil {
		t.Fatal(err)
	}
	up, err := b.store.GetMetric(b.ctx, live, "api_call")
	if err != nil || up.Name != "API calls" || len(up.Metadata) != 0 || !up.UpdatedAt.Equal(later) ||
		!up.CreatedAt.Equal(now) || up.Type != engine.MetricMetered {
		t.Fatalf("after update = %+v, %v", up, err)
	}
	missing := got
	missing.Key = "nope"
	if err := b.store.UpdateMetric(b.ctx, missing); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("update unknown: %v", err)
	}
}

func TestListMetricsOldestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	var want []uuid.UUID
	for i, key := range []string{"e", "d", "c", "b", "a"} {
		m := metric(live, key, engine.MetricMetered, now.Add(time.Duration(i)*time.Second))
		if i == 4 {
			m.CreatedAt = now.Add(3 * time.Second) // a tie on created_at: id decides
		}
		if err := b.store.CreateMetric(b.ctx, m); err != nil {
			t.Fatal(err)
		}
		want = append(want, m.ID)
	}
	if err := b.store.CreateMetric(b.ctx, metric(sandbox, "x", engine.MetricMetered, now)); err != nil {
		t.Fatal(err)
	}
	if want[3].String() > want[4].String() {
		want[3], want[4] = want[4], want[3]
	}

	var got []uuid.UUID
	cursor := ""
	for pages := 0; ; pages++ {
		page, err := b.store.ListMetrics(b.ctx, live, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range page.Data {
			got = append(got, m.ID)
		}
		if !page.HasMore {
			if page.NextCursor != "" || pages != 2 {
				t.Fatalf("last page: cursor %q after %d pages", page.NextCursor, pages)
			}
			break
		}
		cursor = page.NextCursor
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	if _, err := b.store.ListMetrics(b.ctx, live, "bogus!", 2); !errors.Is(err, errInvalidCursor) {
		t.Fatalf("bad cursor: %v", err)
	}

	all, err := b.store.AllMetrics(b.ctx, live)
	if err != nil || len(all) != 5 || all[0].ID != want[0] {
		t.Fatalf("AllMetrics = %d, %v", len(all), err)
	}
	empty, _ := b.tenant(t)
	if all, err := b.store.AllMetrics(b.ctx, empty); err != nil || all == nil || len(all) != 0 {
		t.Fatalf("AllMetrics of an empty scope = %v, %v", all, err)
	}
	if page, err := b.store.ListMetrics(b.ctx, empty, "", 10); err != nil || page.Data == nil || page.HasMore {
		t.Fatalf("empty page = %+v, %v", page, err)
	}
}

// TestCreateRuleSupersedes: a new rule ends the active one and is the only
// active rule of its key; a missing metric is created with the first rule.
func TestCreateRuleSupersedes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)

	if _, err := b.store.ActiveRule(b.ctx, live, "tokens"); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("no rule yet: %v", err)
	}
	r1 := rule(live, "tokens", 3, now)
	r1.Metadata = engine.Metadata{"v": json.RawMessage(`1`)}
	if err := b.store.CreateRule(b.ctx, r1, metric(live, "tokens", engine.MetricMetered, now)); err != nil {
		t.Fatal(err)
	}
	m, err := b.store.GetMetric(b.ctx, live, "tokens")
	if err != nil || m.Type != engine.MetricMetered || m.Name != "Metric tokens" {
		t.Fatalf("metric created with the rule = %+v, %v", m, err)
	}

	t2 := now.Add(time.Minute)
	upTo := int64(10)
	r2 := rule(live, "tokens", 0, t2)
	r2.CostType = engine.CostTiered
	r2.TierConfig = &engine.TierConfig{Mode: engine.TierVolume, Tiers: []engine.Tier{
		{UpTo: &upTo, UnitCost: 5}, {UnitCost: 2, FlatCost: 100}}}
	// The metric exists: the one passed in is not inserted.
	if err := b.store.CreateRule(b.ctx, r2, metric(live, "tokens", engine.MetricMetered, t2)); err != nil {
		t.Fatal(err)
	}
	if m2, err := b.store.GetMetric(b.ctx, live, "tokens"); err != nil || m2.ID != m.ID {
		t.Fatalf("metric replaced: %+v, %v", m2, err)
	}
	// The other environment has its own rules.
	if err := b.store.CreateRule(b.ctx, rule(sandbox, "tokens", 9, t2), metric(sandbox, "tokens", engine.MetricMetered, t2)); err != nil {
		t.Fatal(err)
	}

	act, err := b.store.ActiveRule(b.ctx, live, "tokens")
	if err != nil {
		t.Fatal(err)
	}
	if act.ID != r2.ID || act.EffectiveUntil != nil || act.CostType != engine.CostTiered || act.TierConfig == nil ||
		act.TierConfig.Mode != engine.TierVolume || len(act.TierConfig.Tiers) != 2 || *act.TierConfig.Tiers[0].UpTo != 10 ||
		act.TierConfig.Tiers[1].UpTo != nil || act.TierConfig.Tiers[1].FlatCost != 100 || !act.EffectiveFrom.Equal(t2) {
		t.Fatalf("active rule = %+v", act)
	}
	page, err := b.store.ListRules(b.ctx, live, "tokens", false, "", 10)
	if err != nil || len(page.Data) != 2 {
		t.Fatalf("rules = %+v, %v", page, err)
	}
	old := page.Data[0]
	if old.ID != r1.ID || old.EffectiveUntil == nil || !old.EffectiveUntil.Equal(t2) || !old.UpdatedAt.Equal(t2) ||
		old.UnitCost != 3 || old.TierConfig != nil || string(old.Metadata["v"]) != "1" {
		t.Fatalf("superseded rule = %+v", old)
	}
	if n := b.activeRules(t, live, "tokens"); n != 1 {
		t.Fatalf("%d active rules", n)
	}
}

func (b *bundle) activeRules(t *testing.T, s engine.Scope, key string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM metering_rules WHERE tenant_id = $1 AND environment = $2
		AND billable_metric_key = $3 AND effective_until IS NULL`, s.TenantID, string(s.Environment), key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCreateRuleConcurrent: racing creates of one key, with the metric not
// yet there, all succeed and leave exactly one active rule; every other
// one is ended.
func TestCreateRuleConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	for round, key := range []string{"fresh", "existing"} {
		if round == 1 {
			if err := b.store.CreateRule(b.ctx, rule(live, key, 1, now), metric(live, key, engine.MetricMetered, now)); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				at := now.Add(time.Duration(i+1) * time.Millisecond)
				errs <- b.store.CreateRule(b.ctx, rule(live, key, int64(i+1), at), metric(live, key, engine.MetricMetered, at))
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("%s: concurrent CreateRule: %v", key, err)
			}
		}
		if n := b.activeRules(t, live, key); n != 1 {
			t.Fatalf("%s: %d active rules, want 1", key, n)
		}
		page, err := b.store.ListRules(b.ctx, live, key, false, "", 100)
		if err != nil || len(page.Data) != 8+round {
			t.Fatalf("%s: %d rules, %v", key, len(page.Data), err)
		}
		var metrics int
		_ = b.pool.QueryRow(b.ctx, `SELECT count(*) FROM billable_metrics WHERE key = $1`, key).Scan(&metrics)
		if metrics != 1 {
			t.Fatalf("%s: %d metrics", key, metrics)
		}
	}
}

func TestListRulesFiltersAndPaging(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	type made struct {
		id     uuid.UUID
		key    string
		active bool
	}
	var all []made
	for i, key := range []string{"a", "b", "a", "c", "b", "a"} {
		at := now.Add(time.Duration(i) * time.Second)
		r := rule(live, key, int64(i+1), at)
		if err := b.store.CreateRule(b.ctx, r, metric(live, key, engine.MetricMetered, at)); err != nil {
			t.Fatal(err)
		}
		for j := range all {
			if all[j].key == key {
				all[j].active = false
			}
		}
		all = append(all, made{r.ID, key, true})
	}
	if err := b.store.CreateRule(b.ctx, rule(sandbox, "a", 1, now), metric(sandbox, "a", engine.MetricMetered, now)); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name       string
		key        string
		activeOnly bool
	}{
		{"all", "", false},
		{"one key", "a", false},
		{"active", "", true},
		{"active of one key", "b", true},
		{"unknown key", "zzz", false},
	}
	for _, tc := range cases {
		var want []uuid.UUID
		for _, m := range all {
			if (tc.key == "" || m.key == tc.key) && (!tc.activeOnly || m.active) {
				want = append(want, m.id)
			}
		}
		var got []uuid.UUID
		cursor := ""
		for {
			page, err := b.store.ListRules(b.ctx, live, tc.key, tc.activeOnly, cursor, 2)
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			if page.Data == nil {
				t.Fatalf("%s: nil data", tc.name)
			}
			for _, r := range page.Data {
				got = append(got, r.ID)
				if tc.activeOnly && r.EffectiveUntil != nil {
					t.Fatalf("%s: inactive rule listed", tc.name)
				}
			}
			if !page.HasMore {
				break
			}
			cursor = page.NextCursor
		}
		if len(got) != len(want) {
			t.Fatalf("%s: got %v, want %v", tc.name, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: got %v, want %v", tc.name, got, want)
			}
		}
	}
	if _, err := b.store.ListRules(b.ctx, live, "", false, "%%%", 2); !errors.Is(err, errInvalidCursor) {
		t.Fatalf("bad cursor: %v", err)
	}
	act, err := b.store.ActiveRule(b.ctx, live, "a")
	if err != nil || act.ID != all[5].id || act.UnitCost != 6 {
		t.Fatalf("ActiveRule(a) = %+v, %v", act, err)
	}
	if _, err := b.store.ActiveRule(b.ctx, sandbox, "b"); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("other environment's rule: %v", err)
	}
}
