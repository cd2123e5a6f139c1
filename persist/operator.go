package persist

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// MaxTenantList bounds one page of ListTenants.
const MaxTenantList = 1000

// ListTenants reads up to limit tenants whose id sorts after the cursor
// (uuid.Nil: from the start), in id order: ids are UUIDv7, so oldest first.
// It serves `creditd tenant list`, an operator's look at the whole
// directory; the API has no list route.
func (s *Store) ListTenants(ctx context.Context, after uuid.UUID, limit int) ([]engine.Tenant, error) {
	if limit <= 0 || limit > MaxTenantList {
		return nil, fmt.Errorf("persist: list tenants: limit %d is not 1..%d", limit, MaxTenantList)
	}
	rows, err := s.pool.Query(ctx, `SELECT `+tenantColumns+` FROM tenants WHERE id > $1 ORDER BY id LIMIT $2`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("persist: list tenants: %w", err)
	}
	out, err := pgx.CollectRows(rows, scanTenantRow)
	if err != nil {
		return nil, fmt.Errorf("persist: list tenants: %w", err)
	}
	return out, nil
}

// ListAPIKeys reads every key of tenant, revoked ones included, oldest
// first; the plain keys are never stored, so Key stays empty.
func (s *Store) ListAPIKeys(ctx context.Context, tenant uuid.UUID) ([]engine.APIKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, tenant_id, environment, created_at, revoked_at
		FROM api_keys WHERE tenant_id = $1 ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("persist: list api keys: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (engine.APIKey, error) {
		var k engine.APIKey
		var env string
		err := row.Scan(&k.ID, &k.TenantID, &env, &k.CreatedAt, &k.RevokedAt)
		k.Environment = engine.Environment(env)
		return k, err
	})
	if err != nil {
		return nil, fmt.Errorf("persist: list api keys: %w", err)
	}
	return out, nil
}

// scanTenantRow reads one row of tenantColumns.
func scanTenantRow(row pgx.CollectableRow) (engine.Tenant, error) {
	var t engine.Tenant
	var policy string
	err := row.Scan(&t.ID, &t.Name, &policy, &t.DefaultLowBalanceThresholdMC, &t.WebhookURL, &t.WebhookSecret,
		&t.RateLimitPerSecond, &t.RateLimitBurst, &t.CreatedAt, &t.UpdatedAt)
	t.DefaultOveragePolicy = engine.OveragePolicy(policy)
	return t, err
}
