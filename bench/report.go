package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// Results is everything one run measured; results.json is this, encoded.
type Results struct {
	RunID          string              `json:"run_id"`
	Started        time.Time           `json:"started"`
	Finished       time.Time           `json:"finished"`
	Options        Options             `json:"options"`
	Machine        Machine             `json:"machine"`
	PGSettings     [][]string          `json:"postgres_settings"`
	Seed           *SeedResult         `json:"seed,omitempty"`
	RedisBenchmark *RedisBench         `json:"redis_benchmark,omitempty"`
	Ceiling        *ScenarioResult     `json:"http_evalsha_ceiling,omitempty"`
	PGBench        []PGBench           `json:"pgbench,omitempty"`
	Scenarios      []ScenarioResult    `json:"scenarios"`
	Ledger         *LedgerCheck        `json:"ledger,omitempty"`
	Rebuild        *RebuildResult      `json:"rebuild,omitempty"`
	UsageReport    *UsageReportResult  `json:"usage_report,omitempty"`
	LedgerScale    *LedgerScaleResult  `json:"ledger_scale,omitempty"`
	Worst          *WorstResult        `json:"worst_allowed_input,omitempty"`
	Memory         *MemoryResult       `json:"memory,omitempty"`
	ReplicaAck     *ReplicaAckResult   `json:"replica_ack,omitempty"`
	FleetScale     *FleetScaleResult   `json:"fleet_scale,omitempty"`
	PGStatements   *PGStatementsResult `json:"pg_statements,omitempty"`
	Floors         *FloorsResult       `json:"floors,omitempty"`
	CopyFloor      *CopyFloorRun       `json:"true_floor_ledger_copy,omitempty"`
	HotPath        *HotPathResult      `json:"pg_outage,omitempty"`
	Edge           *EdgeResult         `json:"edge,omitempty"`
	Goals27        []Goal              `json:"goals_issue27,omitempty"`
	Goals28        []Goal              `json:"goals_issue28,omitempty"`
	Goals26        []Goal              `json:"goals_issue26"`
	Goals          []Goal              `json:"goals"`
	Warnings       []string            `json:"warnings,omitempty"`
	Errors         []string            `json:"errors,omitempty"`
	CreditdLogTail string              `json:"creditd_log_tail,omitempty"`
}

// Machine describes where the run happened.
type Machine struct {
	CPUs         int    `json:"cpus"`
	CPUModel     string `json:"cpu_model"`
	GoVersion    string `json:"go_version"`
	Commit       string `json:"commit"`
	RedisVersion string `json:"redis_version"`
	LoadAvg      string `json:"loadavg_at_start"`
	LoadAvgEnd   string `json:"loadavg_at_end"`
}

// SeedResult is the API seeding and the Redis memory it took.
type SeedResult struct {
	Customers        int        `json:"customers"`
	Seconds          float64    `json:"seconds"`
	CallsPerSecond   float64    `json:"calls_per_second"`
	RedisBytesBefore int64      `json:"redis_used_memory_before"`
	RedisBytesAfter  int64      `json:"redis_used_memory_after"`
	BytesPerCustomer float64    `json:"redis_bytes_per_customer"`
	SampleKey        string     `json:"sample_account_key"`
	SampleKeyBytes   int64      `json:"sample_account_key_bytes"`
	SampleKeyFields  int64      `json:"sample_account_key_fields"`
	KeyClasses       []KeyClass `json:"key_classes"`
}

// KeyClass is the memory of one kind of key under the run's prefix.
type KeyClass struct {
	Class            string  `json:"class"`
	Keys             int64   `json:"keys"`
	Bytes            int64   `json:"bytes"`
	BytesPerCustomer float64 `json:"bytes_per_customer"`
}

