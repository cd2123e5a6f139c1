package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// moneyOp is one money-moving request of a crash workload: a grant of
// credits or a negative adjust, sent with its own Idempotency-Key. Its body
// bytes are fixed, so a retry is byte-identical (same fingerprint).
type moneyOp struct {
	key      string
	customer string
	grant    bool
	amount   int64
	path     string
	body     []byte
}

// opResult is what a client learned about one moneyOp.
type opResult struct {
	// status is the last definitive answer (2xx or a 4xx that changed
	// nothing); 0 when the op never got one.
	status  int
	problem string
	// txIDs and deltas are the ledger entries a 2xx returned.
	txIDs  []string
	deltas []int64
	// unknown is set when an attempt ended without a definitive answer
	// (connection refused or reset, 5xx): the op was retried with the same
	// key and body.
	unknown  bool
	attempts int
	lastErr  string
	// firstErr is why the first attempt without an answer failed.
	firstErr string
}

// workload runs moneyOps against one creditd with concurrent workers; the
// ops that meet an outage are deferred and retried, with the same key and
// body, once the rest are done.
type workload struct {
	base   string
	apiKey string
	client *http.Client
	ops    []moneyOp
	res    []opResult
	done   atomic.Int64
	// inflight counts requests sent and not yet answered, so a crash can
	// be timed to land on some.
	inflight atomic.Int64
	// failed counts attempts that ended without a definitive answer, so an
	// outage can be held until it has been felt.
	failed  atomic.Int64
	workers int

	// gate, when closed, holds every worker before its next request (the
	// outage of a killed creditd: nothing to talk to).
	gateMu sync.Mutex
	gate   chan struct{}

	deferMu  sync.Mutex
	deferred []int
	wg       sync.WaitGroup
}

// newWorkload builds n ops over customers from seed: 55 % grants of 1..1000
// millicredits, 45 % adjusts of -1..-1000 (some of which find too little
// credit and get 409 insufficient-credits).
func newWorkload(base, apiKey string, customers []string, n, workers int, seed uint64) *workload {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	run := randomID()
	w := &workload{base: base, apiKey: apiKey, client: loadClient(), workers: workers,
		ops: make([]moneyOp, n), res: make([]opResult, n), gate: make(chan struct{})}
	close(w.gate)
	for i := range w.ops {
		c := customers[rng.IntN(len(customers))]
		amount := int64(rng.IntN(1000) + 1)
		op := moneyOp{key: fmt.Sprintf("load-%s-%05d", run, i), customer: c, amount: amount}
		if rng.IntN(100) < 55 {
			op.grant = true
			op.path = "/v1/customers/" + c + "/credits/grant"
			op.body, _ = json.Marshal(map[string]any{"credits": amount, "source": "promotional", "reason": "load " + strconv.Itoa(i)})
		} else {
			op.path = "/v1/customers/" + c + "/credits/adjust"
			op.body, _ = json.Marshal(map[string]any{"delta": -amount, "source": "manual", "reason": "load " + strconv.Itoa(i)})
		}
		w.ops[i] = op
	}
	return w
}

// waitInflight blocks until at least n requests are on the wire, so a kill
// that follows lands on them. Closing the gate first would drain them: on a
// loaded machine every in-flight request can finish before the kill.
func (w *workload) waitInflight(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for w.inflight.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than %d requests in flight for 10 s", n)
		}
		runtime.Gosched()
	}
}

