package persist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// Reservations (reservations) and gauge counters: two Mutation sections the
// persister writes in Apply's transaction, and the reads of them (the
// reservation API and the rebuild).

var _ engine.ReservationReader = (*Store)(nil)

func init() {
	sectionWriters = append(sectionWriters,
		sectionWriter{name: "reservations", queue: queueReservations},
		sectionWriter{name: "gauges", queue: queueGauges},
	)
}

// FinalizedReservationWindow is how long after its commit, release or expiry a
// reservation is still loaded into Redis by a rebuild, so a second commit or
// release of it still answers 409 rather than 404.
const FinalizedReservationWindow = 24 * time.Hour

// upsertReservationsSQL keeps a reservation's stored metadata when the incoming
// row has none: a release or expiry Mutation does not carry the reservation's
// metadata (invariant 13), only the reserve and a commit that merges into it.
// A multi-metric reservation's items likewise: a release does not carry them.
const upsertReservationsSQL = `INSERT INTO reservations AS r
	(id, tenant_id, customer_id, environment, billable_metric_key, estimated_units, estimated_cost,
	 actual_units, actual_cost, released, status, reference_id, expires_at, metadata, created_at,
	 committed_at, released_at, version, items)
SELECT id, tenant_id, customer_id, env, metric, est_units, est_cost, act_units, act_cost, released,
	status, id, expires, meta::jsonb, created, committed, released_at, version, items::jsonb
FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::bigint[], $7::bigint[],
	$8::bigint[], $9::bigint[], $10::bigint[], $11::text[], $12::timestamptz[], $13::text[],
	$14::timestamptz[], $15::timestamptz[], $16::timestamptz[], $17::bigint[], $18::text[])
	AS t(id, tenant_id, customer_id, env, metric, est_units, est_cost, act_units, act_cost, released,
	     status, expires, meta, created, committed, released_at, version, items)
ON CONFLICT (id, tenant_id) DO UPDATE SET
	tenant_id = EXCLUDED.tenant_id, customer_id = EXCLUDED.customer_id,
	environment = EXCLUDED.environment, billable_metric_key = EXCLUDED.billable_metric_key,
	estimated_units = EXCLUDED.estimated_units, estimated_cost = EXCLUDED.estimated_cost,
	actual_units = EXCLUDED.actual_units, actual_cost = EXCLUDED.actual_cost,
	released = EXCLUDED.released, status = EXCLUDED.status, expires_at = EXCLUDED.expires_at,
	metadata = CASE WHEN EXCLUDED.metadata = '{}'::jsonb THEN r.metadata ELSE EXCLUDED.metadata END,
	created_at = EXCLUDED.created_at,
	committed_at = EXCLUDED.committed_at, released_at = EXCLUDED.released_at,
	version = EXCLUDED.version, items = COALESCE(EXCLUDED.items, r.items)
WHERE r.version < EXCLUDED.version`

const upsertGaugesSQL = `INSERT INTO gauges AS g
	(customer_id, metric_key, tenant_id, environment, current, version, updated_at)
SELECT customer_id, metric, tenant_id, env, current, version, at
FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::bigint[], $6::bigint[], $7::timestamptz[])
	AS t(customer_id, metric, tenant_id, env, current, version, at)
ON CONFLICT (customer_id, metric_key, tenant_id) DO UPDATE SET
	tenant_id = EXCLUDED.tenant_id, environment = EXCLUDED.environment,
	current = EXCLUDED.current, version = EXCLUDED.version, updated_at = EXCLUDED.updated_at
WHERE g.version < EXCLUDED.version`

// msTime is a Unix ms instant as UTC time, nil when ms is.
func msTime(ms *int64) *time.Time {
	if ms == nil {
		return nil
	}
	t := time.UnixMilli(*ms).UTC()
	return &t
}