// ScenarioResult is one scenario: its ramp, its max and its latency run.
type ScenarioResult struct {
	Name    string         `json:"name"`
	Unit    string         `json:"unit"`
	Hot     bool           `json:"hot"`
	Skipped string         `json:"skipped,omitempty"`
	Steps   []Step         `json:"ramp,omitempty"`
	Max     float64        `json:"max_throughput"`
	Run     *RunResult     `json:"run_at_70pct,omitempty"`
	CPU     CPUSample      `json:"cpu_seconds,omitempty"`
	Server  *ServerLatency `json:"server_latency,omitempty"`
	Lag     *LagResult     `json:"persister_lag,omitempty"`
	Redis   []RedisCalls   `json:"redis_commands,omitempty"`
	PG      *PGStats       `json:"postgres,omitempty"`
	Profile *CPUProfile    `json:"creditd_profile,omitempty"`
	// PlainTwin is the plain consume run at this scenario's rate right
	// after it (consume-controlled only): CPU per op depends on the rate
	// (the idle loops' CPU spreads over fewer ops at a lower one), so
	// issue 28's ratio compares the two at the same rate.
	PlainTwin *TwinRun `json:"plain_twin,omitempty"`
}

// TwinRun is a run of another scenario at a given rate, with its CPU.
type TwinRun struct {
	Scenario string    `json:"scenario"`
	Run      RunResult `json:"run"`
	CPU      CPUSample `json:"cpu_seconds"`
}

// ServerLatency is creditd's own duration histogram for the route.
type ServerLatency struct {
	Requests      int64   `json:"requests"`
	ShareUnder1ms float64 `json:"share_at_most_1ms"`
	P50UpperMS    float64 `json:"p50_bucket_upper_ms"`
	P99UpperMS    float64 `json:"p99_bucket_upper_ms"`
}

// LagResult is the persister lag after consuming at max throughput.
type LagResult struct {
	Rate         float64   `json:"offered_rate"`
	Seconds      float64   `json:"seconds"`
	Run          RunResult `json:"run"`
	CPU          CPUSample `json:"cpu_seconds"`
	LagSeconds   float64   `json:"lag_seconds_at_end"`
	Backlog      int64     `json:"backlog_at_end"`
	DrainSeconds float64   `json:"drain_seconds"`
	Error        string    `json:"error,omitempty"`
}

// LedgerCheck compares ledger rows in Postgres with acknowledged calls.
type LedgerCheck struct {
	DrainSeconds    float64     `json:"drain_seconds"`
	FinalLagSeconds float64     `json:"final_lag_seconds"`
	Ambiguous       int64       `json:"ambiguous_calls"`
	Rows            []LedgerRow `json:"rows"`
	Error           string      `json:"error,omitempty"`
}

// LedgerRow is the ledger entries of one metric and type.
type LedgerRow struct {
	Metric       string `json:"billable_metric_key"`
	Type         string `json:"type"`
	Rows         int64  `json:"rows"`
	Ops          int64  `json:"distinct_ops"`
	Keys         int64  `json:"distinct_idempotency_keys"`
	Acknowledged *int64 `json:"acknowledged,omitempty"`
	Match        *bool  `json:"match,omitempty"`
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadAvg = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		m.Commit = strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "status", "--porcelain", "--", "api", "engine", "lua", "persist", "internal", "cmd").Output(); err == nil && len(st) > 0 {
			m.Commit += " (+ uncommitted changes)"
		}
	}
	return m
}

func (r *Results) scenario(name string) *ScenarioResult {
	for i := range r.Scenarios {
		if r.Scenarios[i].Name == name && r.Scenarios[i].Skipped == "" {
			return &r.Scenarios[i]
		}
	}
	return nil
}

func (r *Results) pgbench(name string) *PGBench {
	for i := range r.PGBench {
		if r.PGBench[i].Name == name && r.PGBench[i].Error == "" {
			return &r.PGBench[i]
		}
	}
	return nil
}

func boolp(b bool) *bool { return &b }

