package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"
)

// The replica-acknowledgement scenario (issue 11): what WAIT after each
// money script costs. A private redis-server master with one replica
// (--replicaof), a creditd of its own on a fresh database, and the consume
// scenario's load (ramp to the limit, then 70 % of it) twice: once with
// CREDITD_REPLICA_ACKS=0 and once with 1, creditd restarted between on the
// same database, keys and customers. Each 70 % run is at its own max, so a
// third run, acks off at the acks-on run's rate, compares latency at equal
// load.

// ackCustomers is how many customers the scenario seeds: enough to spread
// the load over many account hashes, few enough to seed in seconds.
const ackCustomers = 200

// ReplicaAckResult is the scenario's outcome.
type ReplicaAckResult struct {
	Setting string `json:"setting"`
	// Runs are the consume load with acks off (0) and on (1), each ramped
	// and run at 70 % of its max, then acks off at the acks-on run's rate.
	Runs  []ReplicaAckRun `json:"runs"`
	Error string          `json:"error,omitempty"`
}

// ReplicaAckRun is the consume scenario under one CREDITD_REPLICA_ACKS.
type ReplicaAckRun struct {
	Acks string `json:"creditd_replica_acks"`
	// AtRate is the offered rate when the run is not ramped (the
	// equal-load run), else 0.
	AtRate float64        `json:"at_rate,omitempty"`
	Result ScenarioResult `json:"consume"`
	// ReplicaCPUUS is the replica's CPU per consume in the 70 % run.
	ReplicaCPUUS float64 `json:"replica_cpu_us_per_op"`
}

// cost is the runs' figures: acks off and on, each at 70 % of its max,
// and acks off at the acks-on run's rate (equal); ok is false when one did
// not reach its latency run.
func (r *ReplicaAckResult) cost() (off, on, equal *ReplicaAckRun, ok bool) {
	if r == nil || len(r.Runs) != 3 {
		return nil, nil, nil, false
	}
	off, on, equal = &r.Runs[0], &r.Runs[1], &r.Runs[2]
	for _, x := range r.Runs {
		if x.Result.Run == nil || x.Result.Run.OK == 0 {
			return off, on, equal, false
		}
	}
	return off, on, equal, true
}

// replicaAck runs the scenario and stores its result; a failure is
// reported, not fatal to the rest of the bench.
func (b *Bench) replicaAck(ctx context.Context) {
	r := &ReplicaAckResult{}
	b.res.ReplicaAck = r
	if err := b.replicaAckRun(ctx, r); err != nil {
		r.Error = err.Error()
		logf("replica-ack: %v", err)
	}
}

// replicaAckRun starts the stack, seeds it, runs consume with acks off and
// on, and stops every process by PID and drops the database on the way out.
func (b *Bench) replicaAckRun(ctx context.Context, r *ReplicaAckResult) error {
	master, err := startPrivateRedis(ctx, filepath.Join(b.tmp, "redis-ack-master.log"))
	if err != nil {
		return err
	}
	defer master.Stop()
	host, port, _ := net.SplitHostPort(master.Addr)
	// The master starts its first full sync at once, not after Redis' 5 s
	// wait for more replicas.
	if err := master.rdb.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
		return err
	}
	replica, err := startPrivateRedis(ctx, filepath.Join(b.tmp, "redis-ack-replica.log"), "--replicaof", host, port)
	if err != nil {
		return err
	}
	defer replica.Stop()
	if err := waitReplicaOnline(ctx, master); err != nil {
		return err
	}
	version, _ := redisInfo(ctx, master.rdb, "server", "redis_version")

	dbName, dbURL, drop, err := b.scenarioDatabase(ctx, "replica-ack", "a")
	if err != nil {
		return err
	}
	defer drop()
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	prefix := b.prefix + "a"
	redisURL := "redis://" + master.Addr + "/0"
	start := func(acks string) (*Proc, error) {
		return startProc("creditd-ack"+acks, b.bin, []string{"serve"},
			creditdEnv(redisURL, dbURL, prefix, addr, "bench-ack", "CREDITD_REPLICA_ACKS="+acks),
			addr, filepath.Join(b.tmp, "creditd-ack"+acks+".log"))
	}

	// A copy of the bench that drives this stack: its own results (the
	// seeding's figures are not the main run's), only the consume load,
	// no pprof (the main consume run has the profile).
	w := *b
	w.res = &Results{}
	w.o.Customers = ackCustomers
	w.o.Scenarios = []string{"consume"}
	w.rdb, w.prefix, w.addr, w.dbURL, w.redisURL, w.pprofAddr, w.pg = master.rdb, prefix, addr, dbURL, redisURL, "", nil
	w.probe = &CPUProbe{Redis: master.Pid(), Postmaster: b.probe.Postmaster, Extra: map[string]int{"redis-server replica": replica.Pid()}}

	for i, acks := range []string{"0", "1", "0"} {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		w.o.Rate = b.o.Rate
		if i == 2 {
			// Acks off at the acks-on run's offered rate: latency at equal load.
			on := r.Runs[1].Result
			if on.Run == nil {
				break
			}
			w.o.Rate = on.Run.Offered
		}
		cd, err := start(acks)
		if err != nil {
			return err
		}
		w.probe.Creditd = cd.Pid()
		if i == 0 {
			logf("replica-ack: redis-server %s master %s (pid %d), replica %s (pid %d), creditd on %s (database %s)",
				version, master.Addr, master.Pid(), replica.Addr, replica.Pid(), addr, dbName)
			if err := w.seed(ctx); err != nil {
				cd.Stop()
				return fmt.Errorf("seed: %w", err)
			}
		}
		sc := w.target.scenarios()["consume"](false)
		sc.Name = "consume, CREDITD_REPLICA_ACKS=" + acks
		if i == 2 {
			sc.Name += fmt.Sprintf(" at %.0f/s", w.o.Rate)
		}
		sr := w.load(ctx, sc, addr, "POST /v1/entitlements/consume")
		cd.Stop()
		w.probe.Creditd = 0
		run := ReplicaAckRun{Acks: acks, Result: sr}
		if i == 2 {
			run.AtRate = w.o.Rate
		}
		if sr.Run != nil && sr.Run.OK > 0 {
			run.ReplicaCPUUS = sr.CPU["redis-server replica"] * 1e6 / float64(sr.Run.OK)
		}
		r.Runs = append(r.Runs, run)
	}
	r.Setting = fmt.Sprintf("a private redis-server %s master and one replica (--replicaof, no persistence) on this machine, "+
		"a creditd of its own on a fresh database with %d customers (3 blocks each), restarted between the runs; "+
		"CREDITD_REPLICA_ACK_TIMEOUT at its default", version, ackCustomers)
	if off, on, equal, ok := r.cost(); ok {
		logf("replica-ack: max %.0f/s -> %.0f/s, at %.0f/s p50 %.3f -> %.3f ms, p99 %.3f -> %.3f ms, CPU %s -> %s per consume",
			off.Result.Max, on.Result.Max, equal.AtRate, equal.Result.Run.Latency.P50, on.Result.Run.Latency.P50,
			equal.Result.Run.Latency.P99, on.Result.Run.Latency.P99,
			perOp(equal.Result.CPU, float64(equal.Result.Run.OK)), perOp(on.Result.CPU, float64(on.Result.Run.OK)))
	}
	return nil
}