// waitFailed blocks until at least one attempt has failed, after at least
// min: an outage that ends before any request met it tests nothing, and on a
// loaded machine the first failure can take longer than any fixed sleep.
func (w *workload) waitFailed(t *testing.T, min time.Duration) {
	t.Helper()
	time.Sleep(min)
	deadline := time.Now().Add(20 * time.Second)
	for w.failed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no request failed for %s of outage", min+20*time.Second)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// closeGate holds the workers before their next request.
func (w *workload) closeGate() {
	w.gateMu.Lock()
	defer w.gateMu.Unlock()
	w.gate = make(chan struct{})
}

// openGate releases the workers.
func (w *workload) openGate() {
	w.gateMu.Lock()
	defer w.gateMu.Unlock()
	select {
	case <-w.gate:
	default:
		close(w.gate)
	}
}

func (w *workload) waitGate() {
	w.gateMu.Lock()
	g := w.gate
	w.gateMu.Unlock()
	<-g
}

// start runs the first pass of every op on the workers and returns at once.
func (w *workload) start() {
	jobs := make(chan int)
	w.wg.Add(w.workers)
	for range w.workers {
		go func() {
			defer w.wg.Done()
			for i := range jobs {
				w.waitGate()
				if !w.attempt(i) {
					w.deferMu.Lock()
					w.deferred = append(w.deferred, i)
					w.deferMu.Unlock()
					// Do not hammer a creditd whose Redis is down.
					time.Sleep(20 * time.Millisecond)
				}
				w.done.Add(1)
			}
		}()
	}
	go func() {
		for i := range w.ops {
			jobs <- i
		}
		close(jobs)
	}()
}

// waitDone blocks until at least n ops had their first pass.
func (w *workload) waitDone(t *testing.T, n int64) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for w.done.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("workload stalled at %d of %d ops", w.done.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// finish waits for the first pass, then retries every deferred op with its
// own key and body until it gets a definitive answer (the server's claim on
// a key whose request died lapses after 30 s, so this may take that long).
func (w *workload) finish(t *testing.T) {
	t.Helper()
	w.wg.Wait()
	deadline := time.Now().Add(75 * time.Second)
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range w.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				for !w.attempt(i) && time.Now().Before(deadline) {
					time.Sleep(200 * time.Millisecond)
				}
			}
		}()
	}
	for _, i := range w.deferred {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	for _, i := range w.deferred {
		if w.res[i].status == 0 {
			t.Errorf("op %d (%s): no definitive answer after %d attempts; last: %s", i, w.ops[i].key, w.res[i].attempts, w.res[i].lastErr)
		}
	}
}

// attempt sends op i once, retrying at once only what certainly changed
// nothing (429, a 409 for a key still in progress, within a bound). It
// reports whether the op now has a definitive answer.
func (w *workload) attempt(i int) bool {
	op, res := w.ops[i], &w.res[i]
	for tries := 0; ; tries++ {
		res.attempts++
		w.inflight.Add(1)
		r, err := TryCall(w.client, w.base, "POST", op.path, op.body,
			"X-API-Key", w.apiKey, "Idempotency-Key", op.key)
		w.inflight.Add(-1)
		switch {
		case err != nil:
			res.fail(err.Error())
			w.failed.Add(1)
			return false
		case r.Status >= 500:
			res.fail(fmt.Sprintf("%d %s", r.Status, r.Raw))
			w.failed.Add(1)
			return false
		case r.Status == http.StatusTooManyRequests:
			time.Sleep(10 * time.Millisecond)
			continue
		case r.Status == http.StatusConflict && problemType(r) == "conflict":
			// The key is held by a request that may have died with a
			// crash; its claim lapses on its own.
			res.lastErr = fmt.Sprintf("%d %s", r.Status, r.Raw)
			if tries < 2 {
				continue
			}
			return false
		}
		res.status, res.problem, res.lastErr = r.Status, problemType(r), ""
		res.txIDs, res.deltas = nil, nil
		if r.Status/100 == 2 {
			var txs []any
			if op.grant {
				txs = []any{r.Body["transaction"]}
			} else {
				txs, _ = r.Body["transactions"].([]any)
			}
			for _, tx := range txs {
				m, _ := tx.(map[string]any)
				id, _ := m["id"].(string)
				d, _ := m["delta"].(json.Number)
				n, _ := d.Int64()
				res.txIDs = append(res.txIDs, id)
				res.deltas = append(res.deltas, n)
			}
		}
		return true
	}
}

// fail records an attempt that ended without a definitive answer.
func (r *opResult) fail(why string) {
	if !r.unknown {
		r.firstErr = why
	}
	r.unknown, r.lastErr = true, why
}

// replayAcknowledged sends again, with the same key and body, every op that
// met the outage and every 50th other acknowledged op: each must answer its
// first status and transactions (invariant 4) and change nothing, which the
// ledger checks that follow confirm.
func (w *workload) replayAcknowledged(t *testing.T) {
	t.Helper()
	replayed := 0
	for i, op := range w.ops {
		res := w.res[i]
		if res.status/100 != 2 || (!res.unknown && i%50 != 0) {
			continue
		}
		replayed++
		r, err := TryCall(w.client, w.base, "POST", op.path, op.body, "X-API-Key", w.apiKey, "Idempotency-Key", op.key)
		if err != nil {
			t.Errorf("replay of op %d (%s): %v", i, op.key, err)
			continue
		}
		var ids []string
		if op.grant {
			m, _ := r.Body["transaction"].(map[string]any)
			id, _ := m["id"].(string)
			ids = []string{id}
		} else {
			ids = strings.Split(txIDsOf(r), ",")
		}
		if r.Status != res.status || strings.Join(ids, ",") != strings.Join(res.txIDs, ",") {
			t.Errorf("replay of op %d (%s): %d with transactions %v, want the first answer %d with %v: %s",
				i, op.key, r.Status, ids, res.status, res.txIDs, r.Raw)
		}
	}
	t.Logf("replayed %d acknowledged ops with their keys", replayed)
}

