package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/internal/testenv"
)

// TestConcurrentAdjustsSpendExactlyTheCredit protects invariant 2 (no double
// spend): with credit for exactly K millicredits, N > K racing adjusts of
// delta -1 (each with its own Idempotency-Key) succeed exactly K times, every
// other one is a 409 insufficient-credits that changed nothing, the balance
// ends at exactly 0, and once the persister has drained, Postgres agrees
// (invariant 1: ledger sum = account balance = 0).
func TestConcurrentAdjustsSpendExactlyTheCredit(t *testing.T) {
	t.Parallel()
	const (
		credit = 20 // K millicredits
		racers = 50 // N adjusts of -1
	)
	s := NewStack(t)
	tn := s.NewTenant("concurrency")
	cust := createCustomer(t, s.HTTP, s.URL, tn.Live, "racer-"+randomID())

	g := s.Do("POST", "/v1/customers/"+cust+"/credits/grant", tn.Live, "grant-"+randomID(),
		map[string]any{"credits": credit, "source": "promotional", "reason": "race"})
	if g.Status != 201 {
		t.Fatalf("grant: %d %s", g.Status, g.Raw)
	}

	statuses := make([]Response, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := TryCall(s.HTTP, s.URL, "POST", "/v1/customers/"+cust+"/credits/adjust",
				map[string]any{"delta": -1, "source": "manual", "reason": fmt.Sprintf("racer %d", i)},
				"X-API-Key", tn.Live, "Idempotency-Key", fmt.Sprintf("race-%d-%s", i, cust))
			if err != nil {
				r = Response{Status: -1, Raw: []byte(err.Error())}
			}
			statuses[i] = r
		}()
	}
	close(start)
	wg.Wait()

	ok, short := 0, 0
	for i, r := range statuses {
		switch {
		case r.Status == 200:
			ok++
			txs, _ := r.Body["transactions"].([]any)
			if len(txs) != 1 {
				t.Errorf("racer %d: 200 with %d transactions, want 1: %s", i, len(txs), r.Raw)
			}
		case r.Status == 409 && problemType(r) == "insufficient-credits":
			short++
		default:
			t.Errorf("racer %d: got %d %s, want 200 or 409 insufficient-credits", i, r.Status, r.Raw)
		}
	}
	if ok != credit || short != racers-credit {
		t.Errorf("got %d successes and %d insufficient-credits, want exactly %d and %d", ok, short, credit, racers-credit)
	}

	acct := s.Do("GET", "/v1/customers/"+cust+"/credits", tn.Live, "", nil)
	if acct.Status != 200 {
		t.Fatalf("get credits: %d %s", acct.Status, acct.Raw)
	}
	for _, f := range []string{"balance", "effective_balance"} {
		if v := Int(t, acct.Body[f]); v != 0 {
			t.Errorf("API %s = %d, want 0", f, v)
		}
	}
	wantVersion := Int(t, acct.Body["version"])

	s.Drain()
	ctx := context.Background()
	var sum, rows int64
	if err := s.Pool.QueryRow(ctx,
		`SELECT COALESCE(SUM(delta), 0), COUNT(*) FROM ledger_entries WHERE customer_id = $1`, cust).Scan(&sum, &rows); err != nil {
		t.Fatal(err)
	}
	if sum != 0 || rows != credit+1 {
		t.Errorf("Postgres ledger: sum %d over %d rows, want 0 over %d rows (one grant, %d debits)", sum, rows, credit+1, credit)
	}
	var bal, version int64
	if err := s.Pool.QueryRow(ctx,
		`SELECT balance, version FROM credit_accounts WHERE customer_id = $1`, cust).Scan(&bal, &version); err != nil {
		t.Fatal(err)
	}
	if bal != 0 || version != wantVersion {
		t.Errorf("Postgres account: balance %d version %d, want 0 and version %d", bal, version, wantVersion)
	}
	var remaining int64
	if err := s.Pool.QueryRow(ctx,
		`SELECT COALESCE(SUM(remaining_amount), 0) FROM credit_blocks WHERE customer_id = $1`, cust).Scan(&remaining); err != nil {
		t.Fatal(err)
	}
	if remaining != 0 {
		t.Errorf("Postgres blocks hold %d, want 0", remaining)
	}
}

