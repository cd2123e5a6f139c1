// Package api is creditd's HTTP surface: a fasthttp server that authenticates
// tenants, rate-limits their keys, enforces Idempotency-Key, decodes bodies
// and turns engine results and errors into JSON and RFC 9457 problems. It
// talks to the engine services only.
package api

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fasthttp/router"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

// Server limits (invariant 11: a limit on everything).
const (
	// DefaultBodyLimitBytes is the largest request body when Config leaves it 0.
	DefaultBodyLimitBytes = 1 << 20
	// anonymousBodyBytes is the most of a body the server buffers before it
	// has seen a valid API key or admin token: a larger body of a request
	// without one is refused (401) unread, so unauthenticated clients cannot
	// make it hold megabytes each.
	anonymousBodyBytes = 64 << 10
	readTimeout        = 10 * time.Second
	writeTimeout       = 10 * time.Second
	idleTimeout        = 60 * time.Second
	// maxConcurrency bounds connections served at once; beyond it fasthttp
	// answers 503 instead of letting goroutines and buffers grow without end.
	maxConcurrency = 16 * 1024
	// readBufferBytes bounds the request line plus headers (a 256-character
	// Idempotency-Key and an API key fit many times over).
	readBufferBytes = 8 * 1024
	// shutdownWait bounds how long Shutdown waits for in-flight requests.
	shutdownWait = 30 * time.Second
	// readyCheckTimeout bounds each /readyz check.
	readyCheckTimeout = 2 * time.Second
)

// HealthCheck is one named readiness probe of /readyz (Redis, Postgres,
// persister lag, each background loop); Check returns nil when the
// dependency is usable.
type HealthCheck struct {
	Name  string
	Check func(ctx context.Context) error
	// Advisory checks show their failure in the body but leave the answer
	// 200: the node still serves (docs/decisions.md "Background loops in
	// /readyz" and "Readiness is this node's": persister lag and dead
	// letters are advisory too, since every node sees them alike).
	Advisory bool
}

// Config wires the server to the engine services and operations hooks.
type Config struct {
	Tenants     *engine.Tenants
	Customers   *engine.Customers
	Credits     *engine.Credits
	Idempotency idempotency.Records

	// Metering, Entitlements and Reservations serve pricing and the hot path.
	Metering     *engine.Metering
	Entitlements *engine.Entitlements
	Reservations *engine.Reservations
	// Webhooks serves the webhook events list, redelivery and test pings.
	Webhooks *engine.Webhooks
	// Plans serves the product catalogue (plans, variants, grants, entitlements).
	Plans *engine.Plans
	// Overrides, Topups and Imports serve subscription overrides, paid
	// credit and the bulk import.
	Overrides *engine.Overrides
	Topups    *engine.Topups
	Imports   *engine.Imports
	// Subscriptions serves subscriptions (docs/spec/addendum.md §6).
	Subscriptions *engine.Subscriptions
	// Alerts serves the credit alert settings (issue 15 item 4).
	Alerts *engine.Alerts
	// Events serves the ordered event log and the balance streams.
	Events *engine.Events
	// Usage serves the usage analytics reports.
	Usage *engine.UsageAnalytics

	// Ready lists the probes /readyz runs, all of them, concurrently.
	Ready []HealthCheck
	// Registry holds every Prometheus family /metrics serves; the server
	// registers its HTTP families on it (nil: a registry of its own).
	Registry *prometheus.Registry
	// MetricsElsewhere leaves /metrics off this server: it is served on the
	// CREDITD_METRICS_ADDR listener instead (docs/spec/addendum.md §12).
	MetricsElsewhere bool
	// Tracer, when set, starts a server span per request, the child of an
	// incoming traceparent (read with Propagator); nil turns tracing off
	// and costs one nil check per request.
	Tracer     trace.Tracer
	Propagator propagation.TextMapPropagator
	// AdminToken is the operator bearer token; empty turns the admin API off
	// (its routes are not registered, so they answer 404).
	AdminToken string
	// BodyLimitBytes bounds request bodies (0 means DefaultBodyLimitBytes);
	// larger ones get a 413 problem.
	BodyLimitBytes int
	// RateBudgets, when set, keeps each API key's rate limit in one budget
	// shared by every node (lua.Store: gcra.lua in Redis); nil, or an error
	// from it, limits each process on its own.
	RateBudgets engine.RateBudgets
	// MaxConnsPerIP caps the open connections of one client (an IPv4
	// address or an IPv6 /64); 0 means DefaultMaxConnsPerIP.
	MaxConnsPerIP int
	// Console, when set, serves the web console under /console.
	Console fasthttp.RequestHandler
	// Unavailable, when set, tells an error that only says a store could
	// not answer now (persist.Unavailable: Postgres down); the API answers
	// it 503 with Retry-After instead of 500.
	Unavailable func(error) bool
	Log         zerolog.Logger
}

