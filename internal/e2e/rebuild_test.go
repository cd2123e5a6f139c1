package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/internal/testenv"
)

// rebuildCustomers is how many customers the rebuild test fills.
const rebuildCustomers = 6

// TestRebuildFromPostgresIsExactAndFenced protects invariant 5. After a
// workload of prioritised and expiring grants, stacked grants that start
// later (pending_balance > 0) and negative adjusts, the persister drains and
// each account is recorded through the API. Then Redis is flushed:
//
//	(a) the next read of each customer loads it from Postgres, and every
//	    figure and block equals the recorded one;
//	(b) after a second flush, `creditd rebuild` reports progress, exits 0
//	    and writes every account hash (checked in Redis before any API
//	    call); the API again shows the recorded figures and blocks, and a
//	    retried adjust replays its original transactions (invariant 4 across
//	    a rebuild);
//	(c) fencing: with Postgres held behind Redis (a newer grant not yet
//	    persisted), a second `creditd rebuild` rolls nothing back: version
//	    and balance keep the newer values, and once released the persister
//	    (on an outbox the flush deleted, so its consumer group is recreated)
//	    brings Postgres to them.
func TestRebuildFromPostgresIsExactAndFenced(t *testing.T) {
	t.Parallel()
	srv, rdb, prefix := ownRedis(t, "rb")
	clock := newTestClock(time.Now())
	s := NewStack(t, WithRedis(rdb, prefix), WithClock(clock))
	tn := s.NewTenant("rebuild")
	ctx := context.Background()
	begin := time.Now()
	phase := func(name string) { t.Logf("%s at %s", name, time.Since(begin).Round(time.Millisecond)) }

	type adjustDone struct {
		customer, key string
		body          []byte
		txIDs         string
	}
	var customers []string
	var adjusts []adjustDone
	now := clock.Now()
	for i := range rebuildCustomers {
		c := createCustomer(t, s.HTTP, s.URL, tn.Live, fmt.Sprintf("rebuild-%s-%d", randomID(), i))
		customers = append(customers, c)
		grants := []map[string]any{
			{"credits": 5000, "source": "promotional", "reason": "base", "priority": 10,
				"expires_at": now.Add(2 * time.Hour).Format(time.RFC3339Nano), "metadata": map[string]any{"plan": "pro", "n": i}},
			{"credits": 3000, "source": "compensation", "reason": "sorry"},
			{"credits": 2000, "source": "referral", "reason": "next period", "duration_seconds": 3600,
				"stack_after": map[string]any{"metadata_match": map[string]any{"plan": "pro"}}, "priority": 3},
			{"credits": 1000 + int64(i), "source": "manual", "reason": "short", "priority": 5,
				"expires_at": now.Add(time.Hour).Format(time.RFC3339Nano), "metadata": map[string]any{"tier": "x"}},
			// Spent last, expired before the flush: a rebuild must not revive it.
			{"credits": 400, "source": "promotional", "reason": "flash", "priority": 200,
				"expires_at": now.Add(time.Second).Format(time.RFC3339Nano)},
		}
		for j, g := range grants {
			r := s.Do("POST", "/v1/customers/"+c+"/credits/grant", tn.Live, fmt.Sprintf("g-%s-%d", c, j), g)
			if r.Status != 201 {
				t.Fatalf("grant %d: %d %s", j, r.Status, r.Raw)
			}
		}
		for j, d := range []int64{-2500, -(int64(i)*100 + 1)} {
			key := fmt.Sprintf("a-%s-%d", c, j)
			body, _ := json.Marshal(map[string]any{"delta": d, "source": "manual", "reason": "spend"})
			r := s.Do("POST", "/v1/customers/"+c+"/credits/adjust", tn.Live, key, body)
			if r.Status != 200 {
				t.Fatalf("adjust %d: %d %s", d, r.Status, r.Raw)
			}
			adjusts = append(adjusts, adjustDone{customer: c, key: key, body: body, txIDs: txIDsOf(r)})
		}
	}

	phase("workload done")
	// Expire the flash blocks; the sweep writes their expiry entries.
	clock.Advance(2 * time.Second)
	waitRows(t, s, `SELECT COUNT(*) FROM ledger_entries WHERE type = 'expiry' AND delta = -400`, rebuildCustomers)
	s.Drain()
	phase("drained")
	recorded := map[string]map[string]any{}
	for i, c := range customers {
		r := getCredits(t, s.HTTP, s.URL, tn.Live, c, true)
		wantBalance := int64(5000+3000+2000+1000+i) - 2500 - int64(i*100+1)
		if got := Int(t, r.Body["balance"]); got != wantBalance {
			t.Errorf("customer %d: balance %d, want %d", i, got, wantBalance)
		}
		if got := Int(t, r.Body["pending_balance"]); got != 2000 {
			t.Errorf("customer %d: pending_balance %d, want 2000 (the stacked block)", i, got)
		}
		if got := Int(t, r.Body["effective_balance"]); got != wantBalance-2000 {
			t.Errorf("customer %d: effective_balance %d, want %d", i, got, wantBalance-2000)
		}
		if blocks, _ := r.Body["blocks"].([]any); len(blocks) < 3 {
			t.Errorf("customer %d: %d live blocks, want at least 3: %s", i, len(blocks), r.Raw)
		}
		recorded[c] = r.Body
		// Invariant 1 in Postgres: ledger sum (expiry included) = account
		// balance = remaining credit of the blocks still active.
		var ledger, account, active int64
		if err := s.Pool.QueryRow(ctx, `SELECT (SELECT COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1),
			(SELECT balance FROM credit_accounts WHERE customer_id = $1),
			(SELECT COALESCE(SUM(remaining_amount), 0) FROM credit_blocks WHERE customer_id = $1 AND (expires_at IS NULL OR expires_at > $2))`,
			c, clock.Now()).Scan(&ledger, &account, &active); err != nil {
			t.Fatal(err)
		}
		if ledger != wantBalance || account != wantBalance || active != wantBalance {
			t.Errorf("customer %d in Postgres: ledger sum %d, credit_accounts.balance %d, active blocks %d, want all %d", i, ledger, account, active, wantBalance)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	// A customer that never moved money has no account row: it reads as
	// zeros before and after a flush alike.
	empty := createCustomer(t, s.HTTP, s.URL, tn.Live, "rebuild-empty-"+randomID())
	recorded[empty] = getCredits(t, s.HTTP, s.URL, tn.Live, empty, true).Body
	if id, _ := recorded[empty]["id"].(string); id != "" || Int(t, recorded[empty]["balance"]) != 0 {
		t.Errorf("customer without account: %s, want id \"\" and zero balance", mustJSON(recorded[empty]))
	}
	same := func(phase string) {
		t.Helper()
		for _, c := range append([]string{empty}, customers...) {
			r := getCredits(t, s.HTTP, s.URL, tn.Live, c, true)
			if !reflect.DeepEqual(r.Body, recorded[c]) {
				t.Errorf("%s: customer %s differs from before the flush\n got: %s\nwant: %s", phase, c, r.Raw, mustJSON(recorded[c]))
			}
		}
	}

	// (a) lazy loading on first use.
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	same("lazy load")
	for _, c := range customers {
		if n, _ := rdb.Exists(ctx, accountKey(prefix, c)).Result(); n != 1 {
			t.Errorf("lazy load: account hash %s missing after a read", accountKey(prefix, c))
		}
	}

	phase("lazy load checked")
	// (b) creditd rebuild.
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	phase("flushed again")
	out := runRebuild(t, srv.URL(), s.DatabaseURL, prefix)
	if !strings.Contains(out, "rebuild:") {
		t.Errorf("creditd rebuild printed no progress:\n%s", out)
	}
	if loaded, total := rebuildCounts(t, out); loaded != rebuildCustomers || total != rebuildCustomers {
		t.Errorf("creditd rebuild: %d of %d accounts loaded, want %d of %d:\n%s", loaded, total, rebuildCustomers, rebuildCustomers, out)
	}
	for _, c := range customers {
		v, err := rdb.HGet(ctx, accountKey(prefix, c), "v").Result()
		if err != nil {
			t.Errorf("after rebuild, before any API call: account hash %s: %v", accountKey(prefix, c), err)
			continue
		}
		if want := Int(t, recorded[c]["version"]); v != strconv.FormatInt(want, 10) {
			t.Errorf("after rebuild: account hash %s has version %s, want %d", accountKey(prefix, c), v, want)
		}
	}
	same("creditd rebuild")
	for _, a := range adjusts {
		r := s.Do("POST", "/v1/customers/"+a.customer+"/credits/adjust", tn.Live, a.key, a.body)
		if r.Status != 200 || txIDsOf(r) != a.txIDs {
			t.Errorf("retried adjust %s after rebuild: %d %s, want 200 replaying transactions %s", a.key, r.Status, r.Raw, a.txIDs)
		}
	}
	same("retries after rebuild")
	phase("rebuild checked")

	// (c) a stale rebuild never rolls back newer state.
	c := customers[0]
	oldBalance, oldVersion := Int(t, recorded[c]["balance"]), Int(t, recorded[c]["version"])
	reservation, err := s.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reservation.Rollback(ctx) }()
	// Readers go on; the persister's upsert of the account waits.
	if _, err := reservation.Exec(ctx, "LOCK TABLE credit_accounts IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	g := s.Do("POST", "/v1/customers/"+c+"/credits/grant", tn.Live, "after-rebuild-"+c,
		map[string]any{"credits": 777, "source": "manual", "reason": "newer than Postgres"})
	if g.Status != 201 {
		t.Fatalf("grant after rebuild: %d %s", g.Status, g.Raw)
	}
	newVersion := Int(t, g.Body["account"].(map[string]any)["version"])
	if newVersion <= oldVersion {
		t.Fatalf("grant after rebuild: version %d, want above %d", newVersion, oldVersion)
	}
	var pgVersion int64
	if err := s.Pool.QueryRow(ctx, `SELECT version FROM credit_accounts WHERE customer_id = $1`, c).Scan(&pgVersion); err != nil {
		t.Fatal(err)
	}
	if pgVersion != oldVersion {
		t.Fatalf("Postgres already at version %d, want it held at %d: the fence check would test nothing", pgVersion, oldVersion)
	}
	phase("fence grant done")
	out = runRebuild(t, srv.URL(), s.DatabaseURL, prefix)
	if loaded, _ := rebuildCounts(t, out); loaded != 0 {
		t.Errorf("stale creditd rebuild loaded %d accounts, want 0 (every hash is current or newer):\n%s", loaded, out)
	}
	r := getCredits(t, s.HTTP, s.URL, tn.Live, c, true)
	if v, b := Int(t, r.Body["version"]), Int(t, r.Body["balance"]); v != newVersion || b != oldBalance+777 {
		t.Errorf("after a stale rebuild: version %d balance %d, want %d and %d (rolled back)", v, b, newVersion, oldBalance+777)
	}
	if err := reservation.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	phase("stale rebuild checked")
	s.Drain()
	phase("drained after flush")
	var pgBalance, ledger int64
	if err := s.Pool.QueryRow(ctx, `SELECT a.version, a.balance, (SELECT COALESCE(SUM(delta), 0) FROM ledger_entries l WHERE l.customer_id = a.customer_id)
		FROM credit_accounts a WHERE a.customer_id = $1`, c).Scan(&pgVersion, &pgBalance, &ledger); err != nil {
		t.Fatal(err)
	}
	if pgVersion != newVersion || pgBalance != oldBalance+777 || ledger != oldBalance+777 {
		t.Errorf("Postgres after the flushed outbox drained: version %d balance %d ledger sum %d, want %d, %d, %d",
			pgVersion, pgBalance, ledger, newVersion, oldBalance+777, oldBalance+777)
	}
}

// accountKey is a customer's account hash as docs/design.md lays it out:
// {prefix:pNN}:a:<customer>, NN = fnv32a(customer uuid text) % 32.
func accountKey(prefix, customer string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(customer))
	return fmt.Sprintf("{%s:p%02d}:a:%s", prefix, h.Sum32()%32, customer)
}

