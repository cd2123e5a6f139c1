package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
)

// The fleet-scale scenario (issue 11, docs/scaling.md): how consume and
// check throughput and CPU per op move from 1 to 3 creditd nodes on one
// Redis Cluster. A private cluster of 3 masters (each with
// fleetReplicas replicas, so money operations wait for a replica as
// `make fleet` does), a fresh database, and creditd nodes added one at a
// time; at each node count, consume then check are ramped to their limit
// and run at 70 % of it. The load generator balances round-robin in the
// client (op i goes to node i mod n, one connection pool per node): no
// proxy process takes CPU from the nodes it measures on a small machine.

const (
	// fleetNodes is the largest node count measured.
	fleetNodes = 3
	// fleetMasters is the cluster's masters (shards).
	fleetMasters = 3
	// fleetReplicas is each master's replicas.
	fleetReplicas = 1
	// fleetCustomers spreads the load over every slot range, and seeds in
	// a second or two.
	fleetCustomers = 300
	// fleetStep and fleetRun are the ramp step and the 70 % run: short,
	// so the scenario stays under two minutes inside `make bench`.
	fleetStep = time.Second
	fleetRun  = 4 * time.Second
	// fleetPoolConns is each node's Postgres pool (pool_max_conns).
	fleetPoolConns = 8
)

// FleetScaleResult is the scenario's outcome.
type FleetScaleResult struct {
	Setting string `json:"setting"`
	// Balancing says how requests reach the nodes.
	Balancing string `json:"balancing"`
	// Counts are the measurements at 1, 2, ... nodes.
	Counts []FleetCount `json:"node_counts"`
	// Storage is what the run left in Postgres per row of the tables a
	// consume writes (the ledger plan in docs/scaling.md).
	Storage []TableSize `json:"storage,omitempty"`
	Error   string      `json:"error,omitempty"`
}

// TableSize is one table's rows and on-disk bytes (indexes and TOAST
// included) at the end of the run.
type TableSize struct {
	Table       string  `json:"table"`
	Rows        int64   `json:"rows"`
	Bytes       int64   `json:"bytes"`
	BytesPerRow float64 `json:"bytes_per_row"`
}

// FleetCount is one node count's consume and check runs.
type FleetCount struct {
	Nodes int `json:"nodes"`
	// Idle is each process's CPU seconds per second with the nodes up and
	// no load: the background work (persisters, sweeps, the cluster's
	// own chatter) a node count costs before any request.
	Idle    CPUSample `json:"idle_cpu_per_second"`
	Consume FleetRun  `json:"consume"`
	Check   FleetRun  `json:"check"`
}

// FleetRun is one operation's ramp and 70 % run at one node count.
type FleetRun struct {
	Max   float64    `json:"max_rate"`
	Steps []Step     `json:"ramp"`
	Run   *RunResult `json:"run,omitempty"`
	// CPU is each process's CPU seconds in the 70 % run (creditd i,
	// redis master i, redis replica i, postgres, the load generator).
	CPU CPUSample `json:"cpu_seconds"`
	// LagSeconds is the largest persister lag any node reported right
	// after the consume run (did Postgres keep up).
	LagSeconds float64 `json:"persister_lag_seconds,omitempty"`
	// ScriptUsecPerOp is the masters' time in scripts per op (INFO
	// commandstats usec of EVALSHA and EVAL, which includes the commands a
	// script calls; those are also counted on their own, so a sum over
	// every command would count them twice). It is wall time: on a busy
	// machine it includes Redis waiting for a core mid-script.
	ScriptUsecPerOp float64 `json:"redis_script_usec_per_op"`
	// RedisCalls is the masters' busiest commands, summed over masters.
	RedisCalls []RedisCalls `json:"redis_calls,omitempty"`
	// PG is the scenario database's transactions (reads included) and
	// rows per op.
	PG *PGStats `json:"postgres,omitempty"`
	// LedgerRowsPerWrite is the run's consumption entries per Postgres
	// transaction that wrote them (rows sharing an xmin were written by
	// one persister group commit).
	LedgerRowsPerWrite float64 `json:"ledger_rows_per_write_transaction,omitempty"`
	// from and to bound the 70 % run (the ledger rows it wrote).
	from, to time.Time
}