// Server is creditd's HTTP server. It is safe for concurrent use.
type Server struct {
	tenants   *engine.Tenants
	customers *engine.Customers
	credits   *engine.Credits
	ready     []HealthCheck
	admin     []byte
	bodyLimit int
	maxConns  int
	log       zerolog.Logger
	// unavailable is Config.Unavailable (nil: none is told apart).
	unavailable func(error) bool

	// registry holds what /metrics serves; metricsHere is false when
	// /metrics lives on its own listener; tracer is nil with tracing off.
	registry    *prometheus.Registry
	metricsHere bool
	tracer      trace.Tracer
	propagator  propagation.TextMapPropagator

	metering     *engine.Metering
	entitlements *engine.Entitlements
	reservations *engine.Reservations
	webhooks     *engine.Webhooks
	plans        *engine.Plans
	overrides    *engine.Overrides
	topups       *engine.Topups
	usageReports *engine.UsageAnalytics
	imports      *engine.Imports
	// subscriptions serves the subscription routes (nil: not registered).
	subscriptions *engine.Subscriptions
	// alerts serves the credit alert routes.
	alerts *engine.Alerts
	// events serves GET /v1/events and the streams; streamsDone, closed by
	// Shutdown, ends every open stream (a stream never finishes by itself).
	events      *engine.Events
	streamsDone chan struct{}
	stopStreams sync.Once

	router  *router.Router
	routes  []*route
	metrics *httpMetrics
	limiter *rateLimiter
	// budgets is the fleet-wide per-key limit (nil: limiter alone);
	// refusals the windows in which it is known to refuse a key;
	// leases the requests this node took from it ahead and serves;
	// budgetClock, when set, is a test's clock for it (nil: Redis' TIME);
	// budgetWarned is when its failure was last logged (unix ns).
	budgets      engine.RateBudgets
	refusals     *refusals
	leases       *leases
	budgetClock  func() time.Time
	budgetWarned atomic.Int64
	// adminLimiter is the admin API's token bucket per client address.
	adminLimiter *rateLimiter
	// claims runs the idempotency claims of optIdem routes over
	// Config.Idempotency (engine/idempotency/claims.go), with its batch
	// writer of rerun marks.
	claims *idempotency.Claims
	calls  sync.Pool
	srv    *fasthttp.Server
	// consoleRoot serves GET /console/ (nil without a console).
	consoleRoot fasthttp.RequestHandler
}

