package persist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// Subscriptions and the scheduler's bookkeeping (migration 007). One row
// holds a subscription, its per-grant firing state and its next due
// instant, so one row lock serializes the API and every scheduler process.
// The events a change reports (SubscriptionRecord.Events) are written in
// the transaction that writes the row: a crash leaves both or neither.

var (
	_ engine.SubscriptionReader = (*Store)(nil)
	_ engine.SubscriptionStore  = (*Store)(nil)
)

// subscriptionsOneLive is the partial unique index of migration 007.
const subscriptionsOneLive = "subscriptions_one_live"

const subscriptionColumns = `id, tenant_id, environment, customer_id, plan_id, plan_variant_id, status, billing_mode,
	current_period_start, current_period_end, trial_ends_at, renewal_due_at, grace_ends_at,
	cancel_at_period_end, canceled_at, metadata, created_at, updated_at,
	activated_at, renewal_warned, grant_state, next_action_at`

func scanRecord(row pgx.Row) (engine.SubscriptionRecord, error) {
	var r engine.SubscriptionRecord
	var env, status, mode string
	var meta, grants []byte
	if err := row.Scan(&r.ID, &r.TenantID, &env, &r.CustomerID, &r.PlanID, &r.PlanVariantID, &status, &mode,
		&r.CurrentPeriodStart, &r.CurrentPeriodEnd, &r.TrialEndsAt, &r.RenewalDueAt, &r.GraceEndsAt,
		&r.CancelAtPeriodEnd, &r.CanceledAt, &meta, &r.CreatedAt, &r.UpdatedAt,
		&r.ActivatedAt, &r.RenewalWarned, &grants, &r.NextActionAt); err != nil {
		return engine.SubscriptionRecord{}, err
	}
	r.Environment = engine.Environment(env)
	r.Status = engine.SubscriptionStatus(status)
	r.BillingMode = engine.BillingMode(mode)
	md, err := parseMetadata(meta)
	if err != nil {
		return engine.SubscriptionRecord{}, err
	}
	r.Metadata = md
	if err := json.Unmarshal(grants, &r.Grants); err != nil {
		return engine.SubscriptionRecord{}, fmt.Errorf("persist: bad grant_state of subscription %s: %w", r.ID, err)
	}
	r.CurrentPeriodStart = r.CurrentPeriodStart.UTC()
	r.CurrentPeriodEnd, r.TrialEndsAt = utcPtr(r.CurrentPeriodEnd), utcPtr(r.TrialEndsAt)
	r.RenewalDueAt, r.GraceEndsAt, r.CanceledAt = utcPtr(r.RenewalDueAt), utcPtr(r.GraceEndsAt), utcPtr(r.CanceledAt)
	r.CreatedAt, r.UpdatedAt = r.CreatedAt.UTC(), r.UpdatedAt.UTC()
	r.ActivatedAt, r.NextActionAt = utcPtr(r.ActivatedAt), utcPtr(r.NextActionAt)
	for i := range r.Grants {
		g := &r.Grants[i]
		g.Anchor = g.Anchor.UTC()
		g.LastFiredAt, g.NextFireAt = utcPtr(g.LastFiredAt), utcPtr(g.NextFireAt)
	}
	return r, nil
}

func recordArgs(r engine.SubscriptionRecord) ([]any, error) {
	meta, err := metadataJSON(r.Metadata)
	if err != nil {
		return nil, err
	}
	grants := r.Grants
	if grants == nil {
		grants = []engine.GrantState{}
	}
	gs, err := json.Marshal(grants)
	if err != nil {
		return nil, err
	}
	return []any{r.ID, r.TenantID, string(r.Environment), r.CustomerID, r.PlanID, r.PlanVariantID, string(r.Status),
		string(r.BillingMode), r.CurrentPeriodStart, r.CurrentPeriodEnd, r.TrialEndsAt, r.RenewalDueAt, r.GraceEndsAt,
		r.CancelAtPeriodEnd, r.CanceledAt, meta, r.CreatedAt, r.UpdatedAt,
		r.ActivatedAt, r.RenewalWarned, gs, r.NextActionAt}, nil
}

