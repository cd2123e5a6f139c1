// The balance of an account at a past instant (GET .../credits?as_of=,
// issue 28 item 6): from the ledger, in bounded work.

package persist

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// asOfSums sums one side of a customer's ledger: the entries of the range
// ($2 the instant) in the history index's order, at most $3 of them: their
// count, the sum of their deltas, of their positive deltas (credit added)
// and of what they moved the debt of the credit line by. An entry's debt
// change is what its delta does not take from, or give to, blocks:
// -(delta + what its draws took), where an entry naming one block moved
// that block by its delta (docs/decisions.md "Credit line": a charge on the
// line debits the whole cost while its draws list what blocks paid; a
// debt_repayment has delta 0 and one draw).
const asOfSums = `SELECT count(*), COALESCE(sum(delta), 0)::bigint,
	COALESCE(sum(delta) FILTER (WHERE delta > 0), 0)::bigint,
	COALESCE(sum(-(delta + COALESCE((SELECT sum(x) FROM unnest(draw_amounts) x),
		CASE WHEN credit_block_id IS NOT NULL THEN -delta ELSE 0 END))), 0)::bigint
FROM (SELECT delta, draw_amounts, credit_block_id FROM ledger_entries
	WHERE customer_id = $1 AND tenant_id = $4 AND %s ORDER BY created_at %s, id %s LIMIT $3) e`

// AccountAt reads customer's figures at instant at (engine.LedgerReader),
// in one read-only snapshot of Postgres:
//   - balance, lifetime earned and debt: the ledger up to at, summed from
//     at back to the first entry when at most maxEntries entries are at or
//     before at; else the present figures (the blocks' credit less the
//     debt, credit_accounts.lifetime_earned and .debt) less the entries
//     after at, summed from at forwards, when at most maxEntries are; else
//     engine.ErrAsOfTooFar. Either walk is one range of the
//     history index (customer_id, created_at DESC, id DESC), so the work is
//     at most maxEntries index entries whatever the ledger's size;
//   - pending: the credit of the blocks made at or before at that started
//     after it (a block is not spent before its start, so all of it);
//   - reserved: the estimated cost of the reservations open at at (created at or
//     before it, not yet committed, released or expired), among the
//     customer's newest maxEntries holds created at or before at.
//
// lifetime earned counts every entry that added credit (rollover carries
// included).
func (s *Store) AccountAt(ctx context.Context, c engine.CustomerKey, at time.Time, maxEntries int) (engine.PastAccount, error) {
	customer, tenant := c.CustomerID, c.TenantID
	var p engine.PastAccount
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var updated *time.Time
		var debtNow, earnedNow int64
		err := tx.QueryRow(ctx, `SELECT COALESCE(id::text, ''), version, updated_at, debt, lifetime_earned
			FROM credit_accounts WHERE customer_id = $1 AND tenant_id = $2`, customer, tenant).Scan(&p.AccountID, &p.Version, &updated, &debtNow, &earnedNow)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // no money ever moved: zero figures
		}
		if err != nil {
			return err
		}
		if updated != nil {
			p.UpdatedAt = updated.UTC()
		}
		var n int64
		var sum, earned, debt int64
		if err := tx.QueryRow(ctx, fmt.Sprintf(asOfSums, "created_at <= $2", "DESC", "DESC"), customer, at, maxEntries+1, tenant).
			Scan(&n, &sum, &earned, &debt); err != nil {
			return err
		}
		if n <= int64(maxEntries) {
			p.Balance, p.LifetimeEarned, p.Debt = sum, earned, debt
		} else {
			if err := tx.QueryRow(ctx, fmt.Sprintf(asOfSums, "created_at > $2", "ASC", "ASC"), customer, at, maxEntries+1, tenant).
				Scan(&n, &sum, &earned, &debt); err != nil {
				return err
			}
			if n > int64(maxEntries) {
				return engine.ErrAsOfTooFar
			}
			var blocks int64
			if err := tx.QueryRow(ctx, `SELECT COALESCE(sum(remaining_amount), 0)::bigint FROM credit_blocks
				WHERE customer_id = $1 AND tenant_id = $2`, customer, tenant).Scan(&blocks); err != nil {
				return err
			}
			p.Balance, p.LifetimeEarned, p.Debt = blocks-debtNow-sum, earnedNow-earned, debtNow-debt
		}
		if err := tx.QueryRow(ctx, `SELECT COALESCE(sum(original_amount), 0)::bigint FROM credit_blocks
			WHERE customer_id = $1 AND tenant_id = $3 AND created_at <= $2 AND starts_at > $2`, customer, at, tenant).Scan(&p.Pending); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT COALESCE(sum(estimated_cost), 0)::bigint FROM (
				SELECT estimated_cost, committed_at, released_at, expires_at FROM reservations
				WHERE customer_id = $1 AND tenant_id = $4 AND created_at <= $2 ORDER BY created_at DESC, id DESC LIMIT $3) r
			WHERE COALESCE(committed_at, released_at, 'infinity') > $2 AND expires_at > $2`,
			customer, at, maxEntries, tenant).Scan(&p.Reserved)
	})
	if err != nil && !errors.Is(err, engine.ErrAsOfTooFar) {
		return engine.PastAccount{}, fmt.Errorf("persist: account at %s: %w", at.Format(time.RFC3339Nano), err)
	}
	return p, err
}
