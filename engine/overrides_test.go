package engine

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// memOverrides is an in-memory OverrideStore with the store's rules: one
// undeleted row per subscription and metric, expired rows replaced.
type memOverrides struct {
	mu      sync.Mutex
	rows    []Override
	deleted map[uuid.UUID]bool
}

func overrideLive(o Override, now time.Time) bool {
	return o.ExpiresAt == nil || o.ExpiresAt.After(now)
}

func (m *memOverrides) LiveOverrides(_ context.Context, _, sub uuid.UUID, now time.Time) ([]Override, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Override
	for _, o := range m.rows {
		if o.SubscriptionID == sub && !m.deleted[o.ID] && overrideLive(o, now) {
			out = append(out, o)
		}
	}
	return out, nil
}

func (m *memOverrides) CreateOverride(_ context.Context, _ Environment, o Override, now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.rows {
		if r.SubscriptionID == o.SubscriptionID && r.BillableMetricKey == o.BillableMetricKey && !m.deleted[r.ID] {
			if overrideLive(r, now) {
				return ErrOverrideExists
			}
			m.deleted[r.ID] = true
		}
	}
	m.rows = append(m.rows, o)
	return nil
}

func (m *memOverrides) find(sub uuid.UUID, key string, now time.Time) int {
	for i, r := range m.rows {
		if r.SubscriptionID == sub && r.BillableMetricKey == key && !m.deleted[r.ID] && overrideLive(r, now) {
			return i
		}
	}
	return -1
}

func (m *memOverrides) UpdateOverride(_ context.Context, _ Scope, sub uuid.UUID, key string, now time.Time, change func(*Override) error) (Override, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := m.find(sub, key, now)
	if i < 0 {
		return Override{}, ErrNotFound
	}
	o := m.rows[i]
	if err := change(&o); err != nil {
		return Override{}, err
	}
	m.rows[i] = o
	return o, nil
}

func (m *memOverrides) DeleteOverride(_ context.Context, _ Scope, sub uuid.UUID, key string, now time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	i := m.find(sub, key, now)
	if i < 0 {
		return ErrNotFound
	}
	m.deleted[m.rows[i].ID] = true
	return nil
}

// overrideSubs is a SubscriptionReader over a fixed list.
type overrideSubs []Subscription

func (m overrideSubs) GetSubscription(_ context.Context, s Scope, id uuid.UUID) (Subscription, error) {
	for _, sub := range m {
		if sub.ID == id && sub.TenantID == s.TenantID && sub.Environment == s.Environment {
			return sub, nil
		}
	}
	return Subscription{}, ErrNotFound
}

func (m overrideSubs) LiveSubscription(context.Context, CustomerKey) (Subscription, error) {
	return Subscription{}, ErrNotFound
}

// overrideMetrics is a MetricLookup over a fixed list.
type overrideMetrics []BillableMetric

func (m overrideMetrics) Metric(_ context.Context, s Scope, key string) (BillableMetric, bool, error) {
	for _, x := range m {
		if x.Key == key && x.TenantID == s.TenantID && x.Environment == s.Environment {
			return x, true, nil
		}
	}
	return BillableMetric{}, false, nil
}

// overrideClock is a Clock tests move by hand.
type overrideClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *overrideClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *overrideClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type overrideFixture struct {
	svc     *Overrides
	ents    *Entitlements
	clock   *overrideClock
	scope   Scope
	sandbox Scope
	sub     Subscription
	// view is the cached PlanView the store decorator makes forget.
	view *CachedPlanView
}

// forgets is how many times an override write made the view forget.
func (f *overrideFixture) forgets() int { return int(f.view.cache.generation()) }

