package persist

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// Gauge leases (engine/leases.go): the persister writes the leases a
// Mutation's gauge section carries in Apply's transaction, next to the
// gauge counter; the lease sweep and the rebuild read them back.

var _ engine.LeaseIndex = (*Store)(nil)

func init() {
	sectionWriters = append(sectionWriters, sectionWriter{name: "gauge leases", queue: queueLeases})
}

const upsertLeasesSQL = `INSERT INTO gauge_leases AS l
	(id, tenant_id, customer_id, environment, billable_metric_key, amount, status, expires_at, seconds,
	 created_at, ended_at, version)
SELECT id, tenant_id, customer_id, env, metric, amount, status, expires, seconds, created, ended, version
FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::bigint[], $7::text[],
	$8::timestamptz[], $9::bigint[], $10::timestamptz[], $11::timestamptz[], $12::bigint[])
	AS t(id, tenant_id, customer_id, env, metric, amount, status, expires, seconds, created, ended, version)
ON CONFLICT (id, tenant_id) DO UPDATE SET
	status = EXCLUDED.status, expires_at = EXCLUDED.expires_at, seconds = EXCLUDED.seconds,
	ended_at = EXCLUDED.ended_at, version = EXCLUDED.version
WHERE l.version < EXCLUDED.version`

// leaseRow is one lease of a batch with the Mutation that carries its
// newest state.
type leaseRow struct {
	lease engine.MutationLease
	m     *engine.Mutation
}

// queueLeases upserts each lease the batch's gauge sections carry, its
// newest state only (one statement may not upsert a row twice), over an
// older stored version only.
func queueLeases(b *pgx.Batch, ms []engine.Mutation) error {
	newest := map[uuid.UUID]leaseRow{}
	for i := range ms {
		m := &ms[i]
		if m.Gauge == nil {
			continue
		}
		for _, l := range m.Gauge.Leases {
			if cur, seen := newest[l.ID]; !seen || cur.m.Account.Version < m.Account.Version {
				newest[l.ID] = leaseRow{l, m}
			}
		}
	}
	if len(newest) == 0 {
		return nil
	}
	ids := make([]uuid.UUID, 0, len(newest))
	for id := range newest {
		ids = append(ids, id)
	}
	// Racing Applies lock rows in one order.
	sort.Slice(ids, func(i, j int) bool { return bytes.Compare(ids[i][:], ids[j][:]) < 0 })
	var (
		tenant, customer         []uuid.UUID
		env, metric, status      []string
		amount, seconds, version []int64
		expires, created         []time.Time
		ended                    []*time.Time
	)
	for _, id := range ids {
		r := newest[id]
		tenant = append(tenant, r.m.TenantID)
		customer = append(customer, r.m.CustomerID)
		env = append(env, string(r.m.Environment))
		metric = append(metric, r.m.Gauge.Metric)
		status = append(status, string(r.lease.Status))
		amount = append(amount, r.lease.Amount)
		seconds = append(seconds, r.lease.Seconds)
		version = append(version, r.m.Account.Version)
		expires = append(expires, time.UnixMilli(r.lease.ExpiresMS).UTC())
		created = append(created, time.UnixMilli(r.lease.CreatedMS).UTC())
		ended = append(ended, msTime(r.lease.EndedMS))
	}
	b.Queue(upsertLeasesSQL, ids, tenant, customer, env, metric, amount, status, expires, seconds, created, ended, version)
	return nil
}

// DueLeases lists up to limit leases Postgres holds active whose
// expires_at is at or before now, soonest first (the lease sweep).
func (s *Store) DueLeases(ctx context.Context, now time.Time, limit int) ([]engine.DueLease, error) {
	rows, err := s.pool.Query(ctx, `SELECT tenant_id, environment, customer_id, billable_metric_key, id
		FROM gauge_leases WHERE status = 'active' AND expires_at <= $1 ORDER BY expires_at LIMIT $2`, now, limit)
	if err != nil {
		return nil, fmt.Errorf("persist: due leases: %w", err)
	}
	var (
		out              []engine.DueLease
		tenant, customer uuid.UUID
		env, metric      string
		id               uuid.UUID
	)
	_, err = pgx.ForEachRow(rows, []any{&tenant, &env, &customer, &metric, &id}, func() error {
		out = append(out, engine.DueLease{Customer: engine.CustomerKey{TenantID: tenant, CustomerID: customer,
			Environment: engine.Environment(env)}, Metric: metric, LeaseID: id})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("persist: due leases: %w", err)
	}
	return out, nil
}

// LeaseOf finds lease id of customer c; ok is false when Postgres does not
// know it.
func (s *Store) LeaseOf(ctx context.Context, c engine.CustomerKey, id uuid.UUID) (engine.StoredLease, bool, error) {
	var (
		l                engine.StoredLease
		status           string
		expires, created time.Time
		ended            *time.Time
	)
	err := s.pool.QueryRow(ctx, `SELECT billable_metric_key, amount, status, expires_at, seconds, created_at, ended_at
		FROM gauge_leases WHERE id = $1 AND customer_id = $2 AND tenant_id = $3 AND environment = $4`,
		id, c.CustomerID, c.TenantID, string(c.Environment)).
		Scan(&l.Metric, &l.Amount, &status, &expires, &l.Seconds, &created, &ended)
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.StoredLease{}, false, nil
	}
	if err != nil {
		return engine.StoredLease{}, false, fmt.Errorf("persist: lease %s: %w", id, err)
	}
	l.ID, l.Status = id, engine.LeaseStatus(status)
	l.ExpiresMS, l.CreatedMS, l.EndedMS = expires.UnixMilli(), created.UnixMilli(), msOf(ended)
	return l, true, nil
}

// fillLeases adds to each state in index its active leases, in the
// rebuild's snapshot tx (their slots are in the gauge counters it reads).
func fillLeases(ctx context.Context, tx pgx.Tx, index map[uuid.UUID]*engine.AccountState, ids []uuid.UUID) error {
	rows, err := tx.Query(ctx, `SELECT customer_id, id, billable_metric_key, amount, expires_at, seconds, created_at
		FROM gauge_leases WHERE customer_id = ANY($1) AND tenant_id = ANY($2) AND status = 'active'
		ORDER BY customer_id, created_at, id`, ids, stateTenants(index))
	if err != nil {
		return err
	}
	var (
		customer         uuid.UUID
		l                engine.StoredLease
		expires, created time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&customer, &l.ID, &l.Metric, &l.Amount, &expires, &l.Seconds, &created}, func() error {
		st := index[customer]
		if st == nil {
			return nil
		}
		x := l
		x.Status, x.ExpiresMS, x.CreatedMS = engine.LeaseActive, expires.UnixMilli(), created.UnixMilli()
		st.Leases = append(st.Leases, x)
		return nil
	})
	return err
}
