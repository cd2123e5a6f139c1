package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
)

// hgetScript is the ceiling's one Redis call: a script doing one HGET.
const hgetScript = `return redis.call('HGET', KEYS[1], ARGV[1])`

// serveCeiling is the bench binary's hidden server mode: the smallest
// fasthttp server that does one EVALSHA per request and nothing else, the
// ceiling of "HTTP + one Redis call" on this machine.
func serveCeiling(addr, redisURL, key string) error {
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return err
	}
	opt.PoolSize = 64 // as creditd's CREDITD_REDIS_POOL_SIZE default
	rdb := redis.NewClient(opt)
	ctx := context.Background()
	sha, err := rdb.ScriptLoad(ctx, hgetScript).Result()
	if err != nil {
		return err
	}
	srv := &fasthttp.Server{Handler: func(c *fasthttp.RequestCtx) {
		if string(c.Path()) == "/healthz" {
			c.SetBodyString("ok")
			return
		}
		v, err := rdb.EvalSha(c, sha, []string{key}, "f").Text()
		if err != nil {
			c.Error(err.Error(), 500)
			return
		}
		c.SetBodyString(v)
	}, Name: "ceiling", NoDefaultServerHeader: true}
	return srv.ListenAndServe(addr)
}

// RedisBench is what redis-benchmark measured.
type RedisBench struct {
	Command string    `json:"command"`
	Clients int       `json:"clients"`
	RPS     float64   `json:"rps"`
	AvgMS   float64   `json:"avg_ms"`
	P50MS   float64   `json:"p50_ms"`
	P99MS   float64   `json:"p99_ms"`
	MaxMS   float64   `json:"max_ms"`
	CPU     CPUSample `json:"cpu_seconds,omitempty"`
	Error   string    `json:"error,omitempty"`
}

// runRedisBenchmark runs redis-benchmark EVALSHA of hgetScript on key with
// n requests and reads its CSV answer.
func runRedisBenchmark(ctx context.Context, redisURL string, rdb *redis.Client, key string, n, clients int) RedisBench {
	out := RedisBench{Clients: clients}
	sha, err := rdb.ScriptLoad(ctx, hgetScript).Result()
	if err != nil {
		out.Error = err.Error()
		return out
	}
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	host, port, _ := strings.Cut(opt.Addr, ":")
	args := []string{"-h", host, "-p", port, "--dbnum", strconv.Itoa(opt.DB), "-c", strconv.Itoa(clients),
		"-n", strconv.Itoa(n), "--csv"}
	if opt.Password != "" {
		args = append(args, "-a", opt.Password)
		if opt.Username != "" {
			args = append(args, "--user", opt.Username)
		}
	}
	args = append(args, "EVALSHA", sha, "1", key, "f")
	out.Command = "redis-benchmark -c " + strconv.Itoa(clients) + " -n " + strconv.Itoa(n) + " EVALSHA <sha of HGET script> 1 key f"
	cmd := exec.CommandContext(ctx, "redis-benchmark", args...)
	raw, err := cmd.Output()
	if err != nil {
		out.Error = fmt.Sprintf("redis-benchmark: %v", err)
		return out
	}
	recs, err := csv.NewReader(strings.NewReader(string(raw))).ReadAll()
	if err != nil || len(recs) < 2 {
		out.Error = fmt.Sprintf("redis-benchmark CSV: %v: %q", err, raw)
		return out
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	row := recs[len(recs)-1]
	get := func(name string) float64 {
		i, ok := col[name]
		if !ok || i >= len(row) {
			return 0
		}
		v, _ := strconv.ParseFloat(row[i], 64)
		return v
	}
	out.RPS, out.AvgMS, out.P50MS, out.P99MS, out.MaxMS = get("rps"), get("avg_latency_ms"), get("p50_latency_ms"), get("p99_latency_ms"), get("max_latency_ms")
	if out.RPS == 0 {
		out.Error = fmt.Sprintf("redis-benchmark: no rps in %q", raw)
	}
	return out
}

// PGBench is what pgbench measured for one customer spread.
type PGBench struct {
	Name       string     `json:"name"`
	Clients    int        `json:"clients"`
	Accounts   int        `json:"accounts"`
	Seconds    float64    `json:"seconds"`
	TPS        float64    `json:"tps"`
	LatencyMS  float64    `json:"latency_avg_ms"`
	Failed     int64      `json:"failed"`
	CPU        CPUSample  `json:"cpu_seconds"`
	Settings   [][]string `json:"settings,omitempty"`
	Error      string     `json:"error,omitempty"`
	ScriptText string     `json:"script"`
}

// pgbenchScript is a consume in a Postgres-only design: take the cost off
// the account and append a ledger row, in one transaction.
const pgbenchScript = `\set id %s
\set cost 1
\set k random(1, 1000000000000)
BEGIN;
UPDATE bench_account SET balance = balance - :cost WHERE id = :id RETURNING balance;
INSERT INTO bench_ledger (account_id, delta, type, idempotency_key) VALUES (:id, -:cost, 'consumption', 'k-' || :k);
END;
`

// preparePGBench creates the Postgres-only tables in db with n accounts.
func preparePGBench(ctx context.Context, dbURL string, n int) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for _, q := range []string{
		`CREATE TABLE bench_account (id INTEGER PRIMARY KEY, balance BIGINT NOT NULL)`,
		`CREATE TABLE bench_ledger (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, account_id INTEGER NOT NULL,
			delta BIGINT NOT NULL, type TEXT NOT NULL, idempotency_key TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())`,
		fmt.Sprintf(`INSERT INTO bench_account SELECT g, 1000000000000 FROM generate_series(1, %d) g`, n),
		`VACUUM ANALYZE bench_account`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", strings.Fields(q)[0], err)
		}
	}
	return nil
}