func newOverrideFixture() *overrideFixture {
	clock := &overrideClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	tenant := uuid.New()
	scope := Scope{TenantID: tenant, Environment: EnvironmentLive}
	sandbox := Scope{TenantID: tenant, Environment: EnvironmentSandbox}
	sub := Subscription{ID: uuid.New(), TenantID: tenant, Environment: EnvironmentLive, CustomerID: uuid.New(), Status: SubscriptionActive}
	metrics := overrideMetrics{}
	for _, k := range []struct {
		key string
		t   MetricType
	}{{"seats", MetricGauge}, {"sso", MetricBoolean}, {"limits", MetricStatic}, {"api", MetricMetered}} {
		metrics = append(metrics, BillableMetric{ID: uuid.New(), TenantID: tenant, Environment: EnvironmentLive, Key: k.key, Type: k.t})
	}
	f := &overrideFixture{ents: &Entitlements{}, clock: clock, scope: scope, sandbox: sandbox, sub: sub,
		view: NewCachedPlanView(nil, clock)}
	f.svc = NewOverrides(f.view.ForgettingOverrides(&memOverrides{deleted: map[uuid.UUID]bool{}}), overrideSubs{sub}, metrics, f.ents, clock)
	return f
}

func ovStr(s string) *string { return &s }

// wantOverrideErr checks err's kind and field ("" kind: no error).
func wantOverrideErr(t *testing.T, what string, err error, kind Kind, field string) {
	t.Helper()
	if kind == "" {
		if err != nil {
			t.Errorf("%s: %v", what, err)
		}
		return
	}
	e, ok := AsError(err)
	if !ok || e.Kind != kind || (field != "" && e.Field != field) {
		t.Errorf("%s: %v, want %s naming %q", what, err, kind, field)
	}
}

// TestOverrideCreateRules: docs/spec/interface.md Overrides POST: 400 for a missing
// field, a metered metric, a value not shaped for the type or a bad
// expires_at; 404 for an unknown metric or a subscription of the other
// environment; 409 for a second live override; an expired one is replaced
// with a new id.
func TestOverrideCreateRules(t *testing.T) {
	f := newOverrideFixture()
	ctx := context.Background()
	future := f.clock.Now().Add(time.Hour).Truncate(time.Second)
	past := f.clock.Now().Add(-time.Hour).Truncate(time.Second)
	tests := []struct {
		name  string
		scope Scope
		in    CreateOverride
		kind  Kind
		field string
	}{
		{"metered", f.scope, CreateOverride{BillableMetricKey: "api", Value: json.RawMessage(`{"enabled":false}`)}, KindBadRequest, "billable_metric_key"},
		{"unknown metric", f.scope, CreateOverride{BillableMetricKey: "nope", Value: json.RawMessage(`{"cap":1}`)}, KindNotFound, "billable_metric_key"},
		{"gauge without cap", f.scope, CreateOverride{BillableMetricKey: "seats", Value: json.RawMessage(`{"enabled":true}`)}, KindBadRequest, "value.cap"},
		{"negative cap", f.scope, CreateOverride{BillableMetricKey: "seats", Value: json.RawMessage(`{"cap":-1}`)}, KindBadRequest, "value.cap"},
		{"boolean without enabled", f.scope, CreateOverride{BillableMetricKey: "sso", Value: json.RawMessage(`{"cap":1}`)}, KindBadRequest, "value.enabled"},
		{"static config not an object", f.scope, CreateOverride{BillableMetricKey: "limits", Value: json.RawMessage(`{"config":[1]}`)}, KindBadRequest, "value.config"},
		{"value not an object", f.scope, CreateOverride{BillableMetricKey: "seats", Value: json.RawMessage(`5`)}, KindBadRequest, "value"},
		{"past expires_at", f.scope, CreateOverride{BillableMetricKey: "seats", Value: json.RawMessage(`{"cap":1}`), ExpiresAt: &past}, KindBadRequest, "expires_at"},
		{"other environment", f.sandbox, CreateOverride{BillableMetricKey: "seats", Value: json.RawMessage(`{"cap":1}`)}, KindNotFound, ""},
	}
	for _, tc := range tests {
		_, err := f.svc.Create(ctx, tc.scope, f.sub.ID, tc.in)
		wantOverrideErr(t, tc.name, err, tc.kind, tc.field)
	}
	if f.forgets() != 0 {
		t.Fatalf("failed creates made the plan view forget %d times", f.forgets())
	}
	if _, err := f.svc.Create(ctx, f.scope, uuid.New(), CreateOverride{BillableMetricKey: "seats", Value: json.RawMessage(`{"cap":1}`)}); err == nil {
		t.Error("unknown subscription accepted")
	}

	o, err := f.svc.Create(ctx, f.scope, f.sub.ID, CreateOverride{BillableMetricKey: "seats", Value: json.RawMessage(`{"cap": 7, "extra": 1}`), ExpiresAt: &future})
	if err != nil {
		t.Fatal(err)
	}
	if string(o.Value) != `{"cap":7}` || o.Reason != "" || o.ExpiresAt == nil || o.SubscriptionID != f.sub.ID || o.TenantID != f.scope.TenantID || o.BillableMetricKey != "seats" {
		t.Errorf("created %+v", o)
	}
	_, err = f.svc.Create(ctx, f.scope, f.sub.ID, CreateOverride{BillableMetricKey: "seats", Value: json.RawMessage(`{"cap":8}`)})
	wantOverrideErr(t, "second live override", err, KindConflict, "billable_metric_key")

	f.clock.add(2 * time.Hour)
	if list, _ := f.svc.List(ctx, f.scope, f.sub.ID); len(list) != 0 || list == nil {
		t.Errorf("an expired override is listed: %+v", list)
	}
	again, err := f.svc.Create(ctx, f.scope, f.sub.ID, CreateOverride{BillableMetricKey: "seats", Value: json.RawMessage(`{"cap":8}`), Reason: ovStr("renewed deal")})
	if err != nil || again.ID == o.ID || again.Reason != "renewed deal" {
		t.Fatalf("replacing an expired override: %+v, %v", again, err)
	}
	if f.forgets() != 2 {
		t.Errorf("the plan view forgot %d times, want 2", f.forgets())
	}
	if _, err := f.svc.List(ctx, f.sandbox, f.sub.ID); err == nil {
		t.Error("list from the other environment worked")
	}
}

