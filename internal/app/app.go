// Package app assembles a running creditd from its parts: the Redis store,
// the Postgres store, the engine services, the persister, the expiry sweep
// and the HTTP server. cmd/creditd and the end-to-end tests both use it, so
// what the tests run is what ships.
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"go.opentelemetry.io/otel/trace"

	"github.com/creditd/creditd/api"
	"github.com/creditd/creditd/console"
	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/sender"
	"github.com/creditd/creditd/internal/telemetry"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

// Config is what an App needs besides its connections.
type Config struct {
	RedisPrefix    string
	AdminToken     string
	AllowPrivate   bool
	MaxLag         time.Duration // persister lag past which /readyz warns (advisory); default 5s
	SweepInterval  time.Duration // expiry sweep period; default 1s
	BodyLimitBytes int
	Consumer       string // persister consumer name; default "creditd"
	Clock          engine.Clock
	// ReservationSweepInterval is the reservation expiry sweep period (default one
	// minute, as docs/spec/interface.md says; tests shorten it).
	ReservationSweepInterval time.Duration
	// WebhookWorkers and WebhookPoll size the webhook delivery pool
	// (engine defaults: 8 workers, 200 ms).
	WebhookWorkers int
	WebhookPoll    time.Duration
	// SchedulerInterval is the subscription scheduler's poll period
	// (default 1s; tests shorten it).
	SchedulerInterval time.Duration
	// StreamsPerTenant caps a tenant's open balance streams in this
	// process (0: engine.DefaultStreamsPerTenant; tests lower it).
	StreamsPerTenant int
	// ChangeStreamsPerTenant caps a tenant's open change streams
	// (GET /v1/changes/stream) in this process (0:
	// engine.DefaultChangeStreamsPerTenant; tests lower it).
	ChangeStreamsPerTenant int
	// StreamPoll is how often a tenant's feed polls (0:
	// engine.DefaultStreamPoll): a test lengthens it to tell a woken read
	// from a polled one.
	StreamPoll time.Duration
	// OutboxClaimIdle is how long outbox messages sit unacknowledged in
	// another node's consumer before this node's persister takes them over
	// (persist.DefaultClaimIdle when 0); WebhookLease how long a claimed
	// webhook event stays with this node (engine.DeliveryLease when 0).
	// They bound the takeover of a node killed mid-batch (docs/decisions.md
	// "Background work across nodes"); tests shorten them.
	OutboxClaimIdle time.Duration
	WebhookLease    time.Duration
	// MaxConnsPerIP caps one client's open connections (0: the api
	// default, 1,024).
	MaxConnsPerIP int
	// ReplicaAcks is how many replicas a money operation's writes must
	// reach before it is acknowledged (lua.WithReplicaAcks; 0 is
	// lua.ReplicaAcksAuto, so a zero Config waits whenever there are
	// replicas; ReplicaAcksOff turns it off). ReplicaAckTimeout bounds the
	// wait (default lua.DefaultReplicaAckTimeout).
	ReplicaAcks       int
	ReplicaAckTimeout time.Duration
	// Registry holds every Prometheus family /metrics serves (nil: a new
	// one with the Go runtime, process and build collectors). A pool opened
	// with persist.WithTracer(telemetry.NewPostgresTracer(Registry, ...))
	// feeds the Postgres latency families on it.
	Registry *prometheus.Registry
	// MetricsElsewhere takes /metrics off the API port: cmd/creditd serves
	// Registry on CREDITD_METRICS_ADDR instead (docs/spec/addendum.md §12).
	MetricsElsewhere bool
	// Tracing, when set, traces every request with child spans for its
	// Redis commands and Postgres queries (nil: off, the default).
	Tracing *telemetry.Tracing
	// ReconcileSample is how many random customers the reconcile sampler
	// compares every ReconcileSampleInterval (default one minute); 0, the
	// default here (serve's is 20), leaves it off.
	ReconcileSample         int
	ReconcileSampleInterval time.Duration
	// FullRecords makes the persister write what the release before
	// migration 023 wrote (persist.Store.WithFullRecords): set it on the
	// new nodes while a rolling upgrade from that release runs.
	FullRecords bool
}

