package persist

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// profilePool opens a pool of one connection on a fresh migrated database,
// so pgSnapshot reads the backend Apply ran on; params are appended to the
// URL (e.g. "&synchronous_commit=off").
func profilePool(ctx context.Context, tb testing.TB, params string) *pgxpool.Pool {
	tb.Helper()
	url := testenv.Database(tb)
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	pool, err := Open(ctx, url+sep+"pool_max_conns=1"+params)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if err := Migrate(ctx, pool); err != nil {
		tb.Fatal(err)
	}
	return pool
}

// seedProfileCustomers stores n customers of a new tenant, two blocks
// each, and returns the tenant and the customers to consume from.
func seedProfileCustomers(ctx context.Context, tb testing.TB, store *Store, n int) (uuid.UUID, []profileCustomer) {
	tb.Helper()
	tenant := uuid.New()
	cs := make([]profileCustomer, n)
	grants := make([]engine.Mutation, n)
	for i := range cs {
		cs[i] = profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 2, balance: 2_000_000}
		grants[i] = cs[i].grant(tenant)
	}
	if err := store.Apply(ctx, grants); err != nil {
		tb.Fatal(err)
	}
	return tenant, cs
}

// TestApplyProfile measures what Postgres spends per consume Mutation in
// Apply: backend CPU (from /proc, the single pooled connection's backend),
// rows inserted and updated, statements and commits, WAL bytes. It is a
// measurement, not a check: it runs only when CREDITD_PG_PROFILE is set
// (to the batch sizes to try, e.g. "1,4,50,500") and logs the figures.
// CREDITD_PG_PROFILE_DRAWS=1 writes one entry per consume with Draws;
// CREDITD_PG_PROFILE_PARAMS adds URL parameters (e.g.
// "&synchronous_commit=off" to see what the WAL flush costs);
// CREDITD_PG_PROFILE_COPY_MIN sets the smallest batch written by COPY
// (default copyMinMutations).
func TestApplyProfile(t *testing.T) {
	sizes := os.Getenv("CREDITD_PG_PROFILE")
	if sizes == "" {
		t.Skip("set CREDITD_PG_PROFILE=1,4,50,500 to profile Apply")
	}
	ctx := context.Background()
	pool := profilePool(ctx, t, os.Getenv("CREDITD_PG_PROFILE_PARAMS"))
	store := NewStore(pool)
	if n, err := strconv.Atoi(os.Getenv("CREDITD_PG_PROFILE_COPY_MIN")); err == nil {
		store.copyMin = n
	}
	draws := os.Getenv("CREDITD_PG_PROFILE_DRAWS") != ""
	const customers, ops = 2000, 8000
	tenant, cs := seedProfileCustomers(ctx, t, store, customers)
	for _, f := range strings.Split(sizes, ",") {
		batch, err := strconv.Atoi(f)
		if err != nil || batch <= 0 {
			t.Fatalf("bad batch size %q", f)
		}
		ms := make([]engine.Mutation, ops)
		for i := range ms {
			ms[i] = cs[i%customers].consume(tenant, draws)
		}
		before := pgSnapshot(t, pool)
		for i := 0; i < len(ms); i += batch {
			if err := store.Apply(ctx, ms[i:min(i+batch, len(ms))]); err != nil {
				t.Fatal(err)
			}
		}
		after := pgSnapshot(t, pool)
		d := after.minus(before)
		t.Logf("batch %4d draws=%v: backend CPU %.1f µs/op, inserted %.2f, updated %.2f (HOT %.2f), commits %.3f, WAL %.0f B/op (%d ops)",
			batch, draws, float64(d.cpu.Microseconds())/ops, float64(d.ins)/ops, float64(d.upd)/ops, float64(d.hot)/ops,
			float64(d.commits)/ops, float64(d.wal)/ops, ops)
	}
}

type profileCustomer struct {
	id      uuid.UUID
	blocks  []uuid.UUID
	version int64
	balance int64
	n       int
}

func (c *profileCustomer) grant(tenant uuid.UUID) engine.Mutation {
	src := engine.Source("purchase")
	at := time.Now().UnixMilli()
	m := engine.Mutation{OpID: uuid.New(), Kind: engine.MutationGrant, TenantID: tenant, CustomerID: c.id,
		Environment: engine.EnvironmentLive, IdempotencyKey: "g-" + c.id.String(), AtMS: at,
		Account: engine.MutationAccount{ID: uuid.NewString(), Version: c.version, Balance: c.balance, LifetimeEarned: c.balance}}
	for _, b := range c.blocks {
		m.Entries = append(m.Entries, engine.MutationEntry{Role: engine.RoleMain, Delta: c.balance / 2, Type: engine.EntryTopup, Source: &src, BlockID: &b})
		m.Blocks = append(m.Blocks, engine.MutationBlock{ID: b, Original: c.balance / 2, Remaining: c.balance / 2, Source: src, StartsMS: at, CreatedMS: at})
	}
	return m
}

