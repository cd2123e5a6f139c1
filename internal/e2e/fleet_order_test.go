package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/creditd/creditd/lua"
)

// fleetRecipe runs issue 25's four requests on nodes, one node after the
// other as a round-robin balancer sends them: create a customer, grant it
// 50, consume 5 units at 10 (200, charged 50), consume 1 more (409 under
// block). It returns the customer and the consume's transaction id.
func fleetRecipe(t *testing.T, nodes []api, first int, metric string) (customer, txn string) {
	t.Helper()
	on := func(j int) api { return nodes[(first+j)%len(nodes)] }
	customer, _ = on(0).newCustomer()
	on(1).grant(customer, map[string]any{"credits": 50})
	r := on(2).post("/v1/entitlements/consume", map[string]any{"customer_id": customer, "billable_metric_key": metric, "units": 5})
	wantStatus(t, r, 200, "consume 5")
	if c := Int(t, r.Body["charged"]); c != 50 {
		t.Fatalf("consume 5 charged %d, want 50", c)
	}
	txn = str(t, r.Body["transaction_id"], "transaction_id")
	r = on(3).post("/v1/entitlements/consume", map[string]any{"customer_id": customer, "billable_metric_key": metric, "units": 1})
	wantStatus(t, r, 409, "consume 1 more")
	return customer, txn
}

// TestFleetPersistsInStreamOrder (issue 25): three nodes on one Redis
// (single or Cluster) and one Postgres, sent ordinary sequential traffic
// round robin, fork no account. Each node's persister used to read every
// partition of the shared consumer group, so one customer's consume and
// the refusal record after it could be committed by two nodes out of
// order; the refusal then claimed the version first and the acknowledged
// consume was dead-lettered as a fork. With concurrent mixed traffic
// besides, no entry is dead-lettered and every acknowledged op is in the
// ledger exactly once.
func TestFleetPersistsInStreamOrder(t *testing.T) {
	s := NewStack(t, SingleNode()) // the test starts its own nodes
	_, n2 := s.addNode(t, "e2e-2")
	_, n3 := s.addNode(t, "e2e-3")
	tn := s.NewTenant(uniq("fleetorder"))
	nodes := []api{s.as(t, tn.Live), n2.as(t, tn.Live), n3.as(t, tn.Live)}
	metric := nodes[0].perUnit(10)

	// Mixed traffic on customers of its own while the recipe runs: grants,
	// consumes (some refused), reservations and their commits, on every node.
	const workers, steps = 3, 25
	var wg sync.WaitGroup
	mixed := make([]string, workers)
	charged := make([]int64, workers)
	granted := make([]int64, workers)
	for w := range workers {
		id, _ := nodes[w].newCustomer()
		mixed[w] = id
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range steps {
				a := nodes[(w+i)%len(nodes)]
				switch i % 5 {
				case 0:
					a.grant(id, map[string]any{"credits": 40})
					granted[w] += 40
				case 1, 2, 3:
					r := a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 2})
					if r.Status == 200 {
						charged[w] += Int(t, r.Body["charged"])
					} else if r.Status != 409 {
						t.Errorf("mixed consume: %d %s", r.Status, r.Raw)
					}
				case 4:
					r := a.post("/v1/reservations", map[string]any{"customer_id": id, "billable_metric_key": metric,
						"estimated_units": 1, "ttl_seconds": 60})
					if r.Status != 201 {
						if r.Status != 409 {
							t.Errorf("mixed reserve: %d %s", r.Status, r.Raw)
						}
						continue
					}
					reservation := str(t, r.Body["id"], "reservation id")
					c := nodes[(w+i+1)%len(nodes)].post("/v1/reservations/"+reservation+"/commit", map[string]any{"actual_units": 1})
					if c.Status != 200 {
						t.Errorf("mixed commit: %d %s", c.Status, c.Raw)
						continue
					}
					charged[w] += 10
				}
			}
		}()
	}

	const rounds = 15
	customers := make([]string, rounds)
	txns := make([]string, rounds)
	for i := range rounds {
		customers[i], txns[i] = fleetRecipe(t, nodes, i, metric)
	}
	wg.Wait()
	s.Drain()

	if n := s.sqlInt(t, `SELECT count(*) FROM outbox_dead_letters`); n != 0 {
		rows, _ := s.Pool.Query(t.Context(), `SELECT error FROM outbox_dead_letters ORDER BY id LIMIT 5`)
		for rows.Next() {
			var e string
			_ = rows.Scan(&e)
			t.Log(e)
		}
		rows.Close()
		t.Fatalf("%d dead letters, want 0", n)
	}
	for i, id := range customers {
		if n := s.sqlInt(t, `SELECT count(*) FROM ledger_entries WHERE id = $1`, txns[i]); n != 1 {
			t.Errorf("customer %s: consume %s in the ledger %d times, want once", id, txns[i], n)
		}
		if n := s.sqlInt(t, `SELECT count(DISTINCT op_id) FROM ledger_entries WHERE customer_id = $1`, id); n != 2 {
			t.Errorf("customer %s: %d ops in the ledger, want 2 (grant, consume)", id, n)
		}
		if sum := s.sqlInt(t, `SELECT COALESCE(sum(delta), 0) FROM ledger_entries WHERE customer_id = $1`, id); sum != 0 {
			t.Errorf("customer %s: ledger sums to %d, want 0", id, sum)
		}
		if b := s.sqlInt(t, `SELECT balance FROM credit_accounts WHERE customer_id = $1`, id); b != 0 {
			t.Errorf("customer %s: postgres balance %d, want 0", id, b)
		}
	}
	for w, id := range mixed {
		want := granted[w] - charged[w]
		if b := nodes[0].balance(id); b != want {
			t.Errorf("mixed customer %s: balance %d, want %d", id, b, want)
		}
		if sum := s.sqlInt(t, `SELECT COALESCE(sum(delta), 0) FROM ledger_entries WHERE customer_id = $1`, id); sum != want {
			t.Errorf("mixed customer %s: ledger sums to %d, want %d", id, sum, want)
		}
		if b := s.sqlInt(t, `SELECT balance FROM credit_accounts WHERE customer_id = $1`, id); b != want {
			t.Errorf("mixed customer %s: postgres balance %d, want %d", id, b, want)
		}
	}
}

