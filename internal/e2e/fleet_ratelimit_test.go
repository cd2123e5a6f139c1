package e2e

import (
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/internal/testenv"
)

// TestFleetRateLimit (issue 11): three creditd nodes on one Redis and one
// Postgres, one API key limited to R/s, a flood spread over the three
// nodes: together they answer R/s (+-10 %) with 2xx, not 3R, since the
// budget lives in Redis (lua/gcra.lua), not in each process. The flood
// asks for 30 times the rate, so the count depends on the limit, not on
// the machine's speed; the expected count is burst + R x the flood's
// length. 16 closed-loop clients keep it so on a busy machine: while some
// wait on a slow 200 (a Postgres read), the others keep asking; with 6, a
// loaded 2-core machine offered less than twice the limit, or left the
// budget unused for a while, in 4 runs of 10 on the Redis Cluster.
func TestFleetRateLimit(t *testing.T) {
	// 40/s, not more: the flood must offer twice the limit, and a 2-core
	// machine running other suites beside this one answered this read at
	// ~145/s over 16 clients (a run at 100/s failed so, proving nothing).
	// Three per-node budgets would still allow three times the count.
	// A burst of 20 keeps the count the limit's when the loaded test
	// process stalls: an idle budget is lost only past the burst (here
	// 0.5 s); at 5 (125 ms) a -race run beside three other suites answered
	// 73 of 85, the budget full and unasked for a while, not over-refused.
	const (
		perSecond = 40
		burst     = 20
		flood     = 2 * time.Second
		clients   = 16
	)
	s := NewStack(t, SingleNode()) // the test starts its own nodes
	urls := []string{s.URL}
	for i := 2; i <= 3; i++ {
		// Nodes 2 and 3 share the stack's Redis prefix and database; their
		// background work stays off (the stack's node runs it).
		a := app.New(s.Redis, s.Pool, app.Config{RedisPrefix: s.Prefix, AdminToken: AdminToken, AllowPrivate: true,
			ReplicaAckTimeout: testenv.ReplicaAckTimeout}, zerolog.New(io.Discard))
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = a.Serve(ln) }()
		t.Cleanup(func() { _ = a.Server.Shutdown() })
		urls = append(urls, "http://"+ln.Addr().String())
	}
	tn := s.NewTenant(uniq("fleet-rl"))
	wantStatus(t, adminCall(t, s, AdminToken, "PATCH", "/admin/v1/tenants/"+tn.ID,
		map[string]any{"rate_limit_per_second": perSecond, "rate_limit_burst": burst}), 200, "set the rate limit")

	var ok, limited, other atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(flood)
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			hc := &http.Client{Timeout: 10 * time.Second}
			// Open keep-alive connections would hold up the nodes' shutdown.
			defer hc.CloseIdleConnections()
			for i := 0; time.Now().Before(end); i++ {
				req, _ := http.NewRequest("GET", urls[(c+i)%len(urls)]+"/v1/customers?limit=1", nil)
				req.Header.Set("X-API-Key", tn.Live)
				res, err := hc.Do(req)
				if err != nil {
					other.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, res.Body)
				_ = res.Body.Close()
				switch res.StatusCode {
				case 200:
					ok.Add(1)
				case 429:
					limited.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	// Requests start only within the flood; the last ones may end after it.
	want := float64(burst) + perSecond*min(elapsed, flood).Seconds()
	t.Logf("3 nodes, %d/s burst %d, %s flood: %d answered 200, %d answered 429, %d other; want %.0f",
		perSecond, burst, elapsed.Round(time.Millisecond), ok.Load(), limited.Load(), other.Load(), want)
	if other.Load() != 0 {
		t.Errorf("%d requests neither 200 nor 429", other.Load())
	}
	if limited.Load() < int64(want) {
		t.Fatalf("only %d requests were limited: the flood did not reach twice the limit, the test proves nothing", limited.Load())
	}
	if got := float64(ok.Load()); got < want*0.9 || got > want*1.1 {
		t.Fatalf("%d answered 200, want %.0f +-10%% (three per-node budgets would allow about %.0f)", ok.Load(), want, 3*want)
	}
}
