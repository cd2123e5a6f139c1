// Command chaos is `make chaos` (issues 11 and 25): it starts a fleet of
// its own (scripts/fleet.sh: 3 creditd nodes behind HAProxy on a Redis
// Cluster of 3 masters + 3 replicas with AOF everysec, on a private
// Postgres it initdbs and starts itself), drives mixed money load and
// checks through the balancer while it kills -9 creditd nodes and Redis
// masters and starts them again (polling every node's /readyz and
// measuring each shard's availability during each promotion), makes one
// Redis master refuse writes for a few seconds and stops Postgres for a
// while; then it drains and checks against Postgres that no acknowledged
// operation was lost or applied twice, that the books balance for every
// customer, and that one API key's rate limit held across the nodes. Each
// run writes bench/results/chaos-<time>.md and .json; the command exits 1
// when a run fails.
//
//	go run ./bench/chaos [-runs 3] [-failovers 3] [-rate 150] [-workers 16] [-check-rate 40]
//	    [-write-refusal 5s] [-postgres-outage 30s] [-out bench/results]
//
// With -upgrade it is `make upgrade-test` instead (upgrade.go): a rolling
// upgrade of the fleet under the same load, node by node, from -from
// (default deploy/previous-release) to -to (default the working tree),
// checked as strictly; its reports are bench/results/upgrade-<time>.md.
//
//	go run ./bench/chaos -upgrade [-from COMMIT] [-to COMMIT] [-runs 1] [-reserve 20] [-settle 4s]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// Options are the command-line settings.
type Options struct {
	Runs      int
	Failovers int
	Workers   int
	Rate      float64
	Customers int
	Settle    time.Duration
	NodeDown  time.Duration
	RateLimit int
	Burst     int
	Flood     time.Duration
	// ReplicaStall stops the last cycle's replica this long before its
	// master is killed (0: every failover is a plain kill -9).
	ReplicaStall time.Duration
	// WriteRefusal is how long one Redis master refuses writes
	// (maxmemory under its use, noeviction); PostgresOutage how long the
	// run's Postgres is down (issue 25; 0: left out).
	WriteRefusal   time.Duration
	PostgresOutage time.Duration
	// CheckRate is the GET /v1/entitlements/check calls per second sent
	// beside the money load (0: none).
	CheckRate float64
	// Upgrade runs `make upgrade-test` (upgrade.go) instead of the chaos:
	// From and To name its releases ("": deploy/previous-release and the
	// working tree); Reserve is the load's share of reserve+commit pairs.
	Upgrade  bool
	From, To string
	Reserve  int
	Out      string
	Keep     bool
	Root     string
}

func main() {
	var o Options
	flag.IntVar(&o.Runs, "runs", envInt("CHAOS_RUNS", 3), "runs in a row, each on a fresh fleet; stops at the first failure (env CHAOS_RUNS)")
	flag.IntVar(&o.Failovers, "failovers", 3, "chaos cycles per run: each kills -9 one creditd node and one Redis master (at least 3 for issue 11)")
	flag.IntVar(&o.Workers, "workers", 16, "money load workers")
	flag.Float64Var(&o.Rate, "rate", 150, "money operations per second offered by all workers together (first attempts)")
	flag.IntVar(&o.Customers, "customers", 40, "customers the load spreads over")
	flag.DurationVar(&o.Settle, "settle", 4*time.Second, "load without chaos before each cycle and after the last one")
	flag.DurationVar(&o.NodeDown, "node-down", 4*time.Second, "how long a killed creditd node stays down at least")
	flag.IntVar(&o.RateLimit, "rate-limit", 50, "R: requests per second of the rate-limited API key flooded during the chaos")
	flag.IntVar(&o.Burst, "burst", 10, "the rate-limited key's burst")
	flag.DurationVar(&o.Flood, "flood", 10*time.Second, "length of the rate-limit flood")
	flag.DurationVar(&o.ReplicaStall, "replica-stall", 0, "the last cycle stops its replica (SIGSTOP) this long before killing the master, so the failover certainly loses writes the persister may have copied (0: off)")
	flag.DurationVar(&o.WriteRefusal, "write-refusal", 5*time.Second, "after the failovers, one Redis master refuses writes this long (CONFIG SET maxmemory under its use, noeviction; 0: off)")
	flag.DurationVar(&o.PostgresOutage, "postgres-outage", 60*time.Second, "then the run's private Postgres is down this long (SIGQUIT, as pg_ctl stop -m immediate; 0: off)")
	flag.Float64Var(&o.CheckRate, "check-rate", 40, "GET /v1/entitlements/check calls per second beside the money load, to measure the read path during the faults")
	flag.BoolVar(&o.Upgrade, "upgrade", false, "make upgrade-test: a rolling upgrade under load from -from to -to instead of the chaos (the fault flags are ignored)")
	flag.StringVar(&o.From, "from", "", "with -upgrade: the commit the fleet starts on (default: deploy/previous-release)")
	flag.StringVar(&o.To, "to", "", "with -upgrade: the commit the nodes are replaced with (default: the working tree)")
	flag.IntVar(&o.Reserve, "reserve", 0, "percent of the load's operations that reserve a reservation and commit it (default 20 with -upgrade, else 0)")
	flag.StringVar(&o.Out, "out", "bench/results", "directory of the reports")
	flag.BoolVar(&o.Keep, "keep", false, "keep the fleet's data directory and database even when the run passes (a failing run keeps them always)")
	flag.Parse()
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
	o.Root = root
	if !filepath.IsAbs(o.Out) {
		o.Out = filepath.Join(root, o.Out)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.Upgrade {
		os.Exit(upgradeRuns(ctx, o))
	}

	for i := 1; i <= o.Runs; i++ {
		logf("run %d of %d", i, o.Runs)
		r := runOnce(ctx, o)
		md, js, err := writeReport(o.Out, r)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos: write report:", err)
			os.Exit(1)
		}
		logf("run %d: %s (report %s, %s)", i, r.Verdict(), md, js)
		if !r.Pass() {
			fmt.Fprintf(os.Stderr, "chaos: run %d of %d FAILED; see %s\n", i, o.Runs, md)
			os.Exit(1)
		}
	}
	logf("%d runs in a row passed", o.Runs)
}

// upgradeRuns runs o.Runs upgrades in a row and returns the exit status.
func upgradeRuns(ctx context.Context, o Options) int {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["reserve"] {
		o.Reserve = 20
	}
	if !set["runs"] && os.Getenv("CHAOS_RUNS") == "" {
		o.Runs = 1
	}
	for i := 1; i <= o.Runs; i++ {
		logf("upgrade run %d of %d", i, o.Runs)
		u := runUpgrade(ctx, o)
		md, js, err := writeUpgradeReport(o.Out, u)
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaos: write report:", err)
			return 1
		}
		logf("upgrade run %d: %s (report %s, %s)", i, u.Verdict(), md, js)
		if !u.Pass() {
			fmt.Fprintf(os.Stderr, "chaos: upgrade run %d of %d FAILED; see %s\n", i, o.Runs, md)
			return 1
		}
	}
	return 0
}

// envInt is the integer in environment variable name, or def.
func envInt(name string, def int) int {
	var n int
	if v := os.Getenv(name); v != "" {
		if _, err := fmt.Sscan(v, &n); err == nil && n > 0 {
			return n
		}
	}
	return def
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s chaos: "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
}

// moduleRoot is the directory of go.mod, found upwards from the working
// directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("go.mod not found above the working directory")
		}
		dir = parent
	}
}
