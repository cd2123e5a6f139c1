package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// TestMixedWorkloadBooksBalance states invariants 1 and 2 under the hot path:
// after concurrent consumes (block and allow customers), reservations, commits and
// releases, and a drained persister, every account's balance equals the sum
// of its ledger deltas in Postgres, its account row and its live blocks; its
// reserved balance equals the estimated cost of its active reservations; and no
// block customer's effective balance ever went below zero, or below minus
// its credit line for the customers that have one (issue 28 item 2: their
// balance is the blocks less the debt, which grants in the mix repay);
// some grants are scoped to one metric (issue 28 item 1), and no
// consumption of a metric draws from a block scoped to another; four
// customers share the pool of a ninth, their parent (issue 28 item 4), one
// of them within a draw limit.
func TestMixedWorkloadBooksBalance(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	tn := s.NewTenant(uniq("books"))
	raiseRateLimit(t, s.HTTP, s.URL, tn.ID)
	a := s.as(t, tn.Sandbox)
	metric := uniq("calls")
	wantStatus(t, a.post("/v1/metering-rules", map[string]any{
		"billable_metric_key": metric, "cost_type": "per_unit", "unit_cost": 3}), 201, "rule")
	// A second metric for multi-metric consumes (items), which charge
	// their total once.
	second := uniq("gpu")
	wantStatus(t, a.post("/v1/metering-rules", map[string]any{
		"billable_metric_key": second, "cost_type": "flat", "base_cost": 5}), 201, "second rule")

	// Customers 0-7, then 8: the parent of the pool children, created first.
	const customers = 9
	pooled := func(i int) bool { return i == 1 || i == 2 || i == 3 || i == 6 }
	const drawLimitMC = 150 // customer 6's per day
	// Customers i%4 == 2 are block customers with a credit line of lineMC.
	const lineMC = 200
	lined := func(i int) bool { return i%4 == 2 }
	// Customers i%4 == 3 (allow: only the budget refuses them) have a
	// daily budget of every metric; customers i%4 == 0 (block) a monthly
	// one of the second metric, which the items of multi-metric consumes
	// count (issue 28 item 3).
	budgetOf := func(i int) map[string]any {
		switch i % 4 {
		case 3:
			return map[string]any{"period": "day", "limit_mc": 80}
		case 0:
			return map[string]any{"period": "month", "time_zone": "Europe/Berlin", "limit_mc": 20, "billable_metric_key": second}
		}
		return nil
	}
	ids := make([]string, customers)
	index := map[string]int{}
	for _, i := range append([]int{customers - 1}, 0, 1, 2, 3, 4, 5, 6, 7) {
		policy := "block"
		if i%2 == 1 {
			policy = "allow"
		}
		body := map[string]any{"external_id": uniq("c"), "overage_policy": policy}
		if lined(i) {
			body["credit_limit_mc"] = lineMC
		}
		if b := budgetOf(i); b != nil {
			body["budgets"] = []any{b}
		}
		if pooled(i) {
			body["parent_id"] = ids[customers-1]
			if i == 6 {
				body["parent_draw_limit"] = map[string]any{"period": "day", "limit_mc": drawLimitMC}
			}
		}
		c := a.createCustomer(body)
		index[c["id"].(string)] = i
		ids[i] = c["id"].(string)
		// Spent after the scoped seed (lower priorities are spent first), so
		// the scoped blocks are drawn even where a budget stops consumes early.
		seed := 300
		if pooled(i) {
			seed = 30 // a child soon spends the pool
		}
		a.grant(ids[i], map[string]any{"credits": seed, "source": "promotional", "reason": "seed", "priority": 1})
		// Credits scoped to one metric (issue 28 item 1) beside them.
		if i%3 == 0 {
			a.grant(ids[i], map[string]any{"credits": 200, "source": "promotional", "reason": "seed",
				"applies_to": map[string]any{"billable_metric_keys": []string{second}}})
		}
	}

	client := loadClient()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var negative []string
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 7))
			call := func(method, path string, body any) Response {
				return Call(t, client, s.URL, method, path, body, "X-API-Key", tn.Sandbox, "Idempotency-Key", idemKey())
			}
			for op := 0; op < 40; op++ {
				cust := ids[rng.IntN(customers)]
				if rng.IntN(8) == 0 {
					// A grant: for a customer in debt, it pays the debt first
					// unless it is scoped to a metric.
					body := map[string]any{"credits": 20 + rng.IntN(60), "source": "promotional", "reason": "top"}
					if k := rng.IntN(3); k < 2 {
						body["applies_to"] = map[string]any{"billable_metric_keys": []string{[]string{metric, second}[k]}}
					}
					r := call("POST", "/v1/customers/"+cust+"/credits/grant", body)
					if r.Status != 201 {
						t.Errorf("grant: %d %s", r.Status, r.Raw)
					}
					continue
				}
				switch rng.IntN(3) {
				case 0:
					body := map[string]any{"customer_id": cust, "billable_metric_key": metric, "units": 1 + rng.IntN(6)}
					if rng.IntN(2) == 0 {
						body = map[string]any{"customer_id": cust, "items": items(metric, 1+rng.IntN(6), second, 1+rng.IntN(3))}
					}
					r := call("POST", "/v1/entitlements/consume", body)
					if r.Status != 200 && r.Status != 409 {
						t.Errorf("consume: %d %s", r.Status, r.Raw)
					}
					floor := int64(0)
					if lined(index[cust]) {
						floor = -lineMC
					}
					if r.Status == 200 && Int(t, r.Body["effective_balance"]) < floor {
						mu.Lock()
						negative = append(negative, cust)
						mu.Unlock()
					}
				default:
					r := call("POST", "/v1/reservations", map[string]any{
						"customer_id": cust, "billable_metric_key": metric, "estimated_units": 1 + rng.IntN(8)})
					if r.Status == 409 {
						continue
					}
					if r.Status != 201 {
						t.Errorf("reserve: %d %s", r.Status, r.Raw)
						continue
					}
					id := r.Body["id"].(string)
					switch rng.IntN(3) {
					case 0:
						r = call("POST", "/v1/reservations/"+id+"/release", nil)
					case 1:
						r = call("POST", "/v1/reservations/"+id+"/commit", map[string]any{"actual_units": rng.IntN(12)})
					default:
						continue // left active: its reservation must still be counted
					}
					if r.Status != 200 && r.Status != 409 {
						t.Errorf("settle %s: %d %s", id, r.Status, r.Raw)
					}
				}
			}
		}(uint64(w + 1))
	}
	wg.Wait()
	s.Drain()

	ctx := context.Background()
	// Consumptions that scoped blocks paid: the check above saw some.
	var scopedDraws int64
	for i, cust := range ids {
		acct := a.credits(cust)
		balance, reserved := Int(t, acct["balance"]), Int(t, acct["reserved_balance"])
		effective := Int(t, acct["effective_balance"])
		var ledger, row, blocks, reservations, debt int64
		q := func(sql string, dst *int64) {
			if err := s.Pool.QueryRow(ctx, sql, cust).Scan(dst); err != nil {
				t.Fatalf("%s: %v", sql, err)
			}
		}
		q(`SELECT COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1`, &ledger)
		q(`SELECT balance FROM credit_accounts WHERE customer_id = $1`, &row)
		q(`SELECT COALESCE(SUM(remaining_amount), 0) FROM credit_blocks WHERE customer_id = $1`, &blocks)
		q(`SELECT COALESCE(SUM(estimated_cost), 0) FROM reservations WHERE customer_id = $1 AND status = 'active'`, &reservations)
		q(`SELECT debt FROM credit_accounts WHERE customer_id = $1`, &debt)
		what := fmt.Sprintf("customer %d (%s)", i, cust)
		if balance != ledger || balance != row || balance != blocks-debt || Int(t, acct["debt_mc"]) != debt {
			t.Errorf("%s: balance %d, ledger sum %d, account row %d, blocks %d less debt %d (answer %v)", what, balance, ledger,
				row, blocks, debt, acct["debt_mc"])
		}
		if lined(i) {
			t.Logf("%s: balance %d, debt %d, lifetime earned %v", what, balance, debt, acct["lifetime_earned"])
		}
		if !lined(i) && debt != 0 {
			t.Errorf("%s: debt %d without a credit line", what, debt)
		}
		// No consumption of one metric drew from a block scoped to others.
		var stray int64
		q(`SELECT count(*) FROM ledger_entries e
			JOIN credit_blocks b ON b.id = ANY(COALESCE(e.draw_block_ids, ARRAY[e.credit_block_id]))
			WHERE e.customer_id = $1 AND e.type = 'consumption' AND COALESCE(e.billable_metric_key, '') <> ''
			AND b.applies_to IS NOT NULL AND NOT (e.billable_metric_key = ANY(b.applies_to))`, &stray)
		if stray != 0 {
			t.Errorf("%s: %d consumptions drew from blocks scoped to other metrics", what, stray)
		}
		var drewScoped int64
		q(`SELECT count(*) FROM ledger_entries e
			JOIN credit_blocks b ON b.id = ANY(COALESCE(e.draw_block_ids, ARRAY[e.credit_block_id]))
			WHERE e.customer_id = $1 AND e.type = 'consumption' AND b.applies_to IS NOT NULL`, &drewScoped)
		scopedDraws += drewScoped
		if reserved != reservations {
			t.Errorf("%s: reserved %d, active reservations %d", what, reserved, reservations)
		}
		switch {
		case lined(i) && effective < -lineMC:
			t.Errorf("%s: effective balance %d below minus the line %d", what, effective, lineMC)
		case i%2 == 0 && !lined(i) && effective < 0:
			t.Errorf("%s: block customer's effective balance %d < 0", what, effective)
		}
	}
	if scopedDraws == 0 {
		t.Error("no consumption drew from a scoped block: the workload tested no scope")
	}
	// The children drew on the pool, customer 6 within its draw limit, and
	// only children did.
	var draws, strays, limited int64
	if err := s.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE customer_id <> $1 OR NOT (reference_id = ANY($2))),
			COALESCE(SUM(-delta) FILTER (WHERE reference_id = $3), 0)::bigint
		FROM ledger_entries WHERE type = 'pool_draw' AND tenant_id = $4`,
		ids[customers-1], []string{ids[1], ids[2], ids[3], ids[6]}, ids[6], tn.ID).Scan(&draws, &strays, &limited); err != nil {
		t.Fatal(err)
	}
	if draws == 0 || strays != 0 || limited > drawLimitMC {
		t.Errorf("pool draws %d (%d not by a child from its parent), customer 6 drew %d of its limit %d; want some, none and within",
			draws, strays, limited, drawLimitMC)
	} else {
		t.Logf("pool draws %d; customer 6 drew %d of %d", draws, limited, drawLimitMC)
	}
	if len(negative) > 0 {
		t.Errorf("consumes answered an effective balance below the floor for %v", negative)
	}
	// What consumes (not commits, which a budget never refuses) spent never
	// passes a budget: the cost of consumption entries without a reservation, of
	// the budget's metric (a multi-metric entry's items of it) or of all.
	for i, cust := range ids {
		b := budgetOf(i)
		if b == nil {
			continue
		}
		metric, _ := b["billable_metric_key"].(string)
		var spent int64
		if err := s.Pool.QueryRow(ctx, `SELECT COALESCE(SUM(CASE WHEN $2 = '' OR e.billable_metric_key = $2
				THEN -e.delta + e.overage_mc
				ELSE (SELECT COALESCE(SUM((i->>'cost')::bigint), 0) FROM jsonb_array_elements(e.metadata->'items') i
					WHERE i->>'billable_metric_key' = $2) END), 0)::bigint
			FROM ledger_entries e WHERE e.customer_id = $1 AND e.type = 'consumption' AND e.reference_id IS NULL`,
			cust, metric).Scan(&spent); err != nil {
			t.Fatal(err)
		}
		// What the parent paid of the customer's consumes counts too.
		var fromPool int64
		if err := s.Pool.QueryRow(ctx, `SELECT COALESCE(SUM(-delta), 0)::bigint FROM ledger_entries
			WHERE type = 'pool_draw' AND reference_id = $1 AND ($2 = '' OR billable_metric_key = $2)`,
			cust, metric).Scan(&fromPool); err != nil {
			t.Fatal(err)
		}
		spent += fromPool
		if limit := int64(b["limit_mc"].(int)); spent > limit {
			t.Errorf("customer %d (%s): consumes spent %d past the budget of %d", i, cust, spent, limit)
		} else {
			t.Logf("customer %d: consumes spent %d of a budget of %d", i, spent, limit)
		}
	}
	// Redis and Postgres agree too, debts of the credit lines included.
	if rep := reconcileOf(t, s, false); rep.Found != 0 {
		t.Errorf("reconcile: %d differences: %+v", rep.Found, rep.First)
	}
}
