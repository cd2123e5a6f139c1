package persist

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

var _ engine.TopupReader = (*Store)(nil)

// Topups implements engine.TopupReader: the customer's ledger entries of
// type topup, newest first, with the priority and expiry of the block each
// created. The ledger is the only record of a topup.
func (s *Store) Topups(ctx context.Context, c engine.CustomerKey, cursor string, limit int) (engine.Page[engine.Topup], error) {
	after, hasAfter, err := decodeCursor(cursor)
	if err != nil {
		return engine.Page[engine.Topup]{}, err
	}
	var sql strings.Builder
	sql.WriteString(`SELECT e.id, e.customer_id, e.delta, e.reason, e.credit_block_id, b.expires_at,
		COALESCE(b.priority, 0), e.metadata, e.idempotency_key, e.created_at, b.applies_to
		FROM ledger_entries e LEFT JOIN credit_blocks b ON b.id = e.credit_block_id AND b.tenant_id = e.tenant_id
		WHERE e.customer_id = $1 AND e.tenant_id = $2 AND e.type = 'topup'`)
	args := []any{c.CustomerID, c.TenantID}
	if hasAfter {
		args = append(args, after.at, after.id)
		// The bound on created_at prunes the newer months of the ledger
		// (reader.go historySQL).
		sql.WriteString(` AND (e.created_at, e.id) < ($3, $4) AND e.created_at <= $3`)
	}
	args = append(args, limit+1)
	fmt.Fprintf(&sql, ` ORDER BY e.created_at DESC, e.id DESC LIMIT $%d`, len(args))
	rows, err := s.pool.Query(ctx, sql.String(), args...)
	if err != nil {
		return engine.Page[engine.Topup]{}, fmt.Errorf("persist: topups: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (engine.Topup, error) {
		var t engine.Topup
		var meta []byte
		var scope []string
		if err := r.Scan(&t.ID, &t.CustomerID, &t.Credits, &t.PaymentReference, &t.CreditBlockID, &t.ExpiresAt,
			&t.Priority, &meta, &t.IdempotencyKey, &t.CreatedAt, &scope); err != nil {
			return t, err
		}
		t.AppliesTo = engine.AppliesToOf(scope)
		t.CreatedAt = t.CreatedAt.UTC()
		if t.ExpiresAt != nil {
			e := t.ExpiresAt.UTC()
			t.ExpiresAt = &e
		}
		m, err := parseMetadata(meta)
		t.Metadata = m
		return t, err
	})
	if err != nil {
		return engine.Page[engine.Topup]{}, fmt.Errorf("persist: topups: %w", err)
	}
	return pageOf(list, limit, func(t engine.Topup) pageKey { return pageKey{at: t.CreatedAt, id: t.ID} }), nil
}
