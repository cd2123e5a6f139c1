package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
)

// The floors scenario (issue 10: a goal not met needs the profile that
// names what is left and why it cannot go lower on this box). Each
// component of a consume gets a floor: the durable work the spec makes a
// consume do, done with no logic, with the sizes copied from the run's own
// consumes:
//
//   - Redis: one FCALL of floorLibrary's function on an account hash copied
//     from the run (HGETALL, HSET of every field back, XADD of an entry the
//     size of a real consume's outbox entry, SET of a record the size of a
//     real op record with PX 24 h), plus the idempotency claim (SET NX GET).
//   - creditd: the floor server (this binary, -floor-server): an HTTP
//     request, the claim, one indexed single-row look-up in Postgres (the
//     applied-operations query a consume runs), the FCALL, a fixed reply.
//   - Postgres: the rows a consume writes (an operation record, a ledger
//     entry, a webhook event, COPYed from copies of real rows) and the
//     account and block rows (updated once per customer and block of a
//     group, at the run's rate per op), in one transaction per group of the
//     persister's size.
//
// Run alone: `go run ./bench -scenarios floors`.

// floorLibrary is the Redis floor of a consume: what a consume must make
// Redis do, with no pricing, no draining and no encoding.
const floorLibrary = `#!lua name=benchfloor
redis.register_function('benchfloor_consume', function(keys, args)
  local a = redis.call('HGETALL', keys[1])
  redis.call('HSET', keys[1], unpack(a))
  redis.call('XADD', keys[2], '*', 'm', args[1])
  redis.call('SET', keys[3], args[2], 'PX', 86400000)
  return 1
end)
`

// floorLookupSQL is the look-up a consume makes in Postgres per request
// (persist/applied.go's appliedSQL): an index probe that finds no row.
const floorLookupSQL = `SELECT customer_id, mutation FROM operations WHERE tenant_id = $1 AND idempotency_key = $2`

// floorGroupDefault is the Postgres floor's group size when the run has no
// pg-statements measure of the persister's.
const floorGroupDefault = 100

// FloorsResult is the floors scenario's outcome.
type FloorsResult struct {
	Sample   FloorSample     `json:"sample"`
	Server   *FloorServerRun `json:"creditd_redis_floor,omitempty"`
	Postgres *PGFloorRun     `json:"postgres_floor,omitempty"`
	Error    string          `json:"error,omitempty"`
}

// FloorSample is what the floors copy from the run's own consumes.
type FloorSample struct {
	AccountKey    string `json:"account_key"`
	AccountFields int    `json:"account_fields"`
	// AccountBytes is the fields' names and values, summed.
	AccountBytes int `json:"account_bytes"`
	// OutboxEntryBytes is the longest consume Mutation caught in the
	// outbox streams during a burst of consumes (the persister deletes
	// entries once applied).
	OutboxEntryBytes int `json:"outbox_entry_bytes"`
	// OpRecordBytes is a consume's op key value; ClaimBytes the HTTP
	// idempotency record's (0: none found, OpRecordBytes then stands in).
	OpRecordBytes int    `json:"op_record_bytes"`
	ClaimBytes    int    `json:"claim_bytes"`
	Note          string `json:"note,omitempty"`
}

// FloorServerRun is the floor server's run: creditd's floor and, on its
// private redis-server, Redis's.
type FloorServerRun struct {
	Run *RunResult `json:"run"`
	// CPU: "floor server", "redis-server" (the private one: only the
	// floor's work) and "postgres" (the shared server: the look-ups and
	// whatever else runs there).
	CPU   CPUSample    `json:"cpu_seconds"`
	Redis []RedisCalls `json:"redis_commands"`
	// ServerUSPerRequest, RedisUSPerRequest and PostgresUSPerRequest are
	// CPU µs per acknowledged request.
	ServerUSPerRequest   float64 `json:"server_cpu_us_per_request"`
	RedisUSPerRequest    float64 `json:"redis_cpu_us_per_request"`
	PostgresUSPerRequest float64 `json:"postgres_cpu_us_per_request"`
	// LookupBackendUSPerRequest is the CPU of the floor server's own
	// Postgres backends per request: the look-up alone, without the
	// shared server's other work; LookupBackends is how many were sampled.
	LookupBackendUSPerRequest float64 `json:"lookup_backend_cpu_us_per_request"`
	LookupBackends            int     `json:"lookup_backends"`
	// FcallUSPerCall is INFO commandstats usec_per_call of the floor FCALL.
	FcallUSPerCall float64 `json:"fcall_usec_per_call"`
}