// TestOverrideUpdateDelete: PATCH keeps an omitted expires_at, null makes
// it permanent, value is shaped by the type; DELETE is soft and once; both
// refresh the customer's snapshot and run the hook.
func TestOverrideUpdateDelete(t *testing.T) {
	f := newOverrideFixture()
	ctx := context.Background()
	future := f.clock.Now().Add(time.Hour).Truncate(time.Second)
	o, err := f.svc.Create(ctx, f.scope, f.sub.ID, CreateOverride{BillableMetricKey: "sso", Value: json.RawMessage(`{"enabled":true}`), ExpiresAt: &future, Reason: ovStr("trial")})
	if err != nil {
		t.Fatal(err)
	}

	cached := func() bool {
		_, ok := f.ents.snapshots.get(f.sub.CustomerID, f.clock.Now(), 0)
		return ok
	}
	f.ents.snapshots.put(Snapshot{CustomerID: f.sub.CustomerID, CachedAt: f.clock.Now()}, 0)

	u, err := f.svc.Update(ctx, f.scope, f.sub.ID, "sso", UpdateOverride{Reason: ovStr("sales")})
	if err != nil || u.ExpiresAt == nil || !u.ExpiresAt.Equal(*o.ExpiresAt) || u.Reason != "sales" || string(u.Value) != `{"enabled":true}` {
		t.Fatalf("update reason only: %+v, %v", u, err)
	}
	if cached() {
		t.Error("the snapshot survived an override update")
	}
	u, err = f.svc.Update(ctx, f.scope, f.sub.ID, "sso", UpdateOverride{SetExpiry: true, Value: json.RawMessage(`{"enabled":false}`)})
	if err != nil || u.ExpiresAt != nil || string(u.Value) != `{"enabled":false}` || u.Reason != "sales" {
		t.Fatalf("update to permanent: %+v, %v", u, err)
	}
	_, err = f.svc.Update(ctx, f.scope, f.sub.ID, "sso", UpdateOverride{Value: json.RawMessage(`{"cap":1}`)})
	wantOverrideErr(t, "value mismatch", err, KindBadRequest, "value.enabled")
	_, err = f.svc.Update(ctx, f.scope, f.sub.ID, "seats", UpdateOverride{Reason: ovStr("x")})
	wantOverrideErr(t, "no override of that metric", err, KindNotFound, "")
	_, err = f.svc.Update(ctx, f.scope, f.sub.ID, "nope", UpdateOverride{Value: json.RawMessage(`{"cap":1}`)})
	wantOverrideErr(t, "unknown metric", err, KindNotFound, "")
	_, err = f.svc.Update(ctx, f.sandbox, f.sub.ID, "sso", UpdateOverride{Reason: ovStr("x")})
	wantOverrideErr(t, "other environment", err, KindNotFound, "")
	nullValue := BadRequest("value", "value cannot be null; omit it to keep the value")
	_, err = f.svc.Update(ctx, f.sandbox, f.sub.ID, "sso", UpdateOverride{ValueErr: nullValue})
	wantOverrideErr(t, "null value, other environment", err, KindNotFound, "")
	_, err = f.svc.Update(ctx, f.scope, f.sub.ID, "sso", UpdateOverride{ValueErr: nullValue})
	wantOverrideErr(t, "null value", err, KindBadRequest, "value")

	f.ents.snapshots.put(Snapshot{CustomerID: f.sub.CustomerID, CachedAt: f.clock.Now()}, 0)
	if err := f.svc.Delete(ctx, f.scope, f.sub.ID, "sso"); err != nil {
		t.Fatal(err)
	}
	if cached() {
		t.Error("the snapshot survived an override delete")
	}
	wantOverrideErr(t, "second delete", f.svc.Delete(ctx, f.scope, f.sub.ID, "sso"), KindNotFound, "")
	wantOverrideErr(t, "delete from the other environment", f.svc.Delete(ctx, f.sandbox, f.sub.ID, "seats"), KindNotFound, "")
	if list, _ := f.svc.List(ctx, f.scope, f.sub.ID); len(list) != 0 {
		t.Errorf("listed after delete: %+v", list)
	}
	if _, err := f.svc.Create(ctx, f.scope, f.sub.ID, CreateOverride{BillableMetricKey: "sso", Value: json.RawMessage(`{"enabled":true}`)}); err != nil {
		t.Errorf("create after delete: %v", err)
	}
	if f.forgets() != 5 {
		t.Errorf("the plan view forgot %d times, want 5 (create, 2 updates, delete, create)", f.forgets())
	}
}

// TestImportNeverFiresGranted: an import grant owes no credit.granted; a
// topup grant does (docs/spec/interface.md Events).
func TestImportNeverFiresGranted(t *testing.T) {
	src := SourceMigration
	block := uuid.New()
	m := Mutation{OpID: uuid.New(), Kind: MutationGrant, TenantID: uuid.New(), CustomerID: uuid.New(), Environment: EnvironmentLive,
		Account: MutationAccount{Balance: 100, Version: 1},
		Entries: []MutationEntry{{Role: RoleMain, Delta: 100, Type: EntryAdjustment, Source: &src, BlockID: &block}},
		Context: &MutationContext{ExternalID: "acme", Emitter: EmitterImport}}
	if evs := EventsOf(m); len(evs) != 0 {
		t.Errorf("import grant events %+v", evs)
	}
	m.Context.Emitter = EmitterTopup
	if evs := EventsOf(m); len(evs) != 1 || evs[0].EventType != EventCreditGranted {
		t.Errorf("topup grant events %+v", evs)
	}
}
