package persist

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/testenv"
)

// TestMigrateIdempotent runs Migrate again, and from several goroutines at
// once (as several creditd processes would), and expects each migration
// recorded exactly once.
func TestMigrateIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := Migrate(b.ctx, b.pool); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- Migrate(b.ctx, b.pool)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	var n, distinct int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*), count(DISTINCT version) FROM schema_migrations").Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n != len(ms) || distinct != len(ms) {
		t.Fatalf("schema_migrations has %d rows (%d distinct), want %d", n, distinct, len(ms))
	}
	// A fresh database ends contracted: every contract step recorded once.
	cs, err := contractions()
	if err != nil || len(cs) == 0 {
		t.Fatalf("contractions: %d, %v", len(cs), err)
	}
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*), count(DISTINCT version) FROM schema_contracts").Scan(&n, &distinct); err != nil {
		t.Fatal(err)
	}
	if n != len(cs) || distinct != len(cs) {
		t.Fatalf("schema_contracts has %d rows (%d distinct), want %d", n, distinct, len(cs))
	}
	// The session limits of Open survive Migrate's temporary lift.
	var timeout string
	if err := b.pool.QueryRow(b.ctx, "SHOW statement_timeout").Scan(&timeout); err != nil {
		t.Fatal(err)
	}
	if timeout != "10s" {
		t.Fatalf("statement_timeout = %q, want 10s", timeout)
	}
}

func TestOpenPoolLimits(t *testing.T) {
	t.Parallel()
	url := testenv.Database(t)
	tests := []struct {
		name string
		url  string
		want int32
	}{
		{"default", url, DefaultMaxConns},
		{"url sets it", url + "&pool_max_conns=3", 3},
	}
	for _, tc := range tests {
		pool, err := Open(context.Background(), tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := pool.Config().MaxConns
		pool.Close()
		if got != tc.want {
			t.Fatalf("%s: MaxConns = %d, want %d", tc.name, got, tc.want)
		}
	}
	if _, err := Open(context.Background(), "postgres://nobody@127.0.0.1:1/x?connect_timeout=1"); err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
}

// TestSchemaStatus: a fresh database has every migration pending (Check
// says behind), a migrated one is current, and one that records a version
// this binary does not know is newer: Check and Migrate both refuse it.
func TestSchemaStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := Open(ctx, testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	st, err := Schema(ctx, pool)
	if err != nil || len(st.Pending) != len(ms) || len(st.Applied) != 0 || !errors.Is(st.Check(), ErrSchemaBehind) {
		t.Fatalf("fresh: %+v %v, check %v", st, err, st.Check())
	}
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	st, err = Schema(ctx, pool)
	if err != nil || len(st.Pending) != 0 || len(st.Applied) != len(ms) || st.Latest != ms[len(ms)-1].version || st.Check() != nil {
		t.Fatalf("migrated: %+v %v, check %v", st, err, st.Check())
	}
	newer := st.Latest + 1
	if _, err := pool.Exec(ctx, "INSERT INTO schema_migrations (version, name) VALUES ($1, 'from_the_future')", newer); err != nil {
		t.Fatal(err)
	}
	st, err = Schema(ctx, pool)
	if err != nil || len(st.Unknown) != 1 || st.Unknown[0] != newer || !errors.Is(st.Check(), ErrSchemaNewer) {
		t.Fatalf("newer: %+v %v, check %v", st, err, st.Check())
	}
	if err := Migrate(ctx, pool); !errors.Is(err, ErrSchemaNewer) {
		t.Fatalf("Migrate on a newer schema = %v, want ErrSchemaNewer", err)
	}
}

// TestMigrateStepRetriesDeadlock: a step that Postgres rolls back as a
// deadlock's victim runs again. The step takes a SHARE lock, then an
// ACCESS EXCLUSIVE one (as 024 does); a writer that read the table first
// then inserts into it closes the cycle, with a long deadlock_timeout so
// the step's session is the one Postgres picks. The step is recorded once,
// on its second attempt, after the writer's commit.
func TestMigrateStepRetriesDeadlock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `CREATE TABLE lock_cycle (v int)`); err != nil {
		t.Fatal(err)
	}
	writer, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = writer.Rollback(b.ctx) }()
	for _, q := range []string{"SET LOCAL deadlock_timeout = '20s'", "SELECT count(*) FROM lock_cycle"} {
		if _, err := writer.Exec(b.ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := b.pool.Acquire(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	step := migration{version: 9001, name: "9001_lock_cycle", sql: `LOCK TABLE lock_cycle IN SHARE MODE;
		SELECT pg_sleep(0.3); LOCK TABLE lock_cycle IN ACCESS EXCLUSIVE MODE`}
	type result struct {
		attempts int
		err      error
	}
	done := make(chan result, 1)
	go func() {
		n, err := applyStep(b.ctx, conn.Conn(), step, "schema_migrations")
		done <- result{n, err}
	}()
	// The step holds SHARE and sleeps; the writer's insert waits for it,
	// the step's ACCESS EXCLUSIVE then waits for the writer: a cycle. The
	// insert waits until Postgres shows the step's SHARE lock granted: a
	// fixed pause lost the race on a loaded box (the insert ran first, no
	// cycle, one attempt).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var held bool
		if err := b.pool.QueryRow(b.ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
			WHERE c.relname = 'lock_cycle' AND l.mode = 'ShareLock' AND l.granted
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&held); err != nil {
			t.Fatal(err)
		}
		if held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the step never took its SHARE lock")
		}
	}
	if _, err := writer.Exec(b.ctx, "INSERT INTO lock_cycle VALUES (1)"); err != nil {
		t.Fatalf("writer: %v", err)
	}
	if err := writer.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.attempts != 2 {
		t.Fatalf("applyStep = %d attempts, %v; want 2, nil", r.attempts, r.err)
	}
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM schema_migrations WHERE version = 9001").Scan(&n); err != nil || n != 1 {
		t.Fatalf("step recorded %d times (%v)", n, err)
	}
}