// PGFloorRun is the Postgres floor's run.
type PGFloorRun struct {
	GroupSize   int    `json:"group_size"`
	GroupSource string `json:"group_source"`
	// AccountsPerOp and BlocksPerOp are the rows updated per op, from the
	// consume scenario's pg_stat_user_tables (1 when not measured).
	AccountsPerOp float64 `json:"accounts_per_op"`
	BlocksPerOp   float64 `json:"blocks_per_op"`
	// RowBytes is each copied table's sampled row, COPY binary bytes.
	RowBytes map[string]int `json:"row_bytes"`
	Groups   int            `json:"groups"`
	Ops      int64          `json:"ops"`
	Seconds  float64        `json:"seconds"`
	CPU      CPUSample      `json:"cpu_seconds"`
	// PostgresUSPerOp is Postgres's CPU (every process of the server) per
	// op; StatementUSPerOp the client's wall time of the group's
	// statements per op, by step ("COPY operations", ..., "COMMIT").
	PostgresUSPerOp  float64            `json:"postgres_cpu_us_per_op"`
	StatementUSPerOp map[string]float64 `json:"statement_us_per_op"`
	// BackendUSPerOp is the CPU of the floor's own backend alone per op
	// (the server's other processes, and on the shared server others'
	// work, left out).
	BackendUSPerOp float64 `json:"backend_cpu_us_per_op"`
	// PGStatUSPerOp and PGStatTop are pg_stat_statements' top-level
	// statement time per op and top statements, on a cluster that loads
	// it (the pg-statements scenario's).
	PGStatUSPerOp float64       `json:"pg_stat_statements_us_per_op,omitempty"`
	PGStatTop     []PGStatement `json:"pg_stat_statements_top,omitempty"`
	Error         string        `json:"error,omitempty"`
}

// floors runs the scenario and stores its result; a failure is reported,
// not fatal to the rest of the bench.
func (b *Bench) floors(ctx context.Context) {
	r := &FloorsResult{}
	b.res.Floors = r
	t0 := time.Now()
	if err := b.floorsRun(ctx, r); err != nil {
		r.Error = err.Error()
		logf("floors: %v", err)
	}
	logf("floors: done in %.0fs", time.Since(t0).Seconds())
}

func (b *Bench) floorsRun(ctx context.Context, r *FloorsResult) error {
	if b.target == nil || len(b.target.Customers) == 0 {
		return errors.New("no seeded customers")
	}
	entry, record, claim, err := b.floorSample(ctx, &r.Sample)
	if err != nil {
		return err
	}
	if _, errText := b.waitDrained(ctx, 3*time.Minute); errText != "" {
		return errors.New(errText)
	}
	pgRun := b.pgFloorOn(ctx, b.pgFloorParams(), b.dbURL, b.probe, nil, "")
	r.Postgres = pgRun
	if pgRun.Error != "" {
		logf("floors: postgres: %s", pgRun.Error)
	} else {
		logf("floors: postgres: group %d, %.0f µs CPU per op", pgRun.GroupSize, pgRun.PostgresUSPerOp)
	}
	srv, err := b.floorServer(ctx, r.Sample.AccountKey, entry, record, claim)
	if err != nil {
		return err
	}
	r.Server = srv
	logf("floors: server %.0f µs, redis %.0f µs (FCALL %.1f µs), postgres %.0f µs per request",
		srv.ServerUSPerRequest, srv.RedisUSPerRequest, srv.FcallUSPerCall, srv.PostgresUSPerRequest)
	return nil
}