// CreateSubscription inserts r and its events (r.Events) in one
// transaction; engine.ErrLiveSubscription when the customer already has a
// live subscription.
func (s *Store) CreateSubscription(ctx context.Context, r engine.SubscriptionRecord) error {
	args, err := recordArgs(r)
	if err != nil {
		return fmt.Errorf("persist: create subscription: %w", err)
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO subscriptions (`+subscriptionColumns+`)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)`,
			args...); err != nil {
			return err
		}
		return insertEvents(ctx, tx, r.Events)
	})
	if isUniqueViolation(err, subscriptionsOneLive) {
		return engine.ErrLiveSubscription
	}
	if err != nil {
		return fmt.Errorf("persist: create subscription: %w", err)
	}
	return nil
}

// GetRecord reads subscription id of scope sc with its bookkeeping;
// engine.ErrNotFound when there is none.
func (s *Store) GetRecord(ctx context.Context, sc engine.Scope, id uuid.UUID) (engine.SubscriptionRecord, error) {
	r, err := scanRecord(s.pool.QueryRow(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions
		WHERE id = $1 AND tenant_id = $2 AND environment = $3`, id, sc.TenantID, string(sc.Environment)))
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.SubscriptionRecord{}, notFound("subscription")
	}
	if err != nil {
		return engine.SubscriptionRecord{}, fmt.Errorf("persist: get subscription: %w", err)
	}
	return r, nil
}

// GetSubscription reads subscription id of scope sc (engine.SubscriptionReader).
func (s *Store) GetSubscription(ctx context.Context, sc engine.Scope, id uuid.UUID) (engine.Subscription, error) {
	r, err := s.GetRecord(ctx, sc, id)
	if err != nil {
		return engine.Subscription{}, err
	}
	return r.Subscription, nil
}

