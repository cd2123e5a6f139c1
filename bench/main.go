// Command bench measures creditd against its ceilings and its alternative in
// one run on one machine: it starts creditd (the binary, as its own process)
// on a fresh database and key prefix, seeds customers through the API,
// drives open-loop load per scenario (ramp to the limit, then a run at 70 %
// of it), measures raw Redis (redis-benchmark EVALSHA), a minimal HTTP +
// one-EVALSHA server, and a Postgres-only consume (pgbench), checks that the
// ledger in Postgres matches what was acknowledged, times `creditd rebuild`,
// and writes bench/results/<time>/{report.md,results.json,
// latency_vs_throughput.svg} and bench/results/latest.md.
//
//	go run ./bench [-quick] [-duration 15s] [-customers 1000] [-scenarios check,consume,...] [-hot]
//	go run ./bench -scenario worst   # the worst allowed input alone (invariant 13)
//	go run ./bench -scenario replica-ack # consume with replica acks off and on, private master + replica
//	go run ./bench -scenario fleet-scale # consume and check on 1, 2, 3 creditd nodes, private Redis Cluster
//	go run ./bench -scenario pg-statements # Postgres statements per op (pg_stat_statements), private cluster
//	go run ./bench -scenario pg-outage # round trips per money call, Postgres bytes and rows per consume, a Postgres outage (issue 26)
//	go run ./bench -scenario floors # logic-free replicas of today's round trips (not in the default set)
//	go run ./bench -scenario memory  # Redis memory at a fixed consume rate alone
//	go run ./bench -scenario rebuild # creditd rebuild of -rebuild-customers alone
//	go run ./bench -scenario edge    # in-process checks and change propagation of client/edge (issue 27)
//	go run ./bench -scenario usage-report # usage report latency over -usage-report-rows ledger rows alone
//	go run ./bench -scenario ledger-scale # reads as the ledger grows from 1 to 6 monthly partitions (50M rows), a month's retention drop
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Options are the command-line settings.
type Options struct {
	Duration         time.Duration
	StepDuration     time.Duration
	LagDuration      time.Duration
	Customers        int
	Rate             float64
	Scenarios        []string
	Hot              bool
	Quick            bool
	Out              string
	RebuildCustomers int
	Workers          int
	PGBenchClients   int
	PGBenchDuration  time.Duration
	RedisBenchN      int
	MaxP99           time.Duration
	Keep             bool
	RebuildTimeout   time.Duration
	WorstMetaBytes   int
	WorstPace        time.Duration
	WorstRedisNice   int
	WorstRedisRT     bool
	MemoryRate       float64
	MemoryDuration   time.Duration
	MemoryEvery      time.Duration
	// PGStatementsRate is the pg-statements scenario's offered rate for
	// every operation; 0 picks a moderate rate per operation.
	PGStatementsRate float64
	// UsageReportRows are the ledger rows of the usage-report scenario's
	// customer; UsageReportQueries the timed reports per granularity.
	UsageReportRows    int64
	UsageReportQueries int
	// LedgerScaleRows are the ledger rows of the ledger-scale scenario
	// (ledgerscale.go), over its months; LedgerScaleQueries the timed
	// rounds of its reads per phase.
	LedgerScaleRows    int64
	LedgerScaleQueries int
}

// loadScenarios are the scenarios that ramp creditd and need the ceilings.
var loadScenarios = map[string]bool{"check": true, "consume": true, "consume-multi": true, scenarioControlled: true, "gauge": true, "gauge-lease": true,
	"reserve": true, "usage": true, "mixed": true}

// has reports whether the run includes scenario name.
func (o Options) has(name string) bool {
	for _, s := range o.Scenarios {
		if s == name {
			return true
		}
	}
	return false
}

// full: the run ramps creditd's load scenarios (and so measures the
// ceilings, the persister lag and the ledger).
func (o Options) full() bool {
	for _, s := range o.Scenarios {
		if loadScenarios[s] {
			return true
		}
	}
	return false
}

