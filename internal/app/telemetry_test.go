package app_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/internal/e2e"
	"github.com/creditd/creditd/internal/telemetry"
	"github.com/creditd/creditd/internal/testenv"
	"github.com/creditd/creditd/persist"
)

// node is one creditd on the test Redis and a fresh database, its pool
// opened with the Postgres tracer as cmd/creditd opens it.
type node struct {
	URL      string
	App      *app.App
	Registry *prometheus.Registry
	log      *syncBuffer
	// Redis and Prefix are the node's Redis and key prefix.
	Redis  redis.UniversalClient
	Prefix string
}

func startNode(t *testing.T, tracing *telemetry.Tracing, change func(*app.Config)) *node {
	t.Helper()
	rdb, prefix := testenv.RedisPool(t, e2e.StackRedisPoolSize)
	return startNodeOn(t, rdb, prefix, "", tracing, change)
}

// startNodeOn is startNode on a Redis of the test's own and, when dbURL is
// set, on that database (else a fresh one of the test Postgres).
func startNodeOn(t *testing.T, rdb redis.UniversalClient, prefix, dbURL string, tracing *telemetry.Tracing, change func(*app.Config)) *node {
	t.Helper()
	if dbURL == "" {
		dbURL = testenv.Database(t)
	}
	reg := telemetry.NewRegistry(telemetry.Build{Version: "v-test", Commit: "c0ffee"})
	var tp trace.TracerProvider
	if tracing != nil {
		tp = tracing.Provider
	}
	ctx := context.Background()
	pool, err := persist.Open(ctx, dbURL, persist.WithTracer(telemetry.NewPostgresTracer(reg, tp)))
	if err != nil {
		t.Fatal(err)
	}
	if err := persist.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	cfg := app.Config{
		RedisPrefix: prefix, AdminToken: e2e.AdminToken, AllowPrivate: true, Consumer: "telemetry",
		SweepInterval: 50 * time.Millisecond, ReplicaAckTimeout: testenv.ReplicaAckTimeout,
		Registry: reg, Tracing: tracing,
	}
	if change != nil {
		change(&cfg)
	}
	logs := &syncBuffer{}
	a := app.New(rdb, pool, cfg, zerolog.New(logs))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a.Start()
	go func() { _ = a.Serve(ln) }()
	t.Cleanup(func() {
		a.Stop(0)
		pool.Close()
	})
	return &node{URL: "http://" + ln.Addr().String(), App: a, Registry: reg, log: logs, Redis: rdb, Prefix: prefix}
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// requiredFamilies is every family issue 13 asks /metrics to show.
var requiredFamilies = []string{
	// RED per route, no tenant label.
	"creditd_http_requests_total", "creditd_http_request_duration_seconds", "creditd_http_requests_in_flight",
	// Readiness, persister lag and outbox depth (in all and per partition), dead letters.
	"creditd_readiness_check",
	"creditd_persister_lag_seconds", "creditd_persister_backlog", "creditd_persister_partition_lag_seconds", "creditd_outbox_depth",
	"creditd_dead_letters_unresolved", "creditd_persister_dead_letters_total",
	"creditd_persister_mutations_total", "creditd_persister_batches_total", "creditd_persister_apply_errors_total",
	"creditd_persister_replayed_batches_total", "creditd_persister_unreplicated_batches_total", "creditd_persister_last_batch_seconds",
	"creditd_persister_partitions_owned",
	// Webhooks.
	"creditd_webhook_backlog", "creditd_webhook_backlog_due", "creditd_webhook_deliveries_total",
	// Redis and Postgres latency and pools.
	"creditd_redis_command_duration_seconds", "creditd_redis_pool_connections", "creditd_redis_pool_hits_total",
	"creditd_redis_pool_misses_total", "creditd_redis_pool_timeouts_total",
	"creditd_postgres_query_duration_seconds", "creditd_postgres_errors_total", "creditd_postgres_pool_connections",
	"creditd_postgres_pool_acquires_total", "creditd_postgres_pool_empty_acquires_total",
	"creditd_postgres_pool_canceled_acquires_total", "creditd_postgres_pool_acquire_seconds_total",
	// Scripts, reloads, background work.
	"creditd_redis_script_errors_total", "creditd_nostate_reloads_total", "creditd_scheduler_backlog", "creditd_sweep_backlog",
	"creditd_runner_healthy", // its last_success twin is absent until a loop's first pass
	// Reconcile sampler (issue 15).
	"creditd_reconcile_checked_total", "creditd_reconcile_mismatches_total", "creditd_reconcile_skipped_total",
	"creditd_reconcile_last_sample_mismatches",
	// Runtime and build.
	"go_goroutines", "go_memstats_heap_alloc_bytes", "go_gc_duration_seconds", "process_cpu_seconds_total",
	"process_resident_memory_bytes", "creditd_build_info",
}

// scrape reads GET url and decodes the Prometheus text into families.
func scrape(t *testing.T, url string) map[string]*familyInfo {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, res.StatusCode, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("GET %s: not the Prometheus text format: %v", url, err)
	}
	out := map[string]*familyInfo{}
	for name, mf := range mfs {
		fi := &familyInfo{Type: mf.GetType().String(), Labels: map[string]bool{}}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				fi.Labels[l.GetName()] = true
			}
		}
		out[name] = fi
	}
	return out
}

