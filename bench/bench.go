package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Bench is one run's state.
type Bench struct {
	o        Options
	res      *Results
	rdb      *redis.Client
	redisURL string
	dbURL    string
	baseDB   string // the server's maintenance database, to create more
	prefix   string
	runID    string
	addr     string
	probe    *CPUProbe
	tmp      string
	root     string
	api      *API
	target   *Target
	pg       *pgx.Conn // for pg_stat_database of the run's database
	// pprofAddr serves creditd's runtime profiles (CREDITD_PPROF_ADDR), and
	// bin is the creditd binary they describe.
	pprofAddr string
	bin       string
	// worstRedisPid is the worst scenario's private redis-server.
	worstRedisPid int
}

const grantCredits = 1_000_000_000

// newTenant creates a tenant on the creditd at addr and lifts its rate
// limit (the bench measures creditd, not its limiter); the API it returns
// calls with the tenant's live key.
func newTenant(addr, runID string) (*API, error) {
	httpc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	admin := &API{Base: "http://" + addr, HTTP: httpc}
	bearer := []string{"Authorization", "Bearer " + adminToken}
	a, err := admin.Expect(201, "POST", "/admin/v1/tenants", map[string]any{"name": "bench " + runID}, bearer...)
	if err != nil {
		return nil, err
	}
	var tn struct {
		Tenant  struct{ ID string }   `json:"tenant"`
		APIKeys struct{ Live string } `json:"api_keys"`
	}
	if err := a.Decode(&tn); err != nil {
		return nil, err
	}
	if _, err := admin.Expect(200, "PATCH", "/admin/v1/tenants/"+tn.Tenant.ID,
		map[string]any{"rate_limit_per_second": 1_000_000, "rate_limit_burst": 10_000_000}, bearer...); err != nil {
		return nil, err
	}
	return &API{Base: admin.Base, Key: tn.APIKeys.Live, HTTP: httpc}, nil
}