// summarize logs what the run saw and checks every op ended in 2xx or 409
// insufficient-credits.
func (w *workload) summarize(t *testing.T) {
	t.Helper()
	var ok, short, unknown, retriedOK int
	for i, r := range w.res {
		switch {
		case r.status/100 == 2:
			ok++
		case r.status == 409 && r.problem == "insufficient-credits":
			short++
		case r.status != 0:
			t.Errorf("op %d (%s %s): unexpected final status %d %s", i, w.ops[i].path, w.ops[i].key, r.status, r.problem)
		}
		if r.unknown {
			unknown++
			if r.status/100 == 2 {
				retriedOK++
			}
		}
	}
	t.Logf("workload: %d ops, %d 2xx, %d insufficient-credits, %d unknown and retried (%d of them 2xx after retry)",
		len(w.ops), ok, short, unknown, retriedOK)
	shown := 0
	for i, r := range w.res {
		if r.unknown && shown < 5 {
			shown++
			t.Logf("op %d (%s) first failed with: %.200s", i, w.ops[i].key, r.firstErr)
		}
	}
	if ok == 0 {
		t.Errorf("no op succeeded")
	}
}

// unknownCount is how many ops met the outage.
func (w *workload) unknownCount() int {
	n := 0
	for _, r := range w.res {
		if r.unknown {
			n++
		}
	}
	return n
}

var backlogLine = regexp.MustCompile(`(?m)^creditd_persister_backlog (\d+)$`)