// floorSample copies a seeded account and, from a short burst of consumes,
// the size of a consume's outbox entry, op record and idempotency record.
func (b *Bench) floorSample(ctx context.Context, s *FloorSample) (entry, record, claim string, err error) {
	c := b.target.Customers[len(b.target.Customers)/2]
	id, err := uuid.Parse(c.ID)
	if err != nil {
		return "", "", "", err
	}
	s.AccountKey = accountKey(b.prefix, id)
	acct, err := b.rdb.HGetAll(ctx, s.AccountKey).Result()
	if err != nil || len(acct) == 0 {
		return "", "", "", fmt.Errorf("account %s: %v (%d fields)", s.AccountKey, err, len(acct))
	}
	s.AccountFields = len(acct)
	for k, v := range acct {
		s.AccountBytes += len(k) + len(v)
	}
	var outboxes []string
	iter := b.rdb.Scan(ctx, 0, "{"+b.prefix+":p*}:outbox", 1000).Iterator()
	for iter.Next(ctx) {
		outboxes = append(outboxes, iter.Val())
	}
	if len(outboxes) == 0 {
		return "", "", "", errors.New("no outbox stream of the run's prefix")
	}
	sc := b.target.scenarios()["consume"](false)
	g := NewGenerator(strings.TrimPrefix(b.target.Base, "http://"), b.o.Workers)
	entry, burst := b.catchConsumeEntry(ctx, outboxes, func() RunResult { return g.Run(ctx, 2000, 2*time.Second, sc.op) })
	if burst.OK == 0 {
		return "", "", "", fmt.Errorf("burst of consumes: none acknowledged (%s)", burst.ErrorSummary())
	}
	if entry == "" {
		return "", "", "", errors.New("no consume outbox entry caught during the burst")
	}
	s.OutboxEntryBytes = len(entry)
	record = b.sampleString(ctx, "{"+b.prefix+":p*}:op:*")
	claim = b.sampleString(ctx, "{"+b.prefix+"*:i:*")
	s.OpRecordBytes, s.ClaimBytes = len(record), len(claim)
	switch {
	case record == "" && claim == "":
		return "", "", "", errors.New("neither an op key nor an idempotency record of the run found")
	case record == "":
		record = claim
		s.Note = "no op key found: the op record is the idempotency record's size"
	case claim == "":
		claim = record
		s.Note = "no HTTP idempotency record found: the claim is the op record's size"
	}
	return entry, record, claim, nil
}

// sampleString is the value of the first string key matching pattern in a
// bounded SCAN (the shared Redis holds others' keys), or "".
func (b *Bench) sampleString(ctx context.Context, pattern string) string {
	var cursor uint64
	for i := 0; i < 500; i++ {
		keys, next, err := b.rdb.Scan(ctx, cursor, pattern, 2000).Result()
		if err != nil {
			return ""
		}
		for _, k := range keys {
			if v, err := b.rdb.Get(ctx, k).Result(); err == nil {
				return v
			}
		}
		if cursor = next; cursor == 0 {
			return ""
		}
	}
	return ""
}