// ReplicaAcksOff is the Config.ReplicaAcks that never waits for replicas
// (Config's zero value means auto).
const ReplicaAcksOff = -2

// replicaAcks is the lua.WithReplicaAcks count of cfg.
func (cfg Config) replicaAcks() int {
	switch cfg.ReplicaAcks {
	case 0:
		return lua.ReplicaAcksAuto
	case ReplicaAcksOff:
		return 0
	}
	return cfg.ReplicaAcks
}

// App is one creditd process.
type App struct {
	Redis     redis.UniversalClient
	Pool      *pgxpool.Pool
	Store     *lua.Store
	DB        *persist.Store
	Tenants   *engine.Tenants
	Customers *engine.Customers
	Credits   *engine.Credits
	Persister *persist.Persister
	Sweeper   *engine.ExpirySweeper
	Webhooks  *engine.Webhooks
	// Events serves the ordered event log and the balance streams.
	Events *engine.Events
	// Usage answers the usage analytics reports from the rollup.
	Usage *engine.UsageAnalytics
	// Plans is the product catalogue.
	Plans *engine.Plans
	// Overrides, Topups and Imports serve subscription overrides, paid
	// credit and the bulk import.
	Overrides *engine.Overrides
	// Alerts serves the credit alert settings (issue 15 item 4).
	Alerts  *engine.Alerts
	Topups  *engine.Topups
	Imports *engine.Imports
	Server  *api.Server
	// Registry holds every family /metrics serves.
	Registry *prometheus.Registry
	// Console is the web dashboard the server serves under /console.
	Console *console.Console

	// Metering, Entitlements and Reservations price usage and hold credit;
	// ReservationSweeper expires reservations past their expires_at.
	Metering           *engine.Metering
	Entitlements       *engine.Entitlements
	Reservations       *engine.Reservations
	ReservationSweeper *engine.ReservationSweeper
	// LeaseSweeper writes down the lapse of gauge leases past their expiry.
	LeaseSweeper *engine.LeaseSweeper
	// SeenSeeder fills the seen filter from Postgres, so money calls need
	// not ask it (engine/seen_seed.go).
	SeenSeeder *engine.SeenSeeder

	// Subscriptions puts customers on plans; Scheduler moves them on time;
	// PlanFacts is the entitlement service's cached view of them.
	Subscriptions *engine.Subscriptions
	Scheduler     *engine.Scheduler
	PlanFacts     *engine.CachedPlanView

	// ReconcileSampler compares random customers' Redis state with
	// Postgres in the background and counts mismatches (never repairs).
	ReconcileSampler *engine.ReconcileSampler

	// outboxRedis serves the persister alone: its blocking reads hold one
	// connection per partition, which must not starve the API's pool.
	outboxRedis redis.UniversalClient
	// readyChecks are /readyz's probes; the metrics show them too.
	readyChecks []api.HealthCheck
	// runners are the background loops, each listed once: Start and Stop
	// walk the list and /readyz shows each one.
	runners []engine.Runner
	cfg     Config
	log     zerolog.Logger
	cancel  context.CancelFunc
}