// newestBy keeps, per key, the Mutation with the highest account version
// that carries a section (one statement may not upsert a row twice), and
// returns the keys sorted so racing Applies lock rows in one order.
func newestBy[K comparable](ms []engine.Mutation, key func(*engine.Mutation) (K, bool), less func(a, b K) bool) ([]K, map[K]*engine.Mutation) {
	newest := map[K]*engine.Mutation{}
	for i := range ms {
		m := &ms[i]
		k, ok := key(m)
		if !ok {
			continue
		}
		if cur, seen := newest[k]; !seen || cur.Account.Version < m.Account.Version {
			newest[k] = m
		}
	}
	keys := make([]K, 0, len(newest))
	for k := range newest {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return less(keys[i], keys[j]) })
	return keys, newest
}

// queueReservations upserts the reservation state each Mutation carries,
// only over an older stored version.
func queueReservations(b *pgx.Batch, ms []engine.Mutation) error {
	ids, newest := newestBy(ms, func(m *engine.Mutation) (uuid.UUID, bool) {
		if m.Reservation == nil {
			return uuid.Nil, false
		}
		return m.Reservation.ID, true
	}, func(a, b uuid.UUID) bool { return bytes.Compare(a[:], b[:]) < 0 })
	if len(ids) == 0 {
		return nil
	}
	// The newest metadata of each reservation in the batch, for a newest state
	// whose Mutation (a release) does not carry it.
	metaOf := map[uuid.UUID]json.RawMessage{}
	metaVersion := map[uuid.UUID]int64{}
	for i := range ms {
		r := ms[i].Reservation
		if r == nil || len(r.Metadata) == 0 {
			continue
		}
		if v, ok := metaVersion[r.ID]; !ok || ms[i].Account.Version > v {
			metaOf[r.ID], metaVersion[r.ID] = r.Metadata, ms[i].Account.Version
		}
	}
	var (
		tenant, customer                     []uuid.UUID
		env, metric, status, meta            []string
		estUnits, estCost, released, version []int64
		actUnits, actCost                    []*int64
		expires, created                     []time.Time
		committed, releasedAt                []*time.Time
		items                                []*string
	)
	for _, id := range ids {
		m := newest[id]
		r := m.Reservation
		tenant = append(tenant, m.TenantID)
		customer = append(customer, m.CustomerID)
		env = append(env, string(m.Environment))
		metric = append(metric, r.Metric)
		estUnits = append(estUnits, r.EstimatedUnits)
		estCost = append(estCost, r.EstimatedCost)
		actUnits = append(actUnits, r.ActualUnits)
		actCost = append(actCost, r.ActualCost)
		released = append(released, r.Released)
		status = append(status, string(r.Status))
		expires = append(expires, time.UnixMilli(r.ExpiresMS).UTC())
		raw := r.Metadata
		if len(raw) == 0 {
			raw = metaOf[id]
		}
		meta = append(meta, string(rawObject(raw)))
		created = append(created, time.UnixMilli(r.CreatedMS).UTC())
		committed = append(committed, msTime(r.CommittedMS))
		releasedAt = append(releasedAt, msTime(r.ReleasedMS))
		version = append(version, m.Account.Version)
		var it *string
		if len(r.Items) > 0 {
			raw, err := json.Marshal(r.Items)
			if err != nil {
				return fmt.Errorf("persist: reservation %s items: %w", id, err)
			}
			text := string(raw)
			it = &text
		}
		items = append(items, it)
	}
	b.Queue(upsertReservationsSQL, ids, tenant, customer, env, metric, estUnits, estCost, actUnits, actCost,
		released, status, expires, meta, created, committed, releasedAt, version, items)
	return nil
}

// gaugeKey names one gauge counter.
type gaugeKey struct {
	customer uuid.UUID
	metric   string
}

// queueGauges upserts the gauge counter each Mutation carries, only over
// an older stored version.
func queueGauges(b *pgx.Batch, ms []engine.Mutation) error {
	keys, newest := newestBy(ms, func(m *engine.Mutation) (gaugeKey, bool) {
		if m.Gauge == nil {
			return gaugeKey{}, false
		}
		return gaugeKey{m.CustomerID, m.Gauge.Metric}, true
	}, func(a, b gaugeKey) bool {
		if c := bytes.Compare(a.customer[:], b.customer[:]); c != 0 {
			return c < 0
		}
		return a.metric < b.metric
	})
	if len(keys) == 0 {
		return nil
	}
	var (
		customer, tenant []uuid.UUID
		metric, env      []string
		current, version []int64
		at               []time.Time
	)
	for _, k := range keys {
		m := newest[k]
		customer = append(customer, k.customer)
		metric = append(metric, k.metric)
		tenant = append(tenant, m.TenantID)
		env = append(env, string(m.Environment))
		current = append(current, m.Gauge.Current)
		version = append(version, m.Account.Version)
		at = append(at, m.At())
	}
	b.Queue(upsertGaugesSQL, customer, metric, tenant, env, current, version, at)
	return nil
}

