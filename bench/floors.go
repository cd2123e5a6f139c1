package main

import (
	"fmt"
	"sort"
	"strings"
)

// floorsMarkdown writes what is left of each missed CPU and latency goal
// of issue 10 and what this box allows at all: issue 10 asks, for a goal
// not met, for the profile that names what is left and why it cannot go
// lower here. The floor is the ceiling server (bench/ceilings.go): a
// fasthttp handler that makes one go-redis round trip to a one-line
// script and writes a fixed body, on the same 2 cores, measured by the
// same load generator. No creditd request can cost less than that: it
// reads the same request, makes at least that round trip and writes a
// response. When the run has the floors scenario (bench/workfloors.go),
// each operation's CPU is then set against per-component floors for the
// same durable work (floorTables).
func (r *Results) floorsMarkdown(w func(string, ...any)) {
	c := r.Ceiling
	if c == nil || c.Run == nil || c.Run.OK == 0 {
		if tables := r.floorTables(); len(tables) > 0 || r.Floors != nil {
			w("\n### What is left over the ceiling server (issue 10)\n")
			r.floorsScenarioMarkdown(w, tables)
		}
		return
	}
	ops := float64(c.Run.OK)
	srv := c.CPU["ceiling server"] * 1e6 / ops
	rd := c.CPU["redis-server"] * 1e6 / ops
	w("\n### What is left over the ceiling server (issue 10)\n\n")
	w("The ceiling server: one HTTP request, one Redis round trip to a one-line script, a fixed reply (with one COPYed ledger row, issue 26's true floor above). ")
	w("At its 70 %% run (%.0f/s) it costs **%.0f µs of CPU per request in the server and %.0f µs in Redis**, p99 %.3f ms", c.Run.Achieved, srv, rd, c.Run.Latency.P99)
	if rb := r.RedisBenchmark; rb != nil && rb.RPS > 0 {
		w("; its max, %.0f/s, is **%.2fx raw Redis EVALSHA** (%.0f/s from redis-benchmark with no HTTP at all)", c.Max, c.Max/rb.RPS, rb.RPS)
	}
	w(".\n\n")

	var rows []string
	if s := r.scenario("check"); s != nil && s.Run != nil && s.Run.OK > 0 {
		cp := perOp(s.CPU, float64(s.Run.OK))
		line := fmt.Sprintf("- **check**: %.0f µs (creditd %.0f, Redis %.0f, Postgres %.0f) against the ceiling server's %.0f + %.0f µs: creditd spends %.0f µs over a bare round trip (its key, tenant, customer and rule lookups from in-process caches, the JSON reply, metrics and the access log).",
			cp.total(), cp.creditd, cp.redis, cp.postgres, srv, rd, cp.creditd-srv)
		if rb := r.RedisBenchmark; rb != nil && rb.RPS > 0 {
			line += fmt.Sprintf(" Throughput: the goal, 0.5x raw EVALSHA, is %.0f/s; the ceiling server itself reaches %.2fx, so on this box the goal is above what any HTTP service reaches.", 0.5*rb.RPS, c.Max/rb.RPS)
		}
		line += fmt.Sprintf(" p99 <= 1 ms at 70 %% load: the ceiling server's own client p99 at its 70 %% run is %.3f ms (two cores shared by the load generator, the server and Redis).", c.Run.Latency.P99)
		rows = append(rows, line)
	}
	for _, v := range []struct {
		name, label, unit string
		requests          float64 // HTTP requests per op: each costs at least the floor
	}{
		{"consume", "consume", "consume", 1}, {"reserve", "reserve + commit", "create+commit", 2}, {"usage", "usage", "call of 10 events", 1},
	} {
		s := r.scenario(v.name)
		if s == nil || s.Run == nil || s.Run.OK == 0 {
			continue
		}
		cp := perOp(s.CPU, float64(s.Run.OK))
		line := fmt.Sprintf("- **%s** (per %s): %.0f µs (creditd %.0f, Redis %.0f, Postgres %.0f). ", v.label, v.unit, cp.total(), cp.creditd, cp.redis, cp.postgres)
		if calls := scriptCalls(s); calls != "" {
			line += "Redis: " + calls + "; the rest of Redis's time is reading and writing its sockets (the ceiling server's one round trip costs it " + fmt.Sprintf("%.0f", rd) + " µs). "
		}
		if p := s.PG; p != nil && p.InsertedPerOp+p.UpdatedPerOp > 0 {
			rowsPerOp := p.InsertedPerOp + p.UpdatedPerOp
			line += fmt.Sprintf("Postgres: %.2f rows inserted and %.2f updated per op in %.2f commits, %.0f µs per row written", p.InsertedPerOp, p.UpdatedPerOp, p.CommitsPerOp, cp.postgres/rowsPerOp)
			if tables := pgTables(s); tables != "" {
				line += " (" + tables + ")"
			}
			line += ". "
		}
		line += pgStatementsFloor(r.PGStatements, v.name)
		if pr := s.Profile; pr != nil && len(pr.Packages) > 0 {
			var pk []string
			for i, p := range pr.Packages {
				if i == 4 {
					break
				}
				pk = append(pk, fmt.Sprintf("%s %.0f%%", p.Name, 100*p.Share))
			}
			line += fmt.Sprintf("creditd: %.0f µs over the ceiling server's %.0f for %g request(s); its profile by package: %s.", cp.creditd-srv*v.requests, srv*v.requests, v.requests, strings.Join(pk, ", "))
		}
		rows = append(rows, line)
	}
	for _, l := range rows {
		w("%s\n", l)
	}
	if tables := r.floorTables(); len(tables) > 0 || r.Floors != nil {
		r.floorsScenarioMarkdown(w, tables)
	}
}