// New wires an App on open connections; Start runs its background work.
func New(rdb redis.UniversalClient, pool *pgxpool.Pool, cfg Config, log zerolog.Logger) *App {
	if cfg.Clock == nil {
		cfg.Clock = engine.SystemClock{}
	}
	if cfg.MaxLag <= 0 {
		cfg.MaxLag = 5 * time.Second
	}
	if cfg.Consumer == "" {
		cfg.Consumer = "creditd"
	}
	if cfg.RedisPrefix == "" {
		cfg.RedisPrefix = "cd"
	}
	a := &App{Redis: rdb, Pool: pool, cfg: cfg, log: log, Registry: cfg.Registry}
	if a.Registry == nil {
		a.Registry = telemetry.NewRegistry(telemetry.BuildFromBinary())
	}
	// The API's client is timed per command; the outbox client's blocking
	// reads would only blur the histogram (its pool is still collected).
	rdb.AddHook(telemetry.NewRedisMetrics(a.Registry).Hook())
	var tp trace.TracerProvider
	if cfg.Tracing != nil {
		tp = cfg.Tracing.Provider
		ictx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := cfg.Tracing.InstrumentRedis(ictx, rdb)
		cancel()
		if err != nil {
			log.Warn().Err(err).Msg("tracing: Redis commands will have no spans")
		}
	}
	// The Postgres families exist even when the pool was opened without the
	// tracer (it then feeds nothing).
	telemetry.NewPostgresTracer(a.Registry, tp)
	a.Store = lua.NewStore(rdb, cfg.RedisPrefix).WithClock(cfg.Clock).WithReplicaAcks(cfg.replicaAcks(), cfg.ReplicaAckTimeout)
	a.DB = persist.NewStore(pool).WithFullRecords(cfg.FullRecords)
	a.Store.WithAppliedOps(persist.NewAppliedBatcher(a.DB))
	// Every cache checks the tenants' change stamps in Redis, which every
	// write through a cache's decorator moves, so a change made on any node
	// governs the next request on this one (issue 25); and serves its last
	// good copy while Postgres is unreachable (persist.Unavailable), within
	// engine.LastGoodLimit (issue 26 item 3, invariant 16).
	stamps := engine.NewStamps(a.Store, log)
	a.DB.WithAlertStamps(stamps)
	keys := engine.NewCachedKeys(engine.NewKeyLookup(a.DB)).WithStamps(stamps).WithSourceDown(persist.Unavailable)
	// A request whose key is cached sends its stamps read, rate take and
	// idempotency claim in one round trip (engine door.go, issue 26).
	a.Tenants = engine.NewTenants(keys.ForgettingDirectory(a.DB), keys, cfg.Clock, cfg.AllowPrivate).WithDoor(a.Store, stamps)
	// The hot path resolves customers through a cache over a service of
	// its own on the raw directory (it reads, and auto-creates a customer,
	// which forgets nothing); the API's service writes through the cache's
	// forgetting directory, so this process sees a change at once.
	customers := engine.NewCachedCustomers(engine.NewCustomers(a.DB, cfg.Clock)).WithStamps(stamps).WithSourceDown(persist.Unavailable)
	a.Customers = engine.NewCustomers(customers.ForgettingDirectory(a.DB), cfg.Clock).WithSlots(lua.Partition)
	a.outboxRedis = dedicatedClient(rdb, lua.Partitions+8)
	outbox := lua.NewStore(a.outboxRedis, cfg.RedisPrefix).WithClock(cfg.Clock)
	a.Persister = persist.NewPersister(outbox, a.DB, persist.PersisterConfig{Consumer: cfg.Consumer, Clock: cfg.Clock, ClaimIdle: cfg.OutboxClaimIdle,
		Wakes: a.Store}, log)
	// Reads Postgres answers wait for the outbox as it stood when they came
	// in, on every node (docs/decisions.md "Read-your-writes on any node").
	behind := engine.NewWrittenBehind(a.Store, a.Persister.Hurry)
	a.Credits = engine.NewCredits(a.Customers, a.Store, a.DB, cfg.Clock, behind).WithLookup(customers)
	a.Usage = engine.NewUsageAnalytics(a.Credits, a.DB)
	// The persister stores only outbox entries a replica holds (issue 11):
	// an op the master never replicated vanishes in a failover, and
	// Postgres must not keep it while the promoted replica lacks it.
	outbox.WithReplicaAcks(cfg.replicaAcks(), cfg.ReplicaAckTimeout)
	a.Sweeper = &engine.ExpirySweeper{Blocks: a.Store, Index: a.DB, Credits: a.Credits, Clock: cfg.Clock, Interval: cfg.SweepInterval, Log: log,
		Prepare: a.dropLegacyExpiryIndex}
	a.Events = engine.NewEvents(a.DB, cfg.StreamPoll, cfg.StreamsPerTenant, log)
	a.Events.WrittenBehind = behind
	// The change stream's config changes are the stamps' bumps (issue 27).
	a.Events.WithChangeFeed(a.Store, cfg.ChangeStreamsPerTenant)
	// Every node's persister wakes every node's feeds of the tenants it
	// committed, and the feed scripts wake them of config changes: the
	// streams hear of a change in milliseconds, the poll staying the
	// fallback (docs/decisions.md "Waking the change feeds").
	a.Events.WithWakes(a.Store)
	a.Webhooks = engine.NewWebhooks(newDeliveryOutcomes(a.DB, a.Registry), a.DB, sender.New(engine.DeliveryTimeout, cfg.AllowPrivate), cfg.Clock, log)
	a.Webhooks.Workers, a.Webhooks.Poll, a.Webhooks.Lease = cfg.WebhookWorkers, cfg.WebhookPoll, cfg.WebhookLease
	a.Webhooks.Slots = a.Store
	a.Webhooks.WrittenBehind = behind
	// The caches are decorators over the stores (docs/decisions.md "Caches
	// are decorators"): the services hold the decorated port, and a write
	// through it forgets what it changes, so no service is told afterwards.
	catalog := engine.NewCachedCatalog(a.DB).WithStamps(stamps).WithSourceDown(persist.Unavailable)
	a.Metering = engine.NewMetering(catalog, catalog, cfg.Clock)
	plans := engine.NewCachedPlanStore(a.DB).WithStamps(stamps).WithSourceDown(persist.Unavailable)
	a.Plans = engine.NewPlans(plans, plans, a.Metering, cfg.Clock)
	a.PlanFacts = engine.NewCachedPlanView(engine.NewPlanFacts(a.DB, plans, a.DB, cfg.Clock), cfg.Clock).WithStamps(stamps).WithSourceDown(persist.Unavailable)
	a.Entitlements = engine.NewEntitlements(engine.EntitlementsDeps{Customers: customers, Metering: a.Metering,
		Credits: a.Credits, Hot: a.Store, Clock: cfg.Clock, Plans: a.PlanFacts, Applied: a.DB, AppliedDown: persist.Unavailable, UsageIDs: a.Store, Leases: a.Store, LeaseIndex: a.DB, Stamps: stamps})
	// Reservations write a notice to the change feed (issue 27): they move
	// effective balances without an event.
	reservationsNoted := engine.NotingReservations(a.Store, a.Store, log)
	a.Reservations = engine.NewReservations(engine.ReservationsDeps{Entitlements: a.Entitlements, Credits: a.Credits,
		Customers: a.Customers, Lookup: customers, Metering: a.Metering, Hot: reservationsNoted, Reservations: a.DB, Clock: cfg.Clock})
	a.Overrides = engine.NewOverrides(a.PlanFacts.ForgettingOverrides(a.DB), a.DB, a.Metering, a.Entitlements, cfg.Clock)
	a.Topups = engine.NewTopups(a.Credits, a.DB)
	a.Alerts = engine.NewAlerts(stamps.ForgettingAlerts(a.DB), a.Customers, cfg.Clock)
	a.Imports = engine.NewImports(a.Customers, a.Credits)
	a.Subscriptions = engine.NewSubscriptions(a.PlanFacts.ForgettingSubscriptions(a.DB), a.Plans, a.Customers, a.Credits, a.Store, a.Store, cfg.Clock, log)
	a.Scheduler = &engine.Scheduler{Subscriptions: a.Subscriptions, Clock: cfg.Clock, Interval: cfg.SchedulerInterval,
		Partitions: a.DB, Log: log}
	a.ReconcileSampler = &engine.ReconcileSampler{Source: a.DB, Store: a.Store, Drained: a.outboxDrained,
		Size: cfg.ReconcileSample, Interval: cfg.ReconcileSampleInterval, Clock: cfg.Clock, Log: log}
	a.ReservationSweeper = &engine.ReservationSweeper{Hot: reservationsNoted, Credits: a.Credits, Clock: cfg.Clock, Interval: cfg.ReservationSweepInterval, Log: log}
	// Leases lapse at read time; the sweep runs as often as the expiry sweep.
	a.LeaseSweeper = &engine.LeaseSweeper{Hot: a.Store, Index: a.DB, Credits: a.Credits, Clock: cfg.Clock, Interval: cfg.SweepInterval, Log: log}
	a.Console = console.New(console.Config{
		Tenants: a.Tenants, Customers: a.Customers, Credits: a.Credits, Reservations: a.Reservations,
		Webhooks: a.Webhooks, Plans: a.Plans, Entitlements: a.Entitlements, Subscriptions: a.Subscriptions,
		Directory: a.DB, SignOuts: a.Store, Idempotency: a.Store, AdminToken: cfg.AdminToken,
		Metrics: func(w io.Writer) { a.Server.WriteMetrics(w) }, Clock: cfg.Clock, Log: log,
	})
	a.SeenSeeder = &engine.SeenSeeder{Filter: a.Store, Keys: a.DB, Clock: cfg.Clock, Log: log}
	a.runners = []engine.Runner{a.Persister, a.Sweeper, a.ReservationSweeper, a.LeaseSweeper, a.Webhooks, a.Scheduler, a.ReconcileSampler, a.SeenSeeder}
	// Readiness is "this node can serve" (issue 25, docs/decisions.md
	// "Readiness is this node's"): what every node sees alike (Postgres, a
	// dead letter, the outbox's lag) is an alarm shown in the body, never a
	// failure, or one cause would take the whole fleet out of the balancer.
	// Postgres is behind the request path (invariant 16): without it the
	// hot path still answers, and what needs it answers 503 with
	// Retry-After (persist.Unavailable).
	a.readyChecks = []api.HealthCheck{
		{Name: "redis", Check: redisReachable(rdb, a.Store)},
		{Name: "postgres", Check: pool.Ping, Advisory: true},
		{Name: "persister", Check: a.checkLag, Advisory: true},
		{Name: "dead_letters", Check: a.checkDeadLetters, Advisory: true},
		{Name: "partitions", Check: a.checkPartitions, Advisory: true},
	}
	a.readyChecks = append(a.readyChecks, runnerChecks(a.runners)...)
	var tracer api.Config
	if cfg.Tracing != nil {
		tracer.Tracer = cfg.Tracing.Provider.Tracer("github.com/creditd/creditd/api")
		tracer.Propagator = cfg.Tracing.Propagator
	}
	a.Server = api.New(api.Config{
		Console:  fasthttpadaptor.NewFastHTTPHandler(a.Console),
		Registry: a.Registry, MetricsElsewhere: cfg.MetricsElsewhere, Tracer: tracer.Tracer, Propagator: tracer.Propagator,
		Tenants: a.Tenants, Customers: a.Customers, Credits: a.Credits, Idempotency: a.Store, Webhooks: a.Webhooks,
		Metering: a.Metering, Entitlements: a.Entitlements, Reservations: a.Reservations, Plans: a.Plans,
		Overrides: a.Overrides, Topups: a.Topups, Imports: a.Imports, Subscriptions: a.Subscriptions,
		Events: a.Events, Usage: a.Usage, Alerts: a.Alerts,
		AdminToken: cfg.AdminToken, BodyLimitBytes: cfg.BodyLimitBytes, Log: log,
		MaxConnsPerIP: cfg.MaxConnsPerIP, RateBudgets: a.Store,
		Ready: a.readyChecks, Unavailable: persist.Unavailable,
	})
	a.registerMetrics(a.Registry)
	return a
}