// LiveSubscription is the customer's non-terminal subscription;
// engine.ErrNotFound when it has none.
func (s *Store) LiveSubscription(ctx context.Context, c engine.CustomerKey) (engine.Subscription, error) {
	r, err := scanRecord(s.pool.QueryRow(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions
		WHERE customer_id = $1 AND tenant_id = $2 AND status IN ('trialing', 'active', 'past_due', 'paused')`,
		c.CustomerID, c.TenantID))
	if errors.Is(err, pgx.ErrNoRows) {
		return engine.Subscription{}, notFound("subscription")
	}
	if err != nil {
		return engine.Subscription{}, fmt.Errorf("persist: live subscription: %w", err)
	}
	return r.Subscription, nil
}

// ListSubscriptions pages the subscriptions of one customer of scope sc
// newest first; a bad cursor is engine.BadRequest("cursor").
func (s *Store) ListSubscriptions(ctx context.Context, sc engine.Scope, customer uuid.UUID, cursor string, limit int) (engine.Page[engine.Subscription], error) {
	after, hasAfter, err := decodeCursor(cursor)
	if err != nil {
		return engine.Page[engine.Subscription]{}, err
	}
	q := `SELECT ` + subscriptionColumns + ` FROM subscriptions WHERE customer_id = $1 AND tenant_id = $2 AND environment = $3`
	args := []any{customer, sc.TenantID, string(sc.Environment)}
	if hasAfter {
		q += ` AND (created_at, id) < ($4, $5)`
		args = append(args, after.at, after.id)
	}
	args = append(args, limit+1)
	q += fmt.Sprintf(` ORDER BY created_at DESC, id DESC LIMIT $%d`, len(args))
	recs, err := collect(ctx, s, q, args, scanRecord)
	if err != nil {
		return engine.Page[engine.Subscription]{}, fmt.Errorf("persist: list subscriptions: %w", err)
	}
	list := make([]engine.Subscription, len(recs))
	for i, r := range recs {
		list[i] = r.Subscription
	}
	return pageOf(list, limit, func(x engine.Subscription) pageKey { return pageKey{at: x.CreatedAt, id: x.ID} }), nil
}

// writeRecord rewrites every mutable column of r and inserts the events
// its change added (r.Events), in tx.
func writeRecord(ctx context.Context, tx pgx.Tx, r engine.SubscriptionRecord) error {
	args, err := recordArgs(r)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE subscriptions SET plan_id = $5, plan_variant_id = $6, status = $7, billing_mode = $8,
		current_period_start = $9, current_period_end = $10, trial_ends_at = $11, renewal_due_at = $12,
		grace_ends_at = $13, cancel_at_period_end = $14, canceled_at = $15, metadata = $16, updated_at = $18,
		activated_at = $19, renewal_warned = $20, grant_state = $21, next_action_at = $22
		WHERE id = $1 AND tenant_id = $2 AND environment = $3 AND customer_id = $4 AND created_at = $17`, args...)
	if isUniqueViolation(err, subscriptionsOneLive) {
		return engine.ErrLiveSubscription
	}
	if err != nil {
		return err
	}
	return insertEvents(ctx, tx, r.Events)
}

// UpdateSubscription locks subscription id of scope sc, applies change and
// writes the record and the events change added, in one transaction. An
// error of change is returned as is and writes nothing.
func (s *Store) UpdateSubscription(ctx context.Context, sc engine.Scope, id uuid.UUID, change func(*engine.SubscriptionRecord) error) (engine.SubscriptionRecord, error) {
	var out engine.SubscriptionRecord
	var changeErr error
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		r, err := scanRecord(tx.QueryRow(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions
			WHERE id = $1 AND tenant_id = $2 AND environment = $3 FOR UPDATE`, id, sc.TenantID, string(sc.Environment)))
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("subscription")
		}
		if err != nil {
			return err
		}
		if changeErr = change(&r); changeErr != nil {
			return changeErr
		}
		if err := writeRecord(ctx, tx, r); err != nil {
			return err
		}
		r.Events = nil
		out = r
		return nil
	})
	if changeErr != nil {
		return engine.SubscriptionRecord{}, changeErr
	}
	if errors.Is(err, engine.ErrNotFound) || errors.Is(err, engine.ErrLiveSubscription) {
		return engine.SubscriptionRecord{}, err
	}
	if err != nil {
		return engine.SubscriptionRecord{}, fmt.Errorf("persist: update subscription: %w", err)
	}
	return out, nil
}

// RunDue claims due subscriptions one at a time, each in its own
// transaction with FOR UPDATE SKIP LOCKED: a row another process (or an API
// call) reservations is skipped, so several schedulers split the work and never
// run one subscription twice at once. Subscriptions whose change failed in
// this call are not claimed again by it.
func (s *Store) RunDue(ctx context.Context, now time.Time, limit int, change func(ctx context.Context, r *engine.SubscriptionRecord) error) (int, error) {
	failed := []uuid.UUID{}
	ran := 0
	for ran < limit {
		claimed := false
		var changeErr error
		err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			r, err := scanRecord(tx.QueryRow(ctx, `SELECT `+subscriptionColumns+` FROM subscriptions
				WHERE next_action_at <= $1 AND NOT (id = ANY($2))
				ORDER BY next_action_at LIMIT 1 FOR UPDATE SKIP LOCKED`, now, failed))
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err != nil {
				return err
			}
			claimed = true
			if changeErr = change(ctx, &r); changeErr != nil {
				failed = append(failed, r.ID)
				return changeErr
			}
			return writeRecord(ctx, tx, r)
		})
		if !claimed {
			return ran, err
		}
		ran++
		if err != nil && changeErr == nil {
			return ran, fmt.Errorf("persist: run due subscription: %w", err)
		}
	}
	return ran, nil
}

// PeriodUsage sums the customer's consumption entries per metric in
// [from, to): units, credit charged (positive) and overage.
func (s *Store) PeriodUsage(ctx context.Context, c engine.CustomerKey, from, to time.Time) ([]engine.MetricUsage, error) {
	// One consume writes an entry per block it drained, each with the
	// call's units: units are counted once per operation.
	// A multi-metric consume's one entry counts per item (itemShares).
	rows, err := s.pool.Query(ctx, `SELECT key, SUM(units)::bigint, SUM(credits)::bigint, SUM(overage)::bigint
		FROM (SELECT billable_metric_key AS key, COALESCE(MAX(cost_units), 0)::numeric AS units,
				-SUM(delta)::numeric AS credits, SUM(overage_mc)::numeric AS overage
			FROM ledger_entries
			WHERE customer_id = $1 AND tenant_id = $4 AND type = 'consumption' AND created_at >= $2 AND created_at < $3
				AND billable_metric_key IS NOT NULL
			GROUP BY billable_metric_key, op_id
			UNION ALL
			`+itemSharesSQL+`
				WHERE e.customer_id = $1 AND e.tenant_id = $4 AND e.type = 'consumption' AND e.created_at >= $2
					AND e.created_at < $3`+itemSharesTail+`
		) per_op
		GROUP BY key
		ORDER BY key COLLATE "C"`, c.CustomerID, from, to, c.TenantID)
	if err != nil {
		return nil, fmt.Errorf("persist: period usage: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.MetricUsage, error) {
		var u engine.MetricUsage
		err := r.Scan(&u.BillableMetricKey, &u.Units, &u.Credits, &u.OverageMC)
		return u, err
	})
	if err != nil {
		return nil, fmt.Errorf("persist: period usage: %w", err)
	}
	if out == nil {
		out = []engine.MetricUsage{}
	}
	return out, nil
}