// fleetProbes are what a run samples around its 70 % run.
type fleetProbes struct {
	cpu     *CPUProbe
	masters []*redis.Client
	pg      *pgx.Conn
}

// redisStats sums INFO commandstats over the masters.
func (p fleetProbes) redisStats(ctx context.Context) map[string][2]int64 {
	out := map[string][2]int64{}
	for _, m := range p.masters {
		for cmd, v := range commandStats(ctx, m) {
			o := out[cmd]
			out[cmd] = [2]int64{o[0] + v[0], o[1] + v[1]}
		}
	}
	return out
}

// fleetCPU is µs of CPU per acknowledged op by kind of process.
type fleetCPU struct {
	creditd, masters, replicas, postgres, gen, other float64
	// hottestMaster is the busiest master's share of the masters' CPU.
	hottestMaster float64
}

// cpu is r's CPU per acknowledged op by kind of process.
func (r FleetRun) cpu() (fleetCPU, bool) {
	if r.Run == nil || r.Run.OK == 0 {
		return fleetCPU{}, false
	}
	return byKind(r.CPU, 1e6/float64(r.Run.OK)), true
}

// aboveIdle is r's CPU per acknowledged op by kind of process less what
// the processes burn with no load (c.Idle per second over the run's
// length): the marginal cost of an op, which the background work of more
// nodes and a busy machine blur less than the plain figure.
func (c FleetCount) aboveIdle(r FleetRun) (fleetCPU, bool) {
	if r.Run == nil || r.Run.OK == 0 || c.Idle == nil {
		return fleetCPU{}, false
	}
	d := CPUSample{}
	for k, v := range r.CPU {
		d[k] = max(v-c.Idle[k]*r.Run.Seconds, 0)
	}
	return byKind(d, 1e6/float64(r.Run.OK)), true
}

// byKind sums a CPU sample by kind of process, each scaled by per.
func byKind(sample CPUSample, per float64) fleetCPU {
	var c fleetCPU
	hottest := 0.0
	for name, s := range sample {
		v := s * per
		switch {
		case strings.HasPrefix(name, "creditd "):
			c.creditd += v
		case strings.HasPrefix(name, "redis master "):
			c.masters += v
			hottest = max(hottest, v)
		case strings.HasPrefix(name, "redis replica "):
			c.replicas += v
		case name == "postgres":
			c.postgres += v
		case name == "bench (load generator)":
			c.gen += v
		case name == otherKey:
			c.other += v
		}
	}
	if c.masters > 0 {
		c.hottestMaster = hottest / c.masters
	}
	return c
}

// fleetIdle is how long the idle sample of each node count lasts.
const fleetIdle = 2 * time.Second

// short is the servers' part: creditd, masters, replicas, Postgres.
func (c fleetCPU) short() string {
	return fmt.Sprintf("cd %.0f / masters %.0f / replicas %.0f / pg %.0f µs", c.creditd, c.masters, c.replicas, c.postgres)
}

func (c fleetCPU) String() string {
	return fmt.Sprintf("cd %.0f / masters %.0f / replicas %.0f / pg %.0f / gen %.0f / oth %.0f µs",
		c.creditd, c.masters, c.replicas, c.postgres, c.gen, c.other)
}

// fleetScale runs the scenario and stores its result; a failure is
// reported, not fatal to the rest of the bench.
func (b *Bench) fleetScale(ctx context.Context) {
	r := &FleetScaleResult{}
	b.res.FleetScale = r
	t0 := time.Now()
	if err := b.fleetScaleRun(ctx, r); err != nil {
		r.Error = err.Error()
		logf("fleet-scale: %v", err)
	}
	logf("fleet-scale: done in %.0fs", time.Since(t0).Seconds())
}

