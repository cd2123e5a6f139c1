package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/testenv"
)

// moneyAvailabilityGoalMet turns on the assertion that >= 99 % of the money
// calls answer 2xx during the outage (issue 26, "Done when"): since the
// seen filter (lua/seen.go) a money call asks Postgres only when its key
// may have been applied before, so a fresh call needs no Postgres.
const moneyAvailabilityGoalMet = true

// outageLoadDuration is how long TestPostgresOutageUnderMoneyLoad keeps
// Postgres stopped: the 60 s, twelve times the customer cache's TTL
// and far past every cache's stale limit, so only the last good copy
// (engine.LastGoodLimit) can keep the checks answering.
const outageLoadDuration = 60 * time.Second

// outageOp is one kind of call the load makes.
type outageOp string

const (
	opCheck   outageOp = "check"
	opConsume outageOp = "consume"
	opReserve outageOp = "reserve"
	opCommit  outageOp = "commit"
	opGrant   outageOp = "grant"
)

// moneyOps are the calls that move money (or hold it).
var moneyOps = []outageOp{opConsume, opReserve, opCommit, opGrant}

// outageTally counts answers by phase, operation and status; safe for
// concurrent use.
type outageTally struct {
	mu     sync.Mutex
	counts map[string]map[outageOp]map[int]int
}

func (o *outageTally) add(phase string, op outageOp, status int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.counts == nil {
		o.counts = map[string]map[outageOp]map[int]int{}
	}
	if o.counts[phase] == nil {
		o.counts[phase] = map[outageOp]map[int]int{}
	}
	if o.counts[phase][op] == nil {
		o.counts[phase][op] = map[int]int{}
	}
	o.counts[phase][op][status]++
}

// share is the fraction of ops' answers in phase that were 2xx, and their
// number.
func (o *outageTally) share(phase string, ops ...outageOp) (float64, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ok, all := 0, 0
	for _, op := range ops {
		for status, n := range o.counts[phase][op] {
			all += n
			if status >= 200 && status < 300 {
				ok += n
			}
		}
	}
	if all == 0 {
		return 0, 0
	}
	return float64(ok) / float64(all), all
}

