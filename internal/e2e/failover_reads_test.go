package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/internal/testenv"
	"github.com/creditd/creditd/lua"
)

// failoverNodeTimeoutMS is the private cluster's cluster-node-timeout: a
// dead master is marked failed, and its replica promoted, a few seconds
// after the kill instead of the default 15 s.
const failoverNodeTimeoutMS = 2000

// privateCluster is a Redis Cluster of three masters, each with one
// replica, on private redis-server processes: masters[i] serves the i-th
// third of the slots and replicas[i] replicates it.
type privateCluster struct {
	masters, replicas []*testenv.RedisServer
	seeds             []string
}

// startPrivateCluster starts and forms the cluster and waits until every
// node reports cluster_state:ok and every master counts its replica.
func startPrivateCluster(t *testing.T) *privateCluster {
	t.Helper()
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", fmt.Sprint(failoverNodeTimeoutMS), "--appendonly", "no",
		// A replica syncs at once instead of after Redis' 5 s wait for more.
		"--repl-diskless-sync-delay", "0"}
	pc := &privateCluster{}
	for i := 0; i < 3; i++ {
		pc.masters = append(pc.masters, testenv.StartRedisServer(t, args...))
	}
	for i := 0; i < 3; i++ {
		pc.replicas = append(pc.replicas, testenv.StartRedisServer(t, args...))
	}
	ctx := context.Background()
	all := append(append([]*testenv.RedisServer{}, pc.masters...), pc.replicas...)
	clients := make([]*redis.Client, len(all))
	ids := make([]string, len(all))
	for i, n := range all {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr})
		t.Cleanup(func() { _ = clients[i].Close() })
		id, err := clients[i].Do(ctx, "cluster", "myid").Text()
		if err != nil {
			t.Fatalf("cluster myid of %s: %v", n.Addr, err)
		}
		ids[i] = id
		pc.seeds = append(pc.seeds, n.Addr)
	}
	for i := 0; i < 3; i++ {
		lo, hi := i*16384/3, (i+1)*16384/3-1
		if err := clients[i].Do(ctx, "cluster", "addslotsrange", lo, hi).Err(); err != nil {
			t.Fatalf("addslotsrange on %s: %v", all[i].Addr, err)
		}
	}
	host, port, _ := net.SplitHostPort(all[0].Addr)
	for _, c := range clients[1:] {
		if err := c.ClusterMeet(ctx, host, port).Err(); err != nil {
			t.Fatalf("cluster meet: %v", err)
		}
	}
	waitFor(t, 20*time.Second, "every node knows the six", func() bool {
		for _, c := range clients {
			nodes, err := c.ClusterNodes(ctx).Result()
			if err != nil || strings.Count(strings.TrimSpace(nodes), "\n")+1 != len(all) {
				return false
			}
		}
		return true
	})
	for i := 0; i < 3; i++ {
		if err := clients[3+i].ClusterReplicate(ctx, ids[i]).Err(); err != nil {
			t.Fatalf("cluster replicate: %v", err)
		}
	}
	waitFor(t, 30*time.Second, "cluster ok with every replica in sync", func() bool {
		for i, c := range clients {
			info, err := c.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
			repl, err := c.Info(ctx, "replication").Result()
			if err != nil {
				return false
			}
			if i < 3 && !strings.Contains(repl, "connected_slaves:1") {
				return false
			}
			if i >= 3 && !strings.Contains(repl, "master_link_status:up") {
				return false
			}
		}
		return true
	})
	return pc
}

// waitFor polls cond every 50 ms until it holds, failing the test after
// timeout.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// failoverRecoveryBound is how long after a master's kill -9 every
// customer on its slots must be answered 2xx again: the node timeout, the
// replica's election (well under a second here), the client's slot map
// reload and a request's retries, with room for a loaded machine.
const failoverRecoveryBound = 15 * time.Second

// failoverTally is one customer's answers, shared by its consumer and
// its reader goroutines under mu.
type failoverTally struct {
	mu              sync.Mutex
	ok, unavailable int
	// acked counts consumes answered 2xx; unknown those given up after a
	// 409 "still in progress" (see TestFailoverReads), which may or may
	// not have applied; inflight is a consume sent and not yet answered.
	acked, unknown int64
	inflight       bool
	// busy counts the 409 "still in progress" answers.
	busy int
	bad  []string
	// firstAfterKill is when a balance read after the kill was first
	// answered 2xx following a 503; recovered is closed then.
	firstAfterKill time.Time
	recovered      chan struct{}
}

