package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/creditd/creditd/client"
)

func p[T any](v T) *T { return &v }

// TestLocal: a check answered from a snapshot gives what the server's
// check gives (engine.Entitlements.Check), and declines what a snapshot
// cannot answer exactly.
func TestLocal(t *testing.T) {
	t.Parallel()
	snap := &client.Snapshot{CustomerID: "c1", Balance: 1200, ReservedBalance: 200, EffectiveBalance: 1000, AvailableMC: 1000,
		SubscriptionStatus: p("active"),
		Entitlements: map[string]client.SnapshotEntry{
			"api":    {Type: "metered", Allowed: true, EstimatedCostPerUnit: p(int64(10)), CostType: p("per_unit")},
			"export": {Type: "metered", Allowed: true, EstimatedCostPerUnit: p(int64(400)), CostType: p("flat")},
			"gpu":    {Type: "metered", Allowed: false, EstimatedCostPerUnit: p(int64(5)), CostType: p("per_unit")},
			"huge":   {Type: "metered", Allowed: false, EstimatedCostPerUnit: p(int64(5000)), CostType: p("per_unit")},
			"tiered": {Type: "metered", Allowed: true, EstimatedCostPerUnit: p(int64(1)), CostType: p("tiered")},
			"norule": {Type: "metered"},
			"sso":    {Type: "boolean", Allowed: true, Enabled: p(true)},
			"beta":   {Type: "boolean", Allowed: false, Enabled: p(false)},
			"theme":  {Type: "static", Allowed: true, Config: map[string]any{"color": "red"}},
			"seats":  {Type: "gauge", Allowed: true, Current: p(int64(1)), Cap: p(int64(5)), Headroom: p(int64(4))},
		}}
	cases := []struct {
		name, metric, policy string
		units                int64
		ok, allowed          bool
		cost, after          int64
	}{
		{"per unit within the balance", "api", "block", 100, true, true, 1000, 0},
		{"per unit past the balance under block", "api", "block", 101, true, false, 1010, -10},
		{"per unit past the balance under allow", "api", "allow", 101, true, true, 1010, -10},
		{"per unit past the balance under notify", "api", "notify", 5000, true, true, 50000, -49000},
		{"flat whatever the units", "export", "block", 7, true, true, 400, 600},
		{"denied by the plan although one unit fits", "gpu", "block", 1, true, false, 5, 995},
		{"denied by the plan under allow", "gpu", "allow", 1, true, false, 5, 995},
		{"one unit past the balance: no denial to infer", "huge", "block", 1, true, false, 5000, -4000},
		{"tiered goes to HTTP", "tiered", "block", 1, false, false, 0, 0},
		{"no rule goes to HTTP", "norule", "block", 1, false, false, 0, 0},
		{"gauge goes to HTTP", "seats", "block", 1, false, false, 0, 0},
		{"unknown metric goes to HTTP", "nope", "block", 1, false, false, 0, 0},
		{"policy unknown goes to HTTP", "api", "", 1, false, false, 0, 0},
		{"cost past int64 goes to HTTP", "api", "block", 1 << 62, false, false, 0, 0},
		{"boolean on", "sso", "block", 1, true, true, 0, 0},
		{"boolean off", "beta", "block", 1, true, false, 0, 0},
		{"static", "theme", "block", 1, true, true, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, ok := local(snap, tc.policy, tc.metric, tc.units)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if res.Allowed != tc.allowed {
				t.Errorf("allowed = %v, want %v", res.Allowed, tc.allowed)
			}
			if res.CustomerID != "c1" || res.BillableMetricKey != tc.metric || res.SubscriptionStatus == nil || *res.SubscriptionStatus != "active" {
				t.Errorf("identity fields %+v", res)
			}
			if res.Type != "metered" {
				return
			}
			if *res.EstimatedCost != tc.cost || *res.BalanceAfter != tc.after || *res.Units != tc.units {
				t.Errorf("cost %d after %d units %d, want %d %d %d", *res.EstimatedCost, *res.BalanceAfter, *res.Units, tc.cost, tc.after, tc.units)
			}
			if *res.Balance != 1200 || *res.ReservedBalance != 200 || *res.EffectiveBalance != 1000 || *res.OveragePolicy != tc.policy {
				t.Errorf("balances %+v", res)
			}
		})
	}
	if res, _ := local(snap, "block", "theme", 1); res.Config["color"] != "red" {
		t.Errorf("static config %v", res.Config)
	}
}