// floorServer runs the floor server on a private redis-server holding
// copies of the sampled account, at the consume run's offered rate.
func (b *Bench) floorServer(ctx context.Context, acctKey, entry, record, claim string) (*FloorServerRun, error) {
	rs, err := startPrivateRedis(ctx, filepath.Join(b.tmp, "redis-floor.log"))
	if err != nil {
		return nil, err
	}
	defer rs.Stop()
	if err := rs.rdb.FunctionLoad(ctx, floorLibrary).Err(); err != nil {
		return nil, fmt.Errorf("FUNCTION LOAD: %w", err)
	}
	acct, err := b.rdb.HGetAll(ctx, acctKey).Result()
	if err != nil {
		return nil, err
	}
	fields := make([]any, 0, 2*len(acct))
	for k, v := range acct {
		fields = append(fields, k, v)
	}
	n := len(b.target.Customers)
	pipe := rs.rdb.Pipeline()
	for i := 0; i < n; i++ {
		pipe.HSet(ctx, floorAccountKey(i), fields...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("copy accounts: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := startProc("floor", self, []string{"-floor-server", addr},
		[]string{"REDIS_URL=redis://" + rs.Addr + "/0", "DATABASE_URL=" + withAppName(b.dbURL, floorAppName), "FLOOR_ACCOUNTS=" + strconv.Itoa(n),
			// Hex: the copied values are binary (an op record may hold NUL,
			// which an environment variable cannot).
			"FLOOR_ENTRY=" + hex.EncodeToString([]byte(entry)), "FLOOR_RECORD=" + hex.EncodeToString([]byte(record)),
			"FLOOR_CLAIM=" + hex.EncodeToString([]byte(claim))}, addr, filepath.Join(b.tmp, "floor.log"))
	if err != nil {
		return nil, err
	}
	defer p.Stop()
	probe := &CPUProbe{Redis: rs.Pid(), Postmaster: b.probe.Postmaster, Extra: map[string]int{"floor server": p.Pid()}}
	rate := 1000.0
	if s := b.res.scenario("consume"); s != nil && s.Run != nil && s.Run.Offered > 0 {
		rate = s.Run.Offered
	}
	uri := "http://" + addr + "/consume"
	op := func(w *worker, _ uint64) (int, error) {
		w.req.Reset()
		w.resp.Reset()
		w.req.SetRequestURI(uri)
		w.req.Header.SetMethod("POST")
		return w.do()
	}
	g := NewGenerator(addr, b.o.Workers)
	if warm := g.Run(ctx, 1, time.Millisecond, op); warm.OK != 1 {
		return nil, fmt.Errorf("floor server: probe failed (%s): %s", warm.ErrorSummary(), tail(filepath.Join(b.tmp, "floor.log"), 500))
	}
	// The server opens its pool's connections at start (MinConns): their
	// backends are sampled on their own.
	var backends []int
	for i := 0; i < 40 && len(backends) < floorPoolConns; i++ {
		backends = backendsOf(ctx, b.pg, floorAppName)
		time.Sleep(50 * time.Millisecond)
	}
	backendCPU := func() float64 {
		var t float64
		for _, pid := range backends {
			if s, _, _, err := procTimes(pid); err == nil {
				t += s
			}
		}
		return t
	}
	cs0 := commandStats(ctx, rs.rdb)
	cpu0, own0 := probe.Sample(), backendCPU()
	run := g.Run(ctx, rate, b.o.Duration, op)
	out := &FloorServerRun{Run: &run, CPU: probe.Sample().Sub(cpu0), LookupBackends: len(backends)}
	if run.OK > 0 {
		out.LookupBackendUSPerRequest = (backendCPU() - own0) * 1e6 / float64(run.OK)
	}
	out.Redis = redisDelta(cs0, commandStats(ctx, rs.rdb), float64(run.OK))
	if run.OK == 0 {
		return out, fmt.Errorf("floor server: no request acknowledged (%s)", run.ErrorSummary())
	}
	ops := float64(run.OK)
	out.ServerUSPerRequest = out.CPU["floor server"] * 1e6 / ops
	out.RedisUSPerRequest = out.CPU["redis-server"] * 1e6 / ops
	out.PostgresUSPerRequest = out.CPU["postgres"] * 1e6 / ops
	for _, c := range out.Redis {
		if c.Command == "fcall" {
			out.FcallUSPerCall = c.UsecPerCall
		}
	}
	return out, nil
}

// floorAppName is the floor server's application_name in Postgres, by
// which the bench finds its backends; floorPoolConns its pool's size.
const (
	floorAppName   = "bench-floor"
	floorPoolConns = 8
)

// withAppName is dbURL with application_name set to name.
func withAppName(dbURL, name string) string {
	sep := "?"
	if strings.Contains(dbURL, "?") {
		sep = "&"
	}
	return dbURL + sep + "application_name=" + name
}

// backendsOf is the pids of the backends of application name on the
// server conn is connected to.
func backendsOf(ctx context.Context, conn *pgx.Conn, name string) []int {
	if conn == nil {
		return nil
	}
	rows, err := conn.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", name)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			out = append(out, pid)
		}
	}
	return out
}

