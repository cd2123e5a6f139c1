package persist

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// The low-balance thresholds a batch needs (issue 12 item 5): a Mutation
// without a Context (the grant and debit scripts) does not carry its
// customer's threshold, so Apply reads the thresholds of the customers
// whose Mutations could cross one, in one query per batch (none when no
// Mutation could), and eventRowsOf decides with engine.LowBalanceEvent, the
// one home of the crossing rule.

// lowBalanceThresholdsSQL is each listed customer's threshold: its own, else
// its tenant's default, else 0 (off).
const lowBalanceThresholdsSQL = `SELECT m.id, COALESCE(c.low_balance_threshold_mc, t.default_low_balance_threshold_mc, 0)
FROM unnest($1::uuid[], $2::uuid[]) AS m(id, tenant)
LEFT JOIN customers c ON c.id = m.id AND c.tenant_id = m.tenant
LEFT JOIN tenants t ON t.id = m.tenant`

// lowBalanceCandidate reports whether m, lacking a Context, crosses some
// threshold: one at its effective balance before does when any does.
func lowBalanceCandidate(m engine.Mutation) bool {
	if m.Context != nil {
		return false
	}
	eb, ok := engine.EffectiveBeforeOf(&m)
	if !ok {
		return false
	}
	_, crossed := engine.LowBalanceEvent(m, eb)
	return crossed
}

// beforeApply is what Apply reads before its transaction: the alert
// outcome of ms (alertsOf) and the low-balance thresholds of its
// candidates (lowBalanceCandidate), in o.thresholds.
func (s *Store) beforeApply(ctx context.Context, q querier, ms []engine.Mutation) (*alertOutcome, error) {
	o, err := s.alertsOf(ctx, q, ms)
	if err != nil {
		return nil, err
	}
	var customers, tenants []uuid.UUID
	seen := map[uuid.UUID]bool{}
	for _, m := range ms {
		if !seen[m.CustomerID] && lowBalanceCandidate(m) {
			seen[m.CustomerID] = true
			customers, tenants = append(customers, m.CustomerID), append(tenants, m.TenantID)
		}
	}
	if len(customers) == 0 {
		return o, nil
	}
	rows, err := q.Query(ctx, lowBalanceThresholdsSQL, customers, tenants)
	if err != nil {
		return nil, fmt.Errorf("persist: low-balance thresholds: %w", err)
	}
	if o == nil {
		o = &alertOutcome{}
	}
	o.thresholds = make(map[uuid.UUID]int64, len(customers))
	var id uuid.UUID
	var v int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &v}, func() error {
		o.thresholds[id] = v
		return nil
	}); err != nil {
		return nil, fmt.Errorf("persist: low-balance thresholds: %w", err)
	}
	return o, nil
}

// thresholdOf is customer's low-balance threshold as beforeApply read it;
// 0 (off) when it was not read.
func (o *alertOutcome) thresholdOf(customer uuid.UUID) int64 {
	if o == nil {
		return 0
	}
	return o.thresholds[customer]
}
