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
	"github.com/creditd/creditd/internal/telemetry"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

func serve() error {
	cfg := loadConfig()
	if err := cfg.check(); err != nil {
		return err
	}
	log := newLogger(cfg.LogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	build := telemetry.BuildFromBinary()
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
	rdb, pool, closeAll, err := connectAll(ctx, cfg, log, persist.WithTracer(telemetry.NewPostgresTracer(registry, tp)))
	if err != nil {
		return err
	}
	defer closeAll()

	a := app.New(rdb, pool, app.Config{
		Registry: registry, MetricsElsewhere: cfg.MetricsAddr != "", Tracing: tracing,
		RedisPrefix: cfg.RedisPrefix, AdminToken: cfg.AdminToken, AllowPrivate: cfg.AllowPrivate,
		MaxLag: cfg.MaxLag, SweepInterval: cfg.SweepInterval, BodyLimitBytes: cfg.BodyLimitBytes,
		Consumer: cfg.Consumer, ReservationSweepInterval: cfg.HoldSweep, SchedulerInterval: cfg.Scheduler,
		WebhookWorkers: cfg.WebhookWorkers, WebhookPoll: cfg.WebhookPoll, MaxConnsPerIP: cfg.MaxConnsPerIP,
		ReplicaAcks: cfg.appReplicaAcks(), ReplicaAckTimeout: cfg.ReplicaAckTimeout,
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

func migrate() error {
	cfg := loadConfig()
	pool, err := connectPostgres(context.Background(), cfg)
	if err != nil {
		return err
	}
	pool.Close()
	fmt.Println("migrations applied")
	return nil
}

// withStores runs an operator command (rebuild, reconcile) on the Redis and
// Postgres of the configuration, until it ends or SIGINT/SIGTERM.
func withStores(run func(ctx context.Context, ledger *persist.Store, store *lua.Store) error) error {
	cfg := loadConfig()
	log := newLogger(cfg.LogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rdb, pool, closeAll, err := connectAll(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeAll()
	return run(ctx, persist.NewStore(pool), lua.NewStore(rdb, cfg.RedisPrefix))
}

func rebuild() error { return withStores(rebuildOn) }

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