var (
	tpsRe     = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	latRe     = regexp.MustCompile(`latency average = ([0-9.]+) ms`)
	failedRe  = regexp.MustCompile(`number of failed transactions: ([0-9]+)`)
	pgbenchID = map[bool]string{false: "random(1, :accounts)", true: "1"}
)

// runPGBench runs the script for dur with clients connections, spread over
// accounts rows or on one hot row.
func runPGBench(ctx context.Context, dbURL, dir string, accounts, clients int, hot bool, dur time.Duration, probe *CPUProbe) PGBench {
	name := "spread"
	if hot {
		name = "hot"
	}
	script := fmt.Sprintf(pgbenchScript, pgbenchID[hot])
	out := PGBench{Name: name, Clients: clients, Accounts: accounts, Seconds: dur.Seconds(), ScriptText: script}
	path := filepath.Join(dir, "consume-"+name+".sql")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		out.Error = err.Error()
		return out
	}
	jobs := min(clients, 2)
	args := []string{"-n", "-c", strconv.Itoa(clients), "-j", strconv.Itoa(jobs), "-T", strconv.Itoa(int(dur.Seconds())),
		"-D", "accounts=" + strconv.Itoa(accounts), "-f", path, dbURL}
	before := probe.Sample()
	raw, err := exec.CommandContext(ctx, "pgbench", args...).CombinedOutput()
	out.CPU = probe.Sample().Sub(before)
	if err != nil {
		out.Error = fmt.Sprintf("pgbench: %v: %s", err, lastLines(string(raw), 5))
		return out
	}
	m := tpsRe.FindStringSubmatch(string(raw))
	if m == nil {
		out.Error = "pgbench: no tps in output: " + lastLines(string(raw), 5)
		return out
	}
	out.TPS, _ = strconv.ParseFloat(m[1], 64)
	if m := latRe.FindStringSubmatch(string(raw)); m != nil {
		out.LatencyMS, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := failedRe.FindStringSubmatch(string(raw)); m != nil {
		out.Failed, _ = strconv.ParseInt(m[1], 10, 64)
	}
	return out
}

// pgSettings reads the durability settings the comparison depends on.
func pgSettings(ctx context.Context, dbURL string) [][]string {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil
	}
	defer conn.Close(ctx)
	var out [][]string
	for _, name := range []string{"server_version", "fsync", "synchronous_commit", "wal_sync_method", "shared_buffers", "max_connections"} {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", name).Scan(&v); err == nil {
			out = append(out, []string{name, v})
		}
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