// fleetScaleRun starts the cluster, the database and the nodes, seeds
// through node 1, and measures each node count; every process it started
// is stopped by PID on the way out.
func (b *Bench) fleetScaleRun(ctx context.Context, r *FleetScaleResult) error {
	dir := filepath.Join(b.tmp, "fleet-cluster")
	cluster, err := startCluster(ctx, dir, fleetMasters, fleetReplicas)
	defer cluster.stop()
	if err != nil {
		return err
	}
	version, _ := redisInfo(ctx, cluster.nodes[0].rdb, "server", "redis_version")
	dbName, dbURL, drop, err := b.scenarioDatabase(ctx, "fleet-scale", "f")
	if err != nil {
		return err
	}
	defer drop()
	prefix := b.prefix + "f"
	seeds := cluster.seeds()
	// Each node's Postgres pool is fleetPoolConns, not the default 16: the
	// machine's Postgres (max_connections 100 by default) also serves the
	// bench's own creditd and whatever else runs here.
	nodeDB := dbURL + map[bool]string{true: "&", false: "?"}[strings.Contains(dbURL, "?")] + "pool_max_conns=" + strconv.Itoa(fleetPoolConns)
	r.Setting = fmt.Sprintf("a private Redis Cluster (redis-server %s, %d masters with %d replica each, no persistence, "+
		"CREDITD_REPLICA_ACKS at its default auto: every money operation waits for one replica), a fresh database (%s) "+
		"on the machine's Postgres (a pool of %d connections per node), %d customers with one grant each, creditd nodes added one at a time (all running while measured); "+
		"ramp steps of %s, runs of %s at 70 %% of each max", version, fleetMasters, fleetReplicas, dbName, fleetPoolConns, fleetCustomers, fleetStep, fleetRun)
	r.Balancing = "round-robin in the load generator (op i to node i mod n, one connection pool of up to " +
		strconv.Itoa(b.o.Workers) + " per node, " + strconv.Itoa(b.o.Workers) + " requests in flight at most): no proxy process shares the CPUs"

	probe := &CPUProbe{Postmaster: b.probe.Postmaster, Extra: map[string]int{}}
	probes := fleetProbes{cpu: probe}
	for i, n := range cluster.nodes {
		probe.Extra[fmt.Sprintf("redis %s %d", n.role, i+1)] = n.Pid()
		if n.role == "master" {
			probes.masters = append(probes.masters, n.rdb)
		}
	}
	if probes.pg, err = pgx.Connect(ctx, dbURL); err != nil {
		return err
	}
	defer probes.pg.Close(context.Background())
	defer func() { r.Storage = tableSizes(context.Background(), probes.pg) }()
	var nodes []*Proc
	defer func() {
		for _, p := range nodes {
			p.Stop()
		}
	}()
	var target *Target
	var apis []*API
	var prevConsume, prevCheck float64
	for _, n := range fleetCounts(b.o.Quick) {
		if ctx.Err() != nil {
			break
		}
		for len(nodes) < n {
			i := len(nodes) + 1
			addr, err := freeAddr()
			if err != nil {
				return err
			}
			p, err := startFleetNode(ctx, b.bin, i, creditdEnv(seeds, nodeDB, prefix, addr, fmt.Sprintf("bench-fleet-%d", i)),
				addr, filepath.Join(b.tmp, fmt.Sprintf("creditd-fleet%d.log", i)))
			if err != nil {
				return err
			}
			nodes = append(nodes, p)
			probe.Extra[fmt.Sprintf("creditd %d", i)] = p.Pid()
			if i == 1 {
				logf("fleet-scale: cluster %s (redis-server %s), creditd node 1 on %s (database %s)", seeds, version, addr, dbName)
				if target, err = fleetSeed(ctx, addr, b.runID+"f"); err != nil {
					return fmt.Errorf("seed: %w", err)
				}
			}
			apis = append(apis, &API{Base: "http://" + addr, HTTP: &http.Client{Timeout: 5 * time.Second}})
		}
		addrs := make([]string, len(nodes))
		for i, p := range nodes {
			addrs[i] = p.Addr
		}
		fc := FleetCount{Nodes: n}
		logf("fleet-scale: %d node(s)", n)
		fleetDrained(ctx, apis, 30*time.Second)
		idle0 := probe.Sample()
		time.Sleep(fleetIdle)
		fc.Idle = probe.Sample().Sub(idle0)
		for k, v := range fc.Idle {
			fc.Idle[k] = v / fleetIdle.Seconds()
		}
		fc.Consume = fleetLoad(ctx, b.o.Workers, addrs, target.consume(false), max(500, 0.6*prevConsume), probes)
		fc.Consume.LagSeconds = fleetLag(apis)
		// Let the persisters drain, so the check run does not pay for it
		// and the run's ledger rows are all in.
		fleetDrained(ctx, apis, 30*time.Second)
		fc.Consume.LedgerRowsPerWrite = rowsPerWrite(ctx, probes.pg, fc.Consume.from, fc.Consume.to)
		fc.Check = fleetLoad(ctx, b.o.Workers, addrs, target.check(false), max(2000, 0.6*prevCheck), probes)
		prevConsume, prevCheck = fc.Consume.Max, fc.Check.Max
		c, _ := fc.Consume.cpu()
		k, _ := fc.Check.cpu()
		logf("fleet-scale: %d node(s): idle %s per s; consume max %.0f/s (%s), check max %.0f/s (%s)", n, byKind(fc.Idle, 1e6), fc.Consume.Max, c, fc.Check.Max, k)
		r.Counts = append(r.Counts, fc)
	}
	return ctx.Err()
}

