package persist

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

var _ engine.OverrideStore = (*Store)(nil)

const overrideColumns = `id, tenant_id, subscription_id, billable_metric_id, billable_metric_key, value,
	expires_at, reason, created_at, updated_at`

func scanOverride(row pgx.Row) (engine.Override, error) {
	var o engine.Override
	var value []byte
	if err := row.Scan(&o.ID, &o.TenantID, &o.SubscriptionID, &o.BillableMetricID, &o.BillableMetricKey, &value,
		&o.ExpiresAt, &o.Reason, &o.CreatedAt, &o.UpdatedAt); err != nil {
		return engine.Override{}, err
	}
	o.Value = value
	o.CreatedAt, o.UpdatedAt = o.CreatedAt.UTC(), o.UpdatedAt.UTC()
	if o.ExpiresAt != nil {
		t := o.ExpiresAt.UTC()
		o.ExpiresAt = &t
	}
	return o, nil
}

// LiveOverrides implements engine.OverrideReader: the subscription's
// overrides neither deleted nor expired at now, oldest first.
func (s *Store) LiveOverrides(ctx context.Context, tenant, subscription uuid.UUID, now time.Time) ([]engine.Override, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+overrideColumns+` FROM subscription_overrides
		WHERE subscription_id = $1 AND tenant_id = $3 AND deleted_at IS NULL AND (expires_at IS NULL OR expires_at > $2)
		ORDER BY created_at, id`, subscription, now, tenant)
	if err != nil {
		return nil, fmt.Errorf("persist: live overrides: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.Override, error) { return scanOverride(r) })
	if err != nil {
		return nil, fmt.Errorf("persist: live overrides: %w", err)
	}
	if list == nil {
		list = []engine.Override{}
	}
	return list, nil
}

// CreateOverride implements engine.OverrideStore: an undeleted override of
// the metric that is still live is ErrOverrideExists; an expired one is
// marked deleted in the same transaction as the insert.
func (s *Store) CreateOverride(ctx context.Context, env engine.Environment, o engine.Override, now time.Time) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var id uuid.UUID
		var expires *time.Time
		err := tx.QueryRow(ctx, `SELECT id, expires_at FROM subscription_overrides
			WHERE subscription_id = $1 AND billable_metric_key = $2 AND tenant_id = $3 AND deleted_at IS NULL FOR UPDATE`,
			o.SubscriptionID, o.BillableMetricKey, o.TenantID).Scan(&id, &expires)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		case expires == nil || expires.After(now):
			return engine.ErrOverrideExists
		default:
			if _, err := tx.Exec(ctx, `UPDATE subscription_overrides SET deleted_at = $2 WHERE id = $1 AND tenant_id = $3`,
				id, now, o.TenantID); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, `INSERT INTO subscription_overrides (`+overrideColumns+`, environment)
			VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10, $11)`,
			o.ID, o.TenantID, o.SubscriptionID, o.BillableMetricID, o.BillableMetricKey, string(o.Value),
			o.ExpiresAt, o.Reason, o.CreatedAt, o.UpdatedAt, string(env))
		if isUniqueViolation(err, "subscription_overrides_one_per_metric") {
			return engine.ErrOverrideExists
		}
		return err
	})
	if errors.Is(err, engine.ErrOverrideExists) {
		return err
	}
	if err != nil {
		return fmt.Errorf("persist: create override: %w", err)
	}
	return nil
}

// liveOverrideForUpdate locks the override of key live at now in scope.
const liveOverrideForUpdate = `SELECT ` + overrideColumns + ` FROM subscription_overrides
	WHERE subscription_id = $1 AND billable_metric_key = $2 AND tenant_id = $3 AND environment = $4
		AND deleted_at IS NULL AND (expires_at IS NULL OR expires_at > $5)
	FOR UPDATE`

// UpdateOverride implements engine.OverrideStore.
func (s *Store) UpdateOverride(ctx context.Context, sc engine.Scope, subscription uuid.UUID, key string, now time.Time,
	change func(*engine.Override) error) (engine.Override, error) {
	var out engine.Override
	var changeErr error
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		o, err := scanOverride(tx.QueryRow(ctx, liveOverrideForUpdate, subscription, key, sc.TenantID, string(sc.Environment), now))
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("override")
		}
		if err != nil {
			return err
		}
		if changeErr = change(&o); changeErr != nil {
			return changeErr
		}
		if _, err := tx.Exec(ctx, `UPDATE subscription_overrides
			SET value = $2::jsonb, expires_at = $3, reason = $4, updated_at = $5 WHERE id = $1 AND tenant_id = $6`,
			o.ID, string(o.Value), o.ExpiresAt, o.Reason, o.UpdatedAt, o.TenantID); err != nil {
			return err
		}
		out = o
		return nil
	})
	switch {
	case changeErr != nil:
		return engine.Override{}, changeErr
	case errors.Is(err, engine.ErrNotFound):
		return engine.Override{}, err
	case err != nil:
		return engine.Override{}, fmt.Errorf("persist: update override: %w", err)
	}
	return out, nil
}

// DeleteOverride implements engine.OverrideStore: a soft delete.
func (s *Store) DeleteOverride(ctx context.Context, sc engine.Scope, subscription uuid.UUID, key string, now time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE subscription_overrides SET deleted_at = $5, updated_at = $5
		WHERE subscription_id = $1 AND billable_metric_key = $2 AND tenant_id = $3 AND environment = $4
			AND deleted_at IS NULL AND (expires_at IS NULL OR expires_at > $5)`,
		subscription, key, sc.TenantID, string(sc.Environment), now)
	if err != nil {
		return fmt.Errorf("persist: delete override: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return notFound("override")
	}
	return nil
}
