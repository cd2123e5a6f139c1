package persist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// The catalog: billable metrics and the metering rules that price them
// (docs/spec/addendum.md §4, docs/spec/interface.md Metering rules). Both are per tenant and
// environment and are written by the API directly.

var _ engine.Catalog = (*Store)(nil)

// ErrMetricKeyTaken is the 409 of a second billable metric with the same
// key in one tenant and environment (docs/spec/addendum.md §4).
var ErrMetricKeyTaken = &engine.Error{Kind: engine.KindConflict, Field: "key", Detail: "a billable metric with this key exists"}

// MaxCatalogMetrics bounds AllMetrics, the whole-catalog read of a snapshot.
const MaxCatalogMetrics = 10000

// billableMetricKey and meteringRuleActiveKey are the unique constraints of
// migration 003.
const (
	billableMetricKey     = "billable_metrics_key"
	meteringRuleActiveKey = "metering_rules_active_key"
)

// createRuleAttempts bounds CreateRule's retries on the active-rule index.
const createRuleAttempts = 3

const metricColumns = `id, tenant_id, environment, key, name, type, default_value, metadata, created_at, updated_at`

func scanMetric(row pgx.Row) (engine.BillableMetric, error) {
	var m engine.BillableMetric
	var env, typ string
	var def, meta []byte
	if err := row.Scan(&m.ID, &m.TenantID, &env, &m.Key, &m.Name, &typ, &def, &meta, &m.CreatedAt, &m.UpdatedAt); err != nil {
		return engine.BillableMetric{}, err
	}
	m.Environment = engine.Environment(env)
	m.Type = engine.MetricType(typ)
	// A NULL default (metered metrics) reads back as JSON null, the form
	// the engine builds.
	m.DefaultValue = json.RawMessage("null")
	if def != nil {
		m.DefaultValue = json.RawMessage(def)
	}
	md, err := parseMetadata(meta)
	if err != nil {
		return engine.BillableMetric{}, err
	}
	m.Metadata = md
	m.CreatedAt = m.CreatedAt.UTC()
	m.UpdatedAt = m.UpdatedAt.UTC()
	return m, nil
}

// nullableJSON is raw as a JSONB parameter: nil (SQL NULL) when empty or
// JSON null.
func nullableJSON(raw json.RawMessage) *string {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	s := string(raw)
	return &s
}

// CreateMetric inserts m as given (the caller fills id, defaults and
// times); ErrMetricKeyTaken (a 409 conflict) when its scope already has
// a metric with m.Key.
func (s *Store) CreateMetric(ctx context.Context, m engine.BillableMetric) error {
	meta, err := metadataJSON(m.Metadata)
	if err != nil {
		return fmt.Errorf("persist: create metric: %w", err)
	}
	_, err = s.pool.Exec(ctx, `INSERT INTO billable_metrics (`+metricColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		m.ID, m.TenantID, string(m.Environment), m.Key, m.Name, string(m.Type), nullableJSON(m.DefaultValue),
		meta, m.CreatedAt, m.UpdatedAt)
	if isUniqueViolation(err, billableMetricKey) {
		return ErrMetricKeyTaken
	}
	if err != nil {
		return fmt.Errorf("persist: create metric: %w", err)
	}
	return nil
}

// GetMetric reads the metric key of scope sc; engine.ErrNotFound when
// there is none.
func (s *Store) GetMetric(ctx context.Context, sc engine.Scope, key string) (engine.BillableMetric, error) {
	m, err := scanMetric(s.pool.QueryRow(ctx, `SELECT `+metricColumns+` FROM billable_metrics
		WHERE tenant_id = $1 AND environment = $2 AND key = $3`, sc.TenantID, string(sc.Environment), key))
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.BillableMetric{}, notFound("billable metric")
	}
	if err != nil {
		return engine.BillableMetric{}, fmt.Errorf("persist: get metric: %w", err)
	}
	return m, nil
}