// New builds the server and registers every route.
func New(cfg Config) *Server {
	s := &Server{
		tenants:      cfg.Tenants,
		customers:    cfg.Customers,
		credits:      cfg.Credits,
		usageReports: cfg.Usage,
		ready:        cfg.Ready,
		admin:        []byte(cfg.AdminToken),
		bodyLimit:    cfg.BodyLimitBytes,
		maxConns:     cfg.MaxConnsPerIP,
		log:          cfg.Log,
		unavailable:  cfg.Unavailable,
		limiter:      newRateLimiter(),
		budgets:      cfg.RateBudgets,
		refusals:     newRefusals(),
		leases:       newLeases(),

		adminLimiter: newRateLimiter(),
	}
	s.metering, s.entitlements, s.reservations = cfg.Metering, cfg.Entitlements, cfg.Reservations
	s.webhooks = cfg.Webhooks
	s.plans = cfg.Plans
	s.overrides, s.topups, s.imports = cfg.Overrides, cfg.Topups, cfg.Imports
	s.subscriptions, s.alerts = cfg.Subscriptions, cfg.Alerts
	s.events, s.streamsDone = cfg.Events, make(chan struct{})
	s.registry, s.metricsHere = cfg.Registry, !cfg.MetricsElsewhere
	s.tracer, s.propagator = cfg.Tracer, cfg.Propagator
	if s.registry == nil {
		s.registry = prometheus.NewRegistry()
	}
	if s.propagator == nil {
		s.propagator = propagation.TraceContext{}
	}
	s.metrics = newHTTPMetrics(s.registry)
	if s.bodyLimit <= 0 {
		s.bodyLimit = DefaultBodyLimitBytes
	}
	if s.maxConns <= 0 {
		s.maxConns = DefaultMaxConnsPerIP
	}
	s.claims = idempotency.NewClaims(cfg.Idempotency, cfg.Log, engine.ErrUnavailable)
	s.calls.New = func() any { return new(call) }
	r := router.New()
	// An API answers a wrong path with 404, never a redirect to a guess.
	r.RedirectTrailingSlash = false
	r.RedirectFixedPath = false
	r.HandleOPTIONS = false
	r.HandleMethodNotAllowed = true
	r.NotFound = s.notFound
	r.MethodNotAllowed = s.methodNotAllowed
	s.router = r
	s.register()
	s.registerConsole(cfg.Console)
	s.srv = &fasthttp.Server{
		Handler:      s.serveHTTP,
		ErrorHandler: s.connError,
		Name:         "creditd",
		ReadTimeout:  readTimeout,
		WriteTimeout: writeTimeout,
		IdleTimeout:  idleTimeout,
		// A Content-Length over the limit is refused before a byte of the
		// body is read (connError answers 413); a chunked body stops at the
		// limit. headerReceived lowers the limit for requests without valid
		// credentials; doorConn drains what a refused client still sends so
		// the refusal reaches it.
		MaxRequestBodySize:    s.bodyLimit,
		HeaderReceived:        s.headerReceived,
		ExpectHandler:         s.expectContinue,
		Concurrency:           maxConcurrency,
		ReadBufferSize:        readBufferBytes,
		NoDefaultServerHeader: true,
		Logger:                fasthttpLogger{s.log},
	}
	return s
}

// Handler is the request handler with every middleware applied (request id,
// access log, metrics, panic recovery, auth, rate limit, idempotency).
func (s *Server) Handler() fasthttp.RequestHandler { return s.serveHTTP }

// ListenAndServe serves on addr (host:port) until Shutdown.
func (s *Server) ListenAndServe(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	return s.Serve(ln)
}

// Serve serves on ln until Shutdown, behind the per-client connection cap;
// tests pass an in-memory listener.
func (s *Server) Serve(ln net.Listener) error {
	return s.srv.Serve(newDoorListener(ln, s.maxConns, s.log))
}

// Shutdown stops accepting connections and waits, at most 30 s, for the
// requests in flight to finish.
func (s *Server) Shutdown() error {
	s.stopStreams.Do(func() { close(s.streamsDone) })
	ctx, cancel := context.WithTimeout(context.Background(), shutdownWait)
	defer cancel()
	err := s.srv.ShutdownWithContext(ctx)
	s.claims.Close(ctx)
	return err
}

// Routes lists every registered route as "METHOD /path/{param}", sorted; the
// OpenAPI test compares it with api/openapi.json.
func (s *Server) Routes() []string {
	out := make([]string, 0, len(s.routes))
	for _, rt := range s.routes {
		out = append(out, rt.method+" "+rt.path)
	}
	sort.Strings(out)
	return out
}

// routeOpts selects the middleware a route runs behind.
type routeOpts uint8

