package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/internal/e2e"
	"github.com/creditd/creditd/internal/testenv"
	"github.com/creditd/creditd/persist"
)

// TestReadyzShowsEachRunner: a started node's /readyz has one entry per
// background loop, under the loop's Name, next to the checks that were
// there before, all "ok"; after Stop every loop reports stopped.
func TestReadyzShowsEachRunner(t *testing.T) {
	// The reconcile sampler is on, so every loop runs.
	n := startNode(t, nil, func(c *app.Config) { c.ReconcileSample = 5 })
	r := e2e.Call(t, http.DefaultClient, n.URL, "GET", "/readyz", nil)
	var body struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}
	if err := json.Unmarshal(r.Raw, &body); err != nil || r.Status != 200 || body.Status != "ready" {
		t.Fatalf("/readyz = %d %s", r.Status, r.Raw)
	}
	want := []string{"redis", "postgres", "persister", "dead_letters", "partitions"}
	for _, run := range n.App.Runners() {
		want = append(want, run.Name())
	}
	if len(want) != 5+8 {
		t.Errorf("%d runners, want 8: %v", len(want)-5, want[5:])
	}
	for _, name := range want {
		if got := body.Checks[name]; got != "ok" {
			t.Errorf("/readyz checks[%q] = %q, want ok", name, got)
		}
	}
	if len(body.Checks) != len(want) {
		t.Errorf("/readyz checks %v, want exactly %v", body.Checks, want)
	}
	n.App.Stop(0)
	for _, run := range n.App.Runners() {
		if err := run.Health(); err == nil || err.Error() != "stopped" {
			t.Errorf("%s after Stop: %v, want stopped", run.Name(), err)
		}
	}
}

// readyz is one /readyz answer.
type readyz struct {
	Code   int
	Status string            `json:"status"`
	Checks map[string]string `json:"checks"`
}

func getReadyz(t *testing.T, base string) readyz {
	t.Helper()
	r := e2e.Call(t, http.DefaultClient, base, "GET", "/readyz", nil)
	var body readyz
	if err := json.Unmarshal(r.Raw, &body); err != nil {
		t.Fatalf("/readyz = %d %s: %v", r.Status, r.Raw, err)
	}
	body.Code = r.Status
	return body
}

// samples are /metrics' lines of family name: labels (as written) -> value.
func samples(t *testing.T, base, name string) map[string]float64 {
	t.Helper()
	r := e2e.Call(t, http.DefaultClient, base, "GET", "/metrics", nil)
	out := map[string]float64{}
	for _, l := range strings.Split(string(r.Raw), "\n") {
		rest, ok := strings.CutPrefix(l, name)
		if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		sp := strings.LastIndexByte(rest, ' ')
		v, err := strconv.ParseFloat(rest[sp+1:], 64)
		if err != nil {
			t.Fatalf("/metrics line %q: %v", l, err)
		}
		out[strings.TrimSpace(rest[:sp])] = v
	}
	return out
}

// xadd appends an outbox entry to partition 0 of n's Redis, as a script
// would, with stream id id ("*": now) and field m = raw.
func xadd(t *testing.T, n *node, id, raw string) {
	t.Helper()
	key := fmt.Sprintf("{%s:p%02d}:outbox", n.Prefix, 0)
	if err := n.Redis.XAdd(context.Background(), &redis.XAddArgs{Stream: key, ID: id, Values: []string{"m", raw}}).Err(); err != nil {
		t.Fatal(err)
	}
}

