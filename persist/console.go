package persist

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// TenantsNewestFirst pages every tenant newest first, for the operator
// console; limit is the page size (the caller bounds it).
func (s *Store) TenantsNewestFirst(ctx context.Context, cursor string, limit int) (engine.Page[engine.Tenant], error) {
	after, hasAfter, err := decodeCursor(cursor)
	if err != nil {
		return engine.Page[engine.Tenant]{}, err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+tenantColumns+` FROM tenants
		WHERE (NOT $1 OR (created_at, id) < ($2, $3))
		ORDER BY created_at DESC, id DESC LIMIT $4`, hasAfter, after.at, after.id, limit+1)
	if err != nil {
		return engine.Page[engine.Tenant]{}, fmt.Errorf("persist: list tenants: %w", err)
	}
	list, err := pgx.CollectRows(rows, scanTenantRow)
	if err != nil {
		return engine.Page[engine.Tenant]{}, fmt.Errorf("persist: list tenants: %w", err)
	}
	return pageOf(list, limit, func(t engine.Tenant) pageKey { return pageKey{at: t.CreatedAt, id: t.ID} }), nil
}

// PendingWebhookEvents counts the webhook events waiting for delivery (pending or
// failed, due or not), across every tenant, counting at most limit: the
// console's overview shows "limit or more" past it, so the count never
// walks a huge backlog (the due-events index answers it).
func (s *Store) PendingWebhookEvents(ctx context.Context, limit int) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM (SELECT 1 FROM webhook_events
		WHERE status IN ('pending', 'failed') LIMIT $1) AS backlog`, limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("persist: webhook backlog: %w", err)
	}
	return n, nil
}
