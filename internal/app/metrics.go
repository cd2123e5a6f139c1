package app

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/telemetry"
	"github.com/creditd/creditd/lua"
)

// scrapeTimeout bounds the Redis and Postgres reads of one scrape.
const scrapeTimeout = 2 * time.Second

// backlogCollector reads, at each scrape, the figures that live in Redis
// and Postgres: the /readyz checks that gate readiness, each background
// loop's health, the persister's lag and outbox depth (in all and per
// partition), unresolved dead letters, the webhook backlog, and the
// scheduler's and sweeps' due work. A read that fails leaves its families
// out of that scrape (and is logged at debug level).
type backlogCollector struct {
	a *App

	ready, lag, backlog, partLag, partDepth, deadLetters, webhookBacklog, webhookDue, schedulerBacklog, sweepBacklog *prometheus.Desc
	runnerHealthy, runnerLastSuccess                                                                                 *prometheus.Desc
}

func newBacklogCollector(a *App) *backlogCollector {
	return &backlogCollector{
		a:                 a,
		ready:             prometheus.NewDesc("creditd_readiness_check", "1 when the /readyz check passes, 0 when it fails: redis, which gates readiness, and postgres, which only warns (Postgres is shared and behind the request path); lag, dead letters and the loops have their own families (creditd_persister_lag_seconds, creditd_dead_letters_unresolved, creditd_runner_healthy).", []string{"check"}, nil),
		lag:               prometheus.NewDesc("creditd_persister_lag_seconds", "Age of the oldest outbox entry not yet committed to Postgres.", nil, nil),
		backlog:           prometheus.NewDesc("creditd_persister_backlog", "Outbox entries not yet committed to Postgres.", nil, nil),
		partLag:           prometheus.NewDesc("creditd_persister_partition_lag_seconds", "Age of the oldest outbox entry not yet committed to Postgres, per outbox partition.", []string{"partition"}, nil),
		partDepth:         prometheus.NewDesc("creditd_outbox_depth", "Outbox entries not yet committed to Postgres, per outbox partition.", []string{"partition"}, nil),
		deadLetters:       prometheus.NewDesc("creditd_dead_letters_unresolved", "Outbox entries set aside and not yet replayed or discarded.", nil, nil),
		webhookBacklog:    prometheus.NewDesc("creditd_webhook_backlog", "Webhook events not yet delivered nor dead-lettered (pending, or failed and waiting for a retry).", nil, nil),
		webhookDue:        prometheus.NewDesc("creditd_webhook_backlog_due", "Webhook events of the backlog whose next attempt is due now.", nil, nil),
		schedulerBacklog:  prometheus.NewDesc("creditd_scheduler_backlog", "Subscriptions whose next scheduled action is due now.", nil, nil),
		runnerHealthy:     prometheus.NewDesc("creditd_runner_healthy", "1 when the background loop is healthy, 0 when not (not running, its last pass failed, or stalled); /readyz shows why under its name.", []string{"runner"}, nil),
		runnerLastSuccess: prometheus.NewDesc("creditd_runner_last_success_timestamp_seconds", "Unix time of the background loop's last successful pass (absent before the first).", []string{"runner"}, nil),
		sweepBacklog:      prometheus.NewDesc("creditd_sweep_backlog", "Work due now and not yet done by a sweep: customers with blocks to expire (sweep=expiry), reservations to release (sweep=reservation).", []string{"sweep"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *backlogCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.ready, c.lag, c.backlog, c.partLag, c.partDepth, c.deadLetters, c.webhookBacklog, c.webhookDue, c.schedulerBacklog, c.sweepBacklog, c.runnerHealthy, c.runnerLastSuccess} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. The reads run at once, so a
// scrape takes as long as the slowest of them, not their sum.
func (c *backlogCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	a := c.a
	now := a.cfg.Clock.Now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for _, r := range a.runners {
		v := 1.0
		if r.Health() != nil {
			v = 0
		}
		gauge(c.runnerHealthy, v, r.Name())
		if s, ok := r.(interface{ LastSuccess() time.Time }); ok && !s.LastSuccess().IsZero() {
			gauge(c.runnerLastSuccess, float64(s.LastSuccess().UnixNano())/1e9, r.Name())
		}
	}
	var wg sync.WaitGroup
	for _, hc := range a.readyChecks {
		if hc.Advisory && hc.Name != "postgres" {
			continue // lag, dead letters and the loops have their own families
		}
		wg.Go(func() {
			v := 1.0
			if err := hc.Check(ctx); err != nil {
				v = 0
			}
			gauge(c.ready, v, hc.Name)
		})
	}
	wg.Go(func() {
		parts, err := a.Persister.Partitions(ctx)
		if !c.ok("persister backlog", err) {
			return
		}
		var lag time.Duration
		var total int64
		for _, p := range parts {
			id := strconv.Itoa(p.Partition)
			gauge(c.partLag, p.Lag.Seconds(), id)
			gauge(c.partDepth, float64(p.Depth), id)
			lag, total = max(lag, p.Lag), total+p.Depth
		}
		gauge(c.lag, lag.Seconds())
		gauge(c.backlog, float64(total))
	})
	wg.Go(func() {
		if n, err := a.DB.UnresolvedDeadLetters(ctx); c.ok("dead letters", err) {
			gauge(c.deadLetters, float64(n))
		}
	})
	wg.Go(func() {
		if waiting, due, err := a.DB.WebhookBacklog(ctx, now); c.ok("webhook backlog", err) {
			gauge(c.webhookBacklog, float64(waiting))
			gauge(c.webhookDue, float64(due))
		}
	})
	wg.Go(func() {
		if n, err := a.DB.DueSubscriptions(ctx, now); c.ok("scheduler backlog", err) {
			gauge(c.schedulerBacklog, float64(n))
		}
	})
	wg.Go(func() {
		// The window of the sweep's deep pass (engine.ExpirySweeper).
		if n, err := a.DB.DueExpiryCount(ctx, now.Add(-7*24*time.Hour), now); c.ok("expiry sweep backlog", err) {
			gauge(c.sweepBacklog, float64(n), "expiry")
		}
	})
	wg.Go(func() {
		if reservations, err := a.Store.ReservationBacklog(ctx, now); c.ok("reservation sweep backlog", err) {
			gauge(c.sweepBacklog, float64(sum(reservations)), "reservation")
		}
	})
	wg.Wait()
}

func (c *backlogCollector) ok(what string, err error) bool {
	if err != nil {
		c.a.log.Debug().Err(err).Str("figure", what).Msg("metrics: read failed; left out of this scrape")
	}
	return err == nil
}

func sum(v [lua.Partitions]int64) int64 {
	var n int64
	for _, x := range v {
		n += x
	}
	return n
}

// registerMetrics registers every family of the App on reg.
func (a *App) registerMetrics(reg *prometheus.Registry) {
	telemetry.Register(reg, prometheus.Collector(newBacklogCollector(a)))
	telemetry.Register(reg, prometheus.Collector(telemetry.NewPoolCollector(map[string]telemetry.RedisPool{
		"api": a.Redis, "outbox": a.outboxRedis,
	}, a.Pool)))
	counter := func(name, help string, v func() float64) {
		telemetry.Register(reg, prometheus.Collector(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, v)))
	}
	stats := a.Persister.Stats
	counter("creditd_persister_mutations_total", "Mutations in committed persister batches.", func() float64 { return float64(stats().MutationsPersisted) })
	counter("creditd_persister_batches_total", "Committed persister batches.", func() float64 { return float64(stats().Batches) })
	counter("creditd_persister_apply_errors_total", "Failed persister transactions (each retried).", func() float64 { return float64(stats().ApplyErrors) })
	counter("creditd_persister_dead_letters_total", "Outbox entries this process set aside (refused by Postgres, undecodable, or held behind one).", func() float64 { return float64(stats().DeadLettered) })
	counter("creditd_persister_replayed_batches_total", "Persister transactions that met rows already stored (a redelivery after its commit) and were written again skipping them.", func() float64 { return float64(stats().ReplayedBatches) })
	counter("creditd_persister_unreplicated_batches_total", "Outbox batches read again because they had not reached a replica yet.", func() float64 { return float64(stats().NotReplicated) })
	telemetry.Register(reg, prometheus.Collector(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "creditd_persister_partitions_owned", Help: "Outbox partitions this node's persister runs (the partition leases it holds, issue 25).",
	}, func() float64 { return float64(stats().OwnedPartitions) })))
	telemetry.Register(reg, prometheus.Collector(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "creditd_persister_last_batch_seconds", Help: "Duration of the last committed persister batch.",
	}, func() float64 { return stats().LastBatch.Seconds() })))
	sample := a.ReconcileSampler.Stats
	counter("creditd_reconcile_checked_total", "Customers the reconcile sampler compared (Redis with Postgres, no write in flight).", func() float64 { return float64(sample().Checked) })
	counter("creditd_reconcile_mismatches_total", "Customers the reconcile sampler found differing between Redis and Postgres (logged with the customer id; `creditd reconcile --repair` mends them).", func() float64 { return float64(sample().Mismatches) })
	counter("creditd_reconcile_skipped_total", "Sampled customers the reconcile sampler left out: no state in Redis, or a write in flight.", func() float64 { return float64(sample().Skipped) })
	telemetry.Register(reg, prometheus.Collector(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "creditd_reconcile_last_sample_mismatches", Help: "Mismatches the reconcile sampler's last sample found.",
	}, func() float64 { return float64(sample().LastMismatches) })))
	counter("creditd_nostate_reloads_total", "Customer states loaded from Postgres into Redis because Redis had none (a NOSTATE script reply, or a sweep meeting a missing customer).", func() float64 { return float64(a.Credits.Reloads()) })
}