// floorAccountKey is the floor's i-th account copy.
func floorAccountKey(i int) string { return "{f}:a:" + strconv.Itoa(i) }

// serveFloor is the bench binary's hidden floor server: per request the
// round trips a consume needs and no logic (the Redis claim, the Postgres
// look-up, one FCALL of floorLibrary), then a fixed reply.
func serveFloor(addr string) error {
	opt, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	if err != nil {
		return err
	}
	opt.PoolSize = 64 // as creditd's CREDITD_REDIS_POOL_SIZE default
	rdb := redis.NewClient(opt)
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	pcfg.MaxConns, pcfg.MinConns = floorPoolConns, floorPoolConns
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return err
	}
	accounts, _ := strconv.Atoi(os.Getenv("FLOOR_ACCOUNTS"))
	if accounts < 1 {
		accounts = 1
	}
	entry, record, claim, err := floorValues(os.Getenv("FLOOR_ENTRY"), os.Getenv("FLOOR_RECORD"), os.Getenv("FLOOR_CLAIM"))
	if err != nil {
		return err
	}
	tenant := uuid.MustParse("00000000-0000-7000-8000-000000000001")
	var seq atomic.Uint64
	srv := &fasthttp.Server{Handler: func(c *fasthttp.RequestCtx) {
		if string(c.Path()) == "/healthz" {
			c.SetBodyString("ok")
			return
		}
		n := seq.Add(1)
		key := strconv.FormatUint(n, 36)
		err := rdb.SetArgs(c, "{f}:i:"+key, claim, redis.SetArgs{Mode: "NX", Get: true, TTL: 24 * time.Hour}).Err()
		if err != nil && !errors.Is(err, redis.Nil) {
			c.Error(err.Error(), 500)
			return
		}
		var customer, mutation any
		if err := pool.QueryRow(c, floorLookupSQL, tenant, key).Scan(&customer, &mutation); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			c.Error(err.Error(), 500)
			return
		}
		if err := rdb.FCall(c, "benchfloor_consume", []string{floorAccountKey(int(n % uint64(accounts))), "{f}:outbox", "{f}:op:" + key},
			entry, record).Err(); err != nil {
			c.Error(err.Error(), 500)
			return
		}
		c.SetContentType("application/json")
		c.SetBodyString(`{"ok":true}`)
	}, Name: "floor", NoDefaultServerHeader: true}
	return srv.ListenAndServe(addr)
}

// pgFloorTables are the tables whose rows a consume inserts, with the
// filter that picks a consume's row to copy. A consume writes no
// operations row: its record is its ledger entry's op_head
// (docs/decisions.md, "Lean records (issue 26 item 4)"); and no
// webhook_events row: its ledger entry carries its credit.consumed
// (persist/carried.go).
var pgFloorTables = []struct{ table, filter string }{
	{"ledger_entries", "type = 'consumption' AND billable_metric_key = '" + metricConsume + "'"},
}

// pgFloorTable is one inserted table's copy: its sampled row and the
// fields a copy changes so unique indexes hold.
type pgFloorTable struct {
	name, copySQL string
	fields        [][]byte // COPY binary fields of the sampled row; nil is NULL
	unique        map[int]string
}

// pgFloorParams is the Postgres floor's group size and rows per op: the
// persister's group in pg-statements' consume run, the consume scenario's
// account and block rows per op.
func (b *Bench) pgFloorParams() *PGFloorRun {
	out := &PGFloorRun{GroupSize: floorGroupDefault, GroupSource: "default (no pg-statements run)", AccountsPerOp: 1, BlocksPerOp: 1,
		RowBytes: map[string]int{}, StatementUSPerOp: map[string]float64{}}
	if run := b.res.PGStatements.run("consume"); run != nil {
		for _, s := range run.Top {
			if s.Gist == "COPY ledger_entries" && s.RowsPerCall >= 1 {
				out.GroupSize = int(s.RowsPerCall + 0.5)
				out.GroupSource = "rows per call of COPY ledger_entries in pg-statements' consume run"
			}
		}
	}
	if s := b.res.scenario("consume"); s != nil && s.PG != nil {
		for _, t := range s.PG.Tables {
			switch t.Name {
			case "credit_accounts":
				out.AccountsPerOp = t.Inserted + t.Updated
			case "credit_blocks":
				out.BlocksPerOp = t.Inserted + t.Updated
			}
		}
	}
	return out
}