// Start starts every background loop (runners) until Stop, and says in
// the log when unresolved dead letters are already there.
func (a *App) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	for _, r := range a.runners {
		if err := r.Start(ctx); err != nil {
			a.log.Error().Err(err).Str("runner", r.Name()).Msg("background loop not started")
		}
	}
	a.logDeadLetters()
}

// FenceLayouts returns once every account hash in Redis is in the layout
// this release reads, rewriting those of an older layout first
// (lua.Store.RewriteLayouts): this release has no reader for them
// (docs/decisions.md "Legacy account layouts rewritten once (issue 29)").
// serve calls it before it listens; with the markers set it costs one
// round trip. Errors: Redis's; the node must then not serve.
func (a *App) FenceLayouts(ctx context.Context) error {
	pending, err := a.Store.LayoutsPending(ctx)
	if err != nil || len(pending) == 0 {
		return err
	}
	a.log.Info().Int("partitions", len(pending)).Msg("rewriting account hashes of an older layout before serving")
	r, err := a.Store.RewriteLayouts(ctx)
	if err != nil {
		return fmt.Errorf("account layout rewrite: %w", err)
	}
	a.log.Info().Int("scanned", r.Scanned).Int("rewritten", r.Rewritten).Dur("took", r.Took).
		Msg("account hashes in the current layout")
	return nil
}