// runRebuild runs `creditd rebuild` and returns what it printed; it fails
// the test unless the command exits 0.
func runRebuild(t *testing.T, redisURL, dbURL, prefix string) string {
	t.Helper()
	cmd := exec.Command(Binary(t), "rebuild")
	cmd.Env = append(os.Environ(), "REDIS_URL="+redisURL, "DATABASE_URL="+dbURL, "CREDITD_REDIS_PREFIX="+prefix, "LOG_LEVEL=warn")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("creditd rebuild: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("creditd rebuild did not finish in 30 s\n%s", out.String())
	}
	return out.String()
}

var rebuiltLine = regexp.MustCompile(`rebuilt (\d+) accounts \((\d+) loaded`)

// rebuildCounts reads "rebuilt N accounts (L loaded, ...)" from the output.
func rebuildCounts(t *testing.T, out string) (loaded, total int) {
	t.Helper()
	m := rebuiltLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("creditd rebuild: no summary line in:\n%s", out)
	}
	total, _ = strconv.Atoi(m[1])
	loaded, _ = strconv.Atoi(m[2])
	return loaded, total
}

// txIDsOf lists the transaction ids of an adjust response, comma-joined.
func txIDsOf(r Response) string {
	txs, _ := r.Body["transactions"].([]any)
	ids := make([]string, 0, len(txs))
	for _, tx := range txs {
		m, _ := tx.(map[string]any)
		id, _ := m["id"].(string)
		ids = append(ids, id)
	}
	return strings.Join(ids, ",")
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// testClock is an engine.Clock a test moves by hand (invariant 6).
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock(start time.Time) *testClock {
	return &testClock{now: start.UTC().Truncate(time.Millisecond)}
}

// Now implements engine.Clock.
func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// waitRows polls query (a single COUNT) until it returns want, for up to 10 s
// of background work (sweep, persister) to land.
func waitRows(t *testing.T, s *Stack, query string, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int64
		err := s.Pool.QueryRow(context.Background(), query).Scan(&n)
		if err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: got %d (err %v), want %d", query, n, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ownRedis starts a redis-server of the test's own (a rebuild test flushes
// it and runs `creditd rebuild` against it, runRebuild, without touching
// other tests' keys) and returns it, a client of it sized as a stack's,
// and a fresh key prefix starting with tag.
// rebuildable is a stack on a Redis of its own (ownRedis) that a test may
// flush and rebuild (flushAndRebuild), with a fresh tenant's live api.
type rebuildable struct {
	s      *Stack
	a      api
	srv    *testenv.RedisServer
	rdb    *redis.Client
	prefix string
}

// newRebuildable starts a rebuildable stack: tag prefixes its keys, tenant
// names its tenant.
func newRebuildable(t *testing.T, tag, tenant string) rebuildable {
	t.Helper()
	srv, rdb, prefix := ownRedis(t, tag)
	s := NewStack(t, WithRedis(rdb, prefix))
	tn := s.NewTenant(uniq(tenant))
	return rebuildable{s: s, a: s.as(t, tn.Live), srv: srv, rdb: rdb, prefix: prefix}
}

// flushAndRebuild waits for the persister, empties Redis and runs
// `creditd rebuild`: what Redis holds after it came from Postgres alone.
func (r rebuildable) flushAndRebuild(t *testing.T) {
	t.Helper()
	r.s.Drain()
	if err := r.rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	runRebuild(t, r.srv.URL(), r.s.DatabaseURL, r.prefix)
}

func ownRedis(t *testing.T, tag string) (*testenv.RedisServer, *redis.Client, string) {
	t.Helper()
	srv := testenv.StartRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: StackRedisPoolSize})
	t.Cleanup(func() { _ = rdb.Close() })
	return srv, rdb, tag + randomID()
}