// writeReport writes results.json, report.md and the plot under
// o.Out/<time>/, and a copy of the report as o.Out/latest.md.
func writeReport(o Options, r *Results) error {
	if r.Goals == nil {
		r.computeTargets()
	}
	stamp := r.Started.Format("20060102-150405")
	dir := filepath.Join(o.Out, stamp)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "latency_vs_throughput.svg"), []byte(plotSVG(r)), 0o644); err != nil {
		return err
	}
	for i := range r.Scenarios {
		if p := r.Scenarios[i].Profile; p != nil && len(p.raw) > 0 {
			p.File = r.Scenarios[i].Name + ".pprof"
			if err := os.WriteFile(filepath.Join(dir, p.File), p.raw, 0o644); err != nil {
				return err
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(markdown(r, "")), 0o644); err != nil {
		return err
	}
	latest := markdown(r, stamp+"/")
	if err := os.WriteFile(filepath.Join(o.Out, "latest.md"), []byte(latest), 0o644); err != nil {
		return err
	}
	logf("report: %s (and %s)", filepath.Join(dir, "report.md"), filepath.Join(o.Out, "latest.md"))
	return nil
}

func f0(v float64) string { return fmt.Sprintf("%.0f", v) }
func f3(v float64) string { return fmt.Sprintf("%.3f", v) }

func cpuText(c CPUSample, ops float64) string {
	if len(c) == 0 {
		return ""
	}
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		s := fmt.Sprintf("%s %.2f s", k, c[k])
		if ops > 0 {
			s += fmt.Sprintf(" (%.0f µs/op)", c[k]*1e6/ops)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// markdown renders the report; rel prefixes links to files of the run
// directory (for latest.md, which lives one level up).
func markdown(r *Results, rel string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# creditd benchmark %s\n\n", r.Started.Format("2006-01-02 15:04 MST"))
	mode := "default"
	if r.Options.Quick {
		mode = "quick (smoke run: short steps, few customers; figures are indicative)"
	}
	w("Run `%s`: %s mode, %d customers, latency runs of %s at 70%% of each scenario's max, ramp steps of %s, %d load workers. ",
		r.RunID, mode, r.Options.Customers, r.Options.Duration, r.Options.StepDuration, r.Options.Workers)
	w("Machine: %d CPUs (%s), %s, Redis %s, commit %s, load average %s at start, %s at the end. ",
		r.Machine.CPUs, r.Machine.CPUModel, r.Machine.GoVersion, r.Machine.RedisVersion, r.Machine.Commit, r.Machine.LoadAvg, r.Machine.LoadAvgEnd)
	w("Everything (creditd, Redis, Postgres, the load generator, the ceilings) shares these CPUs, on loopback.\n\n")
	w("Reproduce: `make bench` (or `go run ./bench -quick` for a smoke run); raw figures: [results.json](%sresults.json).\n\n", rel)

	r.goals27Markdown(w)
	r.goals26Markdown(w)
	r.goals28Markdown(w)
	w("## Goals of issue 10 and later (kept for comparison; issue 26's table above supersedes its CPU and throughput rows)\n\nCPU per op counts creditd, redis-server and Postgres (all their processes) during each scenario's 70 %% run, per acknowledged op; it counts only when the persister kept up at max consume (the lag row).\n\n")
	w("| figure | goal | now | met |\n|---|---|---|---|\n")
	for _, g := range r.Goals {
		met := "not measured"
		if g.Goal == "measured" && !strings.HasPrefix(g.Now, "not measured") && !strings.HasPrefix(g.Now, "failed") {
			met = "measured (no goal)"
		}
		if g.Met != nil {
			met = map[bool]string{true: "**met**", false: "**missed**"}[*g.Met]
			if f := r.goalCeiling(g.Name); f != "" && !*g.Met {
				met += "; " + f
			}
		}
		w("| %s | %s | %s | %s |\n", g.Name, g.Goal, strings.ReplaceAll(g.Now, "|", "\\|"), met)
	}
	r.floorsMarkdown(w)

	if r.ReplicaAck != nil {
		replicaAckMarkdown(w, r.ReplicaAck)
	}
	if r.FleetScale != nil {
		fleetScaleMarkdown(w, r.FleetScale)
	}
	if r.PGStatements != nil {
		pgStatementsMarkdown(w, r.PGStatements)
	}
	if wr := r.Worst; wr != nil {
		w("\n## Worst allowed input (issue 9, invariant 13)\n\n")
		w("One customer at every cap: %d live blocks and %d active reservations, each with %d bytes of metadata, charged under a rule of %d graduated tiers. ",
			wr.Blocks, wr.Reservations, wr.MetaBytes, wr.Tiers)
		w("Measured on %s. ", wr.Setting)
		w("Redis time per script call from SLOWLOG (slowlog-log-slower-than 0, this scenario's keys only); max is one call and can be the machine taking the core mid-command, p99 and p50 are the cost. ")
		w("Redis CPU per call is the redis-server main thread's CPU time over the phase (schedstat; every command, scripts or not) divided by the phase's script calls; in-command is INFO commandstats usec per script call; run-queue wait is how long Redis was ready but had no core; the request columns are the most CPU and wait Redis had within one request of the phase (all its commands), and the slowest call's request columns are Redis's CPU and wait within the request that made the phase's slowest script call: when that CPU is below the call's max, the call spent the rest without a core. ")
		w("Run alone: `go run ./bench -scenario worst`.\n\n")
		if wr.Error != "" {
			w("**Failed:** %s\n\n", wr.Error)
		}
		w("| requests | script calls | max us | p99 us | p50 us | money scripts | their p50 us | Redis CPU us/call | in-command us/call | run-queue wait us | one request: Redis CPU / wait us | slowest call's request: Redis CPU / wait us | slowest other command |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, p := range wr.Phases {
			w("| %s | %d | %d | %d | %d | %d | %d | %.0f | %.0f | %d | %d / %d | %d / %d | %s %d us |\n", p.Name, p.Calls, p.MaxUS, p.P99US, p.P50US, p.MoneyCalls, p.MoneyP50US,
				p.CPUUSPerCall, p.CmdUSPerCall, p.WaitUS, p.RequestMaxCPUUS, p.RequestMaxWaitUS, p.MaxCallCPUUS, p.MaxCallWaitUS, p.TopCmd, p.TopCmdUS)
		}
		w("\nMax %d us per script call (%s), highest phase p99 %d us; slowest non-script command of the run %s %d us (HGETALL is the snapshot read of the whole hash); account hash %d bytes. Caps refused as they should: %s.\n",
			wr.MaxUS, wr.MaxPhase, wr.P99US, wr.ReadMaxCmd, wr.ReadMaxUS, wr.HashBytes, strings.Join(wr.Refusals, "; "))
		for _, im := range wr.Imports {
			w("\nImport of %d customers x %d blocks: %.2f s (%d created, %d errors).\n", im.Customers, im.Blocks, im.Seconds, im.Created, im.Errors)
		}
	}

	w("\n## Throughput and latency\n\n")
	w("Max = highest achieved rate of the ramp (rate x%.1f per %s step until p99 > %s, errors > 1%% or achieved < 90%% of offered). ",
		1.6, r.Options.StepDuration, r.Options.MaxP99)
	w("Latency is measured by the client from each op's *intended* send time (open loop), at 70%% of max, over %s.\n\n", r.Options.Duration)
	w("| scenario | unit | max /s | run /s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | errors | CPU per op |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	row := func(s *ScenarioResult) {
		if s.Skipped != "" {
			w("| %s | %s | skipped: %s | | | | | | | | |\n", s.Name, s.Unit, strings.ReplaceAll(s.Skipped, "|", "\\|"))
			return
		}
		if s.Run == nil {
			w("| %s | %s | %s | | | | | | | | |\n", s.Name, s.Unit, f0(s.Max))
			return
		}
		l := s.Run.Latency
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Name, s.Unit, f0(s.Max), f0(s.Run.Achieved),
			f3(l.P50), f3(l.P90), f3(l.P99), f3(l.P999), f3(l.Max), s.Run.ErrorSummary(), shortCPU(s.CPU, float64(s.Run.OK)))
	}
	if r.Ceiling != nil {
		row(r.Ceiling)
	}
	for i := range r.Scenarios {
		row(&r.Scenarios[i])
	}
	for i := range r.Scenarios {
		if s := &r.Scenarios[i]; strings.HasPrefix(s.Name, "consume-multi") && s.Run != nil && s.Run.OK > 0 {
			w("\n%s, CPU per item (%d items per consume): %s\n", s.Name, multiItems, shortCPU(s.CPU, float64(s.Run.OK)*multiItems))
		}
		if s := &r.Scenarios[i]; strings.HasPrefix(s.Name, "gauge-lease") && s.Run != nil && s.Run.OK > 0 {
			// An op is a leased increment and one renew of its lease: two
			// requests, so per renew is an upper bound (it carries the
			// increment) and per request the average of the two.
			w("\n%s, CPU per renew (with its leased increment): %s; per request (increment or renew): %s\n", s.Name,
				shortCPU(s.CPU, float64(s.Run.OK)), shortCPU(s.CPU, 2*float64(s.Run.OK)))
		}
	}
	w("\nCPU per op: µs of CPU per acknowledged op in the 70%% run, for creditd (cd), redis-server (rd), Postgres (pg), the load generator (gen), the ceiling server (ce), and every other process on the machine (oth: other work sharing these 2 CPUs during the run). Redis and Postgres are the machine's shared servers, so their figures include any other client's work.\n")
	w("\n### Where the work goes (per acknowledged op, during the 70%% run)\n\n| scenario | Redis commands (calls/op, µs/call) | Postgres commits/op | rows inserted/op | rows updated/op |\n|---|---|---|---|---|\n")
	profRow := func(s *ScenarioResult) {
		if s == nil || s.Run == nil || (len(s.Redis) == 0 && s.PG == nil) {
			return
		}
		var rc []string
		for _, c := range s.Redis {
			if c.CallsPerOp >= 0.01 {
				rc = append(rc, fmt.Sprintf("%s %.2f x %.0f µs", c.Command, c.CallsPerOp, c.UsecPerCall))
			}
		}
		pgc, pgi, pgu := "", "", ""
		if s.PG != nil {
			pgc, pgi, pgu = fmt.Sprintf("%.2f", s.PG.CommitsPerOp), fmt.Sprintf("%.2f", s.PG.InsertedPerOp), fmt.Sprintf("%.2f", s.PG.UpdatedPerOp)
		}
		w("| %s | %s | %s | %s | %s |\n", s.Name, strings.Join(rc, "; "), pgc, pgi, pgu)
	}
	profRow(r.Ceiling)
	for i := range r.Scenarios {
		profRow(&r.Scenarios[i])
	}
	profileSection(w, r, rel)
	tablesSection(w, r)
	for _, s := range r.Scenarios {
		if s.Server != nil {
			w("\ncreditd's own histogram for `%s` during its run: %.2f%% of %d requests took <= 1 ms; p50 bucket <= %g ms, p99 bucket <= %g ms.\n",
				s.Name, 100*s.Server.ShareUnder1ms, s.Server.Requests, s.Server.P50UpperMS, s.Server.P99UpperMS)
		}
	}
	for _, s := range r.Scenarios {
		if s.Name == "usage" && s.Run != nil && s.Run.OK > 0 {
			w("\nUsage: %.0f events/s charged in the run (%d events in %d calls).\n", float64(s.Run.Extra)/s.Run.Seconds, s.Run.Extra, s.Run.OK)
		}
	}
	w("\n![p99 latency vs offered rate](%slatency_vs_throughput.svg)\n", rel)

	w("\n## Ceilings and the alternative\n\n")
	if rb := r.RedisBenchmark; rb != nil {
		if rb.Error != "" {
			w("- raw Redis: %s\n", rb.Error)
		} else {
			w("- raw Redis, `%s`: **%.0f calls/s**, p50 %.3f ms, p99 %.3f ms (redis-server CPU %.2f s).\n", rb.Command, rb.RPS, rb.P50MS, rb.P99MS, rb.CPU["redis-server"])
		}
	}
	if c := r.Ceiling; c != nil && c.Skipped == "" {
		w("- HTTP + one EVALSHA (minimal fasthttp server in bench/, go-redis, pool 64): **%.0f requests/s** max.\n", c.Max)
	}
	for _, p := range r.PGBench {
		if p.Error != "" {
			w("- Postgres-only consume (%s): %s\n", p.Name, p.Error)
			continue
		}
		w("- Postgres-only consume, pgbench %s (%d accounts, %d clients, %.0f s): **%.0f tps**, latency avg %.2f ms, failed %d; CPU %s.\n",
			p.Name, p.Accounts, p.Clients, p.Seconds, p.TPS, p.LatencyMS, p.Failed, cpuText(p.CPU, 0))
	}
	if len(r.PGBench) > 0 {
		w("\n  pgbench script (`id` is `random(1, :accounts)` spread, `1` hot):\n\n```sql\n%s```\n", r.PGBench[0].ScriptText)
	}
	if len(r.PGSettings) > 0 {
		var s []string
		for _, kv := range r.PGSettings {
			s = append(s, kv[0]+"="+kv[1])
		}
		w("\n  Postgres settings: %s.\n", strings.Join(s, ", "))
	}

	if c := r.scenario("consume"); c != nil && c.Lag != nil {
		l := c.Lag
		w("\n## Persister lag\n\nConsume at %.0f/s offered for %.0f s (achieved %.0f/s, p99 %.2f ms, errors %s): at the end `creditd_persister_lag_seconds` = **%.3f s**, backlog %d; the backlog drained in %.1f s. CPU: %s.\n",
			l.Rate, l.Seconds, l.Run.Achieved, l.Run.Latency.P99, l.Run.ErrorSummary(), l.LagSeconds, l.Backlog, l.DrainSeconds, cpuText(l.CPU, float64(l.Run.OK)))
		if l.Error != "" {
			w("\nError: %s\n", l.Error)
		}
	}
	if lc := r.Ledger; lc != nil {
		w("\n## Ledger vs acknowledged (after drain)\n\nDrained in %.1f s, final lag %.3f s; calls without an answer (timeouts: outcome unknown): %d.\n\n", lc.DrainSeconds, lc.FinalLagSeconds, lc.Ambiguous)
		w("| metric | type | rows | distinct ops | distinct idempotency keys | acknowledged | equal |\n|---|---|---|---|---|---|---|\n")
		for _, row := range lc.Rows {
			ack, eq := "", ""
			if row.Acknowledged != nil {
				ack = fmt.Sprint(*row.Acknowledged)
				eq = map[bool]string{true: "yes", false: "**no**"}[*row.Match]
			}
			w("| %s | %s | %d | %d | %d | %s | %s |\n", row.Metric, row.Type, row.Rows, row.Ops, row.Keys, ack, eq)
		}
		if lc.Error != "" {
			w("\nError: %s\n", lc.Error)
		}
	}
	if s := r.Seed; s != nil {
		w("\n## Redis memory per customer (API-seeded)\n\n%d customers seeded through the API (create + 3 grants each, %.0f calls/s): INFO used_memory grew %.0f bytes per customer; ",
			s.Customers, s.CallsPerSecond, s.BytesPerCustomer)
		w("this includes the 24 h idempotency records of the seeding calls. One account hash with 3 blocks (`%s`, %d fields): MEMORY USAGE %d bytes.\n\n", s.SampleKey, s.SampleKeyFields, s.SampleKeyBytes)
		w("| key kind | keys | bytes | bytes per customer |\n|---|---|---|---|\n")
		for _, k := range s.KeyClasses {
			w("| %s | %d | %d | %.0f |\n", k.Class, k.Keys, k.Bytes, k.BytesPerCustomer)
		}
	}
	if m := r.Memory; m != nil {
		memoryMarkdown(w, m)
	}
	if u := r.UsageReport; u != nil {
		usageReportMarkdown(w, u)
	}
	if l := r.LedgerScale; l != nil {
		ledgerScaleMarkdown(w, l)
	}
	if rb := r.Rebuild; rb != nil {
		w("\n## Rebuild\n\n")
		if rb.Error != "" {
			w("Error: %s\n", rb.Error)
		} else {
			w("%d accounts with 3 blocks each COPYed into a fresh database (%.1f s), then `creditd rebuild` into a fresh prefix: **%.1f s, %.0f accounts/s**; Redis grew **%.0f bytes per customer** (INFO used_memory over the accounts rebuilt; shared Redis, so others' keys move it too), one account hash %d bytes; %d account keys loaded. CPU: %s.\n\n`%s`\n",
				rb.Customers, rb.SeedSeconds, rb.Seconds, rb.AccountsPerSecond, rb.BytesPerCustomer, rb.SampleKeyBytes, rb.KeysLoaded, cpuText(rb.CPU, 0), rb.Output)
		}
	}
	if len(r.Warnings)+len(r.Errors) > 0 {
		w("\n## Problems\n\n")
		for _, e := range r.Errors {
			w("- error: %s\n", e)
		}
		for _, e := range r.Warnings {
			w("- warning: %s\n", e)
		}
	}
	return b.String()
}

func shortCPU(c CPUSample, ops float64) string {
	if ops <= 0 || len(c) == 0 {
		return ""
	}
	abbrev := map[string]string{"creditd": "cd", "redis-server": "rd", "postgres": "pg", "bench (load generator)": "gen", "ceiling server": "ce", otherKey: "oth"}
	var parts []string
	for _, k := range []string{"creditd", "ceiling server", "redis-server", "postgres", "bench (load generator)", otherKey} {
		if v, ok := c[k]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f", abbrev[k], v*1e6/ops))
		}
	}
	return strings.Join(parts, " / ") + " µs"
}

// plotSVG draws p99 latency (log scale) against offered rate for every
// scenario's ramp steps and its 70 % run.
func plotSVG(r *Results) string {
	type series struct {
		name string
		pts  [][2]float64
	}
	var all []series
	addSeries := func(s *ScenarioResult) {
		if s == nil || s.Skipped != "" {
			return
		}
		var pts [][2]float64
		for _, st := range s.Steps {
			pts = append(pts, [2]float64{st.Offered, math.Max(st.Latency.P99, 0.01)})
		}
		if s.Run != nil {
			pts = append(pts, [2]float64{s.Run.Offered, math.Max(s.Run.Latency.P99, 0.01)})
		}
		sort.Slice(pts, func(i, j int) bool { return pts[i][0] < pts[j][0] })
		if len(pts) > 0 {
			all = append(all, series{s.Name, pts})
		}
	}
	addSeries(r.Ceiling)
	for i := range r.Scenarios {
		addSeries(&r.Scenarios[i])
	}
	const W, H, L, R, T, B = 900, 520, 70, 220, 40, 50
	maxX, minY, maxY := 1.0, 0.1, 10.0
	for _, s := range all {
		for _, p := range s.pts {
			maxX = math.Max(maxX, p[0])
			minY = math.Min(minY, p[1])
			maxY = math.Max(maxY, p[1])
		}
	}
	maxX = niceCeil(maxX)
	lo, hi := math.Floor(math.Log10(minY)), math.Ceil(math.Log10(maxY))
	x := func(v float64) float64 { return L + v/maxX*(W-L-R) }
	y := func(v float64) float64 { return H - B - (math.Log10(v)-lo)/(hi-lo)*(H-T-B) }
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	w(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	w(`<text x="%d" y="22" font-size="15">creditd: p99 latency vs offered rate (client side, open loop)</text>`+"\n", L)
	for e := lo; e <= hi; e++ {
		v := math.Pow(10, e)
		w(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", L, W-R, y(v), y(v))
		w(`<text x="%d" y="%.1f" text-anchor="end">%g ms</text>`+"\n", L-6, y(v)+4, v)
	}
	if 1 >= math.Pow(10, lo) && 1 <= math.Pow(10, hi) {
		w(`<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#c00" stroke-dasharray="4 3"/>`+"\n", L, W-R, y(1), y(1))
		w(`<text x="%d" y="%.1f" fill="#c00">1 ms target</text>`+"\n", W-R-70, y(1)-4)
	}
	for i := 0; i <= 5; i++ {
		v := maxX * float64(i) / 5
		w(`<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/>`+"\n", x(v), x(v), T, H-B)
		w(`<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(v), H-B+16, humanRate(v))
	}
	w(`<text x="%d" y="%d" text-anchor="middle">offered rate (ops/s)</text>`+"\n", (W-R+L)/2, H-12)
	w(`<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", L, T, W-L-R, H-T-B)
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#000000"}
	for i, s := range all {
		c := colors[i%len(colors)]
		var pts []string
		for _, p := range s.pts {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(p[0]), y(p[1])))
		}
		w(`<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		for _, p := range s.pts {
			w(`<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(p[0]), y(p[1]), c)
		}
		ly := T + 10 + i*18
		w(`<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", W-R+15, W-R+35, ly, ly, c)
		w(`<text x="%d" y="%d">%s</text>`+"\n", W-R+40, ly+4, s.name)
	}
	w("</svg>\n")
	return b.String()
}

func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func humanRate(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%gk", math.Round(v/100)/10)
	}
	return fmt.Sprintf("%.0f", v)
}