// needsCustomers: some scenario drives load at the seeded customers.
func (o Options) needsCustomers() bool { return o.full() || o.has("memory") || o.has("floors") }

func main() {
	var (
		o          Options
		scenarios  string
		ceilingSrv string
		ceilingKey string
		floorSrv   string
		watcher    bool
	)
	flag.DurationVar(&o.Duration, "duration", 0, "length of each scenario's run at 70% of its max (default 10s; -quick 4s)")
	flag.DurationVar(&o.StepDuration, "step", 0, "length of each ramp step (default 2s; -quick 1s)")
	flag.DurationVar(&o.LagDuration, "lag-duration", 0, "consume at max throughput this long before reading persister lag (default 60s; -quick 8s)")
	flag.IntVar(&o.Customers, "customers", 0, "customers seeded through the API, 3 blocks each (default 1000; -quick 200)")
	flag.Float64Var(&o.Rate, "rate", 0, "offered rate (ops/s) of every latency run, instead of 70% of the ramp's max (skips the ramp)")
	const all = "check,consume,consume-multi,consume-controlled,gauge,gauge-lease,reserve,usage,mixed,edge,worst,replica-ack,fleet-scale,pg-statements,pg-outage,memory,usage-report,rebuild"
	flag.StringVar(&scenarios, "scenarios", all, "scenarios to run ("+all+"; consume-multi is a 5-item consume, consume-controlled a consume under scoped credit, a credit line and budgets, gauge-lease a leased gauge increment+renew; floors, the logic-free replicas of today's round trips, and ledger-scale, 50M ledger rows over 6 monthly partitions, run only when named); edge, worst, replica-ack, fleet-scale, pg-statements, pg-outage, floors, memory, usage-report, ledger-scale or rebuild alone skip the load scenarios, ceilings and ledger check")
	flag.StringVar(&scenarios, "scenario", all, "alias of -scenarios (e.g. -scenario worst)")
	flag.Float64Var(&o.PGStatementsRate, "pg-statements-rate", 0, "ops/s of every operation of the pg-statements scenario (default: consume and check 1000, reserve+commit 200, usage 100 calls of 10 events; 70% of the run's max when lower)")
	flag.Float64Var(&o.MemoryRate, "memory-rate", 500, "consumes per second of the memory scenario")
	flag.DurationVar(&o.MemoryDuration, "memory-duration", 0, "length of the memory scenario (default 3m; -quick 30s)")
	flag.DurationVar(&o.MemoryEvery, "memory-every", 0, "how often the memory scenario samples Redis (default 15s; -quick 5s)")
	flag.DurationVar(&o.WorstPace, "worst-pace", 25*time.Millisecond, "pause before each measured call of the worst scenario (lets creditd and the persister go idle)")
	flag.BoolVar(&o.WorstRedisRT, "worst-redis-rt", os.Geteuid() == 0, "run the worst scenario's private redis-server main thread at real-time priority (chrt -f 1; default when run as root), so the calls it times wait for no other task")
	flag.IntVar(&o.WorstRedisNice, "worst-redis-nice", defaultWorstNice(), "nice value of the worst scenario's private redis-server main thread (default -10 when run as root, else 0: it waits less for a core on a busy machine, as on a core of its own)")
	flag.IntVar(&o.WorstMetaBytes, "worst-meta-bytes", engine.MaxMetadataBytes, "metadata bytes per block and reservation in the worst scenario (the API's cap by default; smaller when the API refuses it)")
	flag.BoolVar(&o.Hot, "hot", false, "also run every scenario on one hot customer (consume-hot always runs: a target needs it)")
	flag.BoolVar(&o.Quick, "quick", false, "a smoke run of about a minute")
	flag.StringVar(&o.Out, "out", "bench/results", "results directory")
	flag.IntVar(&o.RebuildCustomers, "rebuild-customers", -1, "customers seeded into Postgres for the rebuild timing (default 1000000; -quick 50000; 0 skips)")
	flag.IntVar(&o.Workers, "workers", 128, "load generator workers (requests in flight at most)")
	flag.IntVar(&o.PGBenchClients, "pgbench-clients", 8, "pgbench client connections")
	flag.DurationVar(&o.PGBenchDuration, "pgbench-duration", 0, "pgbench run length per spread (default 10s; -quick 5s)")
	flag.IntVar(&o.RedisBenchN, "redis-benchmark-n", 0, "redis-benchmark requests (default 500000; -quick 100000)")
	flag.DurationVar(&o.MaxP99, "ramp-max-p99", 50*time.Millisecond, "a ramp stops at the first step whose p99 exceeds this")
	flag.Int64Var(&o.UsageReportRows, "usage-report-rows", 0, "ledger rows of the usage-report scenario's customer (default 10000000; -quick 1000000)")
	flag.IntVar(&o.UsageReportQueries, "usage-report-queries", 200, "timed usage reports per granularity in the usage-report scenario")
	flag.Int64Var(&o.LedgerScaleRows, "ledger-scale-rows", 0, "ledger rows of the ledger-scale scenario over its 6 months (default 50000000; -quick 3000000)")
	flag.IntVar(&o.LedgerScaleQueries, "ledger-scale-queries", 300, "timed rounds of the ledger-scale scenario's reads per phase")
	flag.DurationVar(&o.RebuildTimeout, "rebuild-timeout", 150*time.Second, "stop creditd rebuild after this long and report the rate it reached")
	flag.BoolVar(&o.Keep, "keep", false, "keep the database and Redis keys afterwards")
	flag.StringVar(&ceilingSrv, "ceiling-server", "", "internal: serve the HTTP+EVALSHA ceiling on this address")
	flag.StringVar(&ceilingKey, "ceiling-key", "", "internal: the key the ceiling server reads")
	flag.StringVar(&floorSrv, "floor-server", "", "internal: serve the floors scenario's consume floor on this address")
	flag.BoolVar(&watcher, "edge-watcher", false, "internal: the edge scenario's second process (an evaluator that prints what it answers)")
	flag.Parse()

	if watcher {
		if err := edgeWatch(); err != nil {
			fmt.Fprintln(os.Stderr, "edge watcher:", err)
			os.Exit(1)
		}
		return
	}

	if floorSrv != "" {
		if err := serveFloor(floorSrv); err != nil {
			fmt.Fprintln(os.Stderr, "floor server:", err)
			os.Exit(1)
		}
		return
	}

	if ceilingSrv != "" {
		if err := serveCeiling(ceilingSrv, os.Getenv("REDIS_URL"), ceilingKey); err != nil {
			fmt.Fprintln(os.Stderr, "ceiling server:", err)
			os.Exit(1)
		}
		return
	}
	o.defaults()
	for _, s := range strings.Split(scenarios, ",") {
		if s = strings.TrimSpace(s); s != "" {
			o.Scenarios = append(o.Scenarios, s)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, o)
	if res != nil {
		if werr := writeReport(o, res); werr != nil {
			fmt.Fprintln(os.Stderr, "bench: write report:", werr)
			os.Exit(1)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func (o *Options) defaults() {
	pick := func(d *time.Duration, normal, quick time.Duration) {
		if *d == 0 {
			*d = map[bool]time.Duration{false: normal, true: quick}[o.Quick]
		}
	}
	pick(&o.Duration, 10*time.Second, 4*time.Second)
	pick(&o.StepDuration, 2*time.Second, time.Second)
	pick(&o.LagDuration, 60*time.Second, 8*time.Second)
	pick(&o.PGBenchDuration, 10*time.Second, 5*time.Second)
	pick(&o.MemoryDuration, 3*time.Minute, 30*time.Second)
	pick(&o.MemoryEvery, 15*time.Second, 5*time.Second)
	if o.Customers == 0 {
		o.Customers = map[bool]int{false: 1000, true: 200}[o.Quick]
	}
	if o.RebuildCustomers < 0 {
		o.RebuildCustomers = map[bool]int{false: 1_000_000, true: 50_000}[o.Quick]
	}
	if o.UsageReportRows <= 0 {
		o.UsageReportRows = map[bool]int64{false: 10_000_000, true: 1_000_000}[o.Quick]
	}
	if o.LedgerScaleRows <= 0 {
		o.LedgerScaleRows = map[bool]int64{false: 50_000_000, true: 3_000_000}[o.Quick]
	}
	if o.RedisBenchN == 0 {
		o.RedisBenchN = map[bool]int{false: 500_000, true: 100_000}[o.Quick]
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// run is the whole bench; the results it has when it fails are still
// reported.
func run(ctx context.Context, o Options) (*Results, error) {
	started := time.Now()
	res := &Results{Started: started.UTC(), Options: o, Machine: machine()}
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	redisURL, baseDB, err := services(root)
	if err != nil {
		return nil, err
	}
	logf("redis %s, postgres %s", redact(redisURL), redact(baseDB))
	ropt, err := redis.ParseURL(redisURL)
	if err != nil {
		return nil, fmt.Errorf("REDIS_URL: %w", err)
	}
	rdb := redis.NewClient(ropt)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}

	stamp := started.UTC().Format("20060102t150405")
	runID := "bench" + stamp + fmt.Sprintf("%04x", uuid.New().ID()&0xffff)
	// The Redis prefix is short, as production's "cd" is: key names carry
	// it, and the memory figures (issue 10) should count the keys creditd
	// writes, not the bench's naming. 9 characters keep an idempotency
	// record in Redis's smallest allocation classes (lua/idempotency.go).
	prefix := fmt.Sprintf("b%08x", uuid.New().ID())
	dbName := runID
	res.RunID = runID
	tmp, err := os.MkdirTemp("", "creditd-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)

	probe := &CPUProbe{Extra: map[string]int{}}
	if v, err := redisInfo(ctx, rdb, "server", "process_id"); err == nil {
		var pid int
		fmt.Sscan(v, &pid)
		if isComm(pid, "redis") {
			probe.Redis = pid
		}
	}
	res.Machine.RedisVersion, _ = redisInfo(ctx, rdb, "server", "redis_version")

	logf("building cmd/creditd")
	bin, err := buildCreditd(root, tmp)
	if err != nil {
		return nil, err
	}
	dbURL, err := createDatabase(ctx, baseDB, dbName)
	if err != nil {
		return nil, err
	}
	probe.Postmaster = postmasterPid(ctx, dbURL)
	res.PGSettings = pgSettings(ctx, dbURL)
	defer func() {
		if o.Keep {
			logf("kept database %s and Redis prefix %s", dbName, prefix)
			return
		}
		if err := dropDatabase(context.Background(), baseDB, dbName); err != nil {
			logf("drop database: %v", err)
		}
		if n, err := deletePrefix(context.Background(), rdb, prefix); err != nil {
			logf("delete keys: %v", err)
		} else {
			logf("deleted %d Redis keys of prefix %s", n, prefix)
		}
	}()

	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	pprofAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logf("starting creditd on %s (database %s, prefix %s)", addr, dbName, prefix)
	cd, err := startProc("creditd", bin, []string{"serve"},
		creditdEnv(redisURL, dbURL, prefix, addr, "bench", "CREDITD_PPROF_ADDR="+pprofAddr),
		addr, filepath.Join(tmp, "creditd.log"))
	if err != nil {
		return nil, err
	}
	defer cd.Stop()
	probe.Creditd = cd.Pid()

	b := &Bench{o: o, res: res, rdb: rdb, redisURL: redisURL, dbURL: dbURL, baseDB: baseDB, prefix: prefix, runID: runID,
		addr: addr, probe: probe, tmp: tmp, root: root, pprofAddr: pprofAddr, bin: bin}
	if b.pg, err = pgx.Connect(ctx, dbURL); err != nil {
		return nil, err
	}
	defer b.pg.Close(context.Background())
	if o.needsCustomers() {
		if err := b.seed(ctx); err != nil {
			res.Errors = append(res.Errors, "seed: "+err.Error())
			return res, err
		}
	}
	// The memory census comes first: the run's keys are then the seeding's
	// and its own.
	if o.has("memory") && ctx.Err() == nil {
		b.memory(ctx)
	}
	// The worst allowed input comes before the load scenarios: its bound is
	// what a script call costs Redis, and right after minutes of load the
	// 2-core box is still busy with their tail (persister, autovacuum),
	// which only adds run-queue wait to the calls.
	if o.has("worst") && ctx.Err() == nil {
		b.worst(ctx)
	}
	// Before the load scenarios too: a check's p99 in microseconds is
	// the machine's quiet as much as the evaluator's.
	if o.has("edge") && ctx.Err() == nil {
		b.edge(ctx)
	}
	if o.full() {
		b.ceilings(ctx)
		b.scenarios(ctx)
	}
	if o.has("replica-ack") && ctx.Err() == nil {
		b.replicaAck(ctx)
	}
	if o.has("fleet-scale") && ctx.Err() == nil {
		b.fleetScale(ctx)
	}
	if o.has("pg-statements") && ctx.Err() == nil {
		b.pgStatements(ctx)
	}
	// After pg-statements: the Postgres floor's group is the persister's
	// group size measured there.
	// After pg-statements: the COPY's group is the persister's measured
	// there. Issue 26's true floor needs the ceiling and real ledger rows.
	if o.full() && ctx.Err() == nil {
		b.copyFloor(ctx)
	}
	if o.has("floors") && ctx.Err() == nil {
		b.floors(ctx)
	}
	if o.needsCustomers() {
		b.ledger(ctx)
	}
	// On a stack of its own: it stops its Postgres.
	if o.has("pg-outage") && ctx.Err() == nil {
		b.hotPath(ctx)
	}
	// After the ledger check: its rows are not the load's. Ledger-scale
	// first: it gives the past months partitions of their own, which needs
	// a ledger with no row before this month (usage-report seeds 30 days).
	if o.has("ledger-scale") && ctx.Err() == nil {
		b.ledgerScale(ctx, o.LedgerScaleRows, o.LedgerScaleQueries)
	}
	if o.has("usage-report") && ctx.Err() == nil {
		b.usageReport(ctx, o.UsageReportRows, o.UsageReportQueries)
	}
	cd.Stop()
	probe.Creditd = 0
	if tailLog := strings.TrimSpace(tail(filepath.Join(tmp, "creditd.log"), 1500)); tailLog != "" {
		res.CreditdLogTail = tailLog
	}
	if o.has("rebuild") && o.RebuildCustomers > 0 && ctx.Err() == nil {
		r := runRebuild(ctx, bin, baseDB, dbName+"rb", redisURL, rdb, o.RebuildCustomers, o.RebuildTimeout, probe, logf)
		res.Rebuild = &r
		if r.Error != "" {
			logf("rebuild: %s", r.Error)
		} else {
			logf("rebuild: %d accounts in %.1fs (%.0f/s), %.0f bytes/customer", r.Customers, r.Seconds, r.AccountsPerSecond, r.BytesPerCustomer)
		}
	}
	res.Finished = time.Now().UTC()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		res.Machine.LoadAvgEnd = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	res.computeTargets()
	return res, ctx.Err()
}

// defaultWorstNice is the worst scenario's redis-server nice value: -10 when
// the bench may raise a priority (root), so the 2-core box's other work
// (the bench's own creditd, Postgres, other users) adds less run-queue wait
// to the script times the scenario bounds; the report says which was used.
func defaultWorstNice() int {
	if os.Geteuid() == 0 {
		return -10
	}
	return 0
}