// fleetCounts are the node counts measured: 1 to fleetNodes, or in a
// -quick run only 1 and fleetNodes (the ends of the curve, in half the
// time).
func fleetCounts(quick bool) []int {
	if quick {
		return []int{1, fleetNodes}
	}
	out := make([]int, fleetNodes)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// startFleetNode starts creditd node n, trying again (3 times, 2 s apart)
// when it exits at start: a Postgres shared with other work can refuse a
// connection for a moment (too many clients).
func startFleetNode(ctx context.Context, bin string, n int, env []string, addr, logPath string) (*Proc, error) {
	var err error
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		if try > 0 {
			logf("fleet-scale: node %d did not start (%v); again in 2 s", n, firstLine(err))
			time.Sleep(2 * time.Second)
		}
		var p *Proc
		if p, err = startProc(fmt.Sprintf("creditd-fleet%d", n), bin, []string{"serve"}, env, addr, logPath); err == nil {
			return p, nil
		}
	}
	return nil, err
}

// firstLine is err's text up to its first line break.
func firstLine(err error) string {
	if err == nil {
		return ""
	}
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// fleetSeed creates the tenant (rate limit lifted), the consume metric's
// rule and the customers, each with one grant, through the node at addr.
func fleetSeed(ctx context.Context, addr, runID string) (*Target, error) {
	api, err := newTenant(addr, runID)
	if err != nil {
		return nil, err
	}
	idem := func(s string) []string { return []string{"Idempotency-Key", runID + "-seed-" + s} }
	if _, err := api.Expect(201, "POST", "/v1/metering-rules",
		map[string]any{"billable_metric_key": metricConsume, "cost_type": "per_unit", "unit_cost": 1}, idem("rule")...); err != nil {
		return nil, err
	}
	customers := make([]Customer, fleetCustomers)
	err = parallel(fleetCustomers, 16, func(i int) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		ext := fmt.Sprintf("fleet-%05d", i)
		a, err := api.Expect(201, "POST", "/v1/customers", map[string]any{"external_id": ext}, idem("cust-"+ext)...)
		if err != nil {
			return err
		}
		var c struct{ ID string }
		if err := a.Decode(&c); err != nil {
			return err
		}
		customers[i] = Customer{Ext: ext, ID: c.ID}
		// A grant no replica acknowledged in time answers 503 with
		// Retry-After 1: retried with its key, as a client would.
		for try := 0; ; try++ {
			a, err = api.Call("POST", "/v1/customers/"+ext+"/credits/grant",
				map[string]any{"credits": grantCredits, "source": "promotional", "reason": "bench seed"}, idem("grant-"+ext)...)
			if err != nil || a.Status != 503 || try == 10 || ctx.Err() != nil {
				break
			}
			time.Sleep(time.Second)
		}
		if err == nil && a.Status != 201 {
			err = fmt.Errorf("grant %s: want 201, got %s", ext, a)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Target{Base: api.Base, Key: api.Key, RunID: runID, Customers: customers, Acks: &Acks{}}, nil
}

// fleetLoad ramps op over the nodes at addrs (round-robin by op number)
// from start, then runs it at 70 % of the max with the CPU probe around it.
func fleetLoad(ctx context.Context, workers int, addrs []string, op opFunc, start float64, probes fleetProbes) FleetRun {
	var fr FleetRun
	clients := make([]*fasthttp.HostClient, len(addrs))
	for i, a := range addrs {
		clients[i] = NewGenerator(a, workers).hc
	}
	rr := func(w *worker, seq uint64) (int, error) {
		w.hc = clients[seq%uint64(len(clients))]
		return op(w, seq)
	}
	g := NewGenerator(addrs[0], workers)
	fr.Steps, fr.Max = g.Ramp(ctx, RampConfig{Start: start, Factor: 1.6, Max: 500_000, StepDur: fleetStep,
		MaxP99: 50 * time.Millisecond, MaxError: 0.01, Pause: 500 * time.Millisecond}, rr, logf)
	if fr.Max <= 0 || ctx.Err() != nil {
		return fr
	}
	time.Sleep(500 * time.Millisecond)
	cs0, pg0 := probes.redisStats(ctx), pgStats(ctx, probes.pg)
	cpu0 := probes.cpu.Sample()
	fr.from = time.Now()
	run := g.Run(ctx, 0.7*fr.Max, fleetRun, rr)
	fr.to = time.Now()
	fr.CPU = probes.cpu.Sample().Sub(cpu0)
	fr.Run = &run
	if ops := float64(run.OK); ops > 0 {
		cs1 := probes.redisStats(ctx)
		fr.RedisCalls = redisDelta(cs0, cs1, ops)
		var usec int64
		for _, cmd := range []string{"evalsha", "eval", "evalsha_ro", "eval_ro"} {
			usec += cs1[cmd][1] - cs0[cmd][1]
		}
		fr.ScriptUsecPerOp = float64(usec) / ops
		// Backends flush their counters about once a second.
		time.Sleep(1200 * time.Millisecond)
		d := pgStats(ctx, probes.pg).sub(pg0, ops)
		fr.PG = &d
	}
	logf("  at %.0f/s (70%% of max %.0f/s): achieved %.0f/s p50 %.3fms p99 %.3fms errors %s",
		0.7*fr.Max, fr.Max, run.Achieved, run.Latency.P50, run.Latency.P99, run.ErrorSummary())
	return fr
}

// rowsPerWrite is the consumption entries created in [from, to) per
// transaction that inserted them (their xmin): the persister's group size.
func rowsPerWrite(ctx context.Context, pg *pgx.Conn, from, to time.Time) float64 {
	var rows, txns int64
	err := pg.QueryRow(ctx, `SELECT count(*), count(DISTINCT xmin::text) FROM ledger_entries
		WHERE type = 'consumption' AND created_at >= $1 AND created_at < $2`, from, to).Scan(&rows, &txns)
	if err != nil || txns == 0 {
		return 0
	}
	return float64(rows) / float64(txns)
}

// tableSizes is the on-disk size per row of the tables a consume writes.
func tableSizes(ctx context.Context, pg *pgx.Conn) []TableSize {
	var out []TableSize
	for _, t := range []string{"ledger_entries", "operations", "webhook_events", "credit_accounts", "credit_blocks"} {
		ts := TableSize{Table: t}
		// A partitioned table's own size is 0: its partitions hold the rows
		// (migrations 033 to 035); pg_partition_tree of a plain table is the
		// table itself.
		err := pg.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+t+"), "+
			"(SELECT COALESCE(sum(pg_total_relation_size(relid)), 0)::bigint FROM pg_partition_tree('"+t+"'))").Scan(&ts.Rows, &ts.Bytes)
		if err != nil {
			continue
		}
		if ts.Rows > 0 {
			ts.BytesPerRow = float64(ts.Bytes) / float64(ts.Rows)
		}
		out = append(out, ts)
	}
	return out
}

// fleetLag is the largest persister lag the nodes report now.
func fleetLag(apis []*API) float64 {
	lag := 0.0
	for _, a := range apis {
		if m, err := a.Metrics(); err == nil {
			lag = max(lag, m["creditd_persister_lag_seconds"])
		}
	}
	return lag
}

// fleetDrained waits until every node reports an empty persister backlog,
// at most limit.
func fleetDrained(ctx context.Context, apis []*API, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		backlog := 0.0
		for _, a := range apis {
			if m, err := a.Metrics(); err == nil {
				backlog += m["creditd_persister_backlog"]
			}
		}
		if backlog == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// clusterNode is one redis-server of the scenario's cluster.
type clusterNode struct {
	*ownRedis
	role string // "master" or "replica", as the cluster assigned it
}

// ownCluster is a private Redis Cluster whose nodes die with the bench
// (Pdeathsig).
type ownCluster struct {
	nodes []*clusterNode
}

// seeds is every node's address, comma-separated (creditd's REDIS_URL).
func (c *ownCluster) seeds() string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr
	}
	return strings.Join(out, ",")
}

// stop ends every node by its PID.
func (c *ownCluster) stop() {
	for _, n := range c.nodes {
		n.Stop()
	}
}

// clusterPort is a port in [15000, 22000) free together with its cluster
// bus port (+10000) and not in taken.
func clusterPort(taken map[int]bool) (int, error) {
	free := func(p int) bool {
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			return false
		}
		ln.Close()
		return true
	}
	for i := 0; i < 200; i++ {
		p := 15000 + int(time.Now().UnixNano()/7%7000)
		if !taken[p] && free(p) && free(p+10000) {
			taken[p] = true
			return p, nil
		}
	}
	return 0, errors.New("no free port pair for a cluster node")
}