// startCountTimeout bounds Start's count of unresolved dead letters.
const startCountTimeout = 2 * time.Second

// logDeadLetters logs an error when unresolved dead letters exist as the
// node starts: they no longer keep it from being ready (issue 25), so a
// node that starts on them says so where the one that made them did, the
// log. A count that fails is left to the metric and the alert.
func (a *App) logDeadLetters() {
	ctx, cancel := context.WithTimeout(context.Background(), startCountTimeout)
	defer cancel()
	n, err := a.DB.UnresolvedDeadLetters(ctx)
	if err != nil || n == 0 {
		return
	}
	a.log.Error().Int64("dead_letters", n).
		Msg("unresolved dead letters: acknowledged mutations missing from Postgres; see `creditd deadletters list` (docs/operations.md)")
}

// dropLegacyExpiryIndex frees the memory an earlier creditd's expiry index
// held (issue 10), once, before the expiry sweep's first pass; a failure
// only leaves it in place.
func (a *App) dropLegacyExpiryIndex(ctx context.Context) {
	if err := a.Store.DropLegacyExpiryIndex(ctx); err != nil && ctx.Err() == nil {
		a.log.Warn().Err(err).Msg("expiry index of an earlier version left in Redis")
	}
}

// outboxDrained tells the reconcile sampler whether every outbox partition
// is empty (the persister has caught up).
func (a *App) outboxDrained(ctx context.Context) (bool, error) {
	parts, err := a.Persister.Partitions(ctx)
	if err != nil {
		return false, err
	}
	for _, p := range parts {
		if p.Depth > 0 {
			return false, nil
		}
	}
	return true, nil
}