// ownersWithin waits until every outbox partition has an owner among
// consumers and none owns more than most.
func ownersWithin(t *testing.T, s *Stack, most int, consumers ...string) {
	t.Helper()
	store := lua.NewStore(s.Redis, s.Prefix)
	var owners []string
	defer func(start time.Time) { t.Logf("owners within %d after %s", most, time.Since(start)) }(time.Now())
	eventually(t, fmt.Sprintf("every partition owned by one of %v, at most %d each", consumers, most), func() bool {
		var err error
		if owners, err = store.PartitionOwners(context.Background()); err != nil {
			return false
		}
		counts := map[string]int{}
		for _, o := range owners {
			counts[o]++
		}
		total := 0
		for _, c := range consumers {
			if counts[c] > most {
				return false
			}
			total += counts[c]
		}
		return total == lua.Partitions
	})
}

// TestFleetNodeLeaves (issue 25): three nodes share the outbox partitions
// (at most 11 of 32 each); one stops in the middle of the traffic, and its
// partitions go on with the other two (at most 16 each), in order: no dead
// letter, each consume in the ledger once.
func TestFleetNodeLeaves(t *testing.T) {
	s := NewStack(t, SingleNode()) // the test starts its own nodes
	_, n2 := s.addNode(t, "e2e-2")
	a3, n3 := s.addNode(t, "e2e-3")
	tn := s.NewTenant(uniq("fleetleave"))
	nodes := []api{s.as(t, tn.Live), n2.as(t, tn.Live), n3.as(t, tn.Live)}
	metric := nodes[0].perUnit(10)
	ownersWithin(t, s, 11, "e2e", "e2e-2", "e2e-3")

	var customers, txns []string
	for i := range 6 {
		c, txn := fleetRecipe(t, nodes, i, metric)
		customers, txns = append(customers, c), append(txns, txn)
	}
	a3.Stop(0)
	nodes = nodes[:2]
	for i := range 6 {
		c, txn := fleetRecipe(t, nodes, i, metric)
		customers, txns = append(customers, c), append(txns, txn)
	}
	ownersWithin(t, s, 16, "e2e", "e2e-2")
	s.Drain()
	if n := s.sqlInt(t, `SELECT count(*) FROM outbox_dead_letters`); n != 0 {
		t.Fatalf("%d dead letters, want 0", n)
	}
	for i, id := range customers {
		if n := s.sqlInt(t, `SELECT count(*) FROM ledger_entries WHERE id = $1`, txns[i]); n != 1 {
			t.Errorf("customer %s: consume %s in the ledger %d times, want once", id, txns[i], n)
		}
		if b := s.sqlInt(t, `SELECT balance FROM credit_accounts WHERE customer_id = $1`, id); b != 0 {
			t.Errorf("customer %s: postgres balance %d, want 0", id, b)
		}
	}
}