const (
	// optTenant: X-API-Key auth and the per-key rate limit.
	optTenant routeOpts = 1 << iota
	// optIdem: Idempotency-Key required, response stored and replayed.
	optIdem
	// optAdmin: operator bearer token.
	optAdmin
	// optDryRun: a body with a top-level "dry_run" (not false) changes
	// nothing, so optIdem's key is neither required nor claimed.
	optDryRun
	// optRerun (with optIdem, on a POST): a 2xx answer is not stored; a
	// retry under the key re-runs the endpoint, whose one money script
	// answers it from the operation it remembers (replaysByRerun).
	optRerun
	// optFused (with optRerun): on a store that can (engine.DoorFuser), the
	// request's door runs inside its one money script (fuse).
	optFused
	// optStored (with optIdem, never with optRerun): a route that runs a
	// money script and still stores its answer, because a re-run would not
	// answer from the operation's record alone (a usage batch answers a
	// replayed event "duplicate"; see replaysByRerun). Every money route
	// says optRerun or optStored, other routes neither
	// (TestMoneyRoutesDeclareIdempotency).
	optStored
	// optFusedRead (a GET with optTenant): the request's door is checked by
	// its first Redis read, in that read's round trip (fuseRead).
	optFusedRead
)

// endpoint is one operation; it writes its success response through the
// call and returns an error for the problem writer.
type endpoint func(c *call) error

// route is one registered method and path with its metrics.
type route struct {
	method, path string
	opts         routeOpts
	ep           endpoint
	metrics      *routeMetrics
}

func (s *Server) handle(method, path string, opts routeOpts, ep endpoint) {
	if opts&optRerun != 0 && (opts&optIdem == 0 || method != "POST") {
		panic("api: " + method + " " + path + ": optRerun needs optIdem on a POST")
	}
	if opts&optStored != 0 && (opts&optIdem == 0 || opts&optRerun != 0) {
		panic("api: " + method + " " + path + ": optStored needs optIdem and excludes optRerun")
	}
	if opts&optFused != 0 && opts&(optRerun|optTenant) != optRerun|optTenant {
		panic("api: " + method + " " + path + ": optFused needs optRerun and optTenant")
	}
	if opts&optFusedRead != 0 && (method != "GET" || opts&optTenant == 0 || opts&optIdem != 0) {
		panic("api: " + method + " " + path + ": optFusedRead needs a GET with optTenant and no optIdem")
	}
	rt := &route{method: method, path: path, opts: opts, ep: ep, metrics: s.metrics.route(path, method)}
	s.routes = append(s.routes, rt)
	s.router.Handle(method, path, func(ctx *fasthttp.RequestCtx) {
		c := s.callOf(ctx)
		c.route = rt
		s.serveRoute(rt, c)
	})
}

// register lists every route the server serves; api/openapi.json documents
// exactly these.
func (s *Server) register() {
	s.handle("GET", "/healthz", 0, s.healthz)
	s.handle("GET", "/readyz", 0, s.readyz)
	if s.metricsHere {
		s.handle("GET", "/metrics", 0, s.metricsText)
	}
	s.handle("GET", "/openapi.json", 0, s.openAPI)

	s.handle("GET", "/v1/tenant", optTenant, s.getTenant)
	s.handle("PATCH", "/v1/tenant", optTenant|optIdem, s.patchTenant)

	s.handle("GET", "/v1/customers", optTenant, s.listCustomers)
	s.handle("POST", "/v1/customers", optTenant|optIdem, s.createCustomer)
	for _, form := range []struct {
		prefix string
		strict bool
	}{{"/v1/customers/{id}", false}, {"/v1/customer-by-external-id/{external_id}", true}} {
		ref := refParam(form.strict)
		s.handle("GET", form.prefix, optTenant, s.getCustomer(ref))
		s.handle("PATCH", form.prefix, optTenant|optIdem, s.patchCustomer(ref))
		s.handle("DELETE", form.prefix, optTenant, s.deleteCustomer(ref))
		s.handle("GET", form.prefix+"/credits", optTenant|optFusedRead, s.getCredits(ref))
		s.handle("POST", form.prefix+"/credits/grant", optTenant|optIdem|optRerun|optFused, s.grant(ref))
		s.handle("POST", form.prefix+"/credits/adjust", optTenant|optIdem|optRerun|optFused, s.adjust(ref))
	}
	lenient := refParam(false)
	s.handle("GET", "/v1/customers/{id}/credits/history", optTenant, s.history(lenient))
	s.handle("GET", "/v1/customers/{id}/overage", optTenant, s.overage(lenient))
	s.registerPricing()
	s.registerWebhooks()
	s.registerPlans()
	s.registerOverrides()
	s.registerSubscriptions()
	s.registerSnapshot()
	s.registerTopups()
	s.registerImports()
	s.registerEvents()
	s.registerUsageReports()
	s.registerAlerts()

	if len(s.admin) == 0 {
		return
	}
	s.handle("POST", "/admin/v1/tenants", optAdmin, s.adminCreateTenant)
	s.handle("GET", "/admin/v1/tenants", optAdmin, s.adminListTenants)
	s.handle("GET", "/admin/v1/tenants/{id}", optAdmin, s.adminGetTenant)
	s.handle("PATCH", "/admin/v1/tenants/{id}", optAdmin, s.adminPatchTenant)
	s.handle("POST", "/admin/v1/tenants/{id}/api-keys", optAdmin, s.adminCreateKey)
	s.handle("GET", "/admin/v1/tenants/{id}/api-keys", optAdmin, s.adminListKeys)
	s.handle("DELETE", "/admin/v1/tenants/{id}/api-keys/{key_id}", optAdmin, s.adminRevokeKey)
	s.handle("PUT", "/admin/v1/tenants/{id}/webhook", optAdmin, s.adminSetWebhook)
	s.handle("POST", "/admin/v1/tenants/{id}/webhook/rotate-secret", optAdmin, s.adminRotateSecret)
	s.handle("DELETE", "/admin/v1/tenants/{id}/webhook", optAdmin, s.adminDeleteWebhook)
}

