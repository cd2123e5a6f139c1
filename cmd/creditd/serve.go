package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/creditd/creditd/api"
	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

func serve() error {
	cfg := loadConfig()
	log := newLogger(cfg.LogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	rdb, closeRedis, err := connectRedis(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeRedis()
	pool, err := connectPostgres(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()

	clock := engine.SystemClock{}
	store := lua.NewStore(rdb, cfg.RedisPrefix)
	db := persist.NewStore(pool)
	tenants := engine.NewTenants(db, clock, cfg.AllowPrivate)
	customers := engine.NewCustomers(db, clock)
	credits := engine.NewCredits(customers, store, db, clock)

	persister := persist.NewPersister(store, db, persist.PersisterConfig{Consumer: cfg.Consumer}, log)
	bg, cancelBG := context.WithCancel(context.Background())
	defer cancelBG()
	persisterDone := make(chan struct{})
	go func() {
		defer close(persisterDone)
		if err := persister.Run(bg); err != nil && !errors.Is(err, context.Canceled) {
			log.Error().Err(err).Msg("persister stopped")
		}
	}()
	sweeper := &engine.ExpirySweeper{Blocks: store, Credits: credits, Clock: clock, Interval: cfg.SweepInterval, Log: log}
	go sweeper.Run(bg)

	if cfg.Dev {
		if err := devTenant(ctx, cfg, tenants); err != nil {
			return fmt.Errorf("dev tenant: %w", err)
		}
	}

	srv := api.New(api.Config{
		Tenants: tenants, Customers: customers, Credits: credits, Idempotency: store,
		AdminToken: cfg.AdminToken, BodyLimitBytes: cfg.BodyLimitBytes, Log: log,
		Ready: []api.HealthCheck{
			{Name: "redis", Check: func(ctx context.Context) error { return rdb.Ping(ctx).Err() }},
			{Name: "postgres", Check: pool.Ping},
			{Name: "persister", Check: func(ctx context.Context) error {
				lag, _, err := persister.Lag(ctx)
				if err != nil {
					return err
				}
				if lag > cfg.MaxLag {
					return fmt.Errorf("persister lag %s exceeds %s", lag.Round(time.Millisecond), cfg.MaxLag)
				}
				return nil
			}},
		},
		Metrics: func(w io.Writer) { writePersisterMetrics(context.Background(), w, persister) },
	})
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe(cfg.Addr) }()
	log.Info().Str("addr", cfg.Addr).Msg("creditd listening")

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info().Msg("shutting down")
	_ = srv.Shutdown()
	// Give the persister a moment to write what the last requests produced;
	// whatever is left stays in the outbox for the next start.
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = persister.Drain(dctx, 5*time.Second)
	cancel()
	cancelBG()
	<-persisterDone
	return nil
}

func writePersisterMetrics(ctx context.Context, w io.Writer, p *persist.Persister) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	lag, backlog, err := p.Lag(ctx)
	if err == nil {
		fmt.Fprintf(w, "# HELP creditd_persister_lag_seconds Age of the oldest outbox entry not yet committed to Postgres.\n# TYPE creditd_persister_lag_seconds gauge\ncreditd_persister_lag_seconds %g\n", lag.Seconds())
		fmt.Fprintf(w, "# HELP creditd_persister_backlog Outbox entries not yet committed to Postgres.\n# TYPE creditd_persister_backlog gauge\ncreditd_persister_backlog %d\n", backlog)
	}
	p.WriteMetrics(w)
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

func rebuild() error {
	cfg := loadConfig()
	log := newLogger(cfg.LogLevel)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rdb, closeRedis, err := connectRedis(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer closeRedis()
	pool, err := connectPostgres(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	store := lua.NewStore(rdb, cfg.RedisPrefix)
	start := time.Now()
	last := time.Time{}
	pr, err := engine.Rebuild(ctx, persist.NewStore(pool), store, engine.SystemClock{}, 1000, func(p engine.RebuildProgress) {
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
