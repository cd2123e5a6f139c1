package persist

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

var _ engine.AlertStore = (*Store)(nil)

// alertScopesTTL bounds how long the persister trusts its list of the
// tenants and environments that have alert settings: a setting written
// through this process counts at once (the list is forgotten), one written
// through another creditd process at the next batch when the fleet's alert
// stamp is readable (WithAlertStamps, issue 25), else within this long. It
// is a cache lifetime, measured on the monotonic clock, not a domain time
// (invariant 6 concerns expiry, schedules and retries, which read the
// Mutation's own instant).
const alertScopesTTL = time.Second

// alertScope is a tenant and environment.
type alertScope struct {
	tenant uuid.UUID
	env    engine.Environment
}

// alertScopes caches the scopes that have any alert settings, so a batch
// of tenants without alerts costs no query at all (issue 15 item 4: the
// hot path must not get slower).
type alertScopes struct {
	mu       sync.Mutex
	set      map[alertScope]bool
	loadedAt time.Time
	// stamps, when set, is read before each use of the list: the list is
	// read again when the fleet's alert stamp moved since it was read
	// (stamp: the value then).
	stamps *engine.Stamps
	stamp  uint64
}

// WithAlertStamps makes the persister's list of the scopes with alert
// settings follow the fleet's alert stamp (engine.StampAlerts), which
// engine.Stamps.ForgettingAlerts moves on every settings write: a setting
// written on any node counts from the next batch on every node. Call it
// before the Store is used.
func (s *Store) WithAlertStamps(st *engine.Stamps) *Store {
	s.alerts.stamps = st
	return s
}

// forget makes the next batch read the list again.
func (a *alertScopes) forget() {
	a.mu.Lock()
	a.set = nil
	a.mu.Unlock()
}

