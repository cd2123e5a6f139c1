package main

import (
	"fmt"
	"time"
)

// Goal is one row of issue 10's goal table, computed from the run.
type Goal struct {
	Name string `json:"figure"`
	Goal string `json:"goal"`
	Now  string `json:"now"`
	Met  *bool  `json:"met"` // null: not measured in this run
}

// cpuPerOp is µs of CPU per op of creditd, Redis and Postgres.
type cpuPerOp struct{ creditd, redis, postgres float64 }

func (c cpuPerOp) total() float64 { return c.creditd + c.redis + c.postgres }

func (c cpuPerOp) String() string {
	return fmt.Sprintf("%.0f µs (creditd %.0f, Redis %.0f, Postgres %.0f)", c.total(), c.creditd, c.redis, c.postgres)
}

func perOp(c CPUSample, ops float64) cpuPerOp {
	if ops <= 0 {
		return cpuPerOp{}
	}
	return cpuPerOp{c["creditd"] * 1e6 / ops, c["redis-server"] * 1e6 / ops, c["postgres"] * 1e6 / ops}
}

// runCPU is s's CPU per acknowledged op (or per unit of extra, when
// perExtra) in its 70 % run; ok is false when the scenario did not run.
func (r *Results) runCPU(name string, perExtra bool) (cpuPerOp, float64, bool) {
	s := r.scenario(name)
	if s == nil || s.Run == nil || s.Run.OK == 0 {
		return cpuPerOp{}, 0, false
	}
	ops := float64(s.Run.OK)
	if perExtra {
		ops = float64(s.Run.Extra)
	}
	return perOp(s.CPU, ops), ops / s.Run.Seconds, true
}

// keptUp is whether the persister kept up at max consume (the lag row):
// the CPU figures count only then.
func (r *Results) keptUp() (bool, string) {
	c := r.scenario("consume")
	if c == nil || c.Lag == nil || c.Lag.Error != "" {
		return false, "persister lag not measured"
	}
	if c.Lag.LagSeconds > 1 {
		return false, fmt.Sprintf("persister fell behind (lag %.1f s)", c.Lag.LagSeconds)
	}
	return true, ""
}