// floorsScenarioMarkdown writes the per-component floors: how they are
// measured, then one table per operation.
func (r *Results) floorsScenarioMarkdown(w func(string, ...any), tables []floorTable) {
	w("\n#### Logic-free replicas of today's round trips (floors scenario; not a floor of the design, see issue 26's true floor)\n\n")
	if f := r.Floors; f != nil && f.Server != nil && f.Postgres != nil {
		s, p := f.Sample, f.Postgres
		w("A replica makes the same round trips as today's design and does its durable work with no logic, sized from this run's own consumes; what it costs is the design's, not the machine's least. ")
		w("creditd's: the floor server (`-floor-server`, bench/workfloors.go), per HTTP request the idempotency claim (SET NX GET of %d B, PX 24 h), one indexed single-row look-up in Postgres (the applied-operations query, no row found) and one FCALL, then a fixed reply; at %.0f/s (the consume run's rate) it costs %.0f µs of CPU per request. ",
			s.ClaimBytes, f.Server.Run.Offered, f.Server.ServerUSPerRequest)
		w("Redis's: that FCALL runs a function kept in the bench (HGETALL of a copy of a real account hash, %d fields, %d B; HSET of every field back; XADD of %d B, a real consume's outbox entry's size; SET of %d B, a real op record's size, PX 24 h) on a private redis-server, so INFO commandstats and its CPU hold only the floor's work: %.1f µs per FCALL, %.0f µs of redis-server CPU per request (claim, FCALL, sockets). ",
			s.AccountFields, s.AccountBytes, s.OutboxEntryBytes, s.OpRecordBytes, f.Server.FcallUSPerCall, f.Server.RedisUSPerRequest)
		w("Postgres's: per consume a row of each of %s COPYed (binary, copies of real rows of this run, unique columns varied) into tables created LIKE the real ones (indexes included), and %.2f account and %.2f block rows updated (the consume run's rows per op), in one transaction per group of %d (%s): %.0f µs of Postgres CPU per op (every process of the server; the floor's own backend alone %.0f µs) over %d groups on the machine's server. ",
			p.copiedTables(), p.AccountsPerOp, p.BlocksPerOp, p.GroupSize, p.GroupSource, p.PostgresUSPerOp, p.BackendUSPerOp, p.Groups)
		if fp := r.PGStatements.floor(); fp != nil {
			w("The same Postgres floor on pg-statements' private cluster (no one else's work): %.0f µs of statement time and %.0f µs of Postgres CPU per consume; the tables use this figure. ", fp.PGStatUSPerOp, fp.PostgresUSPerOp)
		}
		if f.Server.LookupBackends > 0 {
			w("The look-up costs the floor server's own %d backends %.0f µs per request (the whole server %.0f µs in that window, others' work included); the tables use the former. ",
				f.Server.LookupBackends, f.Server.LookupBackendUSPerRequest, f.Server.PostgresUSPerRequest)
		} else {
			w("The look-up costs the whole server %.0f µs per request in the floor server's run (others' work included). ", f.Server.PostgresUSPerRequest)
		}
		if s.Note != "" {
			w("Note: %s. ", s.Note)
		}
		w("Run alone: `go run ./bench -scenarios floors`.\n")
	}
	if f := r.Floors; f != nil {
		if f.Error != "" {
			w("\nThe floors scenario failed: %s.\n", f.Error)
		}
		if f.Postgres != nil && f.Postgres.Error != "" {
			w("\nThe Postgres floor failed: %s.\n", f.Postgres.Error)
		}
	}
	floorTablesMarkdown(w, tables)
}