// TestConcurrentFirstUseAfterRedisLossLoadsOnce protects invariants 2 and 5
// together: after Redis loses everything (FLUSHALL of a private server), 50
// racing adjusts of -1 on a customer with 20 millicredits in Postgres all
// find the state missing at once. The load from Postgres must happen as if
// once (single-flight, fenced), so exactly 20 succeed, the rest are 409
// insufficient-credits, and Redis and Postgres both end at 0 with the
// same version.
func TestConcurrentFirstUseAfterRedisLossLoadsOnce(t *testing.T) {
	t.Parallel()
	const credit, racers = 20, 50
	srv := testenv.StartRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: StackRedisPoolSize})
	t.Cleanup(func() { _ = rdb.Close() })
	s := NewStack(t, WithRedis(rdb, "lz"+randomID()))
	tn := s.NewTenant("lazy-race")
	cust := createCustomer(t, s.HTTP, s.URL, tn.Live, "lazy-"+randomID())
	if g := s.Do("POST", "/v1/customers/"+cust+"/credits/grant", tn.Live, "grant-"+cust,
		map[string]any{"credits": credit, "source": "promotional", "reason": "race"}); g.Status != 201 {
		t.Fatalf("grant: %d %s", g.Status, g.Raw)
	}
	s.Drain()
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}

	results := make([]Response, racers)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range racers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := TryCall(s.HTTP, s.URL, "POST", "/v1/customers/"+cust+"/credits/adjust",
				map[string]any{"delta": -1, "source": "manual", "reason": "after loss"},
				"X-API-Key", tn.Live, "Idempotency-Key", fmt.Sprintf("lazy-%d-%s", i, cust))
			if err != nil {
				r = Response{Status: -1, Raw: []byte(err.Error())}
			}
			results[i] = r
		}()
	}
	close(start)
	wg.Wait()
	ok, short := 0, 0
	for i, r := range results {
		switch {
		case r.Status == 200:
			ok++
		case r.Status == 409 && problemType(r) == "insufficient-credits":
			short++
		default:
			t.Errorf("racer %d: %d %s, want 200 or 409 insufficient-credits", i, r.Status, r.Raw)
		}
	}
	if ok != credit || short != racers-credit {
		t.Errorf("after Redis loss: %d successes, %d insufficient-credits; want %d and %d", ok, short, credit, racers-credit)
	}
	acct := s.Do("GET", "/v1/customers/"+cust+"/credits", tn.Live, "", nil)
	if acct.Status != 200 || Int(t, acct.Body["balance"]) != 0 {
		t.Fatalf("balance after the race: %d %s, want 0", acct.Status, acct.Raw)
	}
	version := Int(t, acct.Body["version"])
	s.Drain()
	var sum, bal, pgVersion int64
	if err := s.Pool.QueryRow(context.Background(), `SELECT (SELECT COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1),
		balance, version FROM credit_accounts WHERE customer_id = $1`, cust).Scan(&sum, &bal, &pgVersion); err != nil {
		t.Fatal(err)
	}
	if sum != 0 || bal != 0 || pgVersion != version {
		t.Errorf("Postgres: ledger sum %d, balance %d, version %d; want 0, 0, %d", sum, bal, pgVersion, version)
	}
}

// problemType is the RFC 9457 type of an error response, reduced to its
// last path segment so a URI form and the bare name compare alike.
func problemType(r Response) string {
	s, _ := r.Body["type"].(string)
	if i := strings.LastIndex(s, "/"); i >= 0 {
		s = s[i+1:]
	}
	return s
}
