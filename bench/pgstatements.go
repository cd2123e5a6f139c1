package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The pg-statements scenario (issue 10: a goal not met needs the profile
// that names what is left, Postgres's pg_stat_statements among them): which
// statements each operation costs Postgres. The machine's Postgres does not
// load pg_stat_statements (shared_preload_libraries is empty, and the bench
// must not restart or reconfigure a shared server), so the scenario initdb's
// a private cluster that does, copying the machine's durability settings
// (pgstatCopied), and runs a creditd of its own on it and on a private
// redis-server. It seeds customers as the other scenarios do, then runs
// consume, check, reserve + commit and usage one after the other at a fixed
// moderate rate, resetting pg_stat_statements before each and reading it
// after the persister drained, so each scenario's statements include the
// write-behind work its ops caused.

const (
	// pgstatCustomers spreads the load over many accounts and seeds in a
	// few seconds.
	pgstatCustomers = 200
	// pgstatTop is how many statements (by total time) each run reports.
	pgstatTop = 10
	// pgstatQueryChars is how much of a statement's text the report shows.
	pgstatQueryChars = 80
	// pgstatDrain bounds the wait for the persister after each run.
	pgstatDrain = 60 * time.Second
)

// pgstatCopied are the machine Postgres's settings the private cluster
// copies (read with current_setting): what a commit costs (fsync,
// synchronous_commit, the WAL's sync method and full-page writes) and the
// buffer cache, so the statements cost what they do on the machine's
// server.
var pgstatCopied = []string{"fsync", "synchronous_commit", "wal_sync_method", "full_page_writes", "shared_buffers"}

// pgstatPlan is the scenarios run, in order, each at a moderate rate of
// its own unit (a reserve is two requests, a usage call ten events): well
// under the main run's max on a 2-core box, so statement times are not
// mostly queueing. A run that measured the scenario lowers it to 70 % of
// that max; -pg-statements-rate replaces it.
var pgstatPlan = []struct {
	name string
	rate float64
}{{"consume", 1000}, {"check", 1000}, {"reserve", 200}, {"usage", 100}}

// PGStatementsResult is the scenario's outcome.
type PGStatementsResult struct {
	Setting string `json:"setting"`
	// Copied is the settings taken from the machine's Postgres (name,
	// value).
	Copied [][]string        `json:"settings_copied"`
	Runs   []PGStatementsRun `json:"runs"`
	// Floor is the floors scenario's Postgres floor run on this cluster
	// after the runs (when the run includes floors): its statements and
	// CPU, measured as the persister's real path is here.
	Floor *PGFloorRun `json:"postgres_floor,omitempty"`
	Error string      `json:"error,omitempty"`
}

// PGStatementsRun is one scenario's run and the statements it cost.
type PGStatementsRun struct {
	Scenario string     `json:"scenario"`
	Unit     string     `json:"unit"`
	Run      *RunResult `json:"run,omitempty"`
	// CPU is each process's CPU seconds during the run (creditd, the
	// private redis-server and Postgres, every process of the cluster).
	CPU CPUSample `json:"cpu_seconds,omitempty"`
	// DrainSeconds is how long the persister took to empty its backlog
	// after the run (its statements are counted).
	DrainSeconds float64 `json:"drain_seconds"`
	// StatementUSPerOp is every top-level statement's execution time per
	// acknowledged op, µs (wall time in the executor, lock and I/O waits
	// included; a commit's WAL flush comes after its COMMIT statement and
	// is not in it).
	StatementUSPerOp float64 `json:"statement_us_per_op"`
	// Distinct is how many distinct statements ran.
	Distinct int `json:"distinct_statements"`
	// Top is the statements with the most total time, most first.
	Top   []PGStatement `json:"top_statements"`
	Error string        `json:"error,omitempty"`
}

// PGStatement is one normalized statement's cost in a run.
type PGStatement struct {
	// Query is the statement's text, whitespace collapsed and cut to
	// pgstatQueryChars.
	Query string `json:"query"`
	// Gist is what it does to which table (statementGist).
	Gist string `json:"gist"`
	// Nested: run inside another statement (a function or trigger), so
	// its time is already in its caller's.
	Nested       bool    `json:"nested,omitempty"`
	Calls        int64   `json:"calls"`
	TotalMS      float64 `json:"total_ms"`
	Rows         int64   `json:"rows"`
	CallsPerOp   float64 `json:"calls_per_op"`
	MeanUS       float64 `json:"mean_us"`
	TotalUSPerOp float64 `json:"total_us_per_op"`
	RowsPerCall  float64 `json:"rows_per_call"`
}

// pgStatRow is one row of pg_stat_statements.
type pgStatRow struct {
	query    string
	toplevel bool
	calls    int64
	totalMS  float64
	rows     int64
}

// shortenStatement collapses runs of whitespace to one space and cuts the
// text to n characters (runes), marking a cut with "…".
func shortenStatement(q string, n int) string {
	s := strings.Join(strings.Fields(q), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

// statementGist names what a statement does to which table, from its
// outermost level (the text inside parentheses dropped, so a CTE's body or
// a column list does not count): "INSERT INTO webhook_events", "UPSERT
// credit_accounts" (INSERT ... ON CONFLICT DO UPDATE), "UPDATE x", "DELETE
// FROM x", "COPY x", "SELECT FROM x", "SELECT f" for a function call, else
// the first word. The first 80 characters of a statement that starts with
// WITH rarely say it.
func statementGist(q string) string {
	var top strings.Builder
	depth := 0
	inString := false
	for _, r := range q {
		switch {
		case inString:
			inString = r != '\''
			continue
		case r == '\'':
			inString = true
			continue
		case r == '(':
			depth++
			top.WriteByte(' ')
			continue
		case r == ')':
			depth = max(depth-1, 0)
			continue
		}
		if depth == 0 {
			top.WriteRune(r)
		}
	}
	words := strings.Fields(top.String())
	name := func(i int) string {
		if i >= len(words) {
			return "?"
		}
		return strings.Trim(strings.TrimRight(words[i], ",;"), `"`)
	}
	upper := make([]string, len(words))
	for i, w := range words {
		upper[i] = strings.ToUpper(w)
	}
	has := func(seq ...string) bool {
		for i := 0; i+len(seq) <= len(upper); i++ {
			ok := true
			for k, s := range seq {
				if upper[i+k] != s {
					ok = false
					break
				}
			}
			if ok {
				return true
			}
		}
		return false
	}
	for i, w := range upper {
		switch {
		case w == "INSERT" && i+2 < len(words) && upper[i+1] == "INTO":
			if has("ON", "CONFLICT", "DO", "UPDATE") {
				return "UPSERT " + name(i+2)
			}
			return "INSERT INTO " + name(i+2)
		case w == "UPDATE" && (i == 0 || upper[i-1] != "DO" && upper[i-1] != "FOR"):
			return "UPDATE " + name(i+1)
		case w == "DELETE" && i+1 < len(words) && upper[i+1] == "FROM":
			return "DELETE FROM " + name(i+2)
		case w == "COPY":
			return "COPY " + name(i+1)
		}
	}
	for i, w := range upper {
		if w != "SELECT" {
			continue
		}
		for k := i + 1; k < len(upper); k++ {
			if upper[k] == "FROM" {
				return "SELECT FROM " + name(k+1)
			}
		}
		return "SELECT " + name(i+1)
	}
	if len(upper) == 0 {
		return ""
	}
	return upper[0]
}

// statementPerOp is a statement's figures per op of a run of ops
// acknowledged ops; calls and rows of 0 give 0, not NaN.
func statementPerOp(query string, nested bool, calls, rows int64, totalMS, ops float64) PGStatement {
	s := PGStatement{Query: query, Nested: nested, Calls: calls, TotalMS: totalMS, Rows: rows}
	if calls > 0 {
		s.MeanUS = totalMS * 1000 / float64(calls)
		s.RowsPerCall = float64(rows) / float64(calls)
	}
	if ops > 0 {
		s.CallsPerOp = float64(calls) / ops
		s.TotalUSPerOp = totalMS * 1000 / ops
	}
	return s
}

// topStatements merges rows of the same text and nesting (pg_stat_statements
// keeps one per user and query id), and returns the n with the most total
// time, the top-level statements' time per op and the distinct count.
func topStatements(rows []pgStatRow, ops float64, n int) (top []PGStatement, usPerOp float64, distinct int) {
	type key struct {
		q      string
		nested bool
	}
	merged := map[key]*pgStatRow{}
	var order []key
	var topMS float64
	for _, r := range rows {
		k := key{strings.Join(strings.Fields(r.query), " "), !r.toplevel}
		m := merged[k]
		if m == nil {
			m = &pgStatRow{query: k.q, toplevel: r.toplevel}
			merged[k] = m
			order = append(order, k)
		}
		m.calls += r.calls
		m.rows += r.rows
		m.totalMS += r.totalMS
		if r.toplevel {
			topMS += r.totalMS
		}
	}
	all := make([]PGStatement, 0, len(order))
	for _, k := range order {
		m := merged[k]
		st := statementPerOp(shortenStatement(m.query, pgstatQueryChars), k.nested, m.calls, m.rows, m.totalMS, ops)
		st.Gist = statementGist(m.query)
		all = append(all, st)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].TotalMS > all[j].TotalMS })
	if len(all) > n {
		all = all[:n]
	}
	if ops > 0 {
		usPerOp = topMS * 1000 / ops
	}
	return all, usPerOp, len(order)
}

// pgStatements runs the scenario and stores its result; a failure is
// reported, not fatal to the rest of the bench.
func (b *Bench) pgStatements(ctx context.Context) {
	r := &PGStatementsResult{}
	b.res.PGStatements = r
	t0 := time.Now()
	if err := b.pgStatementsRun(ctx, r); err != nil {
		r.Error = err.Error()
		logf("pg-statements: %v", err)
	}
	logf("pg-statements: done in %.0fs", time.Since(t0).Seconds())
}

// pgstatRate is the offered rate of scenario name: -pg-statements-rate
// when set, else its moderate default, lowered to 70 % of this run's max
// when the run ramped the scenario.
func (b *Bench) pgstatRate(name string, moderate float64) float64 {
	if b.o.PGStatementsRate > 0 {
		return b.o.PGStatementsRate
	}
	if s := b.res.scenario(name); s != nil && s.Max > 0 {
		return min(moderate, 0.7*s.Max)
	}
	return moderate
}

// pgStatementsRun starts the private cluster, Redis and creditd, seeds,
// and measures each scenario; every process it started is stopped by PID
// on the way out.
func (b *Bench) pgStatementsRun(ctx context.Context, r *PGStatementsResult) error {
	copied, err := machineSettings(ctx, b.baseDB, pgstatCopied)
	if err != nil {
		return fmt.Errorf("read the machine Postgres's settings: %w", err)
	}
	r.Copied = copied
	settings := []string{"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all",
		"pg_stat_statements.track_utility=on", "pg_stat_statements.max=10000"}
	for _, kv := range copied {
		settings = append(settings, kv[0]+"="+kv[1])
	}
	pg, err := startPrivatePostgres(ctx, filepath.Join(b.tmp, "postgres-pgstat.log"), settings)
	if pg != nil {
		defer pg.Stop()
	}
	if err != nil {
		return err
	}
	rs, err := startPrivateRedis(ctx, filepath.Join(b.tmp, "redis-pgstat.log"))
	if err != nil {
		return err
	}
	defer rs.Stop()

	admin, err := pgx.Connect(ctx, pg.URL("postgres"))
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	const dbName = "creditd"
	for _, q := range []string{"CREATE EXTENSION IF NOT EXISTS pg_stat_statements", "CREATE DATABASE " + dbName} {
		if _, err := admin.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	var version string
	_ = admin.QueryRow(ctx, "SHOW server_version").Scan(&version)
	dbURL := pg.URL(dbName)

	addr, err := freeAddr()
	if err != nil {
		return err
	}
	prefix := b.prefix + "p"
	redisURL := "redis://" + rs.Addr + "/0"
	cd, err := startProc("creditd-pgstat", b.bin, []string{"serve"}, creditdEnv(redisURL, dbURL, prefix, addr, "bench-pgstat"),
		addr, filepath.Join(b.tmp, "creditd-pgstat.log"))
	if err != nil {
		return err
	}
	defer cd.Stop()

	var copiedText []string
	for _, kv := range copied {
		copiedText = append(copiedText, kv[0]+"="+kv[1])
	}
	r.Setting = fmt.Sprintf("a private Postgres %s cluster (initdb into a temp dir as OS user %s, shared_preload_libraries=pg_stat_statements, "+
		"pg_stat_statements.track=all, track_utility=on; copied from the machine's server with SHOW: %s), a private redis-server (no persistence), "+
		"a creditd of its own on them, %d customers with 3 blocks each; runs of %s",
		version, pg.user, strings.Join(copiedText, ", "), pgstatCustomers, b.o.Duration)
	logf("pg-statements: Postgres %s on %s (pid %d, %s), redis-server %s, creditd on %s", version, pg.Addr, pg.Pid(), strings.Join(copiedText, " "), rs.Addr, addr)

	// A copy of the bench that drives this stack: its own results (the
	// seeding's figures are not the main run's), no pprof (the main run
	// has the profiles).
	w := *b
	w.res = &Results{}
	w.o.Customers = pgstatCustomers
	w.o.Scenarios = []string{"consume"}
	w.rdb, w.prefix, w.addr, w.dbURL, w.redisURL, w.pprofAddr = rs.rdb, prefix, addr, dbURL, redisURL, ""
	w.probe = &CPUProbe{Creditd: cd.Pid(), Redis: rs.Pid(), Postmaster: pg.Pid(), Extra: map[string]int{}}
	if w.pg, err = pgx.Connect(ctx, dbURL); err != nil {
		return err
	}
	defer w.pg.Close(context.Background())
	if err := w.seed(ctx); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	if _, errText := w.waitDrained(ctx, pgstatDrain); errText != "" {
		return fmt.Errorf("after seeding: %s", errText)
	}
	all := w.target.scenarios()
	for _, p := range pgstatPlan {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		sc := all[p.name](false)
		run := PGStatementsRun{Scenario: sc.Name, Unit: sc.Unit}
		rate := b.pgstatRate(p.name, p.rate)
		if _, err := admin.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
			return fmt.Errorf("pg_stat_statements_reset: %w", err)
		}
		g := NewGenerator(addr, b.o.Workers)
		cpu0 := w.probe.Sample()
		res := g.Run(ctx, rate, b.o.Duration, sc.op)
		run.CPU = w.probe.Sample().Sub(cpu0)
		run.Run = &res
		run.DrainSeconds, run.Error = w.waitDrained(ctx, pgstatDrain)
		rows, err := readStatements(ctx, admin, dbName)
		if err != nil {
			run.Error = strings.TrimSpace(run.Error + " " + err.Error())
		}
		run.Top, run.StatementUSPerOp, run.Distinct = topStatements(rows, float64(res.OK), pgstatTop)
		r.Runs = append(r.Runs, run)
		logf("pg-statements: %s at %.0f/s: achieved %.0f/s, errors %s; %d statements, %.0f µs of statement time per %s (Postgres CPU %.0f µs)",
			sc.Name, rate, res.Achieved, res.ErrorSummary(), run.Distinct, run.StatementUSPerOp, sc.Unit, perOp(run.CPU, float64(res.OK)).postgres)
	}
	if b.o.has("floors") && ctx.Err() == nil {
		// The Postgres floor on this cluster: pg_stat_statements and a
		// CPU figure of no one else's work, as the real path's above.
		// (b.res.PGStatements is r: the group is its consume run's.)
		r.Floor = b.pgFloorOn(ctx, b.pgFloorParams(), dbURL, w.probe, admin, dbName)
		logf("pg-statements: Postgres floor: group %d, %.0f µs of statement time and %.0f µs of Postgres CPU per consume %s",
			r.Floor.GroupSize, r.Floor.PGStatUSPerOp, r.Floor.PostgresUSPerOp, r.Floor.Error)
	}
	return nil
}

// readStatements is every pg_stat_statements row of database db.
func readStatements(ctx context.Context, conn *pgx.Conn, db string) ([]pgStatRow, error) {
	rows, err := conn.Query(ctx, `SELECT query, toplevel, calls, total_exec_time, rows FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1)`, db)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []pgStatRow
	for rows.Next() {
		var r pgStatRow
		if err := rows.Scan(&r.query, &r.toplevel, &r.calls, &r.totalMS, &r.rows); err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// machineSettings reads names from the server at dbURL as (name, value)
// pairs.
func machineSettings(ctx context.Context, dbURL string, names []string) ([][]string, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	var out [][]string
	for _, name := range names {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out = append(out, []string{name, v})
	}
	return out, nil
}

// ownPostgres is a private Postgres cluster in a temp dir: a postmaster
// the bench started as its child (Pdeathsig), stopped by its PID.
type ownPostgres struct {
	Addr string // 127.0.0.1:port
	dir  string // the temp dir: data/ and the unix socket
	user string // the OS user the cluster runs as
	cmd  *exec.Cmd
	done chan struct{}
}

// URL is the cluster's URL of database db (user postgres, trust auth).
func (p *ownPostgres) URL(db string) string {
	return "postgres://postgres@" + p.Addr + "/" + db + "?sslmode=disable"
}

// Pid is the postmaster's process id.
func (p *ownPostgres) Pid() int { return p.cmd.Process.Pid }

// Stop ends the postmaster by its PID (SIGINT, Postgres's fast shutdown;
// SIGKILL after 20 s) and deletes the cluster's files.
func (p *ownPostgres) Stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	_ = os.RemoveAll(p.dir)
}

// pgBindir is the directory holding initdb and postgres: the newest
// /usr/lib/postgresql/<major>/bin (Debian's layout, as scripts/services.sh
// looks for it), else pg_config --bindir, else initdb's on PATH.
func pgBindir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		mi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		mj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return mi > mj
	})
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); isExec(filepath.Join(d, "initdb")) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("initdb not found (install PostgreSQL: apt-get install postgresql)")
}