// waitPersisted waits until creditd at base reports an empty persister
// backlog and Postgres holds, for every customer, the account version the
// API shows.
func waitPersisted(t *testing.T, client *http.Client, base, apiKey string, pool *pgxpool.Pool, customers []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := TryCall(client, base, "GET", "/metrics", nil)
		if err == nil && r.Status == 200 {
			if m := backlogLine.FindSubmatch(r.Raw); m != nil && string(m[1]) == "0" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("persister backlog not 0 after 30 s; last /metrics: %v %s", err, backlogOf(r.Raw))
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, c := range customers {
		want := Int(t, getCredits(t, client, base, apiKey, c, false).Body["version"])
		for {
			var v int64
			err := pool.QueryRow(context.Background(), `SELECT version FROM credit_accounts WHERE customer_id = $1`, c).Scan(&v)
			if err == nil && v == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("customer %s: Postgres account version %d (err %v), API version %d", c, v, err, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func backlogOf(raw []byte) string {
	if m := backlogLine.Find(raw); m != nil {
		return string(m)
	}
	return "(no creditd_persister_backlog line)"
}

// getCredits reads a customer's account through the API.
func getCredits(t testing.TB, client *http.Client, base, apiKey, customer string, blocks bool) Response {
	t.Helper()
	path := "/v1/customers/" + customer + "/credits"
	if blocks {
		path += "?include_blocks=true"
	}
	r := Call(t, client, base, "GET", path, nil, "X-API-Key", apiKey)
	if r.Status != 200 {
		t.Fatalf("GET %s: %d %s", path, r.Status, r.Raw)
	}
	return r
}

// ledgerRow is one ledger_entries row as the checks need it.
type ledgerRow struct {
	key, customer string
	delta         int64
}

// verifyBooks checks invariants 1, 3 and 4 after a crash run, once Postgres
// has caught up: every acknowledged op's entries are in ledger_entries
// exactly once with the returned deltas; an op without a 2xx left no row;
// no row exists that no op accounts for; and per customer the API balance,
// the sum of acknowledged deltas, the ledger sum, credit_accounts.balance
// and the blocks' remaining amounts all agree.
func verifyBooks(t *testing.T, w *workload, pool *pgxpool.Pool, customers []string, seeds seedGrants) {
	t.Helper()
	ctx := context.Background()
	rows, err := pool.Query(ctx, `SELECT id::text, idempotency_key, customer_id::text, delta FROM ledger_entries`)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]ledgerRow{}
	perKey := map[string]int{}
	for rows.Next() {
		var id string
		var r ledgerRow
		if err := rows.Scan(&id, &r.key, &r.customer, &r.delta); err != nil {
			t.Fatal(err)
		}
		if _, dup := byID[id]; dup {
			t.Errorf("ledger entry %s appears twice", id)
		}
		byID[id] = r
		perKey[r.key]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	expected := map[string]int64{}
	accounted := 0
	var errs []string
	for i, op := range w.ops {
		r := w.res[i]
		if r.status/100 != 2 {
			if n := perKey[op.key]; n != 0 {
				errs = append(errs, fmt.Sprintf("op %d %s ended %d %s but the ledger holds %d entries for its key", i, op.key, r.status, r.problem, n))
			}
			continue
		}
		if len(r.txIDs) == 0 {
			errs = append(errs, fmt.Sprintf("op %d %s: 2xx without transactions", i, op.key))
		}
		if n := perKey[op.key]; n != len(r.txIDs) {
			errs = append(errs, fmt.Sprintf("op %d %s: %d ledger entries for its key, response returned %d", i, op.key, n, len(r.txIDs)))
		}
		accounted += len(r.txIDs)
		var sum int64
		for j, id := range r.txIDs {
			row, ok := byID[id]
			switch {
			case !ok:
				errs = append(errs, fmt.Sprintf("op %d %s: acknowledged entry %s missing from ledger_entries", i, op.key, id))
			case row.key != op.key || row.customer != op.customer || row.delta != r.deltas[j]:
				errs = append(errs, fmt.Sprintf("op %d %s: entry %s is %+v, response said delta %d for %s", i, op.key, id, row, r.deltas[j], op.customer))
			}
			sum += r.deltas[j]
		}
		want := op.amount
		if !op.grant {
			want = -op.amount
		}
		if sum != want {
			errs = append(errs, fmt.Sprintf("op %d %s: deltas sum to %d, want %d", i, op.key, sum, want))
		}
		expected[op.customer] += sum
	}
	for k := range seeds.keys {
		if perKey[k] != 1 {
			errs = append(errs, fmt.Sprintf("seed grant %s: %d ledger entries, want 1", k, perKey[k]))
		}
		accounted++
	}
	if len(byID) != accounted {
		errs = append(errs, fmt.Sprintf("ledger_entries holds %d rows, acknowledged ops account for %d", len(byID), accounted))
	}
	for _, e := range errs[:min(len(errs), 30)] {
		t.Error(e)
	}
	if len(errs) > 30 {
		t.Errorf("... and %d more ledger mismatches", len(errs)-30)
	}

	for _, c := range customers {
		api := Int(t, getCredits(t, w.client, w.base, w.apiKey, c, false).Body["balance"])
		var ledger, account, blocks int64
		if err := pool.QueryRow(ctx, `SELECT COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1`, c).Scan(&ledger); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT balance FROM credit_accounts WHERE customer_id = $1`, c).Scan(&account); err != nil {
			t.Fatal(err)
		}
		if err := pool.QueryRow(ctx, `SELECT COALESCE(SUM(remaining_amount), 0) FROM credit_blocks WHERE customer_id = $1`, c).Scan(&blocks); err != nil {
			t.Fatal(err)
		}
		want := expected[c] + seeds.amount[c]
		if api != want || ledger != want || account != want || blocks != want {
			t.Errorf("customer %s: API balance %d, acknowledged deltas %d, ledger sum %d, credit_accounts.balance %d, blocks remaining %d: want all equal",
				c, api, want, ledger, account, blocks)
		}
	}
}

// seedGrants are the grants that open every customer's account before a
// workload: their idempotency keys and the amount per customer.
type seedGrants struct {
	keys   map[string]bool
	amount map[string]int64
}

// seedCustomers creates n customers and gives each one grant of 1000, so a
// first negative adjust finds an account.
func seedCustomers(t *testing.T, client *http.Client, base, apiKey string, n int) ([]string, seedGrants) {
	t.Helper()
	run := randomID()
	var ids []string
	seeds := seedGrants{keys: map[string]bool{}, amount: map[string]int64{}}
	for i := range n {
		id := createCustomer(t, client, base, apiKey, fmt.Sprintf("crash-%s-%02d", run, i))
		key := "seed-" + id
		r := Call(t, client, base, "POST", "/v1/customers/"+id+"/credits/grant",
			map[string]any{"credits": 1000, "source": "promotional", "reason": "seed"},
			"X-API-Key", apiKey, "Idempotency-Key", key)
		if r.Status != 201 {
			t.Fatalf("seed grant: %d %s", r.Status, r.Raw)
		}
		ids = append(ids, id)
		seeds.keys[key] = true
		seeds.amount[id] = 1000
	}
	return ids, seeds
}