// callKey is the user value under which serveHTTP hands the call to routes.
const callKey = "creditd.call"

// serveHTTP is the outermost handler: request id, dispatch, access log and
// metrics, for every request including 404s and 405s.
func (s *Server) serveHTTP(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	s.metrics.inFlight.Inc()
	c := s.calls.Get().(*call)
	c.reset(ctx, s)
	ctx.Response.Header.SetBytesKV(headerRequestID, c.requestID(ctx))
	if s.tracer != nil {
		s.startSpan(c)
	}
	ctx.SetUserValue(callKey, c)
	s.dispatch(c)
	s.complete(c, time.Since(start))
	ctx.RemoveUserValue(callKey)
	c.reset(nil, nil)
	s.calls.Put(c)
	s.metrics.inFlight.Dec()
}

// dispatch routes the request; a panic anywhere below becomes a 500.
func (s *Server) dispatch(c *call) {
	defer func() {
		if r := recover(); r != nil {
			c.recovered(r)
		}
	}()
	s.router.Handler(c.ctx)
}

// serveRoute runs the middleware the route's options ask for, then the endpoint.
func (s *Server) serveRoute(rt *route, c *call) {
	ctx := c.ctx
	if len(ctx.Request.Body()) > s.bodyLimit {
		c.fail(errTooLarge)
		return
	}
	if rt.opts&optAdmin != 0 {
		// The limit comes first, so guessing the token costs a slot too.
		if !s.adminRateLimit(c) {
			return
		}
		if !s.adminAuthorized(ctx) {
			ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="creditd-admin"`)
			c.fail(errAdminUnauthorized)
			return
		}
	}
	c.dry = rt.opts&optDryRun != 0 && dryRunAsked(ctx.Request.Body())
	if rt.opts&optFused != 0 && !c.dry && s.fuse(rt, c) {
		return
	}
	if rt.opts&optFusedRead != 0 && s.fuseRead(rt, c) {
		return
	}
	if rt.opts&optTenant != 0 {
		s.openDoor(rt, c)
		if !s.authenticate(c) || !s.rateLimit(c) {
			s.closeDoor(c)
			return
		}
	}
	if rt.opts&optIdem != 0 && !c.dry {
		s.idempotent(rt, c)
		s.closeDoor(c)
		return
	}
	if err := c.invoke(rt.ep); err != nil {
		c.fail(err)
	}
}

// authenticate resolves X-API-Key into the call's scope and tenant.
func (s *Server) authenticate(c *call) bool {
	key := c.ctx.Request.Header.Peek("X-API-Key")
	if len(key) == 0 {
		c.fail(engine.ErrUnauthenticated)
		return false
	}
	scope, tenant, err := s.tenants.AuthenticateBytes(c.reqContext(), key)
	if err != nil {
		c.fail(err)
		return false
	}
	c.scope, c.tenant = scope, tenant
	return true
}

// complete writes the access log line and the metrics of one request.
func (s *Server) complete(c *call, d time.Duration) {
	ctx := c.ctx
	status := ctx.Response.StatusCode()
	path := "unmatched"
	m := s.metrics.unmatchedFor(ctx.Method())
	if c.route != nil {
		path, m = c.route.path, c.route.metrics
	}
	m.observe(status, d)
	ev := s.log.Info()
	if ev == nil {
		c.endSpan(path, status)
		return
	}
	ev = ev.Bytes("request_id", c.reqID).
		Bytes("method", ctx.Method()).
		Str("route", path).
		Int("status", status).
		Dur("duration", d)
	if c.scope.TenantID != uuid.Nil {
		ev = ev.Bytes("tenant_id", bareUUID(c.logIDs[0:38], c.scope.TenantID)).
			Bytes("key_id", bareUUID(c.logIDs[38:76], c.scope.KeyID))
	}
	if c.span != nil {
		ev = ev.Bytes("trace_id", c.traceID())
	}
	ev.Msg("request")
	c.endSpan(path, status)
}

// notFound answers paths no route matches.
func (s *Server) notFound(ctx *fasthttp.RequestCtx) {
	if s.consoleRoot != nil && ctx.IsGet() && string(ctx.Path()) == consoleRootPath {
		s.consoleRoot(ctx)
		return
	}
	s.callOf(ctx).fail(&engine.Error{Kind: engine.KindNotFound, Detail: "no route matches this path"})
}

// methodNotAllowed answers a known path asked with another method; the
// router has already set the Allow header.
func (s *Server) methodNotAllowed(ctx *fasthttp.RequestCtx) {
	s.callOf(ctx).failStatus(fasthttp.StatusMethodNotAllowed, engine.KindBadRequest, "Method Not Allowed", "", "this method is not allowed on this path; see the Allow header")
}

// headerReceived runs once the headers are read, before any of the body:
// a body larger than anonymousBodyBytes (or chunked, size unknown) is
// buffered only for a request with a valid API key or admin token; without
// one the limit drops to anonymousBodyBytes, so fasthttp refuses a larger
// Content-Length unread and connError answers 401. Small bodies, the hot
// path, skip the credential check here (the handler makes it anyway).
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	n := h.ContentLength()
	if n == -2 || (n >= 0 && n <= anonymousBodyBytes) || n > s.bodyLimit {
		// -2 is no body at all; over the limit is refused unread anyway.
		return fasthttp.RequestConfig{}
	}
	if s.credentialed(h) {
		return fasthttp.RequestConfig{}
	}
	return fasthttp.RequestConfig{MaxRequestBodySize: anonymousBodyBytes}
}

// credentialed reports whether h carries the admin token or an API key that
// is not known to be invalid (a directory failure counts as valid: the
// handler then answers it, and the body limit still holds).
func (s *Server) credentialed(h *fasthttp.RequestHeader) bool {
	if s.adminHeaderAuthorized(h) {
		return true
	}
	key := h.Peek("X-API-Key")
	if len(key) == 0 {
		return false
	}
	_, _, err := s.tenants.Authenticate(context.Background(), string(key))
	return !errors.Is(err, engine.ErrUnauthenticated)
}

// adminHeaderAuthorized is adminAuthorized on the bare request header.
func (s *Server) adminHeaderAuthorized(h *fasthttp.RequestHeader) bool {
	const prefix = "Bearer "
	v := h.Peek(fasthttp.HeaderAuthorization)
	if len(s.admin) == 0 || len(v) <= len(prefix) || string(v[:len(prefix)]) != prefix {
		return false
	}
	return subtle.ConstantTimeCompare(v[len(prefix):], s.admin) == 1
}

// refusal is the problem for a request refused before its body is read:
// 413 over the body limit, 401 for a large body without valid credentials;
// nil when the body may be read.
func (s *Server) refusal(ctx *fasthttp.RequestCtx) error {
	n := ctx.Request.Header.ContentLength()
	switch {
	case n > s.bodyLimit:
		return errTooLarge
	case n == -2 || (n >= 0 && n <= anonymousBodyBytes):
		return nil
	case !s.credentialed(&ctx.Request.Header):
		if bytes.HasPrefix(ctx.Path(), adminPathPrefix) {
			ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="creditd-admin"`)
			return errAdminUnauthorized
		}
		return engine.ErrUnauthenticated
	}
	return nil
}