// TestPostgresOutageUnderMoneyLoad (issue 26 item 3, invariants 3, 4 and
// 16): Postgres is stopped (`pg_ctl stop -m immediate`) for 60 s while
// four clients check, consume, reserve and commit, and grant on customers
// whose state is in Redis. Meanwhile no answer is a 5xx other than a 503
// problem with Retry-After, every check answers 2xx (the caches serve
// their last good copy), and what needs Postgres (a customer never seen, a
// ledger page, a customer list, an admin write) is a 503. Once Postgres is
// back every acknowledged money call is in the ledger exactly once, none
// twice, and every balance equals the sum of its ledger. The share of money
// calls answered 2xx is logged; it is asserted (>= 99 %) once
// moneyAvailabilityGoalMet.
func TestPostgresOutageUnderMoneyLoad(t *testing.T) {
	t.Parallel()
	began := time.Now()
	pg := testenv.StartPostgres(t)
	s := NewStack(t, SingleNode(), WithDatabase(pg.URL()))
	tn := s.NewTenant(uniq("pg-outage-load"))
	raiseRateLimit(t, s.HTTP, s.URL, tn.ID)
	a := s.as(t, tn.Live)
	metric := a.perUnit(1)
	const customers = 8
	ids := make([]string, customers)
	for i := range ids {
		ids[i], _ = a.newCustomer()
		a.grant(ids[i], map[string]any{"credits": 100_000_000})
	}

	var (
		tally outageTally
		phase atomic.Value // string: "before", "outage", "after"
		// sent maps the Idempotency-Key of every money call sent to its
		// operation; acked holds those answered 2xx.
		ackedMu sync.Mutex
		sent    = map[string]outageOp{}
		acked   = map[string]bool{}
		seq     atomic.Int64
	)
	phase.Store("before")
	call := func(method, path, idem string, body any) (Response, error) {
		h := []string{"X-API-Key", tn.Live}
		if idem != "" {
			h = append(h, "Idempotency-Key", idem)
		}
		return TryCall(s.HTTP, s.URL, method, path, body, h...)
	}
	// record tallies r and fails the test on an answer no outage excuses.
	record := func(op outageOp, r Response, err error) {
		p := phase.Load().(string)
		if err != nil {
			t.Errorf("%s %s: transport error %v", p, op, err)
			return
		}
		tally.add(p, op, r.Status)
		switch {
		case r.Status >= 200 && r.Status < 300:
		case r.Status == 503:
			if r.Header.Get("Retry-After") == "" || r.Body["type"] != "unavailable" {
				t.Errorf("%s %s: 503 without Retry-After or problem type: %s %v", p, op, r.Raw, r.Header)
			}
		case r.Status >= 500:
			t.Errorf("%s %s: %d %s", p, op, r.Status, r.Raw)
		default: // no 4xx is the outage's: credit is ample, every input valid

			t.Errorf("%s %s: %d %s", p, op, r.Status, r.Raw)
		}
	}
	money := func(op outageOp, path string, body any) Response {
		key := fmt.Sprintf("%s-%d", op, seq.Add(1))
		ackedMu.Lock()
		sent[key] = op
		ackedMu.Unlock()
		r, err := call("POST", path, key, body)
		record(op, r, err)
		if err == nil && r.Status >= 200 && r.Status < 300 {
			ackedMu.Lock()
			acked[key] = true
			ackedMu.Unlock()
		}
		return r
	}
	step := func(rng *rand.Rand) {
		cust := ids[rng.IntN(customers)]
		q := url.Values{"customer_id": {cust}, "billable_metric_key": {metric}, "units": {"1"}}
		r, err := call("GET", "/v1/entitlements/check?"+q.Encode(), "", nil)
		record(opCheck, r, err)
		money(opConsume, "/v1/entitlements/consume",
			map[string]any{"customer_id": cust, "billable_metric_key": metric, "units": 1 + rng.IntN(5)})
		if rng.IntN(2) == 0 {
			h := money(opReserve, "/v1/reservations",
				map[string]any{"customer_id": cust, "billable_metric_key": metric, "estimated_units": 10})
			if id, ok := h.Body["id"].(string); ok && h.Status == 201 {
				money(opCommit, "/v1/reservations/"+id+"/commit", map[string]any{"actual_units": 1 + rng.IntN(10)})
			}
		}
		if rng.IntN(4) == 0 {
			// Short-lived, so the live blocks stay far below the cap of 100
			// per customer however many grants a fast machine sends.
			money(opGrant, "/v1/customers/"+url.PathEscape(cust)+"/credits/grant",
				map[string]any{"credits": 100, "source": "promotional", "reason": "outage load", "duration_seconds": 2})
		}
	}

	// Every customer's state, key, metric, rule and facts are in Redis and
	// the caches before the outage: one round of each call.
	rng := rand.New(rand.NewPCG(1, 2))
	for range customers * 2 {
		step(rng)
	}
	if sh, n := tally.share("before", append(moneyOps, opCheck)...); sh != 1 {
		t.Fatalf("before the outage %.1f %% of %d calls answered 2xx: %v", 100*sh, n, tally.counts)
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	const clients = 4
	for c := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 26))
			for {
				select {
				case <-stop:
					return
				default:
				}
				step(rng)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}

	time.Sleep(time.Second)
	setUp := time.Since(began)
	// Calls in flight while the postmaster goes down count as the outage's.
	phase.Store("outage")
	pg.Stop()
	start := time.Now()
	// What needs Postgres answers 503 with Retry-After, never a 500 nor a
	// wait past the client's patience.
	needsPostgres := []struct {
		name, method, path string
		body               any
		admin              bool
	}{
		{"check of a customer never seen", "GET", "/v1/entitlements/check?customer_id=" + uniq("new") + "&billable_metric_key=" + metric + "&units=1", nil, false},
		{"ledger page", "GET", "/v1/customers/" + ids[0] + "/credits/history?limit=5", nil, false},
		{"customer list", "GET", "/v1/customers?limit=5", nil, false},
		{"customer create", "POST", "/v1/customers", map[string]any{"external_id": uniq("during")}, false},
		{"admin tenant update", "PATCH", "/admin/v1/tenants/" + tn.ID, map[string]any{"rate_limit_burst": 9_999_999}, true},
	}
	for time.Since(start) < outageLoadDuration {
		for _, c := range needsPostgres {
			h := []string{"X-API-Key", tn.Live, "Idempotency-Key", uniq("np")}
			if c.admin {
				h = []string{"Authorization", "Bearer " + AdminToken}
			}
			r, err := TryCall(s.HTTP, s.URL, c.method, c.path, c.body, h...)
			switch {
			case err != nil:
				t.Errorf("outage, %s: %v", c.name, err)
			case r.Status != 503 || r.Header.Get("Retry-After") == "" || r.Body["type"] != "unavailable":
				t.Errorf("outage, %s: %d %s, want 503 with Retry-After", c.name, r.Status, r.Raw)
			}
		}
		time.Sleep(5 * time.Second)
	}
	pg.Start()
	phase.Store("after")
	back := time.Now()
	// Past the outage, money calls answer 2xx again by themselves.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if sh, n := tally.share("after", opConsume); n > 20 && sh > 0.5 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("consumes still fail 30 s after Postgres came back: %v", tally.counts["after"])
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	recovered := time.Since(back)

	checks, nc := tally.share("outage", opCheck)
	moneyShare, nm := tally.share("outage", moneyOps...)
	t.Logf("during the %v outage: checks %.2f %% 2xx of %d, money calls %.2f %% 2xx of %d", outageLoadDuration, 100*checks, nc, 100*moneyShare, nm)
	t.Logf("answers by phase, call and status: %v", tally.counts)
	if nc == 0 || checks != 1 {
		t.Errorf("checks answered 2xx %.2f %% of %d times during the outage, want 100 %%", 100*checks, nc)
	}
	if moneyAvailabilityGoalMet && moneyShare < 0.99 {
		t.Errorf("money calls answered 2xx %.2f %% of %d times during the outage, want >= 99 %%", 100*moneyShare, nm)
	}

	s.Drain()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ops := map[string]int{}
	rows, err := s.Pool.Query(ctx, `SELECT idempotency_key, count(DISTINCT op_id) FROM ledger_entries
		WHERE tenant_id = $1 AND idempotency_key <> '' GROUP BY idempotency_key`, tn.ID)
	if err != nil {
		t.Fatalf("ledger by key: %v", err)
	}
	for rows.Next() {
		var key string
		var n int
		if err := rows.Scan(&key, &n); err != nil {
			t.Fatalf("ledger by key: %v", err)
		}
		ops[key] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("ledger by key: %v", err)
	}
	appliedUnacked := 0
	for key, op := range sent {
		if op == opReserve {
			continue // a reservation writes no ledger entry; its commit does
		}
		n := ops[key]
		switch ok := acked[key]; {
		case ok && n != 1:
			t.Errorf("acknowledged %s is in the ledger as %d operations, want exactly 1", key, n)
		case !ok && n > 1:
			t.Errorf("unacknowledged %s is in the ledger as %d operations", key, n)
		case !ok && n == 1:
			appliedUnacked++
		}
	}
	t.Logf("%d money calls acknowledged, %d sent; %d applied without an acknowledgement", len(acked), len(sent), appliedUnacked)
	for _, cust := range ids {
		var ledger int64
		if err := s.Pool.QueryRow(ctx, `SELECT COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1`, cust).Scan(&ledger); err != nil {
			t.Fatalf("ledger sum: %v", err)
		}
		if bal := a.balance(cust); bal != ledger {
			t.Errorf("customer %s: balance %d, ledger sum %d", cust, bal, ledger)
		}
	}
	t.Logf("run time: set-up %v, outage %v, recovery %v, checks after %v", setUp.Round(time.Millisecond),
		outageLoadDuration, recovered.Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
}
