package persist

import (
	"context"
	"errors"
	"sync"
	"testing"

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