func isExec(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// pgRunAs is who runs initdb and postgres. Both refuse root, so root runs
// them as `postgres`, or as a system user creditd-pg made for it, as
// scripts/services.sh does (pick_pg_user); anyone else runs them as
// themselves (nil credential).
func pgRunAs() (*syscall.Credential, string, error) {
	if os.Geteuid() != 0 {
		u, err := user.Current()
		if err != nil {
			return nil, "", err
		}
		return nil, u.Username, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		if u, err = user.Lookup("creditd-pg"); err != nil {
			logf("pg-statements: creating system user creditd-pg to run the private Postgres")
			if out, err := exec.Command("useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent",
				"--shell", "/usr/sbin/nologin", "creditd-pg").CombinedOutput(); err != nil {
				return nil, "", fmt.Errorf("useradd creditd-pg (initdb refuses root): %v: %s", err, out)
			}
			if u, err = user.Lookup("creditd-pg"); err != nil {
				return nil, "", err
			}
		}
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, u.Username, nil
}

// startPrivatePostgres initdb's a cluster into a fresh temp dir, starts
// postgres on a free loopback port with settings ("name=value", as -c
// options; the unix socket in the temp dir), and waits until it accepts a
// connection. The cluster it returns, even with an error, is safe to Stop.
func startPrivatePostgres(ctx context.Context, logPath string, settings []string) (*ownPostgres, error) {
	bin, err := pgBindir()
	if err != nil {
		return nil, err
	}
	cred, name, err := pgRunAs()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "creditd-bench-pg-")
	if err != nil {
		return nil, err
	}
	p := &ownPostgres{dir: dir, user: name}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return p, err
		}
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return p, err
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-locale")
	initdb.Dir = dir
	initdb.Stdout, initdb.Stderr = logFile, logFile
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if err := initdb.Run(); err != nil {
		logFile.Close()
		return p, fmt.Errorf("initdb as %s: %v:\n%s", name, err, tail(logPath, 1500))
	}
	addr, err := freeAddr()
	if err != nil {
		logFile.Close()
		return p, err
	}
	_, port, _ := strings.Cut(addr, ":")
	args := []string{"-D", data, "-c", "port=" + port, "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + dir}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return p, fmt.Errorf("start postgres: %w", err)
	}
	p.Addr, p.cmd, p.done = addr, cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); logFile.Close(); close(p.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.done:
			return p, fmt.Errorf("private postgres exited at start:\n%s", tail(logPath, 1500))
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, p.URL("postgres"))
		cancel()
		if err == nil {
			conn.Close(ctx)
			return p, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return p, fmt.Errorf("private postgres on %s did not accept a connection within 30 s (%v):\n%s", addr, err, tail(logPath, 1500))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// run is the run of scenario name with acknowledged ops, or nil.
func (r *PGStatementsResult) run(name string) *PGStatementsRun {
	if r == nil {
		return nil
	}
	for i := range r.Runs {
		if x := &r.Runs[i]; x.Scenario == name && x.Run != nil && x.Run.OK > 0 {
			return x
		}
	}
	return nil
}

// floor is the Postgres floor measured on the cluster, or nil.
func (r *PGStatementsResult) floor() *PGFloorRun {
	if r == nil || r.Floor == nil || r.Floor.Ops == 0 {
		return nil
	}
	return r.Floor
}

// mdStatement is a statement's text as a Markdown table cell.
func mdStatement(s PGStatement) string {
	q := "`" + strings.ReplaceAll(strings.ReplaceAll(s.Query, "`", "'"), "|", "\\|") + "`"
	if s.Nested {
		q += " (nested)"
	}
	return q
}

// gistOf is s's gist for a sentence: the gist (nested marked), or the
// shortened text when it has none.
func gistOf(s PGStatement) string {
	g := s.Gist
	if g == "" {
		g = s.Query
	}
	if s.Nested {
		g += " (nested)"
	}
	return g
}

// pgStatementsMarkdown writes the scenario's report section.
func pgStatementsMarkdown(w func(string, ...any), r *PGStatementsResult) {
	w("\n## Postgres statements per op (pg_stat_statements, issue 10)\n\n")
	w("Which statements each operation costs Postgres. The machine's Postgres does not load pg_stat_statements (shared_preload_libraries is empty, and the bench does not reconfigure a shared server), so this is measured on %s. ", r.Setting)
	w("Each scenario runs at a fixed moderate rate of its own unit (`-pg-statements-rate` sets one rate for all), with `pg_stat_statements_reset()` before it and the view read once the persister has drained, so the write-behind work its ops caused (the applied-ops look-up, the ledger COPY, account and block upserts, event inserts) is counted with them, and so is creditd's background work in that window (sweeps, polls). ")
	w("Statement time is `total_exec_time`: wall time in the executor summed over backends, lock and I/O waits included, so it can exceed Postgres's CPU; a commit's WAL flush happens after its COMMIT statement returns, so no statement's time includes it. Per op is per acknowledged op; the total counts top-level statements only (a nested one, inside a function or trigger, is already in its caller's). Postgres CPU is every process of the private cluster. What is the statement's outermost verb and table (UPSERT: INSERT ... ON CONFLICT DO UPDATE). The persister writes in groups, so its statements' calls per op fall as the rate rises (rows/call is the group's size). ")
	w("Run alone: `go run ./bench -scenario pg-statements`.\n\n")
	if r.Error != "" {
		w("**Failed:** %s\n\n", r.Error)
	}
	for _, run := range r.Runs {
		w("### %s (per %s)\n\n", run.Scenario, run.Unit)
		if run.Run == nil || run.Run.OK == 0 {
			w("Not measured%s.\n\n", map[bool]string{true: ": " + run.Error, false: ""}[run.Error != ""])
			continue
		}
		ops := float64(run.Run.OK)
		cp := perOp(run.CPU, ops)
		w("At %.0f/s offered: %.0f/s achieved, %d ops, errors %s; the persister drained %.1f s after the run. ", run.Run.Offered, run.Run.Achieved, run.Run.OK, run.Run.ErrorSummary(), run.DrainSeconds)
		if run.Run.Extra > 0 {
			w("%d events charged (%.1f per call). ", run.Run.Extra, float64(run.Run.Extra)/ops)
		}
		w("**%.0f µs of statement time per %s** in %d distinct statements; CPU per %s: Postgres %.0f µs, creditd %.0f, Redis %.0f.", run.StatementUSPerOp, run.Unit, run.Distinct, run.Unit, cp.postgres, cp.creditd, cp.redis)
		if run.Error != "" {
			w(" Problem: %s.", run.Error)
		}
		w("\n\n| what | statement (top %d by total time) | calls/op | mean µs | total µs/op | rows/call |\n|---|---|---|---|---|---|\n", pgstatTop)
		for _, s := range run.Top {
			w("| %s | %s | %.3f | %.1f | %.1f | %.2f |\n", s.Gist, mdStatement(s), s.CallsPerOp, s.MeanUS, s.TotalUSPerOp, s.RowsPerCall)
		}
		w("\n")
	}
}

// pgStatementsFloor is the floors section's sentence on what scenario name
// costs Postgres statement by statement, or "" when not measured.
func pgStatementsFloor(r *PGStatementsResult, name string) string {
	run := r.run(name)
	if run == nil {
		return ""
	}
	var top []string
	for i, s := range run.Top {
		if i == 3 {
			break
		}
		top = append(top, fmt.Sprintf("%s %.1f µs (%.3f per op x %.0f µs)", gistOf(s), s.TotalUSPerOp, s.CallsPerOp, s.MeanUS))
	}
	// The statements every op runs itself (the applied-ops look-up of a
	// consume) do not shrink with the persister's group size, as the
	// batched ones do.
	var each []string
	for i, s := range run.Top {
		if i >= 3 && s.CallsPerOp >= 0.5 {
			each = append(each, fmt.Sprintf("%s %.1f µs (%.2f per op x %.0f µs)", gistOf(s), s.TotalUSPerOp, s.CallsPerOp, s.MeanUS))
		}
	}
	out := fmt.Sprintf("Postgres statements (pg-statements, private cluster at %.0f/s): %.0f µs of statement time per op; the most: %s",
		run.Run.Offered, run.StatementUSPerOp, strings.Join(top, "; "))
	if len(each) > 0 {
		out += "; also once or more per op: " + strings.Join(each, "; ")
	}
	return out + ". "
}

// pgStatementsGoal is the scenario's row of the goal table: measured, no
// goal.
func pgStatementsGoal(r *PGStatementsResult) (now string, measured bool) {
	if r == nil || len(r.Runs) == 0 {
		if r != nil && r.Error != "" {
			return "failed: " + r.Error, false
		}
		return "not measured", false
	}
	var parts []string
	for _, run := range r.Runs {
		if run.Run == nil || run.Run.OK == 0 {
			parts = append(parts, run.Scenario+" not measured")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %.0f µs (%d statements)", run.Scenario, run.StatementUSPerOp, run.Distinct))
	}
	now = "statement time per op at a moderate rate: " + strings.Join(parts, ", ")
	if c := r.run("consume"); c != nil && len(c.Top) > 0 {
		now += fmt.Sprintf("; consume's most: %s %.1f µs per op (%.3f per op x %.0f µs)", gistOf(c.Top[0]), c.Top[0].TotalUSPerOp, c.Top[0].CallsPerOp, c.Top[0].MeanUS)
	}
	if r.Error != "" {
		now += " (then failed: " + r.Error + ")"
	}
	return now, true
}
