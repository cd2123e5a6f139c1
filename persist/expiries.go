package persist

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// dueExpiriesSQL lists the customers with a block whose expires_at fell in
// ($1, $2] and which Postgres still shows with credit, the soonest first
// (migration 016's index bounds the scan to the window). An account row
// names the environment; a block whose account row is not written yet
// waits for the persister.
const dueExpiriesSQL = `SELECT b.tenant_id, a.environment, b.customer_id, min(b.expires_at)
FROM credit_blocks b JOIN credit_accounts a ON a.customer_id = b.customer_id
WHERE b.expires_at > $1 AND b.expires_at <= $2 AND b.remaining_amount > 0
GROUP BY b.tenant_id, a.environment, b.customer_id
ORDER BY min(b.expires_at)
LIMIT $3`

// DueExpiries lists up to limit customers with a block that expired in
// (since, now] and has credit left as far as Postgres knows
// (engine.ExpiryIndex). Postgres trails Redis by the persister's lag, so a
// customer the sweep expired a moment ago may be listed again: expire.lua
// then finds nothing due.
func (s *Store) DueExpiries(ctx context.Context, since, now time.Time, limit int) ([]engine.DueExpiry, error) {
	rows, err := s.pool.Query(ctx, dueExpiriesSQL, since, now, limit)
	if err != nil {
		return nil, fmt.Errorf("persist: due expiries: %w", err)
	}
	defer rows.Close()
	var out []engine.DueExpiry
	for rows.Next() {
		var d engine.DueExpiry
		var env string
		var tenant, customer uuid.UUID
		if err := rows.Scan(&tenant, &env, &customer, &d.ExpiresAt); err != nil {
			return nil, fmt.Errorf("persist: due expiries: %w", err)
		}
		d.Customer = engine.CustomerKey{TenantID: tenant, CustomerID: customer, Environment: engine.Environment(env)}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("persist: due expiries: %w", err)
	}
	return out, nil
}

// DueExpiryCount counts the customers with a block whose expires_at fell
// in (since, now] and that Postgres still shows with credit: the expiry
// sweep's backlog (metrics).
func (s *Store) DueExpiryCount(ctx context.Context, since, now time.Time) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(DISTINCT customer_id) FROM credit_blocks
		WHERE expires_at > $1 AND expires_at <= $2 AND remaining_amount > 0`, since, now).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("persist: due expiry count: %w", err)
	}
	return n, nil
}