// TestReadyzWarnsWithoutFailing: what every node of a fleet sees alike, an
// unresolved dead letter or the shared outbox's lag, shows in /readyz's
// body under its check but leaves the answer 200 "ready" (issue 25: one
// such cause must not take every node out of the balancer); its alarm is
// its own metric, and creditd_readiness_check keeps only redis and
// postgres. The dead letter is made by the persister itself, from an
// outbox entry it cannot decode, so its error line is checked too
// (invariant 12: a dead letter is an alarm, never a normal path).
func TestReadyzWarnsWithoutFailing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(*app.Config)
		// cause makes the trouble and waits until the node sees it.
		cause func(t *testing.T, n *node)
		// check and want: the warning /readyz shows under check.
		check, want string
		// metric and atLeast: the alarm /metrics shows.
		metric  string
		atLeast float64
		// logged is in the node's error log.
		logged string
	}{
		{
			name: "dead letter",
			cause: func(t *testing.T, n *node) {
				xadd(t, n, "*", "not a mutation")
				deadline := time.Now().Add(15 * time.Second)
				for {
					c, err := n.App.DB.UnresolvedDeadLetters(context.Background())
					if err == nil && c == 1 {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("the persister made %d dead letters (%v), want 1", c, err)
					}
					time.Sleep(20 * time.Millisecond)
				}
			},
			check: "dead_letters", want: "1 unresolved dead letters",
			metric: "creditd_dead_letters_unresolved", atLeast: 1,
			logged: "outbox entry dead-lettered",
		},
		{
			name:   "persister lag",
			change: func(c *app.Config) { c.MaxLag = time.Millisecond },
			cause: func(t *testing.T, n *node) {
				// A stopped persister leaves the entry in the outbox; its
				// stream id dates it 1970, so the lag is decades.
				n.App.Persister.Stop()
				xadd(t, n, "1000-0", "not a mutation")
			},
			check: "persister", want: "exceeds 1ms",
			metric: "creditd_persister_lag_seconds", atLeast: 1e9,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := startNode(t, nil, tc.change)
			if r := getReadyz(t, n.URL); r.Code != 200 || r.Checks[tc.check] != "ok" {
				t.Fatalf("before: /readyz = %d %v, want 200 with %s ok", r.Code, r.Checks, tc.check)
			}
			tc.cause(t, n)
			r := getReadyz(t, n.URL)
			if r.Code != 200 || r.Status != "ready" {
				t.Errorf("/readyz = %d %q %v, want 200 ready", r.Code, r.Status, r.Checks)
			}
			if !strings.Contains(r.Checks[tc.check], tc.want) {
				t.Errorf("/readyz checks[%s] = %q, want it to say %q", tc.check, r.Checks[tc.check], tc.want)
			}
			for _, gate := range []string{"redis", "postgres"} {
				if r.Checks[gate] != "ok" {
					t.Errorf("/readyz checks[%s] = %q, want ok", gate, r.Checks[gate])
				}
			}
			if v := samples(t, n.URL, tc.metric)[""]; v < tc.atLeast {
				t.Errorf("%s = %v, want at least %v", tc.metric, v, tc.atLeast)
			}
			gates := samples(t, n.URL, "creditd_readiness_check")
			want := map[string]float64{`{check="postgres"}`: 1, `{check="redis"}`: 1}
			if fmt.Sprint(gates) != fmt.Sprint(want) {
				t.Errorf("creditd_readiness_check = %v, want %v (the gating checks only, passing)", gates, want)
			}
			if tc.logged != "" {
				found := false
				for _, l := range strings.Split(n.log.String(), "\n") {
					found = found || strings.Contains(l, `"level":"error"`) && strings.Contains(l, tc.logged)
				}
				if !found {
					t.Errorf("no error line %q in the log", tc.logged)
				}
			}
		})
	}
}

