package persist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// The product catalogue: plans, variants, plan grants and variant
// entitlements (migration 006). Every query is scoped by tenant and
// environment, so another scope's row reads as missing.

var _ engine.PlanStore = (*Store)(nil)

// plansOneDefault is the partial unique index of migration 006.
const plansOneDefault = "plans_one_default"

// defaultAttempts bounds the retries of a write that trips plansOneDefault
// because a concurrent transaction made another plan the default.
const defaultAttempts = 5

// MaxListedVariants bounds the variants read for one plan list or variant
// list (a page holds at most 100 plans).
const MaxListedVariants = 10000

const planColumns = `id, tenant_id, environment, name, is_default, status, metadata, created_at, updated_at`

func scanPlan(row pgx.Row) (engine.Plan, error) {
	var p engine.Plan
	var env, status string
	var meta []byte
	if err := row.Scan(&p.ID, &p.TenantID, &env, &p.Name, &p.IsDefault, &status, &meta, &p.CreatedAt, &p.UpdatedAt); err != nil {
		return engine.Plan{}, err
	}
	p.Environment = engine.Environment(env)
	p.Status = engine.PlanStatus(status)
	md, err := parseMetadata(meta)
	if err != nil {
		return engine.Plan{}, err
	}
	p.Metadata = md
	p.CreatedAt, p.UpdatedAt = p.CreatedAt.UTC(), p.UpdatedAt.UTC()
	return p, nil
}

// planScopeLockClass is the first key of the transaction advisory lock that
// serializes the writes that may move a scope's default plan ("plan"); the
// two-key lock space never overlaps Migrate's one-key lock.
const planScopeLockClass = 0x706c616e

// lockPlanScope takes the scope's default-plan lock for the rest of tx.
// Writers take it before any plan row lock, so they never deadlock, and
// each sees the default the previous one committed.
func lockPlanScope(ctx context.Context, tx pgx.Tx, sc engine.Scope) error {
	_, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, hashtext($2))`,
		int32(planScopeLockClass), sc.TenantID.String()+"/"+string(sc.Environment))
	return err
}

// clearDefault un-defaults every other plan of p's scope, in tx.
func clearDefault(ctx context.Context, tx pgx.Tx, p engine.Plan) error {
	_, err := tx.Exec(ctx, `UPDATE plans SET is_default = false, updated_at = GREATEST(updated_at, $4)
		WHERE tenant_id = $1 AND environment = $2 AND is_default AND id <> $3`,
		p.TenantID, string(p.Environment), p.ID, p.UpdatedAt)
	return err
}

// withDefaultRetry runs fn in a transaction, again when it trips the
// one-default index. With the scope lock that should not happen; the index
// and the retry are the backstop.
func (s *Store) withDefaultRetry(ctx context.Context, fn func(tx pgx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := pgx.BeginFunc(ctx, s.pool, fn)
		if isUniqueViolation(err, plansOneDefault) && attempt < defaultAttempts {
			continue
		}
		return err
	}
}

// CreatePlan inserts p as given; when p.IsDefault it first clears the
// previous default of p's scope, in the same transaction.
func (s *Store) CreatePlan(ctx context.Context, p engine.Plan) error {
	meta, err := metadataJSON(p.Metadata)
	if err != nil {
		return fmt.Errorf("persist: create plan: %w", err)
	}
	err = s.withDefaultRetry(ctx, func(tx pgx.Tx) error {
		if p.IsDefault {
			if err := lockPlanScope(ctx, tx, engine.Scope{TenantID: p.TenantID, Environment: p.Environment}); err != nil {
				return err
			}
			if err := clearDefault(ctx, tx, p); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO plans (`+planColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
			p.ID, p.TenantID, string(p.Environment), p.Name, p.IsDefault, string(p.Status), meta, p.CreatedAt, p.UpdatedAt)
		return err
	})
	if err != nil {
		return fmt.Errorf("persist: create plan: %w", err)
	}
	return nil
}