// answer classifies one response and reports a 2xx; what names the
// request in a failure.
func (tl *failoverTally) answer(what string, r Response, err error) bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	switch {
	case err != nil:
		tl.bad = append(tl.bad, fmt.Sprintf("%s: transport error %v", what, err))
	case r.Status/100 == 2:
		tl.ok++
		return true
	case r.Status == 503 && r.Header.Get("Retry-After") != "" && r.Body["type"] == "unavailable":
		tl.unavailable++
	case r.Status == 409 && strings.Contains(fmt.Sprint(r.Body["detail"]), "still in progress"):
		tl.busy++
	default:
		tl.bad = append(tl.bad, fmt.Sprintf("%s: %d %s", what, r.Status, r.Raw))
	}
	return false
}

// check records a failure unless balance v lies in [lo, hi].
func (tl *failoverTally) check(what string, v any, lo, hi int64) {
	got, ok := bodyInt(v)
	if !ok || got < lo || got > hi {
		tl.mu.Lock()
		tl.bad = append(tl.bad, fmt.Sprintf("%s %v, want within [%d, %d]", what, v, lo, hi))
		tl.mu.Unlock()
	}
}

// bodyInt reads an integer member of a decoded body; ok is false when it
// is not one (a worker goroutine cannot fail the test with Int).
func bodyInt(v any) (int64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

// TestFailoverReads (issue 11.5): on a Redis Cluster with replicas, a
// master is killed with -9 while clients read balances and consume for
// customers on its slots and on the others. Every answer is a 2xx with the
// right balance (the grant less the consumes acknowledged, and less at
// most those of unknown outcome) or a 503 with Retry-After; none is a 500
// or a stale balance. Once the replica is promoted, the customers on the
// dead master's slots are answered 2xx again within failoverRecoveryBound.
// After the drain, Postgres holds every acknowledged consume once and the
// balance equals the ledger.
//
// One more answer is tolerated, and counted: a 409 "still in progress" to
// the retry of a 503 whose Idempotency-Key claim could not be released
// (its record's slot had no master either). The claim lapses after its TTL
// (engine/idempotency/windows.go LockTTL, 30 s); the test gives such a key up and
// counts its consume as of unknown outcome.
func TestFailoverReads(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed: the failover test needs private cluster nodes")
	}
	if len(testenv.ClusterSeeds()) > 0 {
		t.Skip("brings its own cluster, so it runs once, in the single-Redis pass of make test")
	}
	pc := startPrivateCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: pc.seeds, PoolSize: StackRedisPoolSize,
		DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := "fo" + testenv.RandomSuffix()
	s := NewStack(t, WithRedis(rdb, prefix))
	tn := s.NewTenant(uniq("failover"))
	// What is tested is the failover, not the rate limit: a budget whose
	// slot sits on the killed master falls back to each node's own bucket.
	raiseRateLimit(t, s.HTTP, s.URL, tn.ID)
	a := s.as(t, tn.Live)
	metric := a.perUnit(1)

	// Customers until at least four sit on masters[0]'s slots (each may
	// ride the failover out in go-redis' dial retries: more of them make it
	// likelier that one meets the window) and two elsewhere.
	ctx := context.Background()
	victim := pc.masters[0].Addr
	const grant = 1_000_000
	var onVictim, elsewhere []string
	const wantOnVictim = 4
	for i := 0; i < 90 && (len(onVictim) < wantOnVictim || len(elsewhere) < 2); i++ {
		id, _ := a.newCustomer()
		tag := fmt.Sprintf("{%s:p%02d}", prefix, lua.Partition(uuid.MustParse(id)))
		master, err := rdb.MasterForKey(ctx, tag)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case master.Options().Addr == victim && len(onVictim) < wantOnVictim:
			onVictim = append(onVictim, id)
		case master.Options().Addr != victim && len(elsewhere) < 2:
			elsewhere = append(elsewhere, id)
		default:
			continue
		}
		a.grant(id, map[string]any{"credits": grant})
	}
	if len(onVictim) < wantOnVictim || len(elsewhere) < 2 {
		t.Fatalf("customers: %d on the victim, %d elsewhere", len(onVictim), len(elsewhere))
	}

	var killedAt time.Time
	var killMu sync.Mutex
	killed := func() time.Time { killMu.Lock(); defer killMu.Unlock(); return killedAt }
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	h := []string{"X-API-Key", tn.Live}
	tallies := map[string]*failoverTally{}
	var wg sync.WaitGroup
	for _, id := range append(append([]string{}, onVictim...), elsewhere...) {
		tl := &failoverTally{recovered: make(chan struct{})}
		tallies[id] = tl
		wg.Add(2)
		// The consumer: each consume retried with its key until answered
		// (a 503 is an unknown outcome; the retry applies it once).
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 20 * time.Second}
			defer hc.CloseIdleConnections()
			body := map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 1}
			for !stopped() {
				key := idemKey()
				tl.mu.Lock()
				tl.inflight = true
				tl.mu.Unlock()
				for {
					r, err := TryCall(hc, s.URL, "POST", "/v1/entitlements/consume", body, append(h, "Idempotency-Key", key)...)
					if tl.answer("consume", r, err) {
						tl.mu.Lock()
						tl.acked, tl.inflight = tl.acked+1, false
						hi := grant - tl.acked
						lo := hi - tl.unknown
						tl.mu.Unlock()
						tl.check("consume balance_after", r.Body["balance_after"], lo, hi)
						break
					}
					if err == nil && r.Status == 409 {
						// The key's claim outlived a 503 whose release
						// failed while its slot had no master; it lapses
						// only after the claim TTL: give the key up.
						tl.mu.Lock()
						tl.unknown, tl.inflight = tl.unknown+1, false
						tl.mu.Unlock()
						break
					}
					if err != nil || r.Status != 503 || stopped() {
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
		// The reader: a balance never shows less than every consume
		// begun before it ended, nor more than what was acknowledged
		// before it began (a stale copy would).
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 20 * time.Second}
			defer hc.CloseIdleConnections()
			for !stopped() {
				tl.mu.Lock()
				hi := grant - tl.acked
				tl.mu.Unlock()
				r, err := TryCall(hc, s.URL, "GET", "/v1/customers/"+url.PathEscape(id)+"/credits", nil, h...)
				if !tl.answer("balance", r, err) {
					if err != nil || r.Status != 503 {
						return
					}
					time.Sleep(50 * time.Millisecond)
					continue
				}
				tl.mu.Lock()
				lo := grant - tl.acked - tl.unknown
				if tl.inflight {
					lo--
				}
				recovered := !killed().IsZero() && tl.firstAfterKill.IsZero() && tl.unavailable > 0
				if recovered {
					tl.firstAfterKill = time.Now()
				}
				tl.mu.Unlock()
				tl.check("balance", r.Body["balance"], lo, hi)
				if recovered {
					close(tl.recovered)
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}

	time.Sleep(time.Second)
	killMu.Lock()
	pc.masters[0].Kill()
	killedAt = time.Now()
	killMu.Unlock()
	bound := time.After(failoverRecoveryBound)
wait:
	for _, id := range onVictim {
		select {
		case <-tallies[id].recovered:
		case <-bound:
			break wait
		}
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()

	// Every consume acknowledged is in Postgres once; of those given up,
	// each is there at most once; the balance is the ledger's.
	s.Drain()
	unavailable := 0
	for id, tl := range tallies {
		unavailable += tl.unavailable
		for _, b := range tl.bad {
			t.Errorf("customer %s: %s", id, b)
		}
		ops := s.sqlInt(t, `SELECT count(DISTINCT op_id) FROM ledger_entries WHERE customer_id = $1 AND type = 'consumption'`, id)
		if ops < tl.acked || ops > tl.acked+tl.unknown {
			t.Errorf("customer %s: %d consumes in the ledger, %d acknowledged, %d of unknown outcome", id, ops, tl.acked, tl.unknown)
		}
		if b := a.balance(id); b != grant-ops {
			t.Errorf("customer %s: balance %d, ledger says %d", id, b, grant-ops)
		}
		t.Logf("customer %s: %d answered 2xx, %d 503, %d 409 still in progress", id, tl.ok, tl.unavailable, tl.busy)
	}
	// A customer of the killed master may ride the window out in go-redis'
	// dial retries and answer a late 2xx, never a 503: that is correct. The
	// window must have been exercised by at least one of them, and each
	// that got a 503 must answer 2xx again within the bound.
	exercised := 0
	for _, id := range onVictim {
		tl := tallies[id]
		if tl.unavailable == 0 {
			t.Logf("customer %s on the killed master rode the window out (no 503)", id)
			continue
		}
		exercised++
		if tl.firstAfterKill.IsZero() {
			t.Errorf("customer %s on the killed master: no 2xx balance within %s of the kill", id, failoverRecoveryBound)
		} else {
			t.Logf("customer %s answered 2xx again %s after the kill", id, tl.firstAfterKill.Sub(killedAt).Round(time.Millisecond))
		}
	}
	if exercised == 0 {
		t.Error("no customer on the killed master got a 503: the failover window was not exercised")
	}
	if unavailable == 0 {
		t.Error("no 503 at all")
	}
}