// Serve answers HTTP on ln until Stop.
func (a *App) Serve(ln net.Listener) error { return a.Server.Serve(ln) }

// Stop shuts the server down, lets the persister write what is queued (up
// to drain), and stops the background loops, waiting for each.
func (a *App) Stop(drain time.Duration) {
	_ = a.Server.Shutdown()
	if drain > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), drain)
		_ = a.Persister.Drain(ctx, drain)
		cancel()
	}
	// Every loop sees its end at once; the Stops below only wait.
	if a.cancel != nil {
		a.cancel()
	}
	for _, r := range a.runners {
		r.Stop()
	}
	if a.outboxRedis != a.Redis {
		_ = a.outboxRedis.Close()
	}
}

// dedicatedClient is a client to the same Redis (or Cluster) as rdb with its
// own pool of poolSize connections; other client kinds are shared as is.
func dedicatedClient(rdb redis.UniversalClient, poolSize int) redis.UniversalClient {
	switch c := rdb.(type) {
	case *redis.Client:
		opt := *c.Options()
		opt.PoolSize = poolSize
		// A copied config pointer would make both clients register the same
		// notification handlers.
		opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		return redis.NewClient(&opt)
	case *redis.ClusterClient:
		opt := *c.Options()
		opt.PoolSize = poolSize
		opt.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
		return redis.NewClusterClient(&opt)
	}
	return rdb
}

// lagCheckTimeout bounds the persister lag check. With a shard down its
// partitions answer nothing until the client gives up, and /readyz must
// not hold the answer for a warning: a balancer's health check has its own
// timeout (deploy/haproxy.cfg).
const lagCheckTimeout = time.Second

