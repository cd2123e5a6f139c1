package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// The true floor of issue 26: what any money call costs this box at the
// least, measured in the same run as the figures divided by it. A money
// call is one HTTP request that needs at least one Redis round trip, and
// its ledger row must reach Postgres; so the floor is the ceiling server's
// CPU per request (ceilings.go: a fasthttp handler, one go-redis round trip
// to a one-line script, a fixed reply; the server, Redis and Postgres, from
// /proc as cpu.go samples them) plus Postgres's CPU to COPY one real
// ledger row, in batches as the persister writes them, into a scratch copy
// of ledger_entries (indexes included). Unlike the floors scenario
// (workfloors.go), it takes no round trip of today's design as given.

// CopyFloorRun is the ledger-row COPY's run.
type CopyFloorRun struct {
	GroupSize   int       `json:"group_size"`
	GroupSource string    `json:"group_source"`
	RowBytes    int       `json:"row_copy_binary_bytes"`
	Rows        int64     `json:"rows"`
	Groups      int       `json:"groups"`
	Seconds     float64   `json:"seconds"`
	CPU         CPUSample `json:"cpu_seconds"`
	// PostgresUSPerRow is every Postgres process's CPU per row (the
	// figure the floor uses, as the CPU rows count every process);
	// BackendUSPerRow is the COPYing backend's alone.
	PostgresUSPerRow float64 `json:"postgres_cpu_us_per_row"`
	BackendUSPerRow  float64 `json:"backend_cpu_us_per_row"`
	Error            string  `json:"error,omitempty"`
}

// copyFloor measures the ledger-row COPY on the run's database, after the
// load scenarios wrote real consume rows to copy.
func (b *Bench) copyFloor(ctx context.Context) {
	out := &CopyFloorRun{GroupSize: floorGroupDefault, GroupSource: "default: no pg-statements run to read the persister's COPY size from"}
	b.res.CopyFloor = out
	if run := b.res.PGStatements.run("consume"); run != nil {
		for _, s := range run.Top {
			if s.Gist == "COPY ledger_entries" && s.RowsPerCall >= 1 {
				out.GroupSize = int(s.RowsPerCall + 0.5)
				out.GroupSource = "rows per call of the persister's COPY ledger_entries in pg-statements' consume run"
			}
		}
	}
	if err := b.copyFloorRun(ctx, out); err != nil {
		out.Error = err.Error()
		logf("true floor: COPY of ledger rows: %v", err)
		return
	}
	logf("true floor: COPY of ledger rows in groups of %d: %.1f µs of Postgres CPU per row (its backend %.1f)", out.GroupSize, out.PostgresUSPerRow, out.BackendUSPerRow)
}