// ---- reads ----

const reservationColumns = `id, tenant_id, customer_id, environment, billable_metric_key, estimated_units,
	estimated_cost, actual_units, actual_cost, status, reference_id, expires_at, metadata, created_at,
	committed_at, released_at, items, released`

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

func scanReservation(row pgx.Row) (engine.Reservation, error) {
	var r engine.Reservation
	var env, status string
	var meta, items []byte
	var released int64
	if err := row.Scan(&r.ID, &r.TenantID, &r.CustomerID, &env, &r.BillableMetricKey, &r.EstimatedUnits,
		&r.EstimatedCost, &r.ActualUnits, &r.ActualCost, &status, &r.ReferenceID, &r.ExpiresAt, &meta,
		&r.CreatedAt, &r.CommittedAt, &r.ReleasedAt, &items, &released); err != nil {
		return engine.Reservation{}, err
	}
	if len(items) > 0 {
		// jsonb keeps every digit; the members are int64 as the script wrote them.
		if err := json.Unmarshal(items, &r.Items); err != nil {
			return engine.Reservation{}, fmt.Errorf("reservation %s items: %w", r.ID, err)
		}
	}
	r.Environment = engine.Environment(env)
	r.Status = engine.ReservationStatus(status)
	md, err := parseMetadata(meta)
	if err != nil {
		return engine.Reservation{}, err
	}
	r.Metadata = md
	r.ExpiresAt = r.ExpiresAt.UTC()
	r.CreatedAt = r.CreatedAt.UTC()
	r.CommittedAt = utcPtr(r.CommittedAt)
	r.ReleasedAt = utcPtr(r.ReleasedAt)
	r.Settle(released)
	return r, nil
}

// GetReservation reads reservation id in any tenant and environment (the API
// checks the tenant; reservations are not environment scoped); engine.ErrNotFound
// when Postgres does not hold it.
func (s *Store) GetReservation(ctx context.Context, tenant, id uuid.UUID) (engine.Reservation, error) {
	r, err := scanReservation(s.pool.QueryRow(ctx, `SELECT `+reservationColumns+` FROM reservations
		WHERE id = $1 AND tenant_id = $2`, id, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.Reservation{}, notFound("reservation")
	}
	if err != nil {
		return engine.Reservation{}, fmt.Errorf("persist: get reservation: %w", err)
	}
	return r, nil
}

// ListReservations pages customer's reservations newest first (created_at DESC,
// id DESC), only those with status when it is non-empty. limit is 1..100
// (validated by the caller); a bad cursor is engine.BadRequest("cursor").
func (s *Store) ListReservations(ctx context.Context, c engine.CustomerKey, status string, cursor string, limit int) (engine.Page[engine.Reservation], error) {
	after, hasAfter, err := decodeCursor(cursor)
	if err != nil {
		return engine.Page[engine.Reservation]{}, err
	}
	var q strings.Builder
	q.WriteString(`SELECT ` + reservationColumns + ` FROM reservations WHERE customer_id = $1 AND tenant_id = $2`)
	args := []any{c.CustomerID, c.TenantID}
	if status != "" {
		args = append(args, status)
		fmt.Fprintf(&q, ` AND status = $%d`, len(args))
	}
	if hasAfter {
		args = append(args, after.at, after.id)
		fmt.Fprintf(&q, ` AND (created_at, id) < ($%d, $%d)`, len(args)-1, len(args))
	}
	args = append(args, limit+1)
	fmt.Fprintf(&q, ` ORDER BY created_at DESC, id DESC LIMIT $%d`, len(args))
	list, err := collect(ctx, s, q.String(), args, scanReservation)
	if err != nil {
		return engine.Page[engine.Reservation]{}, fmt.Errorf("persist: list reservations: %w", err)
	}
	return pageOf(list, limit, func(r engine.Reservation) pageKey { return pageKey{at: r.CreatedAt, id: r.ID} }), nil
}

// ReservationCustomer is the customer that holds reservation id (any
// tenant); engine.ErrNotFound when Postgres does not hold it.
func (s *Store) ReservationCustomer(ctx context.Context, tenant, id uuid.UUID) (engine.CustomerKey, error) {
	var c engine.CustomerKey
	var env string
	err := s.pool.QueryRow(ctx, `SELECT tenant_id, environment, customer_id FROM reservations
		WHERE id = $1 AND tenant_id = $2`, id, tenant).
		Scan(&c.TenantID, &env, &c.CustomerID)
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.CustomerKey{}, notFound("reservation")
	}
	if err != nil {
		return engine.CustomerKey{}, fmt.Errorf("persist: reservation customer: %w", err)
	}
	c.Environment = engine.Environment(env)
	return c, nil
}

