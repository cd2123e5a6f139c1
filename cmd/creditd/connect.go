package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/persist"
)

// newLogger is a JSON logger at level writing to out.
func newLogger(level logLevel, out io.Writer) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(string(level))
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(out).Level(lvl).With().Timestamp().Str("service", "creditd").Logger()
}

// connectRedis opens REDIS_URL: a redis:// URL, a comma list of cluster
// seeds, or "embedded" (an in-process miniredis for a machine without
// redis-server: nothing survives a restart).
func connectRedis(ctx context.Context, cfg config, log zerolog.Logger) (redis.UniversalClient, func(), error) {
	var rdb redis.UniversalClient
	closer := func() {}
	switch {
	case cfg.RedisURL == "embedded":
		mr, err := miniredis.Run()
		if err != nil {
			return nil, nil, err
		}
		log.Warn().Msg("REDIS_URL=embedded: using an in-process miniredis. NOT DURABLE: unpersisted ledger entries are lost on exit. Install redis-server for real use.")
		fmt.Fprintln(os.Stderr, "\n*** WARNING: embedded Redis (miniredis) is NOT DURABLE. Install redis-server. ***")
		rdb = redis.NewClient(&redis.Options{Addr: mr.Addr(), PoolSize: cfg.RedisPoolSize, MaintNotificationsConfig: noMaintNotifications()})
		closer = mr.Close
	case strings.Contains(cfg.RedisURL, ","):
		var addrs []string
		for _, s := range strings.Split(cfg.RedisURL, ",") {
			s = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(s), "redis://"))
			if i := strings.Index(s, "/"); i >= 0 {
				s = s[:i]
			}
			if s != "" {
				addrs = append(addrs, s)
			}
		}
		// Reads go to masters only (ReadOnly, RouteByLatency and
		// RouteRandomly off): a replica may lag, and a balance must never
		// be older than an acknowledged write (issue 11.5). MaxRedirects
		// bounds both MOVED/ASK hops and the retries of CLUSTERDOWN,
		// TRYAGAIN and dead-node errors; what still fails is a 503 with
		// Retry-After (lua.UnavailableError), and the slot map is reloaded.
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: cfg.RedisPoolSize,
			ReadOnly: false, RouteByLatency: false, RouteRandomly: false, MaxRedirects: 3,
			ReadTimeout: 3 * time.Second, WriteTimeout: 3 * time.Second, MaintNotificationsConfig: noMaintNotifications()})
	default:
		opt, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return nil, nil, fmt.Errorf("REDIS_URL: %w", err)
		}
		opt.PoolSize = cfg.RedisPoolSize
		opt.ReadTimeout, opt.WriteTimeout = 3*time.Second, 3*time.Second
		opt.MaintNotificationsConfig = noMaintNotifications()
		rdb = redis.NewClient(opt)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		closer()
		return nil, nil, fmt.Errorf("redis unreachable at %s: %w", redactURLs(cfg.RedisURL), err)
	}
	return rdb, func() { _ = rdb.Close(); closer() }, nil
}

// openDatabase opens DATABASE_URL for a command that must not migrate
// (every one but serve and migrate up): it refuses a schema newer than this
// binary, and one with migrations pending, so an operator command never
// writes through a schema it was not built for.
func openDatabase(ctx context.Context, cfg config) (*pgxpool.Pool, error) {
	pool, err := persist.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("postgres unreachable at %s: %w", redactURLs(cfg.DatabaseURL), err)
	}
	st, err := persist.Schema(ctx, pool)
	if err == nil {
		err = st.Check()
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// migrateDatabase opens DATABASE_URL and applies the pending migrations
// (serve and migrate up); persist.Migrate refuses a newer schema.
func migrateDatabase(ctx context.Context, cfg config, opts ...persist.OpenOption) (*pgxpool.Pool, error) {
	pool, err := persist.Open(ctx, cfg.DatabaseURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("postgres unreachable at %s: %w", redactURLs(cfg.DatabaseURL), err)
	}
	if err := persist.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return pool, nil
}

// noMaintNotifications turns off go-redis's maintenance notifications (a
// managed-Redis feature): open-source Redis 7 refuses the handshake and the
// client logs a warning at every start.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}