// fake is a creditd that answers the calls an Evaluator makes, counting
// them, and whose change stream the test writes to.
type fake struct {
	t       testing.TB
	mu      sync.Mutex
	balance int64
	enabled bool
	policy  string
	calls   map[string]*atomic.Int64
	msgs    chan string   // lines of SSE the stream writes
	drop    chan struct{} // ends the open stream
	lastIDs chan string   // the Last-Event-ID of each stream opened
	srv     *httptest.Server
}

func newFake(t testing.TB) *fake {
	f := &fake{t: t, balance: 1000, enabled: true, policy: "block", msgs: make(chan string, 16),
		drop: make(chan struct{}, 1), lastIDs: make(chan string, 16), calls: map[string]*atomic.Int64{}}
	for _, k := range []string{"snapshot", "customer", "tenant", "check", "stream"} {
		f.calls[k] = new(atomic.Int64)
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fake) n(k string) int64 { return f.calls[k].Load() }

func (f *fake) set(balance int64, enabled bool) {
	f.mu.Lock()
	f.balance, f.enabled = balance, enabled
	f.mu.Unlock()
}

func (f *fake) serve(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	f.mu.Lock()
	bal, on, policy := f.balance, f.enabled, f.policy
	f.mu.Unlock()
	write := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}
	switch {
	case path == "/v1/changes/stream":
		f.calls["stream"].Add(1)
		f.lastIDs <- r.Header.Get("Last-Event-ID")
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		fmt.Fprint(w, "id: 0.0-0\nevent: open\ndata: {}\n\n")
		fl.Flush()
		for {
			select {
			case m := <-f.msgs:
				fmt.Fprint(w, m)
				fl.Flush()
			case <-f.drop:
				return
			case <-r.Context().Done():
				return
			}
		}
	case path == "/v1/tenant":
		f.calls["tenant"].Add(1)
		write(map[string]any{"default_overage_policy": policy})
	case strings.HasSuffix(path, "/entitlements"):
		f.calls["snapshot"].Add(1)
		id := strings.Split(path, "/")[3]
		write(client.Snapshot{CustomerID: "uuid-" + id, Balance: bal, EffectiveBalance: bal, AvailableMC: bal,
			Entitlements: map[string]client.SnapshotEntry{
				"api": {Type: "metered", Allowed: true, EstimatedCostPerUnit: p(int64(10)), CostType: p("per_unit")},
				"sso": {Type: "boolean", Allowed: on, Enabled: p(on)},
			}})
	case strings.Contains(path, "/entitlements/"):
		f.calls["check"].Add(1)
		write(client.CheckResult{Type: "boolean", Allowed: on, Enabled: p(on), BillableMetricKey: "sso"})
	case strings.HasPrefix(path, "/v1/customers/"):
		f.calls["customer"].Add(1)
		write(map[string]any{"id": strings.TrimPrefix(path, "/v1/customers/"), "overage_policy": nil})
	default:
		http.NotFound(w, r)
	}
}