// seed creates the tenant, lifts its rate limit (the bench measures creditd,
// not its limiter), defines the metrics and rules, and seeds customers with
// 3 blocks each through the API.
func (b *Bench) seed(ctx context.Context) error {
	api, err := newTenant(b.addr, b.runID)
	if err != nil {
		return err
	}
	b.api = api
	idem := func(s string) []string { return []string{"Idempotency-Key", b.runID + "-seed-" + s} }

	for _, m := range []string{metricConsume, metricUsage, metricReserve, multiMetrics[3], multiMetrics[4]} {
		if _, err := b.api.Expect(201, "POST", "/v1/metering-rules",
			map[string]any{"billable_metric_key": m, "cost_type": "per_unit", "unit_cost": 1}, idem("rule-"+m)...); err != nil {
			b.res.Warnings = append(b.res.Warnings, "metering rule: "+err.Error())
		}
	}
	if _, err := b.api.Expect(201, "POST", "/v1/billable-metrics",
		map[string]any{"key": metricGauge, "name": "Seats", "type": "gauge", "default_value": map[string]any{"cap": 1_000_000_000}},
		idem("metric-"+metricGauge)...); err != nil {
		b.res.Warnings = append(b.res.Warnings, "gauge metric: "+err.Error())
	}

	if !b.o.needsCustomers() {
		b.target = &Target{Base: b.api.Base, Key: b.api.Key, RunID: b.runID, Acks: &Acks{}}
		return nil
	}
	memBefore, err := redisUsedMemory(ctx, b.rdb)
	if err != nil {
		return err
	}
	n := b.o.Customers
	customers := make([]Customer, n)
	logf("seeding %d customers with 3 blocks each through the API", n)
	t0 := time.Now()
	err = parallel(n, 16, func(i int) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		ext := fmt.Sprintf("bench-%07d", i)
		a, err := b.api.Expect(201, "POST", "/v1/customers", map[string]any{"external_id": ext}, idem("cust-"+ext)...)
		if err != nil {
			return err
		}
		var c struct{ ID string }
		if err := a.Decode(&c); err != nil {
			return err
		}
		customers[i] = Customer{Ext: ext, ID: c.ID}
		for k := 0; k < 3; k++ {
			body := map[string]any{"credits": grantCredits, "source": "promotional", "reason": "bench seed", "priority": k}
			if k == 0 {
				body["duration_seconds"] = 90 * 24 * 3600
			}
			if _, err := b.api.Expect(201, "POST", "/v1/customers/"+ext+"/credits/grant", body,
				idem(fmt.Sprintf("grant-%s-%d", ext, k))...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	secs := time.Since(t0).Seconds()
	memAfter, err := redisUsedMemory(ctx, b.rdb)
	if err != nil {
		return err
	}
	seed := &SeedResult{Customers: n, Seconds: secs, CallsPerSecond: float64(4*n) / secs,
		RedisBytesBefore: memBefore, RedisBytesAfter: memAfter, BytesPerCustomer: float64(memAfter-memBefore) / float64(n)}
	if id, err := uuid.Parse(customers[len(customers)/2].ID); err == nil {
		key := accountKey(b.prefix, id)
		seed.SampleKey = key
		seed.SampleKeyBytes, _ = b.rdb.MemoryUsage(ctx, key).Result()
		seed.SampleKeyFields, _ = b.rdb.HLen(ctx, key).Result()
	}
	seed.KeyClasses = keyClasses(ctx, b.rdb, b.prefix, n)
	b.res.Seed = seed
	logf("seeded in %.1fs (%.0f calls/s); Redis +%.0f bytes/customer, account hash %d bytes",
		secs, seed.CallsPerSecond, seed.BytesPerCustomer, seed.SampleKeyBytes)
	b.target = &Target{Base: b.api.Base, Key: b.api.Key, RunID: b.runID, Customers: customers, Acks: &Acks{}}
	if b.o.has(scenarioControlled) {
		if b.target.Controlled, err = b.seedControlled(ctx, n); err != nil {
			b.res.Warnings = append(b.res.Warnings, "consume-controlled seeding: "+err.Error())
			b.target.Controlled = nil
		}
	}
	return nil
}

// keyClasses sums MEMORY USAGE of the prefix's keys by kind, per customer.
func keyClasses(ctx context.Context, rdb *redis.Client, prefix string, customers int) []KeyClass {
	classes := map[string]*KeyClass{}
	classOf := func(k string) string {
		switch {
		case strings.Contains(k, ":a:"):
			return "account hash (a:<customer>)"
		case strings.Contains(k, ":op:"):
			return "operation record (op:<customer>:<key>, TTL)"
		case strings.Contains(k, ":i:"):
			return "HTTP idempotency record (i:<hash>, TTL 24 h)"
		case strings.HasSuffix(k, ":outbox"):
			return "outbox stream (per partition)"
		case strings.HasSuffix(k, ":exp"):
			return "expiry zset of an earlier version (per partition)"
		}
		return "other"
	}
	iter := rdb.Scan(ctx, 0, "{"+prefix+":*", 5000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	for i := 0; i < len(keys); i += 500 {
		batch := keys[i:min(i+500, len(keys))]
		pipe := rdb.Pipeline()
		cmds := make([]*redis.IntCmd, len(batch))
		for j, k := range batch {
			cmds[j] = pipe.MemoryUsage(ctx, k)
		}
		_, _ = pipe.Exec(ctx)
		for j, k := range batch {
			c := classOf(k)
			kc := classes[c]
			if kc == nil {
				kc = &KeyClass{Class: c}
				classes[c] = kc
			}
			kc.Keys++
			kc.Bytes += cmds[j].Val()
		}
	}
	out := make([]KeyClass, 0, len(classes))
	for _, kc := range classes {
		kc.BytesPerCustomer = float64(kc.Bytes) / float64(customers)
		out = append(out, *kc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Bytes > out[j].Bytes })
	return out
}

// ceilings measures raw Redis, HTTP + one EVALSHA, and Postgres alone.
func (b *Bench) ceilings(ctx context.Context) {
	key := "{" + b.prefix + "}:ceiling"
	if err := b.rdb.HSet(ctx, key, "f", "a value about as long as a balance field: 1234567890").Err(); err != nil {
		b.res.Errors = append(b.res.Errors, "ceiling key: "+err.Error())
		return
	}
	if ctx.Err() == nil {
		logf("ceiling: redis-benchmark EVALSHA (%d requests)", b.o.RedisBenchN)
		before := b.probe.Sample()
		rb := runRedisBenchmark(ctx, b.redisURL, b.rdb, key, b.o.RedisBenchN, 50)
		cpu := b.probe.Sample().Sub(before)
		rb.CPU = cpu
		b.res.RedisBenchmark = &rb
		if rb.Error != "" {
			logf("  %s", rb.Error)
		} else {
			logf("  %.0f EVALSHA/s, p50 %.3fms p99 %.3fms", rb.RPS, rb.P50MS, rb.P99MS)
		}
	}

	if ctx.Err() == nil {
		b.ceilingServer(ctx, key)
	}

	if ctx.Err() == nil {
		logf("alternative: pgbench Postgres-only consume (%d accounts, %d clients, %s each)", b.o.Customers, b.o.PGBenchClients, b.o.PGBenchDuration)
		if err := preparePGBench(ctx, b.dbURL, b.o.Customers); err != nil {
			b.res.Errors = append(b.res.Errors, "pgbench tables: "+err.Error())
			return
		}
		for _, hot := range []bool{false, true} {
			r := runPGBench(ctx, b.dbURL, b.tmp, b.o.Customers, b.o.PGBenchClients, hot, b.o.PGBenchDuration, b.probe)
			b.res.PGBench = append(b.res.PGBench, r)
			if r.Error != "" {
				logf("  %s: %s", r.Name, r.Error)
			} else {
				logf("  %s: %.0f tps, latency avg %.2fms", r.Name, r.TPS, r.LatencyMS)
			}
		}
		// Backends flush pg_stat_database about once a second: let pgbench's
		// land before the next run reads its own.
		time.Sleep(1500 * time.Millisecond)
	}
}

// ceilingServer starts this binary's minimal HTTP + EVALSHA server as its
// own process and loads it like creditd.
func (b *Bench) ceilingServer(ctx context.Context, key string) {
	self, err := os.Executable()
	if err != nil {
		b.res.Errors = append(b.res.Errors, "ceiling server: "+err.Error())
		return
	}
	addr, err := freeAddr()
	if err != nil {
		b.res.Errors = append(b.res.Errors, "ceiling server: "+err.Error())
		return
	}
	p, err := startProc("ceiling", self, []string{"-ceiling-server", addr, "-ceiling-key", key},
		[]string{"REDIS_URL=" + b.redisURL}, addr, filepath.Join(b.tmp, "ceiling.log"))
	if err != nil {
		b.res.Errors = append(b.res.Errors, "ceiling server: "+err.Error())
		return
	}
	defer p.Stop()
	b.probe.Extra["ceiling server"] = p.Pid()
	defer delete(b.probe.Extra, "ceiling server")
	uri := "http://" + addr + "/evalsha"
	op := func(w *worker, _ uint64) (int, error) {
		w.req.Reset()
		w.resp.Reset()
		w.req.SetRequestURI(uri)
		return w.do()
	}
	sr := b.load(ctx, Scenario{Name: "http+evalsha ceiling", RampStart: 2000, Unit: "request", op: op}, addr, "")
	b.res.Ceiling = &sr
}

// scenarios runs every selected creditd scenario.
func (b *Bench) scenarios(ctx context.Context) {
	all := b.target.scenarios()
	type planned struct {
		name string
		hot  bool
	}
	var plan []planned
	for _, name := range b.o.Scenarios {
		if name == "worst" || name == "replica-ack" || name == "fleet-scale" || name == "pg-statements" || name == "pg-outage" || name == "floors" || name == "memory" ||
			name == "usage-report" || name == "ledger-scale" || name == "rebuild" {
			continue // run on their own (worst.go, replicaack.go, fleetscale.go, pgstatements.go, hotpath.go, workfloors.go, memory.go, usagereport.go, ledgerscale.go, rebuild.go)
		}
		if _, ok := all[name]; !ok {
			b.res.Errors = append(b.res.Errors, "unknown scenario "+name)
			continue
		}
		plan = append(plan, planned{name, false})
		if b.o.Hot || name == "consume" {
			plan = append(plan, planned{name, true})
		}
	}
	for _, p := range plan {
		if ctx.Err() != nil {
			return
		}
		sc := all[p.name](p.hot)
		route := map[string]string{"check": "GET /v1/entitlements/check", "consume": "POST /v1/entitlements/consume", scenarioControlled: "POST /v1/entitlements/consume",
			"gauge": "POST /v1/customers/{id}/entitlements/{billable_metric_key}/increment", "reserve": "POST /v1/reservations",
			"gauge-lease": "POST /v1/customers/{id}/entitlements/{billable_metric_key}/leases/{lease_id}/renew",
			"usage":       "POST /v1/usage", "mixed": "GET /v1/entitlements/check"}[p.name]
		sr := b.load(ctx, sc, strings.TrimPrefix(b.target.Base, "http://"), route)
		if p.name == "consume" && !p.hot && sr.Skipped == "" && sr.Max > 0 && ctx.Err() == nil {
			sr.Lag = b.lagRun(ctx, sc, sr.Max)
		}
		if p.name == scenarioControlled && !p.hot && sr.Run != nil && sr.Run.OK > 0 && ctx.Err() == nil {
			sr.PlainTwin = b.twinRun(ctx, all["consume"](false), sr.Run.Offered)
		}
		b.res.Scenarios = append(b.res.Scenarios, sr)
	}
}

// twinRun runs sc at rate for the run duration and samples the servers'
// CPU meanwhile (the consume-controlled scenario's plain twin).
func (b *Bench) twinRun(ctx context.Context, sc Scenario, rate float64) *TwinRun {
	if rate <= 0 {
		return nil
	}
	logf("  plain twin: %s at %.0f/s", sc.Name, rate)
	g := NewGenerator(strings.TrimPrefix(b.target.Base, "http://"), b.o.Workers)
	_ = g.Run(ctx, rate/2, time.Second, sc.op) // the connections opened, as in load's probe and ramp
	time.Sleep(time.Second)
	cpu0 := b.probe.Sample()
	r := g.Run(ctx, rate, b.o.Duration, sc.op)
	t := &TwinRun{Scenario: sc.Name, Run: r, CPU: b.probe.Sample().Sub(cpu0)}
	logf("  plain twin: achieved %.0f/s p50 %.3fms p99 %.3fms errors %s", r.Achieved, r.Latency.P50, r.Latency.P99, r.ErrorSummary())
	return t
}

// load probes a scenario once, ramps it to its limit, then runs it at 70 %
// of the highest achieved rate (or at -rate) for the latency figures.
func (b *Bench) load(ctx context.Context, sc Scenario, addr, route string) ScenarioResult {
	sr := ScenarioResult{Name: sc.Name, Unit: sc.Unit, Hot: sc.Hot}
	logf("scenario %s", sc.Name)
	g := NewGenerator(addr, b.o.Workers)
	// One op first: a missing endpoint is reported, not ramped.
	probe := g.Run(ctx, 1, time.Millisecond, sc.op)
	if probe.OK != 1 {
		sr.Skipped = fmt.Sprintf("probe failed (%s)", probe.ErrorSummary())
		if sample := b.sampleAnswer(sc); sample != "" {
			sr.Skipped += ": " + sample
		}
		logf("  skipped: %s", sr.Skipped)
		return sr
	}
	rate := b.o.Rate
	if rate <= 0 {
		steps, best := g.Ramp(ctx, RampConfig{Start: sc.RampStart, Factor: 1.6, Max: 500_000, StepDur: b.o.StepDuration,
			MaxP99: b.o.MaxP99, MaxError: 0.01, Pause: 500 * time.Millisecond}, sc.op, logf)
		sr.Steps, sr.Max = steps, best
		rate = 0.7 * best
		time.Sleep(time.Second)
	}
	if rate <= 0 || ctx.Err() != nil {
		return sr
	}
	var before map[string]float64
	if route != "" {
		before, _ = b.api.Metrics()
	}
	cs0, pg0 := commandStats(ctx, b.rdb), pgStats(ctx, b.pg)
	// creditd's own CPU profile of the run (not of the hot twin, whose
	// profile would say the same), to name where its CPU goes.
	var prof chan []byte
	if b.pprofAddr != "" && route != "" && !sc.Hot {
		prof = make(chan []byte, 1)
		go func() {
			raw, err := fetchProfile(ctx, b.pprofAddr, b.o.Duration)
			if err != nil {
				logf("  pprof: %v", err)
			}
			prof <- raw
		}()
	}
	cpu0 := b.probe.Sample()
	r := g.Run(ctx, rate, b.o.Duration, sc.op)
	sr.CPU = b.probe.Sample().Sub(cpu0)
	if prof != nil {
		if raw := <-prof; len(raw) > 0 {
			p := summarizeProfile(b.bin, raw, b.tmp, sc.Name)
			sr.Profile = &p
		}
	}
	sr.Run = &r
	sr.Redis = redisDelta(cs0, commandStats(ctx, b.rdb), float64(r.OK))
	if b.pg != nil && route != "" {
		d := pgStats(ctx, b.pg).sub(pg0, float64(r.OK))
		sr.PG = &d
	}
	if route != "" && before != nil {
		if after, err := b.api.Metrics(); err == nil {
			method, path, _ := strings.Cut(route, " ")
			sr.Server = serverLatency(before, after, method, path)
		}
	}
	logf("  at %.0f/s (70%% of max %.0f/s): achieved %.0f/s p50 %.3fms p90 %.3fms p99 %.3fms p99.9 %.3fms errors %s",
		rate, sr.Max, r.Achieved, r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.P999, r.ErrorSummary())
	return sr
}

// sampleAnswer sends one request of a skipped scenario through the plain
// client to show what creditd answered.
func (b *Bench) sampleAnswer(sc Scenario) string {
	g := NewGenerator(strings.TrimPrefix(b.target.Base, "http://"), 1)
	var ans string
	_ = g.Run(context.Background(), 1, time.Millisecond, func(w *worker, seq uint64) (int, error) {
		st, err := sc.op(w, seq)
		if err == nil {
			body := string(w.resp.Body())
			if len(body) > 200 {
				body = body[:200] + "..."
			}
			ans = fmt.Sprintf("%s %s -> %d %s", w.req.Header.Method(), w.req.URI().Path(), st, body)
		}
		return st, err
	})
	return ans
}

// serverLatency is creditd's own request-duration histogram for one route,
// between two /metrics reads: what share of requests took at most 1 ms, and
// the bucket bound under which 99 % fall.
func serverLatency(before, after map[string]float64, method, path string) *ServerLatency {
	type bucket struct {
		le float64
		n  float64
	}
	var buckets []bucket
	var count float64
	// Labels are matched one by one: the exposition orders them by name
	// (method, route), and older creditd wrote route first.
	route, meth := `route="`+path+`"`, `method="`+method+`"`
	for k, v := range after {
		if !strings.Contains(k, route) || !strings.Contains(k, meth) {
			continue
		}
		d := v - before[k]
		switch {
		case strings.HasPrefix(k, "creditd_http_request_duration_seconds_bucket{"):
			i := strings.Index(k, `le="`)
			if i < 0 {
				continue
			}
			le := strings.TrimSuffix(k[i+4:], `"}`)
			f, err := strconv.ParseFloat(le, 64)
			if le == "+Inf" {
				f, err = 1e18, nil
			}
			if err == nil {
				buckets = append(buckets, bucket{f, d})
			}
		case strings.HasPrefix(k, "creditd_http_request_duration_seconds_count{"):
			count = d
		}
	}
	if count == 0 {
		return nil
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	out := &ServerLatency{Requests: int64(count)}
	for _, bk := range buckets {
		if bk.le <= 0.001 {
			out.ShareUnder1ms = bk.n / count
		}
		if out.P99UpperMS == 0 && bk.n >= 0.99*count {
			out.P99UpperMS = bk.le * 1000
		}
		if out.P50UpperMS == 0 && bk.n >= 0.5*count {
			out.P50UpperMS = bk.le * 1000
		}
	}
	return out
}

// lagRun consumes at the max rate for LagDuration and reads the persister
// lag right at the end, then how long the backlog takes to drain.
func (b *Bench) lagRun(ctx context.Context, sc Scenario, rate float64) *LagResult {
	logf("  persister lag: consume at %.0f/s for %s", rate, b.o.LagDuration)
	g := NewGenerator(strings.TrimPrefix(b.target.Base, "http://"), b.o.Workers)
	cpu0 := b.probe.Sample()
	r := g.Run(ctx, rate, b.o.LagDuration, sc.op)
	lr := &LagResult{Rate: rate, Seconds: b.o.LagDuration.Seconds(), Run: r, CPU: b.probe.Sample().Sub(cpu0)}
	m, err := b.api.Metrics()
	if err != nil {
		lr.Error = err.Error()
		return lr
	}
	lag, ok1 := m["creditd_persister_lag_seconds"]
	backlog, ok2 := m["creditd_persister_backlog"]
	if !ok1 || !ok2 {
		lr.Error = "GET /metrics has no creditd_persister_lag_seconds / creditd_persister_backlog"
		return lr
	}
	lr.LagSeconds, lr.Backlog = lag, int64(backlog)
	t0 := time.Now()
	lr.DrainSeconds, lr.Error = b.waitDrained(ctx, 3*time.Minute)
	logf("  achieved %.0f/s; at the end lag %.3fs backlog %d; drained in %.1fs", r.Achieved, lag, lr.Backlog, time.Since(t0).Seconds())
	return lr
}

// waitDrained polls /metrics until the persister backlog is 0.
func (b *Bench) waitDrained(ctx context.Context, limit time.Duration) (float64, string) {
	t0 := time.Now()
	for time.Since(t0) < limit && ctx.Err() == nil {
		m, err := b.api.Metrics()
		if err == nil {
			if v, ok := m["creditd_persister_backlog"]; ok && v == 0 {
				return time.Since(t0).Seconds(), ""
			} else if !ok {
				return 0, "GET /metrics has no creditd_persister_backlog"
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(t0).Seconds(), fmt.Sprintf("backlog not drained within %s", limit)
}

// ledger waits for the persister to drain, then compares the ledger in
// Postgres with what creditd acknowledged.
func (b *Bench) ledger(ctx context.Context) {
	if b.target == nil {
		return
	}
	logf("ledger: waiting for the persister backlog to drain")
	lc := &LedgerCheck{}
	lc.DrainSeconds, lc.Error = b.waitDrained(ctx, 3*time.Minute)
	if m, err := b.api.Metrics(); err == nil {
		lc.FinalLagSeconds = m["creditd_persister_lag_seconds"]
	}
	acks := b.target.Acks
	// Multi-metric consumes write entries without a metric ("" here).
	want := map[string]int64{metricConsume: acks.Consumes.Load(), metricUsage: acks.UsageEvents.Load(), metricReserve: acks.Commits.Load(),
		"": acks.MultiConsumes.Load()}
	lc.Ambiguous = acks.Ambiguous.Load()
	conn, err := pgx.Connect(ctx, b.dbURL)
	if err != nil {
		lc.Error = err.Error()
		b.res.Ledger = lc
		return
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT COALESCE(billable_metric_key, ''), type, count(*), count(DISTINCT op_id),
			count(DISTINCT NULLIF(idempotency_key, ''))
		FROM ledger_entries GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		lc.Error = err.Error()
		b.res.Ledger = lc
		return
	}
	for rows.Next() {
		var r LedgerRow
		if err := rows.Scan(&r.Metric, &r.Type, &r.Rows, &r.Ops, &r.Keys); err != nil {
			lc.Error = err.Error()
			break
		}
		if r.Type == "consumption" {
			if n, ok := want[r.Metric]; ok {
				r.Acknowledged = &n
				eq := r.Rows == n && r.Ops == n
				r.Match = &eq
			}
		}
		lc.Rows = append(lc.Rows, r)
	}
	rows.Close()
	for metric, n := range want {
		found := false
		for _, r := range lc.Rows {
			if r.Metric == metric && r.Type == "consumption" {
				found = true
			}
		}
		if !found && n > 0 {
			n := n
			f := false
			lc.Rows = append(lc.Rows, LedgerRow{Metric: metric, Type: "consumption", Acknowledged: &n, Match: &f})
		}
	}
	b.res.Ledger = lc
	for _, r := range lc.Rows {
		if r.Acknowledged != nil {
			logf("ledger: %s consumption rows %d (ops %d) vs acknowledged %d: match=%v", r.Metric, r.Rows, r.Ops, *r.Acknowledged, *r.Match)
		}
	}
}
