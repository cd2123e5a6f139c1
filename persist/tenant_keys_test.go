package persist

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
)

// upsertShapes are the ON CONFLICT upserts persist makes on every key
// migration 031 widened, with the target the previous release names
// (before 031) and the one this release names.
var upsertShapes = []struct {
	table, insert, old, new string
}{
	{"ledger_entries", `INSERT INTO ledger_entries (id, op_id, tenant_id, customer_id, environment, delta, type, created_at)
		VALUES ($1, $1, $2, $3, 'live', 5, 'grant', '2026-01-02T03:04:05Z')`, // a replay carries its instant
		"(id)", "(id, tenant_id, created_at)"}, // 033 adds created_at
	{"operations", `INSERT INTO operations (op_id, tenant_id, customer_id, idempotency_key, account_version, mutation,
		created_at) VALUES ($1, $2, $3, 'k1', 1, '{}', '2026-01-02T03:04:05Z')`, // a replay carries its instant
		"(tenant_id, idempotency_key, op_id)", "(tenant_id, idempotency_key, op_id, created_at)"}, // 034 adds created_at
	{"credit_accounts", `INSERT INTO credit_accounts (customer_id, tenant_id, environment, version, updated_at)
		VALUES ($3, $2, 'live', 1, now())`, "(customer_id)", "(customer_id, tenant_id)"},
	{"credit_blocks", `INSERT INTO credit_blocks (id, tenant_id, customer_id, original_amount, remaining_amount, priority,
		source, starts_at, created_at, version) VALUES ($1, $2, $3, 5, 5, 0, 'manual', now(), now(), 1)`, "(id)", "(id, tenant_id)"},
	{"reservations", `INSERT INTO reservations (id, tenant_id, customer_id, environment, billable_metric_key,
		estimated_units, estimated_cost, status, reference_id, expires_at, created_at, version)
		VALUES ($1, $2, $3, 'live', 'm', 1, 1, 'active', $1, now(), now(), 1)`, "(id)", "(id, tenant_id)"},
	{"gauges", `INSERT INTO gauges (customer_id, metric_key, tenant_id, environment, current, version, updated_at)
		VALUES ($3, 'seats', $2, 'live', 1, 1, now())`, "(customer_id, metric_key)", "(customer_id, metric_key, tenant_id)"},
	{"gauge_leases", `INSERT INTO gauge_leases (id, tenant_id, customer_id, environment, billable_metric_key, amount,
		status, expires_at, seconds, created_at, version)
		VALUES ($1, $2, $3, 'live', 'seats', 1, 'active', now(), 60, now(), 1)`, "(id)", "(id, tenant_id)"},
	{"webhook_events", `INSERT INTO webhook_events (id, tenant_id, environment, event_type, payload, created_at)
		VALUES ($1, $2, 'live', 'credit.granted', '{}', '2026-01-02T03:04:05Z')`, // a replay carries its instant
		"(id)", "(id, tenant_id, created_at)"}, // 035 adds created_at
	{"usage_hourly", `INSERT INTO usage_hourly (customer_id, hour_start, billable_metric_key, tenant_id, environment,
		units, cost, count) VALUES ($3, date_trunc('hour', now()), 'm', $2, 'live', 1, 1, 1)`,
		"(customer_id, hour_start, billable_metric_key)", "(customer_id, hour_start, billable_metric_key, tenant_id)"},
	{"credit_alert_states", `INSERT INTO credit_alert_states (customer_id, tenant_id, account_version, balance_mc,
		last_grant_mc, updated_at) VALUES ($3, $2, 1, 0, 0, now())`, "(customer_id)", "(customer_id, tenant_id)"},
	{"credit_alert_settings", `INSERT INTO credit_alert_settings (tenant_id, environment, customer_id, settings,
		created_at, updated_at) VALUES ($2, 'live', $3, '{}', now(), now())`,
		"(customer_id) WHERE customer_id IS NOT NULL", "(customer_id, tenant_id) WHERE customer_id IS NOT NULL"},
}