// consume charges 300 mc that two blocks pay: one entry with Draws when
// draws, else one entry per block (the scripts before issue 10).
func (c *profileCustomer) consume(tenant uuid.UUID, draws bool) engine.Mutation {
	c.version++
	c.n++
	before := c.balance
	c.balance -= 300
	metric := "tokens"
	units, rate := int64(3), int64(100)
	at := time.Now().UnixMilli()
	m := engine.Mutation{OpID: uuid.New(), Kind: engine.MutationConsume, TenantID: tenant, CustomerID: c.id,
		Environment: engine.EnvironmentLive, IdempotencyKey: fmt.Sprintf("c-%s-%d", c.id, c.n), RequestHash: "h", AtMS: at,
		Account:         engine.MutationAccount{Version: c.version, Balance: c.balance},
		Context:         &engine.MutationContext{ExternalID: "ext-" + c.id.String()[:8], Policy: engine.OveragePolicyBlock},
		EffectiveBefore: &before,
		Usage:           &engine.MutationUsage{Metric: metric, Units: units, Cost: 300, Charged: 300}}
	if draws {
		m.Entries = []engine.MutationEntry{{Role: engine.RoleMain, Delta: -300, Type: engine.EntryConsumption, Metric: &metric, Units: &units, Rate: &rate,
			Draws: []engine.EntryDraw{{BlockID: c.blocks[0], Amount: 100}, {BlockID: c.blocks[1], Amount: 200}}}}
	} else {
		m.Entries = []engine.MutationEntry{
			{Role: engine.RoleMain, Delta: -100, Type: engine.EntryConsumption, Metric: &metric, Units: &units, Rate: &rate, BlockID: &c.blocks[0]},
			{Role: engine.RoleMain, Delta: -200, Type: engine.EntryConsumption, Metric: &metric, Units: &units, Rate: &rate, BlockID: &c.blocks[1]}}
	}
	for _, b := range c.blocks {
		m.Blocks = append(m.Blocks, engine.MutationBlock{ID: b, Original: 1_000_000, Remaining: c.balance / 2, Source: "purchase", StartsMS: at, CreatedMS: at})
	}
	return m
}

// pgCounters are cumulative Postgres figures of the test database and the
// pool's one backend.
type pgCounters struct {
	cpu                    time.Duration
	ins, upd, hot, commits int64
	wal                    int64
}

func (a pgCounters) minus(b pgCounters) pgCounters {
	return pgCounters{cpu: a.cpu - b.cpu, ins: a.ins - b.ins, upd: a.upd - b.upd, hot: a.hot - b.hot,
		commits: a.commits - b.commits, wal: a.wal - b.wal}
}

func pgSnapshot(t testing.TB, pool *pgxpool.Pool) pgCounters {
	t.Helper()
	ctx := context.Background()
	var c pgCounters
	var pid int
	var lsn string
	if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	err := pool.QueryRow(ctx, `SELECT pg_backend_pid(),
		(SELECT COALESCE(sum(n_tup_ins), 0)::bigint FROM pg_stat_user_tables),
		(SELECT COALESCE(sum(n_tup_upd), 0)::bigint FROM pg_stat_user_tables),
		(SELECT COALESCE(sum(n_tup_hot_upd), 0)::bigint FROM pg_stat_user_tables),
		(SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
		pg_current_wal_lsn()::text`).Scan(&pid, &c.ins, &c.upd, &c.hot, &c.commits, &lsn)
	if err != nil {
		t.Fatal(err)
	}
	var hi, lo int64
	if _, err := fmt.Sscanf(lsn, "%X/%X", &hi, &lo); err != nil {
		t.Fatal(err)
	}
	c.wal = hi<<32 | lo
	c.cpu = backendCPU(t, pid)
	return c
}

// backendCPU is the CPU time process pid has run: the scheduler's own
// nanosecond count (/proc/pid/schedstat), else user+system in 10 ms ticks.
func backendCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid)); err == nil {
		if f := strings.Fields(string(raw)); len(f) > 0 {
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				return time.Duration(ns)
			}
		}
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