// fillReservations adds to each state in index its reservations and gauges, in
// the rebuild's snapshot tx: reservations still active and those finalized at or
// after finalizedSince (oldest first), and every gauge counter.
func fillReservations(ctx context.Context, tx pgx.Tx, index map[uuid.UUID]*engine.AccountState, ids []uuid.UUID, finalizedSince time.Time) error {
	rows, err := tx.Query(ctx, `SELECT customer_id, id, billable_metric_key, estimated_units, estimated_cost,
			actual_units, actual_cost, released, status, expires_at, metadata, created_at, committed_at, released_at
		FROM reservations
		WHERE customer_id = ANY($1) AND tenant_id = ANY($3)
			AND COALESCE(committed_at, released_at, 'infinity'::timestamptz) >= $2
		ORDER BY customer_id, created_at, id`, ids, finalizedSince, stateTenants(index))
	if err != nil {
		return err
	}
	var (
		customer            uuid.UUID
		r                   engine.MutationReservation
		status              string
		expires, created    time.Time
		committed, released *time.Time
		meta                []byte
	)
	_, err = pgx.ForEachRow(rows, []any{&customer, &r.ID, &r.Metric, &r.EstimatedUnits, &r.EstimatedCost,
		&r.ActualUnits, &r.ActualCost, &r.Released, &status, &expires, &meta, &created, &committed, &released}, func() error {
		h := r
		h.Status = engine.ReservationStatus(status)
		h.ExpiresMS = expires.UnixMilli()
		h.CreatedMS = created.UnixMilli()
		h.CommittedMS = msOf(committed)
		h.ReleasedMS = msOf(released)
		if r.ActualUnits != nil {
			v := *r.ActualUnits
			h.ActualUnits = &v
		}
		if r.ActualCost != nil {
			v := *r.ActualCost
			h.ActualCost = &v
		}
		h.Metadata = nil
		if len(meta) > 0 && string(meta) != "{}" {
			h.Metadata = append([]byte(nil), meta...)
		}
		st := index[customer]
		st.Reservations = append(st.Reservations, h)
		return nil
	})
	if err != nil {
		return err
	}

	rows, err = tx.Query(ctx, `SELECT customer_id, metric_key, current FROM gauges
		WHERE customer_id = ANY($1) AND tenant_id = ANY($2)`, ids, stateTenants(index))
	if err != nil {
		return err
	}
	var metric string
	var current int64
	_, err = pgx.ForEachRow(rows, []any{&customer, &metric, &current}, func() error {
		index[customer].Gauges[metric] = current
		return nil
	})
	return err
}

// msOf is t in Unix ms, nil when t is.
func msOf(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	ms := t.UnixMilli()
	return &ms
}

// finalizedSince is the cutoff of finalized reservations a rebuild loads. Callers
// pass appliedSince = now - engine.AppliedRetention (the engine's rule), so
// the cutoff is now - FinalizedReservationWindow, derived without a clock of our own.
func finalizedSince(appliedSince time.Time) time.Time {
	return appliedSince.Add(engine.AppliedRetention - FinalizedReservationWindow)
}