// familyInfo is what the tests check of one family.
type familyInfo struct {
	Type   string
	Labels map[string]bool
}

func names(fams map[string]*familyInfo) []string {
	out := make([]string, 0, len(fams))
	for n := range fams {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// exercise drives a little of everything: a tenant, a customer, a grant,
// a consume, a 404.
func exercise(t *testing.T, base string) e2e.Tenant {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	tn := e2e.CreateTenant(t, client, base, "telemetry")
	r := e2e.Call(t, client, base, "POST", "/v1/customers", map[string]any{"external_id": "telemetry-1"},
		"X-API-Key", tn.Live, "Idempotency-Key", "tel-cust-1")
	if r.Status != 201 {
		t.Fatalf("create customer: %d %s", r.Status, r.Raw)
	}
	cust := r.Body["id"].(string)
	if g := e2e.Call(t, client, base, "POST", "/v1/customers/"+cust+"/credits/grant",
		map[string]any{"credits": 100, "source": "promotional", "reason": "telemetry"},
		"X-API-Key", tn.Live, "Idempotency-Key", "tel-grant-1"); g.Status != 201 {
		t.Fatalf("grant: %d %s", g.Status, g.Raw)
	}
	if g := e2e.Call(t, client, base, "GET", "/v1/customers/"+cust+"/credits", nil, "X-API-Key", tn.Live); g.Status != 200 {
		t.Fatalf("credits: %d %s", g.Status, g.Raw)
	}
	if g := e2e.Call(t, client, base, "GET", "/nowhere", nil); g.Status != 404 {
		t.Fatalf("404: %d %s", g.Status, g.Raw)
	}
	return tn
}

// TestMetricsFamilies: /metrics shows every family of issue 13 item 4,
// the HTTP families carry route, method and status class and no tenant,
// build info carries version and commit, and the access log names the
// tenant and key.
func TestMetricsFamilies(t *testing.T) {
	n := startNode(t, nil, nil)
	tn := exercise(t, n.URL)
	fams := scrape(t, n.URL+"/metrics")
	for _, want := range requiredFamilies {
		if fams[want] == nil {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Fatalf("families: %v", names(fams))
	}
	for _, f := range []string{"creditd_http_requests_total", "creditd_http_request_duration_seconds"} {
		for _, l := range []string{"route", "method"} {
			if !fams[f].Labels[l] {
				t.Errorf("%s has no %s label", f, l)
			}
		}
		for l := range fams[f].Labels {
			if strings.Contains(l, "tenant") || strings.Contains(l, "key") {
				t.Errorf("%s carries the label %s", f, l)
			}
		}
	}
	if !fams["creditd_http_requests_total"].Labels["status"] || fams["creditd_http_request_duration_seconds"].Type != "HISTOGRAM" {
		t.Errorf("http families: %+v %+v", fams["creditd_http_requests_total"], fams["creditd_http_request_duration_seconds"])
	}
	if !fams["creditd_build_info"].Labels["version"] || !fams["creditd_build_info"].Labels["commit"] {
		t.Errorf("creditd_build_info labels: %v", fams["creditd_build_info"].Labels)
	}
	if !fams["creditd_outbox_depth"].Labels["partition"] || !fams["creditd_redis_script_errors_total"].Labels["code"] {
		t.Errorf("per-partition or per-code labels missing")
	}
	logs := n.log.String()
	if !strings.Contains(logs, `"tenant_id":"`+tn.ID+`"`) || !strings.Contains(logs, `"key_id":"`) {
		t.Errorf("access log lacks tenant_id %s or key_id:\n%s", tn.ID, logs)
	}
}

// TestMetricsAddr: with MetricsElsewhere the API port has no /metrics, and
// the metrics listener (CREDITD_METRICS_ADDR) serves the same registry.
func TestMetricsAddr(t *testing.T) {
	n := startNode(t, nil, func(c *app.Config) { c.MetricsElsewhere = true })
	if r := e2e.Call(t, http.DefaultClient, n.URL, "GET", "/metrics", nil); r.Status != 404 {
		t.Fatalf("API port /metrics: %d, want 404", r.Status)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := telemetry.ServeMetrics(ln, n.Registry, zerolog.Nop())
	defer stop()
	fams := scrape(t, "http://"+ln.Addr().String()+"/metrics")
	for _, want := range requiredFamilies {
		if fams[want] == nil {
			t.Errorf("metrics listener lacks %s", want)
		}
	}
	if r := e2e.Call(t, http.DefaultClient, "http://"+ln.Addr().String(), "GET", "/other", nil); r.Status != 404 {
		t.Errorf("metrics listener /other: %d, want 404", r.Status)
	}
}