// computeTargets fills Goals from the measurements: issue 10's goal table,
// plus issue 9's worst-input row.
func (r *Results) computeTargets() {
	var gs []Goal
	add := func(name, goal, now string, met *bool) {
		gs = append(gs, Goal{Name: name, Goal: goal, Now: now, Met: met})
	}
	none := func(name, goal string) { add(name, goal, "not measured", nil) }
	kept, why := r.keptUp()
	cpuRow := func(name, goal, scenario string, perExtra bool, unit string, limit float64, parts *cpuPerOp) {
		c, rate, ok := r.runCPU(scenario, perExtra)
		if !ok {
			none(name, goal)
			return
		}
		now := fmt.Sprintf("%s per %s at %.0f/s", c, unit, rate)
		met := c.total() <= limit
		if parts != nil {
			met = met && c.creditd <= parts.creditd && c.redis <= parts.redis && c.postgres <= parts.postgres
		}
		if !kept {
			now += "; does not count: " + why
			met = false
		}
		add(name, goal, now, boolp(met))
	}
	cpuRow("consume CPU per op, all processes", "<= 60 µs (creditd <= 30, Redis <= 15, Postgres <= 15)", "consume", false, "consume", 60,
		&cpuPerOp{30, 15, 15})
	cpuRow("check CPU per op", "<= 25 µs", "check", false, "check", 25, nil)
	cpuRow("reserve + commit CPU", "<= 250 µs", "reserve", false, "create+commit", 250, nil)
	cpuRow("usage CPU per event", "<= 60 µs", "usage", true, "event", 60, nil)

	for _, v := range []struct {
		sc, pg string
		want   float64
	}{{"consume", "spread", 4}, {"consume-hot", "hot", 20}} {
		s, p := r.scenario(v.sc), r.pgbench(v.pg)
		name := fmt.Sprintf("consume throughput / Postgres-only (%s)", v.pg)
		goal := fmt.Sprintf(">= %gx", v.want)
		if s == nil || p == nil || p.TPS == 0 {
			none(name, goal)
			continue
		}
		ratio := s.Max / p.TPS
		add(name, goal, fmt.Sprintf("%.0f / %.0f tps = %.2fx", s.Max, p.TPS, ratio), boolp(ratio >= v.want))
	}
	check := r.scenario("check")
	if check != nil && r.RedisBenchmark != nil && r.RedisBenchmark.RPS > 0 {
		ratio := check.Max / r.RedisBenchmark.RPS
		add("check throughput / raw Redis EVALSHA", ">= 0.5x",
			fmt.Sprintf("%.0f / %.0f = %.2fx", check.Max, r.RedisBenchmark.RPS, ratio), boolp(ratio >= 0.5))
	} else {
		none("check throughput / raw Redis EVALSHA", ">= 0.5x")
	}
	if check != nil && check.Run != nil && check.Server != nil {
		add("check p99 in creditd's own histogram at 70 % of max", "p99 <= 1 ms",
			fmt.Sprintf("p99 bucket <= %g ms (%.2f%% of %d checks <= 1 ms) at %.0f/s; client p99 %.3f ms",
				check.Server.P99UpperMS, 100*check.Server.ShareUnder1ms, check.Server.Requests, check.Run.Offered, check.Run.Latency.P99),
			boolp(check.Server.ShareUnder1ms >= 0.99))
	} else {
		none("check p99 in creditd's own histogram at 70 % of max", "p99 <= 1 ms")
	}
	if m := r.Memory; m != nil && m.Error == "" && m.Ops > 0 {
		g := m.Growth
		add("Redis bytes per remembered idempotency key", "<= 100 B, kept exactly the 24 h window",
			fmt.Sprintf("%.0f B (%d consumes at %.0f/s; per-op keys live %.1f h); flat once the window is full: %s",
				g.BytesPerRemembered, m.Ops, m.Run.Achieved, g.WindowSeconds/3600, g.FlatWhy),
			boolp(g.BytesPerRemembered <= 100 && g.Flat && g.WindowSeconds <= 24*3600*1.01))
	} else {
		none("Redis bytes per remembered idempotency key", "<= 100 B, kept exactly the 24 h window")
	}
	switch rb, m := r.Rebuild, r.Memory; {
	case rb != nil && rb.Error == "" && rb.Done >= 100_000:
		add("Redis bytes per customer with 3 blocks", "<= 400 B",
			fmt.Sprintf("%.0f B (INFO used_memory growth over %d rebuilt accounts; one account hash %d B)", rb.BytesPerCustomer, rb.Done, rb.SampleKeyBytes),
			boolp(rb.BytesPerCustomer <= 400))
	case m != nil && m.Error == "" && m.Growth.BytesPerCustomer > 0:
		add("Redis bytes per customer with 3 blocks", "<= 400 B",
			fmt.Sprintf("%.0f B (MEMORY USAGE of %d account hashes and the expiry zsets; one hash %.0f B)", m.Growth.BytesPerCustomer, m.Customers, m.Growth.AccountHashBytes),
			boolp(m.Growth.BytesPerCustomer <= 400))
	default:
		none("Redis bytes per customer with 3 blocks", "<= 400 B")
	}
	if rb := r.Rebuild; rb != nil && rb.Error == "" && rb.AccountsPerSecond > 0 {
		per1M := 1e6 / rb.AccountsPerSecond
		now := fmt.Sprintf("%.1f s (%d accounts in %.1f s, %.0f/s)", per1M, rb.Done, rb.Seconds, rb.AccountsPerSecond)
		if rb.Customers != 1_000_000 || rb.TimedOut {
			now = fmt.Sprintf("%.1f s extrapolated (%d accounts in %.1f s, %.0f/s)", per1M, rb.Done, rb.Seconds, rb.AccountsPerSecond)
		}
		add("rebuild of 1M customers", "<= 30 s", now, boolp(per1M <= 30))
	} else {
		none("rebuild of 1M customers", "<= 30 s")
	}
	const usageName = "usage report of a customer with 10M ledger rows, a month at hour and day granularity (issue 15 item 5)"
	if u := r.UsageReport; u != nil {
		now, met := usageReportGoalRow(u)
		add(usageName, "p99 <= 50 ms", now, met)
	} else {
		none(usageName, "p99 <= 50 ms")
	}
	const scaleReads = "history, overage and usage reads, ledger of 50M rows in 6 monthly partitions against one month (issue 30)"
	const scaleDrop = "retention drop of a month's partition (issue 30)"
	if l := r.LedgerScale; l != nil {
		reads, readsMet, drop, dropMet := ledgerScaleGoalRows(l)
		add(scaleReads, fmt.Sprintf("p50 within %.0f %%", ledgerScaleSlack*100), reads, readsMet)
		add(scaleDrop, fmt.Sprintf("<= %d ms", ledgerScaleDropGoal.Milliseconds()), drop, dropMet)
	} else {
		none(scaleReads, fmt.Sprintf("p50 within %.0f %% (run alone: -scenario ledger-scale)", ledgerScaleSlack*100))
		none(scaleDrop, fmt.Sprintf("<= %d ms (run alone: -scenario ledger-scale)", ledgerScaleDropGoal.Milliseconds()))
	}
	const historyName = "history page filtered by type, 1k to 100k entries (issue 31 item 6)"
	if u := r.UsageReport; u != nil && (len(u.History) > 0 || u.HistoryError != "") {
		if u.HistoryError != "" {
			add(historyName, "flat (p50 within 2x + 1 ms)", "failed: "+u.HistoryError, boolp(false))
		} else {
			now, ok := historyFlat(u.History)
			add(historyName, "flat (p50 within 2x + 1 ms)", now, boolp(ok))
		}
	} else {
		none(historyName, "flat (p50 within 2x + 1 ms)")
	}
	lagName := "persister lag at the end of 60 s at max consume (the CPU figures count only when it keeps up)"
	if c := r.scenario("consume"); c != nil && c.Lag != nil && c.Lag.Error == "" {
		lagName = fmt.Sprintf("persister lag at the end of %.0f s at max consume (the CPU figures count only when it keeps up)", c.Lag.Seconds)
		now := fmt.Sprintf("%.3f s (backlog %d) at %.0f/s offered, %.0f/s achieved", c.Lag.LagSeconds, c.Lag.Backlog, c.Lag.Rate, c.Lag.Run.Achieved)
		met := c.Lag.LagSeconds <= 1
		ledger := false
		if lc := r.Ledger; lc != nil && lc.Error == "" {
			for _, row := range lc.Rows {
				if row.Metric == metricConsume && row.Type == "consumption" && row.Acknowledged != nil {
					now += fmt.Sprintf("; %d ledger rows (%d ops) for %d acknowledged consumes", row.Rows, row.Ops, *row.Acknowledged)
					ledger = *row.Match
				}
			}
		}
		if !ledger {
			now += "; ledger rows vs acknowledged consumes: not equal or not checked"
		}
		add(lagName, "<= 1 s, 0 rows lost or duplicated", now, boolp(met && ledger))
	} else {
		none(lagName, "<= 1 s, 0 rows lost or duplicated")
	}
	const worstName = "worst allowed input: max Redis time per script call, private Redis (issue 9)"
	if w := r.Worst; w != nil && w.Error == "" && w.ScriptRuns > 0 {
		add(worstName, "<= 1 ms",
			fmt.Sprintf("max %d µs (%s), highest phase p99 %d µs, over %d paced calls (SLOWLOG of a redis-server serving only this scenario): "+
				"%d live blocks and %d reservations with %d B metadata each, %d tiers",
				w.MaxUS, w.MaxPhase, w.P99US, w.ScriptRuns, w.Blocks, w.Reservations, w.MetaBytes, w.Tiers),
			boolp(time.Duration(w.MaxUS)*time.Microsecond <= worstBudget))
	} else if w != nil {
		add(worstName, "<= 1 ms", "failed: "+w.Error, boolp(false))
	} else {
		none(worstName, "<= 1 ms")
	}
	const ackName = "replica acknowledgement: consume with CREDITD_REPLICA_ACKS=1 vs 0, private Redis (issue 11)"
	if now, ok := replicaAckGoal(r.ReplicaAck); ok || r.ReplicaAck != nil {
		add(ackName, "measured", now, nil)
	} else {
		none(ackName, "measured")
	}
	const fleetName = "fleet scale: max consume and check with 1 to 3 creditd nodes on a 3-master Redis Cluster (issue 11)"
	if now, ok := fleetScaleGoal(r.FleetScale); ok || r.FleetScale != nil {
		add(fleetName, "measured", now, nil)
	} else {
		none(fleetName, "measured")
	}
	const pgstatName = "Postgres statements per op: pg_stat_statements on a private cluster (issue 10)"
	if now, ok := pgStatementsGoal(r.PGStatements); ok || r.PGStatements != nil {
		add(pgstatName, "measured", now, nil)
	} else {
		none(pgstatName, "measured")
	}
	r.Goals = gs
	r.computeGoals26()
	r.computeGoals27()
	r.computeGoals28()
}