// scriptCalls names the scripts' calls per op and their time in Redis.
func scriptCalls(s *ScenarioResult) string {
	var out []string
	for _, c := range s.Redis {
		switch c.Command {
		case "fcall", "evalsha", "eval":
			if c.CallsPerOp >= 0.01 {
				out = append(out, fmt.Sprintf("%.2f %s per op at %.0f µs each (the scripts' work, the commands they run included)", c.CallsPerOp, strings.ToUpper(c.Command), c.UsecPerCall))
			}
		}
	}
	return strings.Join(out, ", ")
}

// pgTables lists the tables an op writes, most rows first.
func pgTables(s *ScenarioResult) string {
	type tw struct {
		name string
		rows float64
	}
	var ts []tw
	for _, t := range s.PG.Tables { // already per op
		n := t.Inserted + t.Updated
		if n >= 0.05 {
			ts = append(ts, tw{t.Name, n})
		}
	}
	sort.Slice(ts, func(i, j int) bool { return ts[i].rows > ts[j].rows })
	var out []string
	for _, t := range ts {
		out = append(out, fmt.Sprintf("%s %.2f", t.name, t.rows))
	}
	return strings.Join(out, ", ")
}

// floorRow is one component's line of a floor table: CPU µs per op of
// ours and of the floor for the same work.
type floorRow struct {
	component   string
	ours, floor float64
	what        string
	share       float64 // the goal's share of this component, µs; 0: none
}

// floorTable is one operation's component table.
type floorTable struct {
	title, unit string
	rows        []floorRow
	goal        float64 // µs per op; 0: none
	basis       string  // how the floor was scaled from a consume's
}

// floorSum is the floors' total.
func (t floorTable) floorSum() (ours, floor float64) {
	for _, r := range t.rows {
		ours += r.ours
		floor += r.floor
	}
	return ours, floor
}

// consumeFloor is the floors scenario's CPU per consume by component, or
// false when it did not measure all of them.
func (r *Results) consumeFloor() (cpuPerOp, bool) {
	f := r.Floors
	if f == nil || f.Server == nil || f.Server.Run == nil || f.Server.Run.OK == 0 || f.Postgres == nil || f.Postgres.Ops == 0 {
		return cpuPerOp{}, false
	}
	return cpuPerOp{f.Server.ServerUSPerRequest, f.Server.RedisUSPerRequest, r.pgWriteFloor() + f.Server.lookupUS()}, true
}

// pgWriteFloor is the Postgres floor of a consume's writes, CPU µs per
// op: measured on pg-statements' private cluster when the run has it (no
// one else's work there), else on the machine's server.
func (r *Results) pgWriteFloor() float64 {
	if fp := r.PGStatements.floor(); fp != nil {
		return fp.PostgresUSPerOp
	}
	return r.Floors.Postgres.PostgresUSPerOp
}

