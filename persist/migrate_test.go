package persist

import (
	"context"
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