func (b *Bench) copyFloorRun(ctx context.Context, out *CopyFloorRun) error {
	if b.api != nil {
		// The persister's own writes would land in the window.
		if _, errText := b.waitDrained(ctx, 3*time.Minute); errText != "" {
			return fmt.Errorf("before the COPY: %s", errText)
		}
	}
	conn, err := pgx.Connect(ctx, b.dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var backend int
	_ = conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend)
	ft, err := prepareFloorTable(ctx, conn, "ledger_entries", floorFilter("ledger_entries"))
	if err != nil {
		return fmt.Errorf("ledger_entries: %w", err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS floor_ledger_entries") }()
	out.RowBytes = encodedLen(ft.fields)
	var seq uint64 = 1 << 40
	cpu0 := b.probe.Sample()
	own0, _, _, _ := procTimes(backend)
	t0 := time.Now()
	for time.Since(t0) < b.o.Duration && ctx.Err() == nil {
		data := ft.copyData(out.GroupSize, &seq)
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(data), ft.copySQL); err != nil {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("COPY: %w", err)
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		out.Groups++
		out.Rows += int64(out.GroupSize)
	}
	out.Seconds = time.Since(t0).Seconds()
	out.CPU = b.probe.Sample().Sub(cpu0)
	own1, _, _, ownErr := procTimes(backend)
	if out.Rows == 0 {
		return fmt.Errorf("no row copied")
	}
	out.PostgresUSPerRow = out.CPU["postgres"] * 1e6 / float64(out.Rows)
	if ownErr == nil && backend > 0 {
		out.BackendUSPerRow = (own1 - own0) * 1e6 / float64(out.Rows)
	}
	if _, ok := out.CPU["postgres"]; !ok {
		return fmt.Errorf("the Postgres server's processes are not visible here: no CPU figure")
	}
	return nil
}

// TrueFloor is the floor's components, CPU µs per request.
type TrueFloor struct {
	Server float64 `json:"ceiling_server_us"`
	Redis  float64 `json:"redis_us"`
	// PostgresOther is Postgres's CPU during the ceiling run, per request:
	// the ceiling server opens no Postgres connection, so it is the
	// shared server's background and others' work, printed and left out
	// (counting it would lift the floor by whatever else the machine ran).
	PostgresOther float64 `json:"postgres_other_us"`
	CopyRow       float64 `json:"copy_ledger_row_us"`
	Rate          float64 `json:"ceiling_rate"`
}

// Total is the floor of one money request.
func (f TrueFloor) Total() float64 { return f.Server + f.Redis + f.CopyRow }

// trueFloor is the run's floor; ok is false when a component is missing.
func (r *Results) trueFloor() (TrueFloor, bool) {
	c, cp := r.Ceiling, r.CopyFloor
	if c == nil || c.Run == nil || c.Run.OK == 0 || cp == nil || cp.Error != "" || cp.Rows == 0 {
		return TrueFloor{}, false
	}
	n := float64(c.Run.OK)
	return TrueFloor{Server: c.CPU["ceiling server"] * 1e6 / n, Redis: c.CPU["redis-server"] * 1e6 / n, PostgresOther: c.CPU["postgres"] * 1e6 / n,
		CopyRow: cp.PostgresUSPerRow, Rate: c.Run.Achieved}, true
}

// ratioVerdict is cpu over floor x requests, and whether it is at most
// limit; a missing figure is never met.
func ratioVerdict(cpu, floor, requests, limit float64) (float64, bool) {
	if cpu <= 0 || floor <= 0 || requests <= 0 {
		return 0, false
	}
	ratio := cpu / (floor * requests)
	return ratio, ratio <= limit
}

// computeGoals26 fills Goals26: issue 26's goal table.
func (r *Results) computeGoals26() {
	var gs []Goal
	add := func(name, goal, now string, met *bool) {
		gs = append(gs, Goal{Name: name, Goal: goal, Now: now, Met: met})
	}
	hp := r.HotPath
	var rt *RoundTripRun
	if hp != nil {
		for i := range hp.RoundTrips {
			if hp.RoundTrips[i].Scenario == "consume" && hp.RoundTrips[i].Requests > 0 {
				rt = &hp.RoundTrips[i]
			}
		}
	}
	const rtName = "round trips before a money call answers (a consume, counted at the wire)"
	const rtGoal = "one per Redis node it needs (1: a single Redis here), no Postgres"
	if rt != nil {
		add(rtName, rtGoal, fmt.Sprintf("Redis %g, Postgres %g (median of %d consumes sent one at a time, background loops' trips apart; means %.2f and %.2f; %d of %d made a Postgres trip)",
			rt.RedisMedian, rt.PostgresMedian, rt.Requests, rt.RedisMean, rt.PostgresMean, rt.WithPostgres, rt.Requests),
			boolp(rt.RedisMedian <= 1 && rt.PostgresMedian == 0))
	} else {
		add(rtName, rtGoal, "not measured (pg-outage scenario not run or failed)", nil)
	}

	floor, haveFloor := r.trueFloor()
	kept, why := r.keptUp()
	cpuRow := func(name, scenario string, perExtra bool, unit string, requests, limit float64) {
		goal := fmt.Sprintf("<= %.1fx", limit)
		c, rate, ok := r.runCPU(scenario, perExtra)
		if !ok || !haveFloor {
			add(name, goal, "not measured", nil)
			return
		}
		ratio, met := ratioVerdict(c.total(), floor.Total(), requests, limit)
		now := fmt.Sprintf("%.2fx: %s per %s at %.0f/s / (%.0f µs floor x %g)", ratio, c, unit, rate, floor.Total(), requests)
		if !kept {
			now += "; does not count: " + why
			met = false
		}
		add(name, goal, now, boolp(met))
	}
	cpuRow("consume CPU per op / true floor", "consume", false, "consume", 1, 2.0)
	cpuRow("reserve + commit CPU per op / (true floor x 2 requests)", "reserve", false, "create+commit", 2, 2.5)
	cpuRow("usage CPU per event / (true floor x 1)", "usage", true, "event", 1, 2.5)
	cpuRow("gauge move CPU per op / (true floor x 1 request)", "gauge", false, "increment", 1, 2.5)

	for _, v := range []struct {
		sc, pg string
		want   float64
	}{{"consume", "spread", 2.5}, {"consume-hot", "hot", 10}} {
		s, p := r.scenario(v.sc), r.pgbench(v.pg)
		name := fmt.Sprintf("consume throughput / Postgres-only consume (%s)", v.pg)
		goal := fmt.Sprintf(">= %gx", v.want)
		if s == nil || p == nil || p.TPS == 0 {
			add(name, goal, "not measured", nil)
			continue
		}
		ratio := s.Max / p.TPS
		add(name, goal, fmt.Sprintf("%.2fx: %.0f / %.0f tps", ratio, s.Max, p.TPS), boolp(ratio >= v.want))
	}

	var st *PGStorage
	if hp != nil && hp.Storage != nil && hp.Storage.Error == "" {
		st = hp.Storage
	}
	const bytesName = "Postgres bytes per consume (all relations, indexes and TOAST included, after 20,000 consumes and a CHECKPOINT)"
	const rowsName = "Postgres rows written per consume (pg_stat_user_tables n_tup_ins + n_tup_upd)"
	if st != nil {
		var top []string
		for i, t := range st.Tables {
			if i == 3 {
				break
			}
			top = append(top, fmt.Sprintf("%s %.0f B", t.Name, t.Bytes))
		}
		add(bytesName, "<= 600 B", fmt.Sprintf("%.0f B (%d consumes; most: %s)", st.BytesPerConsume, st.Consumes, strings.Join(top, ", ")),
			boolp(st.BytesPerConsume <= 600))
		add(rowsName, "<= 2.5", fmt.Sprintf("%.2f (%s)", st.RowsPerConsume, tablesWritten(st.Tables)), boolp(st.RowsPerConsume <= 2.5))
	} else {
		add(bytesName, "<= 600 B", "not measured", nil)
		add(rowsName, "<= 2.5", "not measured", nil)
	}

	var og *OutageResult
	if hp != nil && hp.Outage != nil && hp.Outage.Money.Sent > 0 {
		og = hp.Outage
	}
	outName := func(what string) string {
		if og != nil && og.Quick {
			return fmt.Sprintf("%s 2xx during a %.0f s Postgres outage (-quick: the goal's is 60 s), customers already in Redis", what, og.Planned)
		}
		return what + " 2xx during a 60 s Postgres outage, customers already in Redis"
	}
	if og != nil {
		m, c := og.Money, og.Checks
		mShare, cShare := share(m.OK, m.Sent), share(c.OK, c.Sent)
		add(outName("money calls"), ">= 99 %, every acknowledged one in the ledger exactly once",
			fmt.Sprintf("%.1f %% of %d (503: %.1f %%, other 5xx: %d, other: %d); ledger: %s", mShare, m.Sent, share(m.S503, m.Sent), m.Other5xx, m.Other,
				map[bool]string{true: "exactly once", false: "NOT shown exactly once"}[og.ExactlyOnce]),
			boolp(mShare >= 99 && og.ExactlyOnce))
		add(outName("checks"), "100 %", fmt.Sprintf("%.1f %% of %d (503: %.1f %%, other 5xx: %d, other: %d)", cShare, c.Sent, share(c.S503, c.Sent), c.Other5xx, c.Other),
			boolp(c.Sent > 0 && c.OK == c.Sent))
	} else {
		add(outName("money calls"), ">= 99 %, every acknowledged one in the ledger exactly once", "not measured", nil)
		add(outName("checks"), "100 %", "not measured", nil)
	}

	const keyName = "Redis bytes per remembered idempotency key, 24 h window"
	if m := r.Memory; m != nil && m.Error == "" && m.Ops > 0 {
		add(keyName, "<= 100 B", fmt.Sprintf("%.0f B (%d consumes at %.0f/s; per-op keys live %.1f h)", m.Growth.BytesPerRemembered, m.Ops, m.Run.Achieved, m.Growth.WindowSeconds/3600),
			boolp(m.Growth.BytesPerRemembered <= 100))
	} else {
		add(keyName, "<= 100 B", "not measured (memory scenario not run)", nil)
	}
	r.Goals26 = gs
}

// tablesWritten names the tables written per consume, most first.
func tablesWritten(ts []TableGrowth) string {
	var out []string
	for _, t := range ts {
		if t.Written >= 0.01 {
			out = append(out, fmt.Sprintf("%s %.2f", t.Name, t.Written))
		}
	}
	return strings.Join(out, ", ")
}

// goals26Markdown writes issue 26's goal table, the floor's components and
// the pg-outage scenario's detail.
func (r *Results) goals26Markdown(w func(string, ...any)) {
	w("## Goals (issue 26: a money call touches Redis only)\n\n")
	w("Every figure is from this run; a ratio's floor was measured in this run too. Met or missed, nothing else.\n\n")
	w("| figure | goal | measured | met |\n|---|---|---|---|\n")
	for _, g := range r.Goals26 {
		met := "not measured"
		if g.Met != nil {
			met = map[bool]string{true: "**met**", false: "**missed**"}[*g.Met]
		}
		w("| %s | %s | %s | %s |\n", g.Name, g.Goal, strings.ReplaceAll(g.Now, "|", "\\|"), met)
	}
	w("\n**The true floor** (bench/truefloor.go): what one money request costs this box at the least. ")
	if f, ok := r.trueFloor(); ok {
		cp := r.CopyFloor
		w("The ceiling server (one HTTP request, one Redis round trip to a one-line script, a fixed reply) at its 70 %% run (%.0f/s): %.1f µs of its own CPU and %.1f µs of Redis per request (Postgres used %.1f µs per request meanwhile: the ceiling server has no Postgres connection, so that is the shared server's other work, left out of the floor); "+
			"plus Postgres's CPU to COPY one real ledger row (a copy of a consume's row of this run, %d B in COPY binary, unique columns varied) into a scratch copy of ledger_entries with its indexes, in transactions of %d rows (%s): %.1f µs per row (the COPYing backend alone %.1f µs; %d rows in %.1f s). "+
			"**Floor: %.0f µs per request.** CPU is from /proc/<pid>/stat deltas (cpu.go): the server or creditd, redis-server, and every Postgres process.\n",
			f.Rate, f.Server, f.Redis, f.PostgresOther, cp.RowBytes, cp.GroupSize, cp.GroupSource, f.CopyRow, cp.BackendUSPerRow, cp.Rows, cp.Seconds, f.Total())
	} else {
		w("Not measured in this run")
		if cp := r.CopyFloor; cp != nil && cp.Error != "" {
			w(" (COPY of ledger rows: %s)", cp.Error)
		}
		w(".\n")
	}
	hp := r.HotPath
	if hp == nil {
		w("\nThe pg-outage scenario did not run (`go run ./bench -scenario pg-outage` runs it alone).\n\n")
		return
	}
	w("\n### Round trips, storage and a Postgres outage (pg-outage scenario)\n\n")
	w("Setting: %s. Run alone: `go run ./bench -scenario pg-outage`.\n", hp.Setting)
	if hp.Error != "" {
		w("\n**Failed:** %s\n", hp.Error)
	}
	if len(hp.RoundTrips) > 0 {
		w("\n**Round trips** (bench/rtproxy.go): that creditd reached Redis and Postgres through TCP proxies in the bench that count a round trip each time a client sends after an answer (a pipeline or a Parse/Bind/Execute/Sync is one; a command a script runs inside Redis is none). "+
			"Requests went one at a time, %s apart, each counted over its own window after a warm-up that reached every customer; the proxy held the answer to the persister's blocking outbox read by %s, so the write-behind work a request causes falls after its window. "+
			"Trips only creditd's background loops make (hotpath.go's backgroundTrip: the persister's stream reads, claims, acks and group transaction, INFO, pings, webhook delivery, outbox leases) run on their own clocks and are counted apart; every trip is named in the last two columns, background ones included.\n\n",
			rtGap, rtReservation)
		w("| request | answered | Redis median | Postgres median | Redis mean / max | Postgres mean / max | requests with a Postgres trip | background trips per window, Redis / Postgres | all Redis trips per request, by first command sent | all Postgres trips per request, by statement |\n|---|---|---|---|---|---|---|---|---|---|\n")
		for _, t := range hp.RoundTrips {
			w("| %s | %d (failed %d) | %g | %g | %.2f / %d | %.2f / %d | %d | %.2f / %.2f | %s | %s |\n", t.Scenario, t.Requests, t.Failed, t.RedisMedian, t.PostgresMedian,
				t.RedisMean, t.RedisMax, t.PostgresMean, t.PostgresMax, t.WithPostgres, t.BackgroundRedis, t.BackgroundPostgres, tripText(t.Redis), tripText(t.Postgres))
		}
	}
	if st := hp.Storage; st != nil {
		w("\n**Postgres storage**: %d consumes acknowledged at %.0f/s (errors %s), the persister drained, a CHECKPOINT; every user relation's pg_total_relation_size (heap, indexes, TOAST) and pg_stat_user_tables before and after. ", st.Consumes, st.Rate, st.Errors)
		if st.Error != "" {
			w("**Failed:** %s\n", st.Error)
		} else {
			w("%d B before, %d B after: **%.0f B and %.2f rows written per consume**.\n\n", st.BytesBefore, st.BytesAfter, st.BytesPerConsume, st.RowsPerConsume)
			w("| relation | bytes per consume | rows written per consume |\n|---|---|---|\n")
			for _, t := range st.Tables {
				w("| %s | %.0f | %.2f |\n", t.Name, t.Bytes, t.Written)
			}
		}
	}
	if o := hp.Outage; o != nil {
		w("\n**Postgres outage**: the private Postgres stopped as `pg_ctl stop -m immediate` does (pgserver.Stop: SIGQUIT to the postmaster) for %.1f s", o.Down)
		if o.Quick {
			w(" (a -quick run: the goal's outage is 60 s)")
		}
		w(", under %d money operations/s (60 %% consumes, 15 %% gauge increments, 15 %% reservation create + commit, 10 %% usage calls of 10 events; an operation counts once, by its first non-2xx answer) and %d checks/s, on customers whose state was in Redis. Every request counted was sent and answered while Postgres was down.\n\n",
			outageMoneyRate, outageCheckRate)
		w("| requests | sent | 2xx | 503 | other 5xx | other (4xx, timeouts) | never sent (queue) | p99 ms | answers |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, v := range []struct {
			name string
			c    OutageCalls
		}{{"money", o.Money}, {"checks", o.Checks}} {
			w("| %s | %d | %.1f %% | %.1f %% | %d | %d | %d | %.1f | %s |\n", v.name, v.c.Sent, share(v.c.OK, v.c.Sent), share(v.c.S503, v.c.Sent),
				v.c.Other5xx, v.c.Other, v.c.NotSent, v.c.P99MS, v.c.Errors)
		}
		w("\nAfter Postgres was back the persister drained in %.1f s. Ledger against every acknowledged operation of this stack (seeding, round trips, storage, outage): %s. ", o.RecoverSeconds, o.LedgerNote)
		w("Exactly once means each metric's rows are distinct operations, none acknowledged is missing, and no more are there than the acknowledged plus those with no answer. ")
		w("Over the outage the outbox streams grew by %d entries and Redis's used_memory by %d B.\n", o.OutboxEntries, o.RedisBytes)
		if o.Error != "" {
			w("\n**Error:** %s\n", o.Error)
		}
	}
	if ob := hp.Outbox; ob != nil {
		w("\n**Outage budget**: ")
		if ob.Error != "" {
			w("not measured: %s.\n", ob.Error)
		} else {
			w("a consume's outbox entry (a real one caught in its stream, %d B of JSON) costs **%.0f B of Redis** (MEMORY USAGE SAMPLES 0 of a stream of %d copies, per entry; a consume appends one). "+
				"At %.0f consumes/s (%s) the outbox grows %.1f MB/s, so **each GiB of headroom (maxmemory minus used_memory when Postgres goes down) absorbs %.0f s (%.1f min) of outage**: e.g. maxmemory 8 GiB with 4 GiB in use absorbs %.0f min. "+
				"Idempotency records are not in this figure: they are kept 24 h whether Postgres is up or not, and their steady state belongs in used_memory. "+
				"Past it, Redis (noeviction, docs/operations.md) refuses the writes that would grow it: money calls answer 503 with Retry-After and change nothing, checks keep answering, nothing acknowledged is lost (make chaos's write refusal: bench/results/chaos-20261128T172335Z.md).\n",
				ob.SampleBytes, ob.EntryBytes, ob.Copies, ob.Rate, ob.RateSource, ob.EntryBytes*ob.Rate/1e6, ob.SecondsPerGiB, ob.SecondsPerGiB/60, 4*ob.SecondsPerGiB/60)
		}
	}
	w("\n")
}

// floorFilter is the filter pgFloorTables gives table (its order changed
// once, so it is looked up by name).
func floorFilter(table string) string {
	for _, t := range pgFloorTables {
		if t.table == table {
			return t.filter
		}
	}
	panic("bench: no floor filter for " + table)
}