// startCluster starts masters*(1+replicas) cluster-enabled redis-servers
// (no persistence) with their files under dir, joins them with
// redis-cli --cluster create, and waits until the cluster is ok and every
// replica is in sync. The cluster it returns holds whatever nodes started,
// so stop is always safe to call.
func startCluster(ctx context.Context, dir string, masters, replicas int) (*ownCluster, error) {
	c := &ownCluster{}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return c, err
	}
	taken := map[int]bool{}
	for i := 0; i < masters*(1+replicas); i++ {
		port, err := clusterPort(taken)
		if err != nil {
			return c, err
		}
		p := strconv.Itoa(port)
		logPath := filepath.Join(dir, "node-"+p+".log")
		rlog, err := os.Create(logPath)
		if err != nil {
			return c, err
		}
		rs := exec.Command("redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-"+p+".conf", "--cluster-node-timeout", "5000",
			// A replica syncs at once, not after the default 5 s wait for others.
			"--repl-diskless-sync-delay", "0")
		rs.Stdout, rs.Stderr = rlog, rlog
		rs.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := rs.Start(); err != nil {
			rlog.Close()
			return c, fmt.Errorf("start redis-server: %w", err)
		}
		addr := "127.0.0.1:" + p
		n := &clusterNode{ownRedis: &ownRedis{Addr: addr, cmd: rs, rdb: redis.NewClient(&redis.Options{Addr: addr}), log: rlog}}
		c.nodes = append(c.nodes, n)
		for k := 0; n.rdb.Ping(ctx).Err() != nil; k++ {
			if k == 100 || ctx.Err() != nil {
				return c, fmt.Errorf("cluster node %s did not answer:\n%s", addr, tail(logPath, 1000))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	args := append([]string{"--cluster", "create"}, strings.Split(c.seeds(), ",")...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return c, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ready := true
		for _, n := range c.nodes {
			info, err := n.rdb.ClusterInfo(ctx).Result()
			repl, rerr := n.rdb.Info(ctx, "replication").Result()
			if err != nil || rerr != nil || !strings.Contains(info, "cluster_state:ok") {
				ready = false
				break
			}
			n.role = "master"
			if strings.Contains(repl, "role:slave") {
				n.role = "replica"
				if !strings.Contains(repl, "master_link_status:up") {
					ready = false
					break
				}
			}
		}
		if ready {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return c, errors.New("cluster not ok (replicas in sync) within 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Masters first, then replicas, each in port order: stable names.
	sort.SliceStable(c.nodes, func(i, j int) bool { return c.nodes[i].role == "master" && c.nodes[j].role != "master" })
	return c, nil
}

// fleetScaleMarkdown writes the scenario's report section.
func fleetScaleMarkdown(w func(string, ...any), r *FleetScaleResult) {
	w("\n## Fleet scale: 1 to %d creditd nodes on Redis Cluster (issue 11)\n\n", fleetNodes)
	w("Consume, then check, ramped to the limit (rate x1.6 per step until p99 > 50 ms, errors > 1 %% or achieved < 90 %% of offered) and run at 70 %% of it, with 1 to %d creditd nodes (-quick: 1 and %d). ", fleetNodes, fleetNodes)
	w("Measured on %s. Balancing: %s. ", r.Setting, r.Balancing)
	w("Every process shares the machine's CPUs, so the curve shows what one machine does, not what N machines do: CPU per op (µs per acknowledged op in the 70 %% run: creditd nodes, Redis masters, Redis replicas, Postgres, the load generator, other processes) is the figure that carries over (docs/scaling.md). ")
	w("Postgres is the machine's shared server: its CPU counts every backend, other databases' work included, so read it only on a quiet machine. ")
	w("Redis script µs/op is the masters' time inside EVALSHA per op (INFO commandstats; wall time, so on a busy machine it includes waiting for a core mid-script). ")
	w("CPU per op above idle subtracts each process's CPU per second with no load (the idle row of each node count: persister polls, sweeps, cluster chatter) over the run's length. ")
	w("The busiest master's share is of the masters' CPU: an account and its outbox partition share one of 32 hash tags, and the masters carry as many tags as hash into their slots. ")
	w("Run alone: `go run ./bench -scenario fleet-scale`.\n\n")
	if r.Error != "" {
		w("**Failed:** %s\n\n", r.Error)
	}
	w("| nodes | op | max /s | run /s | p50 ms | p99 ms | errors | CPU per op | CPU per op above idle | busiest master's share | Redis script µs/op | consumes per persister transaction | persister lag after |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, fc := range r.Counts {
		w("| %d | (idle, no load, CPU per second) | | | | | | %s | | | | | |\n", fc.Nodes, byKind(fc.Idle, 1e6))
		for _, x := range []struct {
			name string
			run  FleetRun
		}{{"consume", fc.Consume}, {"check", fc.Check}} {
			if x.run.Run == nil {
				w("| %d | %s | %s | not run | | | | | | | | | |\n", fc.Nodes, x.name, f0(x.run.Max))
				continue
			}
			c, _ := x.run.cpu()
			a, _ := fc.aboveIdle(x.run)
			lag, rows := "", ""
			if x.name == "consume" {
				lag = fmt.Sprintf("%.2f s", x.run.LagSeconds)
				if x.run.LedgerRowsPerWrite > 0 {
					rows = fmt.Sprintf("%.0f", x.run.LedgerRowsPerWrite)
				}
			}
			w("| %d | %s | %s | %.0f | %.3f | %.3f | %s | %s | %s | %.0f %% | %.0f | %s | %s |\n", fc.Nodes, x.name, f0(x.run.Max), x.run.Run.Achieved,
				x.run.Run.Latency.P50, x.run.Run.Latency.P99, x.run.Run.ErrorSummary(), c, a.short(), 100*c.hottestMaster, x.run.ScriptUsecPerOp, rows, lag)
		}
	}
	fleetStorageMarkdown(w, r)
}

// fleetStorageMarkdown writes the Postgres bytes per row the run left.
func fleetStorageMarkdown(w func(string, ...any), r *FleetScaleResult) {
	if len(r.Storage) == 0 {
		return
	}
	w("\nPostgres on disk after the run (indexes and TOAST included; the tables hold the seeding's rows too):\n\n| table | rows | bytes | bytes per row |\n|---|---|---|---|\n")
	for _, t := range r.Storage {
		w("| %s | %d | %d | %.0f |\n", t.Table, t.Rows, t.Bytes, t.BytesPerRow)
	}
}

// fleetScaleGoal is the scenario's row of the goal table: measured, no goal.
func fleetScaleGoal(r *FleetScaleResult) (now string, measured bool) {
	if r == nil || len(r.Counts) == 0 {
		if r != nil && r.Error != "" {
			return "failed: " + r.Error, false
		}
		return "not measured", false
	}
	var counts, cons, chk []string
	for _, fc := range r.Counts {
		counts = append(counts, strconv.Itoa(fc.Nodes))
		cons = append(cons, f0(fc.Consume.Max))
		chk = append(chk, f0(fc.Check.Max))
	}
	last := r.Counts[len(r.Counts)-1]
	c, _ := last.Consume.cpu()
	now = fmt.Sprintf("max consumes/s with %s nodes: %s; checks/s: %s; CPU per consume at %d nodes: creditd %.0f, Redis masters %.0f, replicas %.0f µs; 3 masters + %d replica each, round-robin client, one 2-core machine",
		strings.Join(counts, " / "), strings.Join(cons, " / "), strings.Join(chk, " / "), last.Nodes, c.creditd, c.masters, c.replicas, fleetReplicas)
	if r.Error != "" {
		now += " (then failed: " + r.Error + ")"
	}
	return now, true
}