// clock is a settable clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func setup(t *testing.T, cfg Config) (*fake, *Evaluator, *clock) {
	t.Helper()
	f := newFake(t)
	clk := &clock{now: time.Date(2026, 11, 29, 2, 0, 0, 0, time.UTC)}
	if cfg.Now == nil {
		cfg.Now = clk.Now
	}
	e := New(client.New(f.srv.URL, "ck_test_x", client.WithRetry(1, time.Millisecond, time.Millisecond)), cfg)
	e.Start(context.Background())
	t.Cleanup(e.Close)
	<-f.lastIDs
	waitFor(t, "stream up", e.StreamUp)
	return f, e, clk
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func check(t *testing.T, e *Evaluator, cust, metric string, units int64) Answer {
	t.Helper()
	a, err := e.Check(context.Background(), cust, metric, units)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestEvaluator: the first check of a customer fetches, the next answer
// from memory without a call; an event of the customer refetches it, a
// config change makes every customer fetch again; past MaxAge without
// heartbeats the Fallback decides; the LRU bound holds; a dropped stream
// resumes from the last id seen.
func TestEvaluator(t *testing.T) {
	t.Parallel()
	t.Run("memory after the first fetch", func(t *testing.T) {
		t.Parallel()
		f, e, _ := setup(t, Config{})
		a := check(t, e, "alice", "api", 10)
		if a.Source != SourceMemory || !a.Allowed || *a.EstimatedCost != 100 || *a.BalanceAfter != 900 || *a.OveragePolicy != "block" {
			t.Fatalf("first answer %+v", a)
		}
		for range 100 {
			check(t, e, "alice", "api", 1)
		}
		if f.n("snapshot") != 1 || f.n("customer") != 1 || f.n("tenant") != 1 || f.n("check") != 0 {
			t.Errorf("calls: snapshot %d customer %d tenant %d check %d, want 1 1 1 0",
				f.n("snapshot"), f.n("customer"), f.n("tenant"), f.n("check"))
		}
	})
	t.Run("an event of the customer refetches it", func(t *testing.T) {
		t.Parallel()
		f, e, _ := setup(t, Config{})
		check(t, e, "alice", "api", 1)
		f.set(50, true)
		f.msgs <- "id: 7.0-0\nevent: credit.consumed\ndata: {\"customer_id\":\"uuid-alice\"}\n\n"
		waitFor(t, "refetch", func() bool { return f.n("snapshot") == 2 })
		waitFor(t, "new balance", func() bool { return *check(t, e, "alice", "api", 1).EffectiveBalance == 50 })
		if a := check(t, e, "alice", "api", 10); a.Allowed || a.Source != SourceMemory {
			t.Errorf("100 mc against 50 under block: %+v", a)
		}
		if e.Cursor() != "7.0-0" {
			t.Errorf("cursor %q, want 7.0-0", e.Cursor())
		}
		f.msgs <- "id: 8.0-0\nevent: credit.granted\ndata: {\"customer_id\":\"uuid-bob\"}\n\n"
		waitFor(t, "cursor", func() bool { return e.Cursor() == "8.0-0" })
		if f.n("snapshot") != 2 {
			t.Errorf("an event of a customer not kept fetched it: %d snapshots", f.n("snapshot"))
		}
	})
	t.Run("a reservation notice refetches its customer only", func(t *testing.T) {
		t.Parallel()
		f, e, _ := setup(t, Config{})
		check(t, e, "alice", "api", 1)
		check(t, e, "bob", "api", 1)
		f.set(300, true)
		f.msgs <- "id: 0.7-0\nevent: change.holds\ndata: {\"change\":\"holds\",\"customer_id\":\"uuid-alice\"}\n\n"
		waitFor(t, "refetch", func() bool { return f.n("snapshot") == 3 })
		waitFor(t, "held balance", func() bool { return *check(t, e, "alice", "api", 1).EffectiveBalance == 300 })
		if a := check(t, e, "bob", "api", 1); *a.EffectiveBalance != 1000 || f.n("snapshot") != 3 {
			t.Errorf("bob after alice's reservation: balance %d, %d snapshots; want 1000 kept, 3", *a.EffectiveBalance, f.n("snapshot"))
		}
	})
	t.Run("a config change makes every customer fetch again", func(t *testing.T) {
		t.Parallel()
		f, e, _ := setup(t, Config{})
		check(t, e, "alice", "sso", 1)
		check(t, e, "bob", "sso", 1)
		f.set(1000, false)
		f.msgs <- "id: 0.5-0\nevent: change.plans\ndata: {\"change\":\"plans\"}\n\n"
		waitFor(t, "cursor", func() bool { return e.Cursor() == "0.5-0" })
		for _, c := range []string{"alice", "bob"} {
			if a := check(t, e, c, "sso", 1); a.Allowed || *a.Enabled {
				t.Errorf("%s after the plan change: %+v", c, a)
			}
		}
		if f.n("snapshot") != 4 || f.n("tenant") != 1 {
			t.Errorf("snapshots %d tenant reads %d, want 4 and 1", f.n("snapshot"), f.n("tenant"))
		}
		f.msgs <- "id: 0.6-0\nevent: change.tenant\ndata: {\"change\":\"tenant\"}\n\n"
		waitFor(t, "cursor", func() bool { return e.Cursor() == "0.6-0" })
		check(t, e, "alice", "sso", 1)
		if f.n("tenant") != 2 {
			t.Errorf("a tenant change did not read the tenant's policy again: %d reads", f.n("tenant"))
		}
	})
	for _, tc := range []struct {
		name     string
		fallback Fallback
		source   Source
		allowed  bool
		checks   int64
	}{
		{"stale answers go to HTTP", FallbackHTTP, SourceHTTP, true, 1},
		{"stale answers fail open", FallbackOpen, SourcePolicy, true, 0},
		{"stale answers fail closed", FallbackClosed, SourcePolicy, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, e, clk := setup(t, Config{MaxAge: time.Second, Fallback: tc.fallback})
			if a := check(t, e, "alice", "sso", 1); a.Source != SourceMemory || a.Age != 0 {
				t.Fatalf("fresh answer %+v", a)
			}
			clk.add(900 * time.Millisecond)
			if a := check(t, e, "alice", "sso", 1); a.Source != SourceMemory || a.Age != 900*time.Millisecond {
				t.Fatalf("answer within MaxAge: source %s age %v", a.Source, a.Age)
			}
			f.msgs <- ": heartbeat 0\n\n"
			waitFor(t, "heartbeat", func() bool { return check(t, e, "alice", "sso", 1).Age == 0 })
			clk.add(1100 * time.Millisecond)
			a := check(t, e, "alice", "sso", 1)
			if a.Source != tc.source || a.Allowed != tc.allowed || f.n("check") != tc.checks {
				t.Errorf("past MaxAge: source %s allowed %v, %d HTTP checks; want %s %v %d", a.Source, a.Allowed, f.n("check"), tc.source, tc.allowed, tc.checks)
			}
		})
	}
	t.Run("a heartbeat dates the figures by its lag; behind does not count", func(t *testing.T) {
		t.Parallel()
		f, e, clk := setup(t, Config{})
		check(t, e, "alice", "sso", 1)
		clk.add(2 * time.Second)
		f.msgs <- ": heartbeat 300\n\n"
		waitFor(t, "heartbeat", func() bool { return check(t, e, "alice", "sso", 1).Age == 300*time.Millisecond })
		clk.add(time.Second)
		f.msgs <- ": behind\n\n"
		f.msgs <- "id: 0.9-0\nevent: credit.granted\ndata: {\"customer_id\":\"nobody\"}\n\n"
		waitFor(t, "cursor", func() bool { return e.Cursor() == "0.9-0" })
		if a := check(t, e, "alice", "sso", 1); a.Age != 1300*time.Millisecond {
			t.Errorf("age after a behind comment %v, want 1.3s", a.Age)
		}
	})
	t.Run("concurrent first checks share one fetch", func(t *testing.T) {
		t.Parallel()
		f, e, _ := setup(t, Config{})
		f.mu.Lock() // holds the snapshot answer until every check waits
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := e.Check(context.Background(), "carol", "api", 1); err != nil {
					t.Error(err)
				}
			}()
		}
		time.Sleep(100 * time.Millisecond)
		f.mu.Unlock()
		wg.Wait()
		if n := f.n("snapshot"); n != 1 {
			t.Errorf("%d snapshot fetches for 20 concurrent first checks, want 1", n)
		}
	})
	t.Run("the LRU bound holds", func(t *testing.T) {
		t.Parallel()
		f, e, _ := setup(t, Config{MaxCustomers: 2})
		for _, c := range []string{"a", "b", "a", "c"} {
			check(t, e, c, "sso", 1)
		}
		if e.Len() != 2 {
			t.Fatalf("kept %d, want 2", e.Len())
		}
		check(t, e, "a", "sso", 1) // kept: checked after b
		if f.n("snapshot") != 3 {
			t.Errorf("a was evicted: %d snapshots, want 3", f.n("snapshot"))
		}
		check(t, e, "b", "sso", 1) // evicted
		if f.n("snapshot") != 4 {
			t.Errorf("b was kept: %d snapshots, want 4", f.n("snapshot"))
		}
	})
	t.Run("a dropped stream resumes from the last id", func(t *testing.T) {
		t.Parallel()
		f, e, _ := setup(t, Config{})
		f.msgs <- "id: 3.1-0\nevent: credit.granted\ndata: {\"customer_id\":\"x\"}\n\n"
		waitFor(t, "cursor", func() bool { return e.Cursor() == "3.1-0" })
		f.drop <- struct{}{}
		select {
		case id := <-f.lastIDs:
			if id != "3.1-0" {
				t.Errorf("resumed with Last-Event-ID %q, want 3.1-0", id)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the stream was not opened again")
		}
	})
}

// TestImportsOnlyTheClient: the evaluator is for integrators: it imports
// the standard library and the client, nothing of the server and no
// module beyond go.mod's.
func TestImportsOnlyTheClient(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p != "github.com/creditd/creditd/client" && strings.Contains(strings.SplitN(p, "/", 2)[0], ".") {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
}

// BenchmarkCheckFromMemory: a metered check answered from a kept snapshot
// (issue 27's goal: <= 5 µs p99, >= 1M checks/s per core).
func BenchmarkCheckFromMemory(b *testing.B) {
	f := newFake(b)
	e := New(client.New(f.srv.URL, "ck_test_x"), Config{MaxAge: time.Hour})
	ctx := context.Background()
	if _, err := e.Check(ctx, "alice", "api", 3); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if a, _ := e.Check(ctx, "alice", "api", 3); a.Source != SourceMemory {
			b.Fatal(a.Source)
		}
	}
}