// GetPlan reads plan id of scope sc; engine.ErrNotFound when there is none.
func (s *Store) GetPlan(ctx context.Context, sc engine.Scope, id uuid.UUID) (engine.Plan, error) {
	p, err := scanPlan(s.pool.QueryRow(ctx, `SELECT `+planColumns+` FROM plans
		WHERE id = $1 AND tenant_id = $2 AND environment = $3`, id, sc.TenantID, string(sc.Environment)))
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.Plan{}, notFound("plan")
	}
	if err != nil {
		return engine.Plan{}, fmt.Errorf("persist: get plan: %w", err)
	}
	return p, nil
}

// UpdatePlan takes the scope's default-plan lock, locks plan id of scope
// sc, applies change and writes name, is_default, status, metadata and
// updated_at; a plan that ends up the default clears the previous one, all
// in one transaction. An error of
// change is returned as is and writes nothing.
func (s *Store) UpdatePlan(ctx context.Context, sc engine.Scope, id uuid.UUID, change func(*engine.Plan) error) (engine.Plan, error) {
	var out engine.Plan
	var changeErr error
	err := s.withDefaultRetry(ctx, func(tx pgx.Tx) error {
		// Any change may make the plan the default, so every update takes
		// the scope lock first (plan updates are rare).
		if err := lockPlanScope(ctx, tx, sc); err != nil {
			return err
		}
		p, err := scanPlan(tx.QueryRow(ctx, `SELECT `+planColumns+` FROM plans
			WHERE id = $1 AND tenant_id = $2 AND environment = $3 FOR UPDATE`, id, sc.TenantID, string(sc.Environment)))
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("plan")
		}
		if err != nil {
			return err
		}
		if changeErr = change(&p); changeErr != nil {
			return changeErr
		}
		meta, err := metadataJSON(p.Metadata)
		if err != nil {
			return err
		}
		if p.IsDefault {
			if err := clearDefault(ctx, tx, p); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE plans SET name = $2, is_default = $3, status = $4, metadata = $5, updated_at = $6
			WHERE id = $1 AND tenant_id = $7`, p.ID, p.Name, p.IsDefault, string(p.Status), meta, p.UpdatedAt, p.TenantID); err != nil {
			return err
		}
		out = p
		return nil
	})
	if changeErr != nil {
		return engine.Plan{}, changeErr
	}
	if errors.Is(err, engine.ErrNotFound) {
		return engine.Plan{}, err
	}
	if err != nil {
		return engine.Plan{}, fmt.Errorf("persist: update plan: %w", err)
	}
	return out, nil
}

// ListPlans pages the plans of scope sc newest first (created_at DESC, id
// DESC): active ones, and retired ones too when withRetired. limit is
// 1..100 (validated by the caller); a bad cursor is engine.BadRequest("cursor").
func (s *Store) ListPlans(ctx context.Context, sc engine.Scope, withRetired bool, cursor string, limit int) (engine.Page[engine.Plan], error) {
	after, hasAfter, err := decodeCursor(cursor)
	if err != nil {
		return engine.Page[engine.Plan]{}, err
	}
	q := `SELECT ` + planColumns + ` FROM plans WHERE tenant_id = $1 AND environment = $2`
	args := []any{sc.TenantID, string(sc.Environment)}
	if !withRetired {
		q += ` AND status = 'active'`
	}
	if hasAfter {
		q += ` AND (created_at, id) < ($3, $4)`
		args = append(args, after.at, after.id)
	}
	args = append(args, limit+1)
	q += fmt.Sprintf(` ORDER BY created_at DESC, id DESC LIMIT $%d`, len(args))
	list, err := collect(ctx, s, q, args, scanPlan)
	if err != nil {
		return engine.Page[engine.Plan]{}, fmt.Errorf("persist: list plans: %w", err)
	}
	return pageOf(list, limit, func(p engine.Plan) pageKey { return pageKey{at: p.CreatedAt, id: p.ID} }), nil
}

// ---- variants ----

const variantColumns = `id, plan_id, tenant_id, environment, billing_cycle, trial_days, status, billing_mode,
	renewal_due_days, grace_period_days, allow_usage_while_overdue, metadata, created_at, updated_at`

func scanVariant(row pgx.Row) (engine.PlanVariant, error) {
	var v engine.PlanVariant
	var env, cycle, status, mode string
	var meta []byte
	if err := row.Scan(&v.ID, &v.PlanID, &v.TenantID, &env, &cycle, &v.TrialDays, &status, &mode,
		&v.RenewalDueDays, &v.GracePeriodDays, &v.AllowUsageWhileOverdue, &meta, &v.CreatedAt, &v.UpdatedAt); err != nil {
		return engine.PlanVariant{}, err
	}
	v.Environment = engine.Environment(env)
	v.BillingCycle = engine.BillingCycle(cycle)
	v.Status = engine.PlanStatus(status)
	v.BillingMode = engine.BillingMode(mode)
	md, err := parseMetadata(meta)
	if err != nil {
		return engine.PlanVariant{}, err
	}
	v.Metadata = md
	v.CreatedAt, v.UpdatedAt = v.CreatedAt.UTC(), v.UpdatedAt.UTC()
	return v, nil
}

// CreateVariant inserts v as given under plan v.PlanID; engine.ErrNotFound
// when that plan is not in v's tenant and environment.
func (s *Store) CreateVariant(ctx context.Context, v engine.PlanVariant) error {
	meta, err := metadataJSON(v.Metadata)
	if err != nil {
		return fmt.Errorf("persist: create variant: %w", err)
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO plan_variants (`+variantColumns+`)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14
		WHERE EXISTS (SELECT 1 FROM plans WHERE id = $2 AND tenant_id = $3 AND environment = $4)`,
		v.ID, v.PlanID, v.TenantID, string(v.Environment), string(v.BillingCycle), v.TrialDays, string(v.Status),
		string(v.BillingMode), v.RenewalDueDays, v.GracePeriodDays, v.AllowUsageWhileOverdue, meta, v.CreatedAt, v.UpdatedAt)
	if err != nil {
		return fmt.Errorf("persist: create variant: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return notFound("plan")
	}
	return nil
}

// GetVariant reads variant id of scope sc; engine.ErrNotFound when there is none.
func (s *Store) GetVariant(ctx context.Context, sc engine.Scope, id uuid.UUID) (engine.PlanVariant, error) {
	v, err := scanVariant(s.pool.QueryRow(ctx, `SELECT `+variantColumns+` FROM plan_variants
		WHERE id = $1 AND tenant_id = $2 AND environment = $3`, id, sc.TenantID, string(sc.Environment)))
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.PlanVariant{}, notFound("plan variant")
	}
	if err != nil {
		return engine.PlanVariant{}, fmt.Errorf("persist: get variant: %w", err)
	}
	return v, nil
}

// UpdateVariant locks variant id of plan planID in scope sc, applies change
// and writes status, trial_days, metadata and updated_at (the other fields
// are fixed at creation), in one transaction. An error of change is
// returned as is and writes nothing.
func (s *Store) UpdateVariant(ctx context.Context, sc engine.Scope, planID, id uuid.UUID, change func(*engine.PlanVariant) error) (engine.PlanVariant, error) {
	var out engine.PlanVariant
	var changeErr error
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		v, err := scanVariant(tx.QueryRow(ctx, `SELECT `+variantColumns+` FROM plan_variants
			WHERE id = $1 AND plan_id = $2 AND tenant_id = $3 AND environment = $4 FOR UPDATE`,
			id, planID, sc.TenantID, string(sc.Environment)))
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("plan variant")
		}
		if err != nil {
			return err
		}
		if changeErr = change(&v); changeErr != nil {
			return changeErr
		}
		meta, err := metadataJSON(v.Metadata)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE plan_variants SET status = $2, trial_days = $3, metadata = $4, updated_at = $5
			WHERE id = $1 AND tenant_id = $6`, v.ID, string(v.Status), v.TrialDays, meta, v.UpdatedAt, v.TenantID); err != nil {
			return err
		}
		out = v
		return nil
	})
	if changeErr != nil {
		return engine.PlanVariant{}, changeErr
	}
	if errors.Is(err, engine.ErrNotFound) {
		return engine.PlanVariant{}, err
	}
	if err != nil {
		return engine.PlanVariant{}, fmt.Errorf("persist: update variant: %w", err)
	}
	return out, nil
}

// ListVariants lists the variants of plans planIDs in scope sc, oldest
// first (created_at, id), at most MaxListedVariants. The slice is never nil.
func (s *Store) ListVariants(ctx context.Context, sc engine.Scope, planIDs []uuid.UUID) ([]engine.PlanVariant, error) {
	list, err := collect(ctx, s, `SELECT `+variantColumns+` FROM plan_variants
		WHERE plan_id = ANY($1) AND tenant_id = $2 AND environment = $3 ORDER BY created_at, id LIMIT $4`,
		[]any{planIDs, sc.TenantID, string(sc.Environment), MaxListedVariants}, scanVariant)
	if err != nil {
		return nil, fmt.Errorf("persist: list variants: %w", err)
	}
	if list == nil {
		list = []engine.PlanVariant{}
	}
	return list, nil
}

// ---- grants ----

const grantColumns = `id, plan_variant_id, tenant_id, environment, credits, grant_interval, expires_after_seconds,
	accumulation_cap, rollover_percentage, max_rollover_cycles, grant_type, source, created_at, updated_at, applies_to`

func scanGrant(row pgx.Row) (engine.PlanGrant, error) {
	var g engine.PlanGrant
	var env, typ, src string
	var scope []string
	if err := row.Scan(&g.ID, &g.PlanVariantID, &g.TenantID, &env, &g.Credits, &g.GrantInterval, &g.ExpiresAfterSeconds,
		&g.AccumulationCap, &g.RolloverPercentage, &g.MaxRolloverCycles, &typ, &src, &g.CreatedAt, &g.UpdatedAt, &scope); err != nil {
		return engine.PlanGrant{}, err
	}
	g.AppliesTo = engine.AppliesToOf(scope)
	g.Environment = engine.Environment(env)
	g.GrantType = engine.GrantType(typ)
	g.Source = engine.Source(src)
	g.CreatedAt, g.UpdatedAt = g.CreatedAt.UTC(), g.UpdatedAt.UTC()
	return g, nil
}

// CreateGrant inserts g as given; engine.ErrNotFound when variant
// g.PlanVariantID is not a variant of plan planID in g's scope.
func (s *Store) CreateGrant(ctx context.Context, planID uuid.UUID, g engine.PlanGrant) error {
	tag, err := s.pool.Exec(ctx, `INSERT INTO plan_grants (`+grantColumns+`)
		SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $16
		WHERE EXISTS (SELECT 1 FROM plan_variants WHERE id = $2 AND plan_id = $15 AND tenant_id = $3 AND environment = $4)`,
		g.ID, g.PlanVariantID, g.TenantID, string(g.Environment), g.Credits, g.GrantInterval, g.ExpiresAfterSeconds,
		g.AccumulationCap, g.RolloverPercentage, g.MaxRolloverCycles, string(g.GrantType), string(g.Source),
		g.CreatedAt, g.UpdatedAt, planID, scopeKeys(g.AppliesTo))
	if err != nil {
		return fmt.Errorf("persist: create grant: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return notFound("plan variant")
	}
	return nil
}

// ListGrants lists the grants of variants variantIDs in scope sc, oldest
// first (created_at, id). The slice is never nil.
func (s *Store) ListGrants(ctx context.Context, sc engine.Scope, variantIDs []uuid.UUID) ([]engine.PlanGrant, error) {
	list, err := collect(ctx, s, `SELECT `+grantColumns+` FROM plan_grants
		WHERE plan_variant_id = ANY($1) AND tenant_id = $2 AND environment = $3 ORDER BY created_at, id`,
		[]any{variantIDs, sc.TenantID, string(sc.Environment)}, scanGrant)
	if err != nil {
		return nil, fmt.Errorf("persist: list grants: %w", err)
	}
	if list == nil {
		list = []engine.PlanGrant{}
	}
	return list, nil
}

// ---- entitlements ----

const entitlementColumns = `id, plan_variant_id, tenant_id, environment, billable_metric_key, type, value, created_at`

func scanEntitlement(row pgx.Row) (engine.VariantEntitlement, error) {
	var e engine.VariantEntitlement
	var env, typ string
	var val []byte
	if err := row.Scan(&e.ID, &e.PlanVariantID, &e.TenantID, &env, &e.BillableMetricKey, &typ, &val, &e.CreatedAt); err != nil {
		return engine.VariantEntitlement{}, err
	}
	e.Environment = engine.Environment(env)
	e.Type = engine.MetricType(typ)
	e.Value = json.RawMessage(val)
	e.CreatedAt = e.CreatedAt.UTC()
	return e, nil
}

// PutEntitlement replaces the entitlement of e's metric on variant
// e.PlanVariantID with e in one transaction, under a lock of the variant
// row so concurrent puts of one metric serialize; engine.ErrNotFound when
// that variant is not a variant of plan planID in e's scope.
func (s *Store) PutEntitlement(ctx context.Context, planID uuid.UUID, e engine.VariantEntitlement) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM plan_variants
			WHERE id = $1 AND plan_id = $2 AND tenant_id = $3 AND environment = $4 FOR UPDATE`,
			e.PlanVariantID, planID, e.TenantID, string(e.Environment)).Scan(&one)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("plan variant")
		}
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM variant_entitlements WHERE plan_variant_id = $1 AND billable_metric_key = $2 AND tenant_id = $3`,
			e.PlanVariantID, e.BillableMetricKey, e.TenantID); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO variant_entitlements (`+entitlementColumns+`)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			e.ID, e.PlanVariantID, e.TenantID, string(e.Environment), e.BillableMetricKey, string(e.Type), string(e.Value), e.CreatedAt)
		return err
	})
	if errors.Is(err, engine.ErrNotFound) {
		return err
	}
	if err != nil {
		return fmt.Errorf("persist: put entitlement: %w", err)
	}
	return nil
}

// ListEntitlements lists the entitlements of variants variantIDs in scope
// sc, oldest first (created_at, id). The slice is never nil.
func (s *Store) ListEntitlements(ctx context.Context, sc engine.Scope, variantIDs []uuid.UUID) ([]engine.VariantEntitlement, error) {
	list, err := collect(ctx, s, `SELECT `+entitlementColumns+` FROM variant_entitlements
		WHERE plan_variant_id = ANY($1) AND tenant_id = $2 AND environment = $3 ORDER BY created_at, id`,
		[]any{variantIDs, sc.TenantID, string(sc.Environment)}, scanEntitlement)
	if err != nil {
		return nil, fmt.Errorf("persist: list entitlements: %w", err)
	}
	if list == nil {
		list = []engine.VariantEntitlement{}
	}
	return list, nil
}

// scopeKeys is a plan grant's applies_to as its text[] column: nil (NULL)
// for every metric.
func scopeKeys(a *engine.AppliesTo) []string {
	if a == nil {
		return nil
	}
	return a.BillableMetricKeys
}