// UpdateMetric writes name, default_value, metadata and updated_at of the
// metric m.Key in m's tenant and environment; engine.ErrNotFound when there
// is none. Id, key, type (immutable, docs/spec/addendum.md §4) and created_at never change.
func (s *Store) UpdateMetric(ctx context.Context, m engine.BillableMetric) error {
	meta, err := metadataJSON(m.Metadata)
	if err != nil {
		return fmt.Errorf("persist: update metric: %w", err)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE billable_metrics SET name = $4, default_value = $5, metadata = $6,
			updated_at = $7
		WHERE tenant_id = $1 AND environment = $2 AND key = $3`,
		m.TenantID, string(m.Environment), m.Key, m.Name, nullableJSON(m.DefaultValue), meta, m.UpdatedAt)
	if err != nil {
		return fmt.Errorf("persist: update metric: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return notFound("billable metric")
	}
	return nil
}

// ListMetrics pages the metrics of scope sc oldest first (created_at, id).
// limit is 1..100 (validated by the caller); a bad cursor is
// engine.BadRequest("cursor").
func (s *Store) ListMetrics(ctx context.Context, sc engine.Scope, cursor string, limit int) (engine.Page[engine.BillableMetric], error) {
	after, hasAfter, err := decodeCursor(cursor)
	if err != nil {
		return engine.Page[engine.BillableMetric]{}, err
	}
	q := `SELECT ` + metricColumns + ` FROM billable_metrics WHERE tenant_id = $1 AND environment = $2`
	args := []any{sc.TenantID, string(sc.Environment)}
	if hasAfter {
		q += ` AND (created_at, id) > ($3, $4)`
		args = append(args, after.at, after.id)
	}
	args = append(args, limit+1)
	q += fmt.Sprintf(` ORDER BY created_at, id LIMIT $%d`, len(args))
	list, err := collect(ctx, s, q, args, scanMetric)
	if err != nil {
		return engine.Page[engine.BillableMetric]{}, fmt.Errorf("persist: list metrics: %w", err)
	}
	return pageOf(list, limit, func(m engine.BillableMetric) pageKey { return pageKey{at: m.CreatedAt, id: m.ID} }), nil
}

// AllMetrics is every metric of scope sc, oldest first, for snapshots;
// at most MaxCatalogMetrics of them. The slice is never nil.
func (s *Store) AllMetrics(ctx context.Context, sc engine.Scope) ([]engine.BillableMetric, error) {
	list, err := collect(ctx, s, `SELECT `+metricColumns+` FROM billable_metrics
		WHERE tenant_id = $1 AND environment = $2 ORDER BY created_at, id LIMIT $3`,
		[]any{sc.TenantID, string(sc.Environment), MaxCatalogMetrics}, scanMetric)
	if err != nil {
		return nil, fmt.Errorf("persist: all metrics: %w", err)
	}
	if list == nil {
		list = []engine.BillableMetric{}
	}
	return list, nil
}

// collect runs q and scans every row with scan.
func collect[T any](ctx context.Context, s *Store, q string, args []any, scan func(pgx.Row) (T, error)) ([]T, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (T, error) { return scan(r) })
}

// ---- metering rules ----

const ruleColumns = `id, tenant_id, environment, billable_metric_key, cost_type, base_cost, unit_cost,
	tier_config, effective_from, effective_until, metadata, created_at, updated_at`

func scanRule(row pgx.Row) (engine.MeteringRule, error) {
	var r engine.MeteringRule
	var env, cost string
	var tiers, meta []byte
	if err := row.Scan(&r.ID, &r.TenantID, &env, &r.BillableMetricKey, &cost, &r.BaseCost, &r.UnitCost,
		&tiers, &r.EffectiveFrom, &r.EffectiveUntil, &meta, &r.CreatedAt, &r.UpdatedAt); err != nil {
		return engine.MeteringRule{}, err
	}
	r.Environment = engine.Environment(env)
	r.CostType = engine.CostType(cost)
	if tiers != nil {
		var tc engine.TierConfig
		if err := json.Unmarshal(tiers, &tc); err != nil {
			return engine.MeteringRule{}, fmt.Errorf("persist: bad tier_config of rule %s: %w", r.ID, err)
		}
		r.TierConfig = &tc
	}
	md, err := parseMetadata(meta)
	if err != nil {
		return engine.MeteringRule{}, err
	}
	r.Metadata = md
	r.EffectiveFrom = r.EffectiveFrom.UTC()
	if r.EffectiveUntil != nil {
		u := r.EffectiveUntil.UTC()
		r.EffectiveUntil = &u
	}
	r.CreatedAt = r.CreatedAt.UTC()
	r.UpdatedAt = r.UpdatedAt.UTC()
	return r, nil
}

// CreateRule makes r the active rule of its metric in one transaction:
// it inserts metricIfMissing (under r's tenant, environment and key) when
// the scope has no metric with that key, ends the active rule of the key
// (effective_until and updated_at = r.EffectiveFrom, never before that
// rule's own effective_from), and inserts r with effective_until NULL.
//
// Concurrent creates for one key serialize on a lock of the metric row, so
// exactly one rule stays active; the partial unique index on active rules
// is the backstop, and a create that trips it is retried.
func (s *Store) CreateRule(ctx context.Context, r engine.MeteringRule, metricIfMissing engine.BillableMetric) error {
	m := metricIfMissing
	m.TenantID, m.Environment, m.Key = r.TenantID, r.Environment, r.BillableMetricKey
	mMeta, err := metadataJSON(m.Metadata)
	if err != nil {
		return fmt.Errorf("persist: create rule: %w", err)
	}
	rMeta, err := metadataJSON(r.Metadata)
	if err != nil {
		return fmt.Errorf("persist: create rule: %w", err)
	}
	var tiers *string
	if r.TierConfig != nil {
		b, err := json.Marshal(r.TierConfig)
		if err != nil {
			return fmt.Errorf("persist: create rule: %w", err)
		}
		t := string(b)
		tiers = &t
	}
	env := string(r.Environment)
	for attempt := 1; ; attempt++ {
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO billable_metrics (`+metricColumns+`)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
				ON CONFLICT (tenant_id, environment, key) DO NOTHING`,
				m.ID, m.TenantID, env, m.Key, m.Name, string(m.Type), nullableJSON(m.DefaultValue),
				mMeta, m.CreatedAt, m.UpdatedAt); err != nil {
				return err
			}
			// Every create of this key takes this lock first, so the
			// statements below see the rule the previous holder inserted.
			if _, err := tx.Exec(ctx, `SELECT 1 FROM billable_metrics
				WHERE tenant_id = $1 AND environment = $2 AND key = $3 FOR UPDATE`,
				r.TenantID, env, r.BillableMetricKey); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `UPDATE metering_rules
				SET effective_until = GREATEST(effective_from, $4), updated_at = GREATEST(updated_at, $4)
				WHERE tenant_id = $1 AND environment = $2 AND billable_metric_key = $3
					AND effective_until IS NULL`,
				r.TenantID, env, r.BillableMetricKey, r.EffectiveFrom); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO metering_rules (`+ruleColumns+`)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULL, $10, $11, $12)`,
				r.ID, r.TenantID, env, r.BillableMetricKey, string(r.CostType), r.BaseCost, r.UnitCost,
				tiers, r.EffectiveFrom, rMeta, r.CreatedAt, r.UpdatedAt)
			return err
		})
		if isUniqueViolation(err, meteringRuleActiveKey) && attempt < createRuleAttempts {
			continue
		}
		if err != nil {
			return fmt.Errorf("persist: create rule: %w", err)
		}
		return nil
	}
}

// ListRules pages the rules of scope sc oldest first (created_at, id):
// those of metricKey only when it is non-empty, and only active ones
// (effective_until NULL) when activeOnly. limit is 1..100 (validated by
// the caller); a bad cursor is engine.BadRequest("cursor").
func (s *Store) ListRules(ctx context.Context, sc engine.Scope, metricKey string, activeOnly bool, cursor string, limit int) (engine.Page[engine.MeteringRule], error) {
	after, hasAfter, err := decodeCursor(cursor)
	if err != nil {
		return engine.Page[engine.MeteringRule]{}, err
	}
	var q strings.Builder
	q.WriteString(`SELECT ` + ruleColumns + ` FROM metering_rules WHERE tenant_id = $1 AND environment = $2`)
	args := []any{sc.TenantID, string(sc.Environment)}
	if metricKey != "" {
		args = append(args, metricKey)
		fmt.Fprintf(&q, ` AND billable_metric_key = $%d`, len(args))
	}
	if activeOnly {
		q.WriteString(` AND effective_until IS NULL`)
	}
	if hasAfter {
		args = append(args, after.at, after.id)
		fmt.Fprintf(&q, ` AND (created_at, id) > ($%d, $%d)`, len(args)-1, len(args))
	}
	args = append(args, limit+1)
	fmt.Fprintf(&q, ` ORDER BY created_at, id LIMIT $%d`, len(args))
	list, err := collect(ctx, s, q.String(), args, scanRule)
	if err != nil {
		return engine.Page[engine.MeteringRule]{}, fmt.Errorf("persist: list rules: %w", err)
	}
	return pageOf(list, limit, func(r engine.MeteringRule) pageKey { return pageKey{at: r.CreatedAt, id: r.ID} }), nil
}

// ActiveRule is the rule of metricKey in scope sc with no effective_until;
// engine.ErrNotFound when the metric has none.
func (s *Store) ActiveRule(ctx context.Context, sc engine.Scope, metricKey string) (engine.MeteringRule, error) {
	r, err := scanRule(s.pool.QueryRow(ctx, `SELECT `+ruleColumns+` FROM metering_rules
		WHERE tenant_id = $1 AND environment = $2 AND billable_metric_key = $3 AND effective_until IS NULL`,
		sc.TenantID, string(sc.Environment), metricKey))
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.MeteringRule{}, notFound("active metering rule")
	}
	if err != nil {
		return engine.MeteringRule{}, fmt.Errorf("persist: active rule: %w", err)
	}
	return r, nil
}