// pgFloorOn measures the Postgres floor with out's parameters in the
// database at dbURL, Postgres's CPU sampled by probe; with stats (a
// connection to the cluster's postgres database, which loads
// pg_stat_statements) it also reads the floor's statements.
func (b *Bench) pgFloorOn(ctx context.Context, out *PGFloorRun, dbURL string, probe *CPUProbe, stats *pgx.Conn, dbName string) *PGFloorRun {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		out.Error = err.Error()
		return out
	}
	defer conn.Close(context.Background())
	var backend int
	_ = conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend)
	var tables []*pgFloorTable
	for _, t := range pgFloorTables {
		ft, err := prepareFloorTable(ctx, conn, t.table, t.filter)
		if err != nil {
			out.Error = fmt.Sprintf("%s: %v", t.table, err)
			return out
		}
		tables = append(tables, ft)
		out.RowBytes[t.table] = encodedLen(ft.fields)
	}
	var accounts, blocks [][16]byte
	for _, q := range []struct {
		table, id string
		ids       *[][16]byte
	}{{"credit_accounts", "customer_id", &accounts}, {"credit_blocks", "id", &blocks}} {
		for _, s := range []string{"DROP TABLE IF EXISTS floor_" + q.table,
			fmt.Sprintf("CREATE TABLE floor_%s (LIKE %s INCLUDING ALL)", q.table, q.table),
			fmt.Sprintf("INSERT INTO floor_%s SELECT * FROM %s", q.table, q.table)} {
			if _, err := conn.Exec(ctx, s); err != nil {
				out.Error = fmt.Sprintf("%s: %v", s, err)
				return out
			}
		}
		rows, err := conn.Query(ctx, fmt.Sprintf("SELECT %s FROM floor_%s", q.id, q.table))
		if err != nil {
			out.Error = err.Error()
			return out
		}
		for rows.Next() {
			var id [16]byte
			if rows.Scan(&id) == nil {
				*q.ids = append(*q.ids, id)
			}
		}
		rows.Close()
		if len(*q.ids) == 0 {
			out.Error = "no rows in " + q.table
			return out
		}
	}
	g := out.GroupSize
	nAcc, nBlk := max(1, int(float64(g)*out.AccountsPerOp+0.5)), max(1, int(float64(g)*out.BlocksPerOp+0.5))
	var seq uint64 = 1 << 40
	var ai, bi int
	pick := func(ids [][16]byte, at *int, n int) [][16]byte {
		out := make([][16]byte, n)
		for i := range out {
			out[i] = ids[*at%len(ids)]
			*at++
		}
		return out
	}
	steps := map[string]time.Duration{}
	timed := func(name string, f func() error) error {
		t0 := time.Now()
		err := f()
		steps[name] += time.Since(t0)
		return err
	}
	if stats != nil {
		if _, err := stats.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
			out.Error = err.Error()
			return out
		}
	}
	dur := b.o.Duration
	cpu0 := probe.Sample()
	own0, _, _, _ := procTimes(backend)
	t0 := time.Now()
	for time.Since(t0) < dur && ctx.Err() == nil {
		err := func() error {
			tx, err := conn.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			for _, ft := range tables {
				data := ft.copyData(g, &seq)
				if err := timed("COPY "+ft.name, func() error {
					_, err := tx.Conn().PgConn().CopyFrom(ctx, bytes.NewReader(data), ft.copySQL)
					return err
				}); err != nil {
					return fmt.Errorf("COPY %s: %w", ft.name, err)
				}
			}
			if err := timed("UPDATE credit_accounts", func() error {
				_, err := tx.Exec(ctx, `UPDATE floor_credit_accounts SET balance = balance - 1, version = version + 1, updated_at = now()
					WHERE customer_id = ANY($1)`, pick(accounts, &ai, nAcc))
				return err
			}); err != nil {
				return err
			}
			if err := timed("UPDATE credit_blocks", func() error {
				_, err := tx.Exec(ctx, `UPDATE floor_credit_blocks SET remaining_amount = remaining_amount - 1, version = version + 1
					WHERE id = ANY($1)`, pick(blocks, &bi, nBlk))
				return err
			}); err != nil {
				return err
			}
			return timed("COMMIT", func() error { return tx.Commit(ctx) })
		}()
		if err != nil {
			out.Error = err.Error()
			break
		}
		out.Groups++
		out.Ops += int64(g)
	}
	out.Seconds = time.Since(t0).Seconds()
	out.CPU = probe.Sample().Sub(cpu0)
	own1, _, _, ownErr := procTimes(backend)
	if out.Ops > 0 {
		out.PostgresUSPerOp = out.CPU["postgres"] * 1e6 / float64(out.Ops)
		if ownErr == nil && backend > 0 {
			out.BackendUSPerOp = (own1 - own0) * 1e6 / float64(out.Ops)
		}
		if stats != nil {
			rows, err := readStatements(ctx, stats, dbName)
			if err != nil {
				out.Error = err.Error()
			}
			out.PGStatTop, out.PGStatUSPerOp, _ = topStatements(rows, float64(out.Ops), pgstatTop)
		}
		for k, d := range steps {
			out.StatementUSPerOp[k] = float64(d.Microseconds()) / float64(out.Ops)
		}
	}
	for _, t := range []string{"operations", "ledger_entries", "webhook_events", "credit_accounts", "credit_blocks"} {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS floor_"+t)
	}
	return out
}

