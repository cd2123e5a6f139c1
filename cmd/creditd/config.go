package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

// config is creditd's environment (addendum 11 plus our own CREDITD_* knobs).
type config struct {
	RedisURL       string
	DatabaseURL    string
	Addr           string
	AdminToken     string
	LogLevel       string
	RedisPrefix    string
	Dev            bool
	DevFile        string
	AllowPrivate   bool
	MaxLag         time.Duration
	SweepInterval  time.Duration
	BodyLimitBytes int
	Consumer       string
	RedisPoolSize  int
	HoldSweep      time.Duration
	Scheduler      time.Duration
	WebhookWorkers int
	WebhookPoll    time.Duration
	MaxConnsPerIP  int
	PprofAddr      string
	// MetricsAddr, when set, serves /metrics on its own listener instead
	// of the API port (addendum 12).
	MetricsAddr string
	// ReplicaAcks is how many replicas a money operation waits for
	// (lua.ReplicaAcksAuto: one when the slot's master has replicas).
	ReplicaAcks       int
	ReplicaAckTimeout time.Duration
	// replicaAcksErr is CREDITD_REPLICA_ACKS's refusal (check returns it).
	replicaAcksErr error
}

// minAdminTokenChars is the shortest operator token serve accepts: the token
// opens every tenant, so it must be out of reach of guessing (32 characters
// of any reasonable alphabet are over 128 bits).
const minAdminTokenChars = 32

func loadConfig() config {
	host, _ := os.Hostname()
	c := config{
		RedisURL:       env("REDIS_URL", "redis://127.0.0.1:6379/0"),
		DatabaseURL:    env("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		Addr:           env("CREDITD_ADDR", ":8080"),
		AdminToken:     os.Getenv("CREDITD_ADMIN_TOKEN"),
		LogLevel:       env("LOG_LEVEL", "info"),
		RedisPrefix:    env("CREDITD_REDIS_PREFIX", "cd"),
		Dev:            envBool("CREDITD_DEV"),
		DevFile:        env("CREDITD_DEV_FILE", ".data/dev-tenant.json"),
		AllowPrivate:   envBool("CREDITD_WEBHOOK_ALLOW_PRIVATE"),
		MaxLag:         envDuration("CREDITD_MAX_PERSISTER_LAG", 5*time.Second),
		SweepInterval:  envDuration("CREDITD_SWEEP_INTERVAL", time.Second),
		BodyLimitBytes: envInt("CREDITD_BODY_LIMIT_BYTES", 1<<20),
		Consumer:       env("CREDITD_INSTANCE", host),
		RedisPoolSize:  envInt("CREDITD_REDIS_POOL_SIZE", 64),
		HoldSweep:      envDuration("CREDITD_RESERVATION_SWEEP_INTERVAL", time.Minute),
		Scheduler:      envDuration("CREDITD_SCHEDULER_INTERVAL", time.Second),
		WebhookWorkers: envInt("CREDITD_WEBHOOK_WORKERS", 8),
		WebhookPoll:    envDuration("CREDITD_WEBHOOK_POLL", 200*time.Millisecond),
		MaxConnsPerIP:  envInt("CREDITD_MAX_CONNS_PER_IP", 1024),
		PprofAddr:      os.Getenv("CREDITD_PPROF_ADDR"),
		MetricsAddr:    os.Getenv("CREDITD_METRICS_ADDR"),
		// WAIT takes whole milliseconds: less than 1ms is the default.
		ReplicaAckTimeout: envDuration("CREDITD_REPLICA_ACK_TIMEOUT", lua.DefaultReplicaAckTimeout),
	}
	c.ReplicaAcks, c.replicaAcksErr = envReplicaAcks("CREDITD_REPLICA_ACKS")
	return c
}

// appReplicaAcks is ReplicaAcks as app.Config spells it (its zero is auto).
func (c config) appReplicaAcks() int {
	if c.ReplicaAcks == 0 {
		return app.ReplicaAcksOff
	}
	return c.ReplicaAcks
}

// envReplicaAcks reads a replica count: "auto" or unset is
// lua.ReplicaAcksAuto, "0" turns the wait off, n waits for n replicas;
// anything else is lua.ReplicaAcksAuto and an error serve refuses.
func envReplicaAcks(name string) (int, error) {
	v := strings.TrimSpace(os.Getenv(name))
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return n, nil
	}
	if v != "" && v != "auto" {
		return lua.ReplicaAcksAuto, fmt.Errorf("%s is %q; it must be auto, 0 (off) or a replica count", name, v)
	}
	return lua.ReplicaAcksAuto, nil
}

// check refuses a configuration serve must not start with.
func (c config) check() error {
	if c.replicaAcksErr != nil {
		return c.replicaAcksErr
	}
	if c.AdminToken != "" && len(c.AdminToken) < minAdminTokenChars {
		return fmt.Errorf("CREDITD_ADMIN_TOKEN is %d characters; it must be at least %d (for example: openssl rand -hex 32), or unset to turn the admin API off", len(c.AdminToken), minAdminTokenChars)
	}
	return nil
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envBool(name string) bool {
	v, _ := strconv.ParseBool(os.Getenv(name))
	return v
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func newLogger(level string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Str("service", "creditd").Logger()
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
		return nil, nil, fmt.Errorf("redis unreachable at %s: %w", cfg.RedisURL, err)
	}
	return rdb, func() { _ = rdb.Close(); closer() }, nil
}

// connectPostgres opens DATABASE_URL and applies the migrations.
func connectPostgres(ctx context.Context, cfg config, opts ...persist.OpenOption) (*pgxpool.Pool, error) {
	pool, err := persist.Open(ctx, cfg.DatabaseURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("postgres unreachable at %s: %w", cfg.DatabaseURL, err)
	}
	if err := persist.Migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return pool, nil
}

// connectAll opens Redis and Postgres (migrated); closeAll closes both.
func connectAll(ctx context.Context, cfg config, log zerolog.Logger, pgOpts ...persist.OpenOption) (redis.UniversalClient, *pgxpool.Pool, func(), error) {
	rdb, closeRedis, err := connectRedis(ctx, cfg, log)
	if err != nil {
		return nil, nil, nil, err
	}
	pool, err := connectPostgres(ctx, cfg, pgOpts...)
	if err != nil {
		closeRedis()
		return nil, nil, nil, err
	}
	return rdb, pool, func() { pool.Close(); closeRedis() }, nil
}

// noMaintNotifications turns off go-redis's maintenance notifications (a
// managed-Redis feature): open-source Redis 7 refuses the handshake and the
// client logs a warning at every start.
func noMaintNotifications() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}