// TestReadyzSurvivesADeadShard: on a Redis Cluster whose one master is
// dead (a shard in failover, before its replica takes over), every node
// stays ready: the redis check passes on any master that answers, and the
// persister's lag, which cannot be read from the dead shard, is only a
// warning (issue 25; calls on the dead shard's slots answer 503 with
// Retry-After, invariant 14). With every master dead the node is not ready.
func TestReadyzSurvivesADeadShard(t *testing.T) {
	t.Parallel()
	masters := testenv.StartRedisCluster(t, 3)
	seeds := make([]string, len(masters))
	for i, m := range masters {
		seeds[i] = m.Addr
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds, PoolSize: e2e.StackRedisPoolSize,
		DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	n := startNodeOn(t, rdb, "t"+testenv.RandomSuffix(), "", nil, nil)
	if r := getReadyz(t, n.URL); r.Code != 200 || r.Checks["redis"] != "ok" || r.Checks["persister"] != "ok" {
		t.Fatalf("whole cluster: /readyz = %d %v, want 200 with redis and persister ok", r.Code, r.Checks)
	}
	steps := []struct {
		name string
		kill int // masters[kill] dies before the step
		code int
		// redis is the redis check's text; persister is false when it
		// must show a warning.
		redis     string
		persister bool
	}{
		{"one shard dead", 0, 200, "ok", false},
		{"two shards dead", 1, 200, "ok", false},
		{"every shard dead", 2, 503, "unavailable", false},
	}
	for _, st := range steps {
		masters[st.kill].Kill()
		// Several answers: the redis check must not pass by luck of the
		// master it picked.
		for range 5 {
			start := time.Now()
			r := getReadyz(t, n.URL)
			if r.Code != st.code || r.Checks["redis"] != st.redis || (r.Checks["persister"] == "ok") != st.persister {
				t.Fatalf("%s: /readyz = %d %v, want %d with redis %q and a persister warning", st.name, r.Code, r.Checks, st.code, st.redis)
			}
			// The answer comes within the balancer's check timeout
			// (deploy/haproxy.cfg: 3 s), not after every check's 2 s.
			if took := time.Since(start); st.code == 200 && took > 1900*time.Millisecond {
				t.Errorf("%s: /readyz took %s", st.name, took)
			}
		}
	}
}

// TestStartLogsDeadLetters: a node that starts while dead letters are
// unresolved is ready and says so in its log, as an error naming the
// count (issue 25: a fleet with dead letters starts, and the alarm is not
// lost on the way).
func TestStartLogsDeadLetters(t *testing.T) {
	t.Parallel()
	first := startNode(t, nil, nil)
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		letters int
		want    string // in the new node's log; "" wants no error line
	}{
		{"none", 0, ""},
		{"two", 2, `"dead_letters":2`},
	} {
		for i := range tc.letters {
			if _, err := first.App.DB.DeadLetter(ctx, persist.Letter{Partition: i, EntryID: fmt.Sprintf("%s-%d", tc.name, i),
				Raw: []byte("not a mutation"), Reason: "start test"}); err != nil {
				t.Fatal(err)
			}
		}
		var logs syncBuffer
		a := app.New(first.Redis, first.App.Pool, app.Config{RedisPrefix: first.Prefix, Consumer: "second-" + tc.name,
			ReplicaAckTimeout: testenv.ReplicaAckTimeout}, zerolog.New(&logs))
		a.Start()
		a.Stop(0)
		var line string
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, "unresolved dead letters") {
				line = l
			}
		}
		switch {
		case tc.want == "" && line != "":
			t.Errorf("%s: logged %q", tc.name, line)
		case tc.want != "" && (!strings.Contains(line, tc.want) || !strings.Contains(line, `"level":"error"`)):
			t.Errorf("%s: log line %q, want an error with %s\n%s", tc.name, line, tc.want, logs.String())
		}
	}
}

// TestReadyzWithoutPostgres: with Postgres down the node stays ready, its
// postgres check a warning, since Postgres is every node's and behind the
// request path (invariant 16: checks and money calls for customers in
// Redis keep answering; issue 25); creditd_readiness_check{check=
// "postgres"} says 0 for CreditdPostgresUnreachable. Back up, all is ok.
func TestReadyzWithoutPostgres(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	rdb, prefix := testenv.RedisPool(t, e2e.StackRedisPoolSize)
	n := startNodeOn(t, rdb, prefix, pg.URL(), nil, nil)
	for _, st := range []struct {
		name     string
		act      func()
		postgres string
		gauge    float64
	}{
		{"up", func() {}, "ok", 1},
		{"down", pg.Stop, "unavailable", 0},
		{"back", pg.Start, "ok", 1},
	} {
		st.act()
		r := getReadyz(t, n.URL)
		if r.Code != 200 || r.Status != "ready" || r.Checks["redis"] != "ok" || r.Checks["postgres"] != st.postgres {
			t.Fatalf("%s: /readyz = %d %q %v, want 200 ready with postgres %q", st.name, r.Code, r.Status, r.Checks, st.postgres)
		}
		if v, ok := samples(t, n.URL, "creditd_readiness_check")[`{check="postgres"}`]; !ok || v != st.gauge {
			t.Errorf("%s: creditd_readiness_check{check=\"postgres\"} = %v (%v), want %v", st.name, v, ok, st.gauge)
		}
	}
}