// lookupUS is the look-up's Postgres CPU per request: the floor server's
// own backends when they were sampled, else the whole server's.
func (s *FloorServerRun) lookupUS() float64 {
	if s.LookupBackends > 0 {
		return s.LookupBackendUSPerRequest
	}
	return s.PostgresUSPerRequest
}

// scriptCallsPerOp is the FCALL/EVALSHA calls per op of s and their µs
// per call (the commands summed).
func scriptCallsPerOp(s *ScenarioResult) (calls, usPerCall float64) {
	var usec float64
	for _, c := range s.Redis {
		switch c.Command {
		case "fcall", "evalsha", "eval":
			calls += c.CallsPerOp
			usec += c.CallsPerOp * c.UsecPerCall
		}
	}
	if calls > 0 {
		usPerCall = usec / calls
	}
	return calls, usPerCall
}

// floorRowsPerOp is the rows the Postgres floor writes per op: those
// copied and the account and block rows updated.
func (p *PGFloorRun) floorRowsPerOp() float64 {
	return float64(p.copiedPerOp()) + p.AccountsPerOp + p.BlocksPerOp
}

// copiedPerOp is how many rows the floor copies per op: one per table of
// RowBytes (three in runs before lean records dropped the consume's
// operations row, docs/decisions.md "Lean records (issue 26 item 4)").
func (p *PGFloorRun) copiedPerOp() int {
	if len(p.RowBytes) == 0 {
		return 3
	}
	return len(p.RowBytes)
}