// prepareFloorTable creates floor_<table> LIKE table and reads one row of
// table matching filter as COPY binary fields.
func prepareFloorTable(ctx context.Context, conn *pgx.Conn, table, filter string) (*pgFloorTable, error) {
	for _, s := range []string{"DROP TABLE IF EXISTS floor_" + table, fmt.Sprintf("CREATE TABLE floor_%s (LIKE %s INCLUDING ALL)", table, table)} {
		if _, err := conn.Exec(ctx, s); err != nil {
			return nil, err
		}
	}
	// Generated columns cannot be copied in; every other column is.
	rows, err := conn.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum`, "floor_"+table)
	if err != nil {
		return nil, err
	}
	var cols, types []string
	for rows.Next() {
		var c, t string
		if err := rows.Scan(&c, &t); err != nil {
			rows.Close()
			return nil, err
		}
		cols, types = append(cols, pgx.Identifier{c}.Sanitize()), append(types, t)
	}
	rows.Close()
	uniq := map[string]bool{}
	rows, err = conn.Query(ctx, `SELECT DISTINCT a.attname FROM pg_index i
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
		WHERE i.indrelid = $1::regclass AND i.indisunique`, "floor_"+table)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var c string
		if rows.Scan(&c) == nil {
			uniq[pgx.Identifier{c}.Sanitize()] = true
		}
	}
	rows.Close()
	colList := strings.Join(cols, ", ")
	var buf bytes.Buffer
	if _, err := conn.PgConn().CopyTo(ctx, &buf, fmt.Sprintf("COPY (SELECT %s FROM %s WHERE %s ORDER BY created_at DESC LIMIT 1) TO STDOUT (FORMAT binary)",
		colList, table, filter)); err != nil {
		return nil, err
	}
	fields, err := parseCopyBinaryRow(buf.Bytes())
	if err != nil {
		return nil, err
	}
	if len(fields) != len(cols) {
		return nil, fmt.Errorf("no row where %s, or %d fields for %d columns", filter, len(fields), len(cols))
	}
	ft := &pgFloorTable{name: table, fields: fields, unique: map[int]string{},
		copySQL: fmt.Sprintf("COPY floor_%s (%s) FROM STDIN (FORMAT binary)", table, colList)}
	for i, c := range cols {
		if uniq[c] {
			ft.unique[i] = types[i]
		}
	}
	for i, t := range ft.unique {
		if _, err := uniqueField(t, fields[i], 1); err != nil {
			return nil, fmt.Errorf("column %s: %w", cols[i], err)
		}
	}
	return ft, nil
}

// copyBinarySignature opens every COPY binary stream.
var copyBinarySignature = []byte("PGCOPY\n\xff\r\n\x00")

// parseCopyBinaryRow is the fields of the first row of a COPY binary
// stream (nil for NULL), or none when the stream has no row.
func parseCopyBinaryRow(b []byte) ([][]byte, error) {
	if !bytes.HasPrefix(b, copyBinarySignature) || len(b) < len(copyBinarySignature)+8 {
		return nil, errors.New("not a COPY binary stream")
	}
	p := len(copyBinarySignature) + 4
	ext := int(binary.BigEndian.Uint32(b[p:]))
	p += 4 + ext
	if p+2 > len(b) {
		return nil, errors.New("short COPY binary stream")
	}
	n := int(int16(binary.BigEndian.Uint16(b[p:])))
	p += 2
	if n < 0 {
		return nil, nil
	}
	fields := make([][]byte, n)
	for i := range fields {
		if p+4 > len(b) {
			return nil, errors.New("short COPY binary row")
		}
		l := int(int32(binary.BigEndian.Uint32(b[p:])))
		p += 4
		if l < 0 {
			continue
		}
		if p+l > len(b) {
			return nil, errors.New("short COPY binary field")
		}
		fields[i] = b[p : p+l : p+l]
		p += l
	}
	return fields, nil
}

// uniqueField is field made unique by seq for a column of type typ.
func uniqueField(typ string, field []byte, seq uint64) ([]byte, error) {
	switch typ {
	case "uuid":
		u := make([]byte, 16)
		_, _ = rand.Read(u)
		return u, nil
	case "bigint":
		return binary.BigEndian.AppendUint64(nil, seq), nil
	case "integer":
		return binary.BigEndian.AppendUint32(nil, uint32(seq)), nil
	case "text", "character varying":
		return append(append(append([]byte{}, field...), '~'), strconv.FormatUint(seq, 36)...), nil
	case "timestamp with time zone":
		// The partition key (migrations 033 to 035) is in every key of its
		// table beside an id, which is varied: the instant stays, and with
		// it the month partition the row goes to.
		return field, nil
	}
	return nil, fmt.Errorf("a unique column of type %s cannot be varied", typ)
}

// copyData is a COPY binary stream of n copies of the sampled row, each
// unique in every unique column.
func (t *pgFloorTable) copyData(n int, seq *uint64) []byte {
	var b bytes.Buffer
	b.Write(copyBinarySignature)
	b.Write(make([]byte, 8)) // flags, header extension length
	for i := 0; i < n; i++ {
		*seq++
		_ = binary.Write(&b, binary.BigEndian, int16(len(t.fields)))
		for k, f := range t.fields {
			if typ, ok := t.unique[k]; ok && f != nil {
				f, _ = uniqueField(typ, f, *seq)
			}
			if f == nil {
				_ = binary.Write(&b, binary.BigEndian, int32(-1))
				continue
			}
			_ = binary.Write(&b, binary.BigEndian, int32(len(f)))
			b.Write(f)
		}
	}
	_ = binary.Write(&b, binary.BigEndian, int16(-1))
	return b.Bytes()
}

// encodedLen is a row's COPY binary size.
func encodedLen(fields [][]byte) int {
	n := 2
	for _, f := range fields {
		n += 4 + len(f)
	}
	return n
}

// floorValues decodes the floor server's hex-encoded copies of a real
// outbox entry, op record and claim (hex because they may hold NUL bytes).
func floorValues(hexes ...string) (entry, record, claim string, err error) {
	out := make([]string, len(hexes))
	for i, h := range hexes {
		b, err := hex.DecodeString(h)
		if err != nil {
			return "", "", "", fmt.Errorf("floor value %d: %w", i, err)
		}
		out[i] = string(b)
	}
	return out[0], out[1], out[2], nil
}