// checkLag reports the persister's lag past MaxLag. It is advisory: the
// outbox is shared, so every node sees the same lag, and failing on it
// would take every node out at once while each can still serve; the alarm
// is creditd_persister_lag_seconds and its alerts.
func (a *App) checkLag(ctx context.Context) error {
	type reading struct {
		lag time.Duration
		err error
	}
	ctx, cancel := context.WithTimeout(ctx, lagCheckTimeout)
	defer cancel()
	read := make(chan reading, 1) // buffered: a late read never blocks
	go func() {
		lag, _, err := a.Persister.Lag(ctx)
		read <- reading{lag, err}
	}()
	var r reading
	select {
	case r = <-read:
	case <-ctx.Done():
		return api.NotReady("persister lag unknown: the outbox did not answer within " + lagCheckTimeout.String())
	}
	if r.err != nil {
		return r.err
	}
	if r.lag > a.cfg.MaxLag {
		return api.NotReady(fmt.Sprintf("persister lag %s exceeds %s", r.lag.Round(time.Millisecond), a.cfg.MaxLag))
	}
	return nil
}

// checkDeadLetters reports unresolved dead letters: acknowledged money
// mutations missing from Postgres (invariant 12). It is advisory: a dead
// letter is an alarm (creditd_dead_letters_unresolved, the CreditdDeadLetters
// alert, the console's banner, the persister's error line), and Postgres is
// shared, so failing on it would take every node out of the balancer.
func (a *App) checkDeadLetters(ctx context.Context) error {
	n, err := a.DB.UnresolvedDeadLetters(ctx)
	if err != nil {
		return err
	}
	if n > 0 {
		return api.NotReady(fmt.Sprintf("%d unresolved dead letters: acknowledged mutations missing from Postgres (see `creditd deadletters list`)", n))
	}
	return nil
}

// checkPartitions reports rows in a DEFAULT partition of the tables
// partitioned by month (persist.Store.PartitionAlarm): rows dated in a
// month without a partition. Advisory, like a dead letter: every node sees
// the same Postgres.
func (a *App) checkPartitions(ctx context.Context) error {
	n, err := a.DB.PartitionAlarm(ctx)
	if err != nil {
		return err
	}
	if n > 0 {
		return api.NotReady(fmt.Sprintf("%d rows in a DEFAULT partition: dated in a month without a partition (docs/operations.md \"Partitions\")", n))
	}
	return nil
}

// redisReachable is the redis readiness check: this node reaches Redis.
// On a Redis Cluster one master of creditd's partitions answering PING is
// enough (issue 25): a shard without a master fails the calls on its
// slots, each with a 503 and Retry-After (lua.Unavailable), while the
// other shards keep serving, and every node sees the same shard down, so
// failing readiness on it would have the balancer answer 503 for every
// tenant instead. The masters come from the client's slot map as it
// stands (no reload: a reload meeting dead nodes outlasts the check).
func redisReachable(rdb redis.UniversalClient, store *lua.Store) func(context.Context) error {
	c, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return func(ctx context.Context) error { return rdb.Ping(ctx).Err() }
	}
	tags := make([]string, store.Partitions())
	for p := range tags {
		tags[p] = store.PartitionTag(p)
	}
	return func(ctx context.Context) error {
		seen := make(map[*redis.Client]bool, 8)
		var masters []*redis.Client
		for _, tag := range tags {
			m, err := c.MasterForKey(ctx, tag)
			if err != nil {
				return err
			}
			if !seen[m] {
				seen[m] = true
				masters = append(masters, m)
			}
		}
		return anyAnswers(ctx, masters, func(ctx context.Context, m *redis.Client) error { return m.Ping(ctx).Err() })
	}
}

// errNoMaster is the redis check's failure when the cluster client knows
// no master at all.
var errNoMaster = errors.New("redis: no cluster master known")

// anyAnswers runs ping on every master at once and returns nil as soon as
// one answers, without waiting for a dead master's timeout; else the last
// error (or ctx's, once it ends).
func anyAnswers(ctx context.Context, masters []*redis.Client, ping func(context.Context, *redis.Client) error) error {
	if len(masters) == 0 {
		return errNoMaster
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()                         // the pings still running end with the answer
	errs := make(chan error, len(masters)) // buffered: a late ping never blocks
	for _, m := range masters {
		go func() { errs <- ping(ctx, m) }()
	}
	var last error
	for range masters {
		select {
		case err := <-errs:
			if err == nil {
				return nil
			}
			last = err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return last
}