// copiedTables names the tables the floor copies a row of per op.
func (p *PGFloorRun) copiedTables() string {
	if len(p.RowBytes) == 0 {
		return "operations, ledger_entries and webhook_events"
	}
	names := make([]string, 0, len(p.RowBytes))
	for t := range p.RowBytes {
		names = append(names, t)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// floorTables builds the component tables of the missed CPU goals from the
// floors scenario (consume, and reserve + commit and usage scaled by their
// script round trips and rows) and the ceiling server (check).
func (r *Results) floorTables() []floorTable {
	var out []floorTable
	profile := func(s *ScenarioResult) string {
		if s.Profile == nil || len(s.Profile.Packages) == 0 {
			return "no profile"
		}
		var pk []string
		for i, p := range s.Profile.Packages {
			if i == 4 {
				break
			}
			pk = append(pk, fmt.Sprintf("%s %.0f%%", p.Name, 100*p.Share))
		}
		return "its profile by package: " + strings.Join(pk, ", ")
	}
	if c := r.Ceiling; c != nil && c.Run != nil && c.Run.OK > 0 {
		if s := r.scenario("check"); s != nil && s.Run != nil && s.Run.OK > 0 {
			ops := float64(s.Run.OK)
			cp := perOp(s.CPU, ops)
			srv, rd := c.CPU["ceiling server"]*1e6/float64(c.Run.OK), c.CPU["redis-server"]*1e6/float64(c.Run.OK)
			calls, us := scriptCallsPerOp(s)
			out = append(out, floorTable{title: "check", unit: "check", goal: 25,
				basis: "the floor is the ceiling server: an HTTP request, one round trip to a one-line script (HGET), a fixed reply; a check reads and writes nothing durable",
				rows: []floorRow{
					{"creditd", cp.creditd, srv, "key, tenant, customer and rule look-ups from in-process caches, the JSON reply, metrics, the access log; " + profile(s), 0},
					{"Redis", cp.redis, rd, fmt.Sprintf("%.2f script calls per check at %.1f µs each (the floor's one-line script is in its figure)", calls, us), 0},
					{"Postgres", cp.postgres, 0, "no statement per check: background work of creditd and the shared server in the window", 0},
				}})
		}
	}
	fl, ok := r.consumeFloor()
	if !ok {
		return out
	}
	f := r.Floors
	pgf := f.Postgres
	pgPerRow := r.pgWriteFloor() / pgf.floorRowsPerOp()
	for _, v := range []struct {
		name, title, unit string
		perExtra          bool
		goal              float64
	}{{"consume", "consume", "consume", false, 60}, {"reserve", "reserve + commit", "create+commit", false, 250}, {"usage", "usage", "event", true, 60}} {
		s := r.scenario(v.name)
		if s == nil || s.Run == nil || s.Run.OK == 0 {
			continue
		}
		ops := float64(s.Run.OK)
		perOpScale := 1.0
		if v.perExtra && s.Run.Extra > 0 {
			perOpScale = ops / float64(s.Run.Extra)
			ops = float64(s.Run.Extra)
		}
		cp := perOp(s.CPU, ops)
		calls, us := scriptCallsPerOp(s)
		calls *= perOpScale
		rows := 0.0
		if s.PG != nil {
			rows = (s.PG.InsertedPerOp + s.PG.UpdatedPerOp) * perOpScale
		}
		t := floorTable{title: v.title, unit: v.unit, goal: v.goal}
		// A consume is the floor's own op; the others are scaled.
		scale, pgFloor := 1.0, fl.postgres
		if v.name != "consume" {
			scale = calls
			pgFloor = pgPerRow*rows + f.Server.lookupUS()*calls
			t.basis = fmt.Sprintf("the consume floors scaled: creditd and Redis by the %.2f script round trips per %s, Postgres by the %.2f rows written per %s (the floor's %.1f µs per row) plus %.2f look-ups", calls, v.unit, rows, v.unit, pgPerRow, calls)
		} else {
			t.basis = fmt.Sprintf("the floors scenario: an HTTP request with the claim (SET NX GET), one indexed look-up in Postgres and one FCALL of a script doing a consume's Redis writes with no logic; %d rows of a consume's tables per transaction", pgf.GroupSize)
		}
		floorScript := f.Server.FcallUSPerCall * scale
		redisWhat := fmt.Sprintf("scripts %.0f µs per %s (%s) against the floor script's %.0f µs (%.1f µs per FCALL: HGETALL and HSET of %d fields, XADD of %d B, SET of %d B with PX 24 h), so %.0f µs per %s of logic in the scripts",
			calls*us, v.unit, scriptList(s, perOpScale), floorScript, f.Server.FcallUSPerCall, f.Sample.AccountFields, f.Sample.OutboxEntryBytes, f.Sample.OpRecordBytes, calls*us-floorScript, v.unit)
		var other []string
		for _, c := range s.Redis {
			if c.Command != "fcall" && c.Command != "evalsha" && c.Command != "eval" && c.CallsPerOp*perOpScale >= 0.1 {
				other = append(other, fmt.Sprintf("%s %.2f x %.0f µs", c.Command, c.CallsPerOp*perOpScale, c.UsecPerCall))
			}
		}
		if len(other) > 0 {
			redisWhat += "; other commands per " + v.unit + " (the persister's reads and deletes of the outbox among them): " + strings.Join(other, ", ")
		}
		if len(s.Redis) > 0 {
			redisWhat += " (INFO commandstats of the shared Redis: every client's calls in the window)"
		}
		pgWhat := fmt.Sprintf("%.2f rows written per %s against the floor's %.2f per consume", rows, v.unit, pgf.floorRowsPerOp())
		if tables := pgTables(s); tables != "" {
			pgWhat += " (" + tables + ")"
		}
		if run := r.PGStatements.run(v.name); run != nil {
			pgWhat += fmt.Sprintf("; pg-statements: %.0f µs of statement time per op", run.StatementUSPerOp)
			if len(run.Top) > 0 {
				pgWhat += fmt.Sprintf(", most in %s (%.1f µs per op)", gistOf(run.Top[0]), run.Top[0].TotalUSPerOp)
			}
			if fp := r.PGStatements.floor(); v.name == "consume" && fp != nil {
				cp := perOp(run.CPU, float64(run.Run.OK))
				pgWhat += fmt.Sprintf("; on that private cluster the persister's real path (with creditd's look-ups) costs %.0f µs of statement time and %.0f µs of Postgres CPU per consume, the floor's writes %.0f µs and %.0f µs (its own backend %.0f µs), most in %s",
					run.StatementUSPerOp, cp.postgres, fp.PGStatUSPerOp, fp.PostgresUSPerOp, fp.BackendUSPerOp, floorTopStatements(fp.PGStatTop))
			}
		}
		t.rows = []floorRow{
			{"creditd", cp.creditd, fl.creditd * scale, profile(s), 0},
			{"Redis", cp.redis, fl.redis * scale, redisWhat, 0},
			{"Postgres", cp.postgres, pgFloor, pgWhat, 0},
		}
		if v.name == "consume" { // issue 10: creditd <= 30, Redis <= 15, Postgres <= 15
			t.rows[0].share, t.rows[1].share, t.rows[2].share = 30, 15, 15
		}
		out = append(out, t)
	}
	return out
}

// floorTablesMarkdown writes the component tables and what the floors
// alone say about each goal.
func floorTablesMarkdown(w func(string, ...any), tables []floorTable) {
	for _, t := range tables {
		w("\n**%s** (CPU µs per %s; %s):\n\n", t.title, t.unit, t.basis)
		w("| component | ours | logic-free replica of the same round trips | over it | what the difference is |\n|---|---|---|---|---|\n")
		for _, r := range t.rows {
			w("| %s | %.0f µs | %.0f µs | %+.0f µs | %s |\n", r.component, r.ours, r.floor, r.ours-r.floor, strings.ReplaceAll(r.what, "|", "\\|"))
		}
		ours, floor := t.floorSum()
		w("| all | %.0f µs | %.0f µs | %+.0f µs | |\n\n", ours, floor, ours-floor)
		w("%s", floorVerdict(t.goal, floor))
		for _, r := range t.rows {
			if r.share > 0 && r.floor > r.share {
				w(" %s's replica alone, %.0f µs, is over its %.0f µs share of the goal.", r.component, r.floor, r.share)
			}
		}
		w("\n")
	}
}

// floorVerdict compares the floors' sum with a goal of goal µs.
func floorVerdict(goal, floor float64) string {
	switch {
	case goal <= 0:
		return ""
	case floor > goal:
		return fmt.Sprintf("The replicas alone sum to %.0f µs > the %.0f µs goal: today's round trips cost more than the goal with no logic at all.", floor, goal)
	default:
		return fmt.Sprintf("The replicas sum to %.0f µs <= the %.0f µs goal: %.0f µs are left for the logic.", floor, goal, goal-floor)
	}
}

// goalCeiling is the goal table's note on a missed check row: what the
// ceiling server reaches on this box; "" when there is none. (The floors
// scenario's sums are no longer offered as an excuse: issue 26.)
func (r *Results) goalCeiling(name string) string {
	if c := r.Ceiling; c != nil && c.Run != nil && c.Run.OK > 0 {
		switch {
		case strings.HasPrefix(name, "check throughput") && r.RedisBenchmark != nil && r.RedisBenchmark.RPS > 0:
			return fmt.Sprintf("the ceiling server (HTTP + one round trip) reaches %.2fx", c.Max/r.RedisBenchmark.RPS)
		case strings.HasPrefix(name, "check p99"):
			return fmt.Sprintf("the ceiling server's client p99 at its 70 %% run: %.3f ms", c.Run.Latency.P99)
		}
	}
	return ""
}

// scriptList names s's script commands per op (times scale) and their µs
// per call.
func scriptList(s *ScenarioResult, scale float64) string {
	var out []string
	for _, c := range s.Redis {
		switch c.Command {
		case "fcall", "evalsha", "eval":
			if c.CallsPerOp*scale >= 0.01 {
				out = append(out, fmt.Sprintf("%.2f %s x %.1f µs", c.CallsPerOp*scale, strings.ToUpper(c.Command), c.UsecPerCall))
			}
		}
	}
	return strings.Join(out, ", ")
}

// floorTopStatements names the floor's three costliest statements per op.
func floorTopStatements(top []PGStatement) string {
	var out []string
	for i, s := range top {
		if i == 3 {
			break
		}
		out = append(out, fmt.Sprintf("%s %.1f µs", gistOf(s), s.TotalUSPerOp))
	}
	return strings.Join(out, ", ")
}