// waitReplicaOnline waits until master counts one connected replica in
// sync, so a WAIT on it can be acknowledged.
func waitReplicaOnline(ctx context.Context, master *ownRedis) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		info, err := master.rdb.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, ",state=online,") {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("replica of %s not online: %v %s", master.Addr, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ratio is on/off, or 0 when off is 0.
func ratio(on, off float64) float64 {
	if off == 0 {
		return 0
	}
	return on / off
}

// replicaAckMarkdown writes the scenario's report section.
func replicaAckMarkdown(w func(string, ...any), r *ReplicaAckResult) {
	w("\n## Replica acknowledgement (issue 11)\n\n")
	w("The consume scenario's load (ramp to the limit, then 70 %% of it) with `CREDITD_REPLICA_ACKS=0` and `=1` (each money script and `WAIT 1 timeout` as one pipeline on the master), then `=0` again at the `=1` run's offered rate: the ratios compare latency and CPU at that equal rate, max throughput between the ramps. ")
	w("Measured on %s. CPU per consume is creditd + master redis-server + Postgres; the replica's is shown apart. ", r.Setting)
	w("Run alone: `go run ./bench -scenario replica-ack`.\n\n")
	if r.Error != "" {
		w("**Failed:** %s\n\n", r.Error)
	}
	w("| CREDITD_REPLICA_ACKS | max consumes/s | 70 %% run at | p50 ms | p99 ms | errors | CPU per consume | replica CPU µs |\n|---|---|---|---|---|---|---|---|\n")
	for _, run := range r.Runs {
		s := run.Result
		maxCol := f0(s.Max)
		if run.AtRate > 0 {
			maxCol = "(not ramped: the =1 run's rate)"
		}
		if s.Run == nil {
			w("| %s | %s | not run | | | %s | | |\n", run.Acks, maxCol, s.Skipped)
			continue
		}
		w("| %s | %s | %.0f/s | %.3f | %.3f | %s | %s | %.0f |\n", run.Acks, maxCol, s.Run.Achieved, s.Run.Latency.P50, s.Run.Latency.P99,
			s.Run.ErrorSummary(), perOp(s.CPU, float64(s.Run.OK)), run.ReplicaCPUUS)
	}
	if off, on, equal, ok := r.cost(); ok {
		w("| on / off (latency and CPU at equal rate) | %.2f | | %.2f | %.2f | | %.2f | |\n", ratio(on.Result.Max, off.Result.Max),
			ratio(on.Result.Run.Latency.P50, equal.Result.Run.Latency.P50), ratio(on.Result.Run.Latency.P99, equal.Result.Run.Latency.P99),
			ratio(perOp(on.Result.CPU, float64(on.Result.Run.OK)).total(), perOp(equal.Result.CPU, float64(equal.Result.Run.OK)).total()))
	}
}

// replicaAckGoal is the scenario's row of the goal table: measured, no goal.
func replicaAckGoal(r *ReplicaAckResult) (now string, measured bool) {
	off, on, equal, ok := r.cost()
	if !ok {
		if r != nil && r.Error != "" {
			return "failed: " + r.Error, false
		}
		return "not measured", false
	}
	cOff, cOn := perOp(equal.Result.CPU, float64(equal.Result.Run.OK)), perOp(on.Result.CPU, float64(on.Result.Run.OK))
	return fmt.Sprintf("acks on vs off: max %.0f vs %.0f consumes/s (x%.2f); at %.0f/s p50 %.3f vs %.3f ms (%+.3f), p99 %.3f vs %.3f ms, "+
		"CPU %.0f vs %.0f µs per consume (x%.2f); private master + 1 replica",
		on.Result.Max, off.Result.Max, ratio(on.Result.Max, off.Result.Max), equal.AtRate,
		on.Result.Run.Latency.P50, equal.Result.Run.Latency.P50, on.Result.Run.Latency.P50-equal.Result.Run.Latency.P50,
		on.Result.Run.Latency.P99, equal.Result.Run.Latency.P99,
		cOn.total(), cOff.total(), ratio(cOn.total(), cOff.total())), true
}
