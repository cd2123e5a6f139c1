// Package persist is creditd's system of record on Postgres: it owns every
// SQL statement and migration, implements the engine's Directory,
// LedgerReader, LedgerWriter and RebuildSource ports on pgx, and runs the
// write-behind persister that streams the Redis outbox into Postgres.
package persist

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool limits (invariant 11). The API answers from Redis, so Postgres sees
// the persister (one connection per busy partition at most), reads of
// history and the directory: 16 connections cover that with room to spare.
const (
	// DefaultMaxConns is the pool size unless the URL sets pool_max_conns.
	DefaultMaxConns = 16
	// ConnectTimeout bounds dialing and the startup handshake.
	ConnectTimeout = 5 * time.Second
	// StatementTimeout bounds every statement server side, so a bad plan
	// cannot hold a connection for ever; migrations lift it.
	StatementTimeout = 10 * time.Second
	// idleInTransactionTimeout ends transactions a crashed client left open.
	idleInTransactionTimeout = 30 * time.Second
)

// Open connects a pool to databaseURL with explicit limits: DefaultMaxConns
// connections (unless the URL's pool_max_conns says otherwise),
// ConnectTimeout, and StatementTimeout as a session default. It pings once,
// so a wrong URL fails here rather than at the first request.
func Open(ctx context.Context, databaseURL string, opts ...OpenOption) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("persist: parse database url: %w", err)
	}
	if !urlSets(databaseURL, "pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	cfg.MaxConnLifetime = 30 * time.Minute
	cfg.MaxConnIdleTime = 5 * time.Minute
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = ConnectTimeout
	}
	params := cfg.ConnConfig.RuntimeParams
	setDefault(params, "statement_timeout", fmt.Sprint(StatementTimeout.Milliseconds()))
	setDefault(params, "idle_in_transaction_session_timeout", fmt.Sprint(idleInTransactionTimeout.Milliseconds()))
	setDefault(params, "application_name", "creditd")
	// Instants are stored and compared in UTC; the session zone only
	// affects text rendering, but keep it fixed for psql users too.
	setDefault(params, "timezone", "UTC")

	cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		registerUUID(conn.TypeMap())
		return nil
	}
	for _, o := range opts {
		o(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("persist: open pool: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("persist: ping postgres: %w", err)
	}
	return pool, nil
}

// urlSets reports whether a URL-form database URL names query parameter key
// (keyword/value DSNs are not inspected; their pool size stays the default).
func urlSets(databaseURL, key string) bool {
	u, err := url.Parse(databaseURL)
	if err != nil {
		return false
	}
	return u.Query().Has(key)
}

func setDefault(m map[string]string, k, v string) {
	if _, ok := m[k]; !ok {
		m[k] = v
	}
}

// OpenOption adjusts the pool configuration Open builds.
type OpenOption func(*pgxpool.Config)

// WithTracer installs a pgx tracer (metrics, spans) on every connection of
// the pool; the tracer is fixed when a connection is made, so it can only
// be set here.
func WithTracer(t pgx.QueryTracer) OpenOption {
	return func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = t }
}