var adminPathPrefix = []byte("/admin/")

// expectContinue answers "Expect: 100-continue" with the final refusal when
// the body would be refused anyway, so the client never sends it; else 100.
func (s *Server) expectContinue(ctx *fasthttp.RequestCtx) int {
	err := s.refusal(ctx)
	if err == nil {
		return fasthttp.StatusContinue
	}
	if dc, ok := ctx.Conn().(*doorConn); ok {
		dc.lingerOnClose() // a client that stops waiting sends the body anyway
	}
	s.refuse(ctx, err, nil)
	return ctx.Response.StatusCode()
}

// connError answers requests fasthttp refused before any handler ran: a
// body over the limit (413), a large body without valid credentials (401),
// or an unreadable request (400). The connection then closes, after
// draining what the client still sends (doorConn).
func (s *Server) connError(ctx *fasthttp.RequestCtx, err error) {
	if dc, ok := ctx.Conn().(*doorConn); ok {
		dc.lingerOnClose()
	}
	var problem error = engine.BadRequest("", "the request could not be read")
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		if ctx.Request.Header.ContentLength() <= 0 {
			// A chunked body ran past its cap and fasthttp reset the request:
			// whether the cap was the limit or the anonymous one is lost.
			detail := fmt.Sprintf("the request body is larger than the limit (%d bytes; %d bytes without a valid API key)", s.bodyLimit, anonymousBodyBytes)
			s.refuseWith(ctx, err, func(c *call) {
				c.failStatus(fasthttp.StatusRequestEntityTooLarge, engine.KindBadRequest, "Payload Too Large", "", detail)
			})
			return
		}
		problem = errTooLarge
		if e := s.refusal(ctx); e != nil {
			problem = e
		}
	}
	s.refuse(ctx, problem, err)
}