// get returns the scopes with alert settings, read again when older than
// alertScopesTTL.
func (a *alertScopes) get(ctx context.Context, q querier) (map[alertScope]bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	stamp, moved := a.stamp, false
	if a.stamps != nil {
		// Read before the list, so a setting written after it moves it
		// again; unreadable, the TTL governs.
		if v, err := a.stamps.Current(ctx, uuid.Nil, engine.StampAlerts); err == nil {
			stamp, moved = v, v != a.stamp
		}
	}
	if a.set != nil && !moved && time.Since(a.loadedAt) < alertScopesTTL {
		return a.set, nil
	}
	rows, err := q.Query(ctx, `SELECT DISTINCT tenant_id, environment FROM credit_alert_settings`)
	if err != nil {
		return nil, fmt.Errorf("persist: alert scopes: %w", err)
	}
	set := map[alertScope]bool{}
	var sc alertScope
	var env string
	if _, err := pgx.ForEachRow(rows, []any{&sc.tenant, &env}, func() error {
		sc.env = engine.Environment(env)
		set[sc] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("persist: alert scopes: %w", err)
	}
	a.set, a.loadedAt, a.stamp = set, time.Now(), stamp
	return set, nil
}

// querier is what the alert read needs of a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// AlertSettingsGet implements engine.AlertStore.
func (s *Store) AlertSettingsGet(ctx context.Context, sc engine.Scope, customer *uuid.UUID) (engine.StoredAlerts, bool, error) {
	var raw []byte
	var out engine.StoredAlerts
	var err error
	if customer == nil {
		err = s.pool.QueryRow(ctx, `SELECT settings, updated_at FROM credit_alert_settings
			WHERE tenant_id = $1 AND environment = $2 AND customer_id IS NULL`,
			sc.TenantID, string(sc.Environment)).Scan(&raw, &out.UpdatedAt)
	} else {
		err = s.pool.QueryRow(ctx, `SELECT settings, updated_at FROM credit_alert_settings
			WHERE customer_id = $1 AND tenant_id = $2 AND environment = $3`,
			*customer, sc.TenantID, string(sc.Environment)).Scan(&raw, &out.UpdatedAt)
	}
	if err == pgx.ErrNoRows {
		return engine.StoredAlerts{}, false, nil
	}
	if err != nil {
		return engine.StoredAlerts{}, false, fmt.Errorf("persist: alert settings: %w", err)
	}
	if err := json.Unmarshal(raw, &out.Settings); err != nil {
		return engine.StoredAlerts{}, false, fmt.Errorf("persist: alert settings: %w", err)
	}
	out.UpdatedAt = out.UpdatedAt.UTC()
	return out, true, nil
}

// AlertSettingsPut implements engine.AlertStore: an upsert on the
// customer's row or the scope's default row.
func (s *Store) AlertSettingsPut(ctx context.Context, sc engine.Scope, customer *uuid.UUID, settings engine.AlertSettings, now time.Time) error {
	raw, err := json.Marshal(settings)
	if err != nil {
		return fmt.Errorf("persist: alert settings: %w", err)
	}
	conflict := `(tenant_id, environment) WHERE customer_id IS NULL`
	if customer != nil {
		conflict = `(customer_id, tenant_id) WHERE customer_id IS NOT NULL`
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO credit_alert_settings AS a
			(tenant_id, environment, customer_id, settings, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $5)
		ON CONFLICT `+conflict+` DO UPDATE SET settings = EXCLUDED.settings, updated_at = EXCLUDED.updated_at`,
		sc.TenantID, string(sc.Environment), customer, string(raw), now)
	if err != nil {
		return fmt.Errorf("persist: alert settings: %w", err)
	}
	s.alerts.forget()
	return nil
}

// AlertSettingsDelete implements engine.AlertStore.
func (s *Store) AlertSettingsDelete(ctx context.Context, sc engine.Scope, customer uuid.UUID) (bool, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM credit_alert_settings
		WHERE customer_id = $1 AND tenant_id = $2 AND environment = $3`, customer, sc.TenantID, string(sc.Environment))
	if err != nil {
		return false, fmt.Errorf("persist: alert settings: %w", err)
	}
	s.alerts.forget()
	return tag.RowsAffected() > 0, nil
}

// alertSubjectsSQL reads, for the customers of a batch, the settings that
// apply (the customer's own, else its tenant default), the persister's
// state, the newest grant (from the ledger while no state exists) and the
// period allowance: the summed credits of the recurring grants of the
// variant of the customer's non-terminal subscription. Customers without
// settings are left out.
const alertSubjectsSQL = `SELECT c.id, c.external_id, cfg.settings::text,
	st.account_version, st.balance_mc, st.topup_requested_at,
	COALESCE(st.last_grant_mc, lg.delta, 0), COALESCE(pa.mc, 0)
FROM unnest($1::uuid[]) AS q(id)
JOIN customers c ON c.id = q.id
CROSS JOIN LATERAL (SELECT COALESCE(
	(SELECT a.settings FROM credit_alert_settings a WHERE a.customer_id = c.id),
	(SELECT a.settings FROM credit_alert_settings a
		WHERE a.customer_id IS NULL AND a.tenant_id = c.tenant_id AND a.environment = c.environment)) AS settings) cfg
LEFT JOIN credit_alert_states st ON st.customer_id = c.id
LEFT JOIN LATERAL (
	SELECT le.delta FROM ledger_entries le
	WHERE st.customer_id IS NULL AND le.customer_id = c.id AND le.delta > 0
		AND le.type IN ('plan_grant', 'topup', 'adjustment')
	ORDER BY le.created_at DESC, le.id DESC LIMIT 1) lg ON true
LEFT JOIN LATERAL (
	SELECT LEAST(sum(g.credits), 9223372036854775807)::bigint AS mc
	FROM subscriptions sb
	JOIN plan_grants g ON g.plan_variant_id = sb.plan_variant_id AND g.grant_type = 'recurring'
	WHERE sb.customer_id = c.id AND sb.status IN ('trialing', 'active', 'past_due', 'paused')) pa ON true
WHERE cfg.settings IS NOT NULL`

// upsertAlertStatesSQL stores the persister's alert state per customer,
// never over a newer one (a late replay).
const upsertAlertStatesSQL = `INSERT INTO credit_alert_states AS s
	(customer_id, tenant_id, account_version, balance_mc, last_grant_mc, topup_requested_at, updated_at)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::bigint[], $4::bigint[], $5::bigint[], $6::timestamptz[],
	$7::timestamptz[])
ON CONFLICT (customer_id, tenant_id) DO UPDATE SET account_version = EXCLUDED.account_version,
	balance_mc = EXCLUDED.balance_mc, last_grant_mc = EXCLUDED.last_grant_mc,
	topup_requested_at = EXCLUDED.topup_requested_at, updated_at = EXCLUDED.updated_at
WHERE s.account_version < EXCLUDED.account_version`

// alertOutcome is what Apply reads before its transaction: what the alert
// settings make of a batch (the events each Mutation owes, by op id, and
// the state to store per customer) and the low-balance thresholds of its
// candidates (beforeApply).
type alertOutcome struct {
	events     map[uuid.UUID][]engine.Event
	states     []alertStateRow
	thresholds map[uuid.UUID]int64
}

// alertStateRow is one customer's state after the batch.
type alertStateRow struct {
	customer, tenant uuid.UUID
	state            engine.AlertState
	at               time.Time
}

// alertsOf evaluates the alert settings over ms (engine.EvaluateAlerts, in
// batch order, which is stream order per customer): nil, with no query,
// when no Mutation belongs to a scope with alert settings; else one read
// of the subjects. The read precedes the batch's transaction: a
// customer's Mutations are applied by one persister at a time, and a batch
// applied twice (a claim of a stalled consumer's batch) derives the same
// event ids, which the events statement stores once, and stores its state
// only over an older one.
func (s *Store) alertsOf(ctx context.Context, q querier, ms []engine.Mutation) (*alertOutcome, error) {
	scopes, err := s.alerts.get(ctx, q)
	if err != nil || len(scopes) == 0 {
		return nil, err
	}
	seen := map[uuid.UUID]bool{}
	var customers []uuid.UUID
	for i := range ms {
		m := &ms[i]
		if scopes[alertScope{m.TenantID, m.Environment}] && !seen[m.CustomerID] {
			seen[m.CustomerID] = true
			customers = append(customers, m.CustomerID)
		}
	}
	if len(customers) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, alertSubjectsSQL, customers)
	if err != nil {
		return nil, fmt.Errorf("persist: alert subjects: %w", err)
	}
	subjects := map[uuid.UUID]*engine.AlertSubject{}
	var id uuid.UUID
	var ext, settings string
	var version, balance *int64
	var topupAt *time.Time
	var lastGrant, allowance int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &ext, &settings, &version, &balance, &topupAt, &lastGrant, &allowance}, func() error {
		sub := &engine.AlertSubject{ExternalID: ext, PeriodAllowanceMC: allowance,
			State: engine.AlertState{LastGrantMC: lastGrant, TopupRequestedAt: topupAt}}
		if version != nil && balance != nil {
			sub.State.Version, sub.State.BalanceMC, sub.State.BalanceKnown = *version, *balance, true
		}
		if err := json.Unmarshal([]byte(settings), &sub.Settings); err != nil {
			return err
		}
		subjects[id] = sub
		return nil
	}); err != nil {
		return nil, fmt.Errorf("persist: alert subjects: %w", err)
	}
	if len(subjects) == 0 {
		return nil, nil
	}
	out := &alertOutcome{events: map[uuid.UUID][]engine.Event{}}
	last := map[uuid.UUID]*engine.Mutation{}
	for i := range ms {
		m := &ms[i]
		sub := subjects[m.CustomerID]
		if sub == nil {
			continue
		}
		if evs := engine.EvaluateAlerts(sub, m); len(evs) > 0 {
			out.events[m.OpID] = append(out.events[m.OpID], evs...)
		}
		last[m.CustomerID] = m
	}
	for cust, sub := range subjects {
		m := last[cust]
		if m == nil || !sub.State.BalanceKnown {
			continue
		}
		out.states = append(out.states, alertStateRow{customer: cust, tenant: m.TenantID, state: sub.State, at: m.At()})
	}
	sort.Slice(out.states, func(i, j int) bool {
		return string(out.states[i].customer[:]) < string(out.states[j].customer[:])
	})
	return out, nil
}

// queueAlertStates queues the state upsert of o, after the events (the
// table order of every Apply path).
func queueAlertStates(b *pgx.Batch, o *alertOutcome) {
	if o == nil || len(o.states) == 0 {
		return
	}
	n := len(o.states)
	customer, tenant := make([]uuid.UUID, n), make([]uuid.UUID, n)
	version, balance, grant := make([]int64, n), make([]int64, n), make([]int64, n)
	topup, at := make([]*time.Time, n), make([]time.Time, n)
	for i, r := range o.states {
		customer[i], tenant[i] = r.customer, r.tenant
		version[i], balance[i], grant[i] = r.state.Version, r.state.BalanceMC, r.state.LastGrantMC
		topup[i], at[i] = r.state.TopupRequestedAt, r.at
	}
	b.Queue(upsertAlertStatesSQL, customer, tenant, version, balance, grant, topup, at)
}

// eventsOf returns the alert events of op (none when o is nil).
func (o *alertOutcome) eventsOf(op uuid.UUID) []engine.Event {
	if o == nil {
		return nil
	}
	return o.events[op]
}
