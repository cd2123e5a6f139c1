package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/internal/logbuf"
	"github.com/creditd/creditd/internal/telemetry"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

// serve runs the API, the persister and the sweeps until SIGINT/SIGTERM;
// it is the only command besides `migrate up` that applies migrations.
func serve() error {
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	if err := cfg.check(); err != nil {
		return err
	}
	// The access log is a line per request: batched (internal/logbuf),
	// written out last of all, after every deferred step below has logged.
	logw := logbuf.New(os.Stderr)
	defer logw.Close()
	log := newLogger(cfg.LogLevel, logw)
	b := buildInfo()
	log.Info().Str("version", b.Version).Str("commit", b.Commit).Str("built", b.Date).
		Dict("config", cfg.logDict()).Msg("creditd starting")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	build := telemetryBuild(b)
	tracing, err := telemetry.TracingFromEnv(ctx, build)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tracing.Shutdown(sctx)
	}()
	var tp trace.TracerProvider
	if tracing != nil {
		tp = tracing.Provider
		telemetry.LogErrors(log)
		log.Info().Msg("tracing on: exporting spans over OTLP/HTTP")
	}
	registry := telemetry.NewRegistry(build)
	rdb, closeRedis, err := connectRedis(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeRedis()
	pool, err := migrateDatabase(ctx, cfg, persist.WithTracer(telemetry.NewPostgresTracer(registry, tp)))
	if err != nil {
		return err
	}
	defer pool.Close()
	// A contract step waits for the operator once every node runs this
	// release (docs/operations.md "Contract steps"); say so at every start.
	if st, err := persist.Schema(ctx, pool); err == nil && len(st.PendingContract) > 0 {
		log.Warn().Strs("pending", st.PendingContract).
			Msg("schema contract steps pending: run `creditd migrate contract` once no node of an older release runs")
	}

	a := app.New(rdb, pool, app.Config{
		Registry: registry, MetricsElsewhere: cfg.MetricsAddr != "", Tracing: tracing,
		RedisPrefix: cfg.RedisPrefix, AdminToken: cfg.AdminToken, AllowPrivate: cfg.AllowPrivate,
		MaxLag: cfg.MaxLag, SweepInterval: cfg.SweepInterval, BodyLimitBytes: cfg.BodyLimitBytes,
		Consumer: cfg.Consumer, ReservationSweepInterval: cfg.ReservationSweep, SchedulerInterval: cfg.Scheduler,
		WebhookWorkers: cfg.WebhookWorkers, WebhookPoll: cfg.WebhookPoll, MaxConnsPerIP: cfg.MaxConnsPerIP,
		ReplicaAcks: cfg.appReplicaAcks(), ReplicaAckTimeout: cfg.ReplicaAckTimeout,
		ReconcileSample: int(cfg.ReconcileSample), ReconcileSampleInterval: cfg.ReconcileSampleInterval,
		FullRecords: cfg.FullRecords,
	}, log)
	if cfg.Dev {
		if err := devTenant(ctx, cfg, a.Tenants); err != nil {
			return fmt.Errorf("dev tenant: %w", err)
		}
	}
	if cfg.PprofAddr != "" {
		stopPprof, err := servePprof(cfg.PprofAddr, log)
		if err != nil {
			return fmt.Errorf("CREDITD_PPROF_ADDR: %w", err)
		}
		defer stopPprof()
	}
	if cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("CREDITD_METRICS_ADDR: %w", err)
		}
		defer telemetry.ServeMetrics(mln, registry, log)()
		log.Info().Str("addr", mln.Addr().String()).Msg("metrics listening")
	}
	// No reader of this release takes an account hash of an older layout:
	// rewrite them (once per Redis) before serving anything.
	if err := a.FenceLayouts(ctx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	a.Start()
	errc := make(chan error, 1)
	go func() { errc <- a.Serve(ln) }()
	log.Info().Str("addr", ln.Addr().String()).Msg("creditd listening")
	fmt.Printf("creditd ready on %s\n", ln.Addr())

	select {
	case err = <-errc:
	case <-ctx.Done():
		log.Info().Msg("shutting down")
	}
	a.Stop(5 * time.Second)
	return err
}

// withDatabase runs an operator command on DATABASE_URL (schema checked,
// never migrated), until it ends or SIGINT/SIGTERM.
func withDatabase(run func(ctx context.Context, cfg config, store *persist.Store) error) error {
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := openDatabase(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	return run(ctx, cfg, persist.NewStore(pool))
}

// withStores runs an operator command (rebuild, reconcile) on the Redis and
// Postgres of the configuration (schema checked, never migrated), until it
// ends or SIGINT/SIGTERM.
func withStores(run func(ctx context.Context, ledger *persist.Store, store *lua.Store) error) error {
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	log := newLogger(cfg.LogLevel, os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := openDatabase(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb, closeRedis, err := connectRedis(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeRedis()
	store := lua.NewStore(rdb, cfg.RedisPrefix)
	// These commands read account hashes in the current layout only, as
	// serve does: they cross the same fence first (one round trip once the
	// markers are set).
	if _, err := store.RewriteLayouts(ctx); err != nil {
		return fmt.Errorf("account layout rewrite: %w", err)
	}
	return run(ctx, persist.NewStore(pool), store)
}

func rebuildOn(ctx context.Context, ledger *persist.Store, store *lua.Store) error {
	// A rebuild's heap is a few pages in flight, so the default GC target
	// collects every few pages: a quarter of its CPU went to the GC.
	debug.SetGCPercent(400)
	start := time.Now()
	var last time.Time
	pr, err := engine.Rebuild(ctx, ledger, store, engine.SystemClock{}, 2000, func(p engine.RebuildProgress) {
		if time.Since(last) < 200*time.Millisecond && p.Done < p.Total {
			return
		}
		last = time.Now()
		printProgress(p, start)
	})
	printProgress(pr, start)
	fmt.Fprintln(os.Stderr)
	if err != nil {
		return err
	}
	fmt.Printf("rebuilt %d accounts (%d loaded, %d already current) in %s\n", pr.Done, pr.Loaded, pr.Done-pr.Loaded, time.Since(start).Round(time.Millisecond))
	return nil
}

func printProgress(p engine.RebuildProgress, start time.Time) {
	pct := 100.0
	if p.Total > 0 {
		pct = float64(p.Done) * 100 / float64(p.Total)
	}
	rate := float64(p.Done) / max(time.Since(start).Seconds(), 0.001)
	fmt.Fprintf(os.Stderr, "\rrebuild: %d/%d accounts (%.1f%%), %.0f/s   ", p.Done, p.Total, pct, rate)
}
