package persist

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/creditd/creditd/internal/testenv"
)

// TestUnavailable: a Postgres nobody listens on, a query cut by its
// deadline and a server that is shutting down are "cannot answer now";
// a statement Postgres refuses and no rows are not.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	refused := func() error {
		url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?connect_timeout=2", testenv.FreePort(t))
		pool, err := Open(ctx, url)
		if err != nil {
			return err
		}
		defer pool.Close()
		return pool.QueryRow(ctx, `SELECT 1`).Scan(new(int))
	}
	deadline := func() error {
		qctx, qcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer qcancel()
		_, err := b.pool.Exec(qctx, `SELECT pg_sleep(2)`)
		return err
	}
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"connection refused", refused(), true},
		{"deadline", deadline(), true},
		{"shutting down", fmt.Errorf("persist: x: %w", pgErr("57P01")), true},
		{"too many connections", pgErr("53300"), true},
		{"syntax error", b.pool.QueryRow(ctx, `SELEC 1`).Scan(new(int)), false},
		{"no rows", b.pool.QueryRow(ctx, `SELECT 1 WHERE false`).Scan(new(int)), false},
		{"unique violation", pgErr("23505"), false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		if tt.name != "nil" && tt.err == nil {
			t.Fatalf("%s: no error to classify", tt.name)
		}
		if got := Unavailable(tt.err); got != tt.want {
			t.Errorf("%s: Unavailable(%v) = %v, want %v", tt.name, tt.err, got, tt.want)
		}
	}
}

// pgErr is a server error of code.
func pgErr(code string) error { return &pgconn.PgError{Code: code, Message: "test"} }