// refuse writes problem for a request no route saw, with its request id,
// access log and metrics.
func (s *Server) refuse(ctx *fasthttp.RequestCtx, problem, cause error) {
	s.refuseWith(ctx, cause, func(c *call) { c.fail(problem) })
}

// refuseWith is refuse with its own problem writer.
func (s *Server) refuseWith(ctx *fasthttp.RequestCtx, cause error, write func(c *call)) {
	c := s.calls.Get().(*call)
	c.reset(ctx, s)
	ctx.Response.Header.SetBytesKV(headerRequestID, c.requestID(ctx))
	write(c)
	if cause != nil {
		s.log.Debug().Bytes("request_id", c.reqID).Err(cause).Msg("request refused before routing")
	}
	s.complete(c, 0)
	c.reset(nil, nil)
	s.calls.Put(c)
}

// callOf is the call serveHTTP attached to ctx; a bare one if the router
// was somehow reached without it.
func (s *Server) callOf(ctx *fasthttp.RequestCtx) *call {
	if c, ok := ctx.UserValue(callKey).(*call); ok {
		return c
	}
	return &call{ctx: ctx, s: s}
}

// fasthttpLogger sends fasthttp's own messages to zerolog.
type fasthttpLogger struct{ log zerolog.Logger }

// Printf implements fasthttp.Logger. A connection closed over a refused
// body is the client's doing and already in the access log: debug only, so
// a flood of them cannot flood the log.
func (l fasthttpLogger) Printf(format string, args ...any) {
	for _, a := range args {
		if err, ok := a.(error); ok && errors.Is(err, fasthttp.ErrBodyTooLarge) {
			l.log.Debug().Msgf(format, args...)
			return
		}
	}
	l.log.Warn().Msgf(format, args...)
}