// TestTenantKeysExpandContract rehearses migrations 031, 033, 034 and 035 under a rolling
// upgrade (docs/decisions.md "Tenant keys: expand now, contract later"): a
// database at 030 with rows in it, migrated by Migrate (not fresh: expand
// only), still takes every upsert of the previous release and already
// takes this release's; a delivery written the old way (no tenant_id)
// gets its event's tenant; Schema reports the contract pending. After
// MigrateContract the old upserts are refused (42P10: no such unique key),
// the new ones still work, the schema has no tenant-sharding break, and
// the events and attempts stored before stay in their legacy partitions
// (035), an attempt dated before its event moved up to it.
func TestTenantKeysExpandContract(t *testing.T) {
	t.Parallel()
	db := setupAt(t, 30)
	tenant, customer := uuid.New(), uuid.New()
	if _, err := db.pool.Exec(db.ctx, `INSERT INTO tenants (id, name) VALUES ($1, 'acme')`, tenant); err != nil {
		t.Fatal(err)
	}
	if _, err := db.pool.Exec(db.ctx, `INSERT INTO customers (id, tenant_id, environment, external_id)
		VALUES ($1, $2, 'live', 'c1')`, customer, tenant); err != nil {
		t.Fatal(err)
	}
	upsert := func(i int, target string) error {
		s := upsertShapes[i]
		// The CTE types every parameter, used by the insert or not.
		_, err := db.pool.Exec(db.ctx, "WITH p AS (SELECT $1::uuid, $2::uuid, $3::uuid) "+s.insert+
			" ON CONFLICT "+target+" DO NOTHING",
			uuid.NewSHA1(tenant, []byte(s.table)), tenant, customer)
		return err
	}
	for i, s := range upsertShapes {
		if err := upsert(i, s.old); err != nil {
			t.Fatalf("%s at 030, old target: %v", s.table, err)
		}
	}

	if err := Migrate(db.ctx, db.pool); err != nil {
		t.Fatalf("Migrate (expand): %v", err)
	}
	st, err := Schema(db.ctx, db.pool)
	if err != nil || st.Check() != nil || !slices.Equal(st.PendingContract,
		[]string{"031_tenant_keys", "033_ledger_partitions", "034_operations_partitions", "035_event_partitions",
			"036_event_months", "037_carried_months"}) {
		t.Fatalf("after expand: %+v %v (check %v), want the contracts of 031 and 033 to 037 pending", st, err, st.Check())
	}
	for i, s := range upsertShapes {
		for _, target := range []string{s.old, s.new} {
			if err := upsert(i, target); err != nil {
				t.Errorf("%s expanded, target %s: %v", s.table, target, err)
			}
		}
	}
	// The previous release writes attempts without tenant_id.
	event := uuid.NewSHA1(tenant, []byte("webhook_events"))
	delivery := uuid.New()
	if _, err := db.pool.Exec(db.ctx, `INSERT INTO webhook_deliveries (id, event_id, duration_ms, created_at)
		VALUES ($1, $2, 3, now())`, delivery, event); err != nil {
		t.Fatal(err)
	}
	var got uuid.UUID
	if err := db.pool.QueryRow(db.ctx, `SELECT tenant_id FROM webhook_deliveries WHERE id = $1`, delivery).Scan(&got); err != nil || got != tenant {
		t.Fatalf("old-style delivery's tenant = %v (%v), want %v", got, err, tenant)
	}
	// The previous release dates an attempt by its own clock, which may be
	// behind the one that dated the event (035's contract moves it up).
	early := uuid.New()
	if _, err := db.pool.Exec(db.ctx, `INSERT INTO webhook_deliveries (id, tenant_id, event_id, duration_ms, created_at)
		VALUES ($1, $2, $3, 3, '2026-01-02T03:04:04Z')`, early, tenant, event); err != nil {
		t.Fatal(err)
	}
	if v, err := tenantViolations(db.ctx, db.pool); err != nil || len(v) == 0 {
		t.Fatalf("expanded schema: violations %v (%v), want the old keys still there", v, err)
	}

	if err := MigrateContract(db.ctx, db.pool); err != nil {
		t.Fatalf("MigrateContract: %v", err)
	}
	if st, err := Schema(db.ctx, db.pool); err != nil || len(st.PendingContract) != 0 || st.Check() != nil {
		t.Fatalf("after contract: %+v %v", st, err)
	}
	for i, s := range upsertShapes {
		err := upsert(i, s.old)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "42P10" {
			t.Errorf("%s contracted, old target %s = %v, want 42P10", s.table, s.old, err)
		}
		if err := upsert(i, s.new); err != nil {
			t.Errorf("%s contracted, new target %s: %v", s.table, s.new, err)
		}
	}
	if v, err := tenantViolations(db.ctx, db.pool); err != nil || len(v) > 0 {
		t.Fatalf("contracted schema: violations:\n%s\n%v", strings.Join(v, "\n"), err)
	}
	// 035's switch kept the rows where they were (the legacy partitions)
	// and dated the early attempt at its event.
	for _, q := range []struct{ sql, want string }{
		{`SELECT tableoid::regclass::text FROM webhook_events WHERE id = $1 LIMIT 1`, "webhook_events_legacy"},
		{`SELECT tableoid::regclass::text FROM webhook_deliveries WHERE id = $1`, "webhook_deliveries_legacy"},
	} {
		id := event
		if strings.Contains(q.sql, "deliveries") {
			id = early
		}
		var where string
		if err := db.pool.QueryRow(db.ctx, q.sql, id).Scan(&where); err != nil || where != q.want {
			t.Errorf("%s: %q (%v), want %s", q.sql, where, err, q.want)
		}
	}
	var dated time.Time
	if err := db.pool.QueryRow(db.ctx, `SELECT created_at FROM webhook_deliveries WHERE id = $1`, early).Scan(&dated); err != nil ||
		!dated.Equal(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)) {
		t.Errorf("early attempt dated %v (%v) after the switch, want its event's instant", dated, err)
	}
	var nullable bool
	if err := db.pool.QueryRow(db.ctx, `SELECT NOT attnotnull FROM pg_attribute
		WHERE attrelid = 'webhook_deliveries'::regclass AND attname = 'tenant_id'`).Scan(&nullable); err != nil || nullable {
		t.Fatalf("webhook_deliveries.tenant_id nullable = %v (%v) after the contract", nullable, err)
	}
	// Contracting again finds nothing to do.
	if err := MigrateContract(db.ctx, db.pool); err != nil {
		t.Fatal(fmt.Errorf("second MigrateContract: %w", err))
	}
}
