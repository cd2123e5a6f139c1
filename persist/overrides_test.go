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

func override(s engine.Scope, sub uuid.UUID, m engine.BillableMetric, value string, expires *time.Time, at time.Time) engine.Override {
	return engine.Override{ID: uuid.Must(uuid.NewV7()), TenantID: s.TenantID, SubscriptionID: sub, BillableMetricID: m.ID,
		BillableMetricKey: m.Key, Value: json.RawMessage(value), ExpiresAt: expires, Reason: "support", CreatedAt: at, UpdatedAt: at}
}

// TestOverrideStore: one live override per subscription and metric, an
// expired one replaced (kept, marked deleted), update and soft delete only
// of live rows in scope, LiveOverrides skipping deleted and expired rows.
func TestOverrideStore(t *testing.T) {
	b := setup(t)
	live, sandbox := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	gauge, flag := metric(live, "seats", engine.MetricGauge, now), metric(live, "sso", engine.MetricBoolean, now)
	for _, m := range []engine.BillableMetric{gauge, flag} {
		if err := b.store.CreateMetric(b.ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	sub := uuid.New()

	first := override(live, sub, gauge, `{"cap": 5}`, nil, now)
	if err := b.store.CreateOverride(b.ctx, live.Environment, first, now); err != nil {
		t.Fatalf("CreateOverride: %v", err)
	}
	if err := b.store.CreateOverride(b.ctx, live.Environment, override(live, sub, gauge, `{"cap": 6}`, nil, now), now); !errors.Is(err, engine.ErrOverrideExists) {
		t.Fatalf("second live override: %v, want ErrOverrideExists", err)
	}
	soon := now.Add(time.Minute)
	expiring := override(live, sub, flag, `{"enabled": true}`, &soon, now)
	if err := b.store.CreateOverride(b.ctx, live.Environment, expiring, now); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.LiveOverrides(b.ctx, live.TenantID, sub, now)
	if err != nil || len(got) != 2 || got[0].ID != first.ID || got[1].ID != expiring.ID {
		t.Fatalf("LiveOverrides = %+v, %v", got, err)
	}
	var cap struct{ Cap int64 }
	if json.Unmarshal(got[0].Value, &cap) != nil || cap.Cap != 5 || got[0].Reason != "support" || got[0].BillableMetricID != gauge.ID {
		t.Errorf("override read back %+v", got[0])
	}

	// After expires_at the flag override stops applying and can be replaced.
	later := soon.Add(time.Second)
	if got, _ := b.store.LiveOverrides(b.ctx, live.TenantID, sub, later); len(got) != 1 || got[0].ID != first.ID {
		t.Fatalf("LiveOverrides after expiry = %+v", got)
	}
	if _, err := b.store.UpdateOverride(b.ctx, live, sub, flag.Key, later, func(*engine.Override) error { return nil }); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("update of an expired override: %v, want ErrNotFound", err)
	}
	if err := b.store.DeleteOverride(b.ctx, live, sub, flag.Key, later); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("delete of an expired override: %v, want ErrNotFound", err)
	}
	replacement := override(live, sub, flag, `{"enabled": false}`, nil, later)
	if err := b.store.CreateOverride(b.ctx, live.Environment, replacement, later); err != nil {
		t.Fatalf("replacing an expired override: %v", err)
	}
	var rows, deleted int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*), count(deleted_at) FROM subscription_overrides
		WHERE subscription_id = $1 AND billable_metric_key = $2`, sub, flag.Key).Scan(&rows, &deleted); err != nil || rows != 2 || deleted != 1 {
		t.Errorf("flag rows %d, deleted %d, %v; want the expired row kept and marked deleted", rows, deleted, err)
	}

	// Update: scoped, the change is written, a change error aborts.
	if _, err := b.store.UpdateOverride(b.ctx, sandbox, sub, gauge.Key, later, func(*engine.Override) error { return nil }); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("update from the other environment: %v", err)
	}
	boom := errors.New("boom")
	if _, err := b.store.UpdateOverride(b.ctx, live, sub, gauge.Key, later, func(o *engine.Override) error {
		o.Reason = "never"
		return boom
	}); !errors.Is(err, boom) {
		t.Errorf("change error: %v", err)
	}
	upd, err := b.store.UpdateOverride(b.ctx, live, sub, gauge.Key, later, func(o *engine.Override) error {
		o.Value, o.ExpiresAt, o.Reason, o.UpdatedAt = json.RawMessage(`{"cap": 9}`), &soon, "", later
		return nil
	})
	if err != nil || upd.ID != first.ID || !upd.UpdatedAt.Equal(later) {
		t.Fatalf("UpdateOverride = %+v, %v", upd, err)
	}
	// It now expires at soon, which is before later: no longer live.
	if got, _ := b.store.LiveOverrides(b.ctx, live.TenantID, sub, later); len(got) != 1 || got[0].ID != replacement.ID {
		t.Fatalf("LiveOverrides after update = %+v", got)
	}
	if got, _ := b.store.LiveOverrides(b.ctx, live.TenantID, sub, now); len(got) != 2 || got[0].Reason != "" || string(got[0].Value) != `{"cap": 9}` {
		t.Fatalf("LiveOverrides at now after update = %+v", got)
	}

	// Delete: scoped, soft, once.
	if err := b.store.DeleteOverride(b.ctx, sandbox, sub, flag.Key, later); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("delete from the other environment: %v", err)
	}
	if err := b.store.DeleteOverride(b.ctx, live, sub, flag.Key, later); err != nil {
		t.Fatal(err)
	}
	if err := b.store.DeleteOverride(b.ctx, live, sub, flag.Key, later); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	if got, _ := b.store.LiveOverrides(b.ctx, live.TenantID, sub, later); len(got) != 0 {
		t.Errorf("LiveOverrides after delete = %+v", got)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*), count(deleted_at) FROM subscription_overrides
		WHERE subscription_id = $1`, sub).Scan(&rows, &deleted); err != nil || rows != 3 || deleted != 2 {
		t.Errorf("rows %d, deleted %d, %v; want history kept", rows, deleted, err)
	}
}

// TestOverrideCreateRace: concurrent creates for one metric leave exactly one.
func TestOverrideCreateRace(t *testing.T) {
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	m := metric(live, "seats", engine.MetricGauge, now)
	if err := b.store.CreateMetric(b.ctx, m); err != nil {
		t.Fatal(err)
	}
	sub := uuid.New()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs[i] = b.store.CreateOverride(b.ctx, live.Environment, override(live, sub, m, `{"cap": 1}`, nil, now), now)
		}(i)
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, engine.ErrOverrideExists):
			t.Errorf("racing create: %v", err)
		}
	}
	if ok != 1 {
		t.Errorf("%d creates won, want 1", ok)
	}
}