// deliveryOutcomes counts webhook delivery attempts by the state they
// led to (delivered, failed: to be retried, dead_letter: given up) and
// their category (http_2xx..http_5xx for an answer, else the failure:
// timeout, dns, connection_refused, no_url, ...).
type deliveryOutcomes struct {
	engine.EventStore
	attempts *prometheus.CounterVec
}

func newDeliveryOutcomes(store engine.EventStore, reg prometheus.Registerer) *deliveryOutcomes {
	d := &deliveryOutcomes{EventStore: store, attempts: telemetry.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "creditd_webhook_deliveries_total",
		Help: "Webhook delivery attempts, by outcome (delivered, failed, dead_letter) and category (http_2xx..http_5xx, or why no answer came: timeout, dns, connection_refused, no_url, ...).",
	}, []string{"outcome", "category"}))}
	// The usual series exist from the start, so a rate() over them works
	// before the first attempt.
	d.attempts.WithLabelValues(string(engine.EventDelivered), "http_2xx")
	d.attempts.WithLabelValues(string(engine.EventFailed), "http_5xx")
	d.attempts.WithLabelValues(string(engine.EventDeadLetter), "http_5xx")
	return d
}

// RecordAttempt implements engine.EventStore, counting the attempt once
// it is stored (an attempt whose lease was lost is not counted).
func (d *deliveryOutcomes) RecordAttempt(ctx context.Context, c engine.Claim, at engine.Attempt) (bool, error) {
	ok, err := d.EventStore.RecordAttempt(ctx, c, at)
	if ok && err == nil {
		d.attempts.WithLabelValues(string(at.Status), deliveryCategory(at)).Inc()
	}
	return ok, err
}

// knownFailures are the categories an attempt's error may carry; anything
// else counts as "other" so the label stays a small fixed set.
var knownFailures = map[string]bool{}

func init() {
	for _, f := range []engine.DeliveryFailure{engine.FailureTimeout, engine.FailureDNS, engine.FailureRefused, engine.FailureReset,
		engine.FailureUnreachable, engine.FailureTLS, engine.FailureBlocked, engine.FailureOther, engine.FailureInternal} {
		knownFailures[string(f)] = true
	}
}

func deliveryCategory(at engine.Attempt) string {
	switch {
	case at.StatusCode != nil && at.Error == nil:
		if k := *at.StatusCode / 100; k >= 1 && k <= 5 {
			return "http_" + strconv.Itoa(k) + "xx"
		}
		return "http_other"
	case at.Error == nil:
		return "other"
	case *at.Error == engine.ErrNoWebhookURL:
		return "no_url"
	case knownFailures[*at.Error]:
		return *at.Error
	}
	return "other"
}