// TestApplyStatementProfile runs Apply's statements one at a time on
// batches of CREDITD_PG_PROFILE_BATCH consume Mutations and logs the
// backend CPU of each per Mutation (10 ms ticks: use big batches): the ON
// CONFLICT statements, or with CREDITD_PG_PROFILE_WAY=copy the lean COPY
// write's round trips and its commit.
func TestApplyStatementProfile(t *testing.T) {
	size, _ := strconv.Atoi(os.Getenv("CREDITD_PG_PROFILE_BATCH"))
	if size <= 0 {
		t.Skip("set CREDITD_PG_PROFILE_BATCH=500 to profile Apply's statements")
	}
	b := setup(t)
	draws := os.Getenv("CREDITD_PG_PROFILE_DRAWS") != ""
	const customers, ops = 2000, 32000
	tenant, cs := seedProfileCustomers(b.ctx, t, b.store, customers)
	ms := make([]engine.Mutation, ops)
	for i := range ms {
		ms[i] = cs[i%customers].consume(tenant, draws)
	}
	spent := map[string]time.Duration{}
	var order []string
	profile := profileStatements
	if os.Getenv("CREDITD_PG_PROFILE_WAY") == "copy" {
		profile = profileCopySteps
	}
	for i := 0; i < ops; i += size {
		tx, err := b.pool.Begin(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		var pid int
		if err := tx.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			t.Fatal(err)
		}
		timed := profile(t, b, tx, ms[i:min(i+size, ops)])
		cpu := backendCPU(t, pid)
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatal(err)
		}
		timed = append(timed, timedStatement{name: "COMMIT", took: backendCPU(t, pid) - cpu})
		for _, q := range timed {
			name := q.name
			if _, ok := spent[name]; !ok {
				order = append(order, name)
			}
			spent[name] += q.took
		}
		spent["wall"] += time.Since(start)
	}
	for _, name := range append(order, "wall") {
		t.Logf("%-28s %7.1f µs/op", name, float64(spent[name].Nanoseconds())/1000/ops)
	}
}

type timedStatement struct {
	name string
	took time.Duration
}

// profileStatements runs Apply's statements for ms in tx one by one.
func profileStatements(t *testing.T, b *bundle, tx pgx.Tx, ms []engine.Mutation) []timedStatement {
	t.Helper()
	batch := &pgx.Batch{}
	if err := queueApply(batch, ms, nil, shapeLean); err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var out []timedStatement
	for _, q := range batch.QueuedQueries {
		start := backendCPU(t, pid)
		if _, err := tx.Exec(b.ctx, q.SQL, q.Arguments...); err != nil {
			t.Fatal(err)
		}
		out = append(out, timedStatement{name: statementName(q.SQL), took: backendCPU(t, pid) - start})
	}
	return out
}

// profileCopySteps runs copyApply's round trips for ms in tx one by one.
func profileCopySteps(t *testing.T, b *bundle, tx pgx.Tx, ms []engine.Mutation) []timedStatement {
	t.Helper()
	steps, err := copySteps(ms, nil, shapeLean)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	if err := tx.QueryRow(b.ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var out []timedStatement
	for _, step := range steps {
		if step.batch == nil {
			start := backendCPU(t, pid)
			if err := step.run(b.ctx, tx); err != nil {
				t.Fatal(err)
			}
			out = append(out, timedStatement{name: step.name, took: backendCPU(t, pid) - start})
			continue
		}
		for i, q := range step.batch.QueuedQueries {
			start := backendCPU(t, pid)
			if step.read != nil && i == 0 {
				rows, err := tx.Query(b.ctx, q.SQL, q.Arguments...)
				if err != nil {
					t.Fatal(err)
				}
				if err := step.read(rows); err != nil {
					t.Fatal(err)
				}
				rows.Close()
			} else if _, err := tx.Exec(b.ctx, q.SQL, q.Arguments...); err != nil {
				t.Fatal(err)
			}
			out = append(out, timedStatement{name: step.name + ": " + statementName(q.SQL), took: backendCPU(t, pid) - start})
		}
	}
	return out
}

// statementName names sql in a profile by its first words and, for a
// statement opening with a WITH clause, its first table.
func statementName(sql string) string {
	f := strings.Fields(sql)
	name := strings.Join(f[:min(3, len(f))], " ")
	if len(f) > 0 && f[0] == "WITH" {
		for i := len(f) - 2; i >= 0; i-- {
			if f[i] == "INTO" {
				return "WITH ... INTO " + f[i+1]
			}
		}
	}
	return name
}
