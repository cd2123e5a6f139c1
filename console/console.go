// Package console is creditd's web dashboard, served by creditd itself under
// /console: server-rendered html/template pages over the same engine
// services the JSON API uses, no JavaScript, charts drawn as inline SVG.
// An operator signs in with the admin token and sees every tenant; a tenant
// signs in with an API key and sees only its own tenant and environment.
package console

import (
	"context"
	"embed"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

// Console limits (invariant 11: a limit on everything).
const (
	// pageSize is the rows of every listed page (customers, ledger, events).
	pageSize = 25
	// chartEntries bounds the ledger entries the balance chart reads: the
	// newest ones, one indexed page, whatever the ledger's length.
	chartEntries = 200
	// requestTimeout bounds the engine calls of one page.
	requestTimeout = 10 * time.Second
	// maxFormBytes bounds a form body.
	maxFormBytes = 16 << 10
)

// Directory is what the console reads that the API does not expose: every
// tenant for the operator, and a tenant's keys to revoke. *persist.Store
// satisfies it.
type Directory interface {
	// TenantsNewestFirst pages every tenant newest first.
	TenantsNewestFirst(ctx context.Context, cursor string, limit int) (engine.Page[engine.Tenant], error)
	// ListAPIKeys lists a tenant's keys, revoked ones included, oldest first.
	ListAPIKeys(ctx context.Context, tenant uuid.UUID) ([]engine.APIKey, error)
	// PendingWebhookEvents counts the events waiting for delivery, at most limit.
	PendingWebhookEvents(ctx context.Context, limit int) (int, error)
	// UnresolvedDeadLetters counts the outbox entries Postgres refused
	// and nobody has replayed or discarded yet (the operator's banner).
	UnresolvedDeadLetters(ctx context.Context) (int64, error)
}

// Config wires the console to the engine services.
type Config struct {
	Tenants      *engine.Tenants
	Customers    *engine.Customers
	Credits      *engine.Credits
	Reservations *engine.Reservations
	Webhooks     *engine.Webhooks
	Plans        *engine.Plans
	// Entitlements and Subscriptions, when set, add a customer's
	// entitlements (gauges included) and subscriptions to its page.
	Entitlements  *engine.Entitlements
	Subscriptions *engine.Subscriptions
	Directory     Directory
	// Idempotency, when set, makes the create forms (plans, variants,
	// plan grants) run once per form key (onceOnly), in the records the
	// API's Idempotency-Key uses.
	Idempotency idempotency.Records
	// SignOuts, when set, remembers the sessions signed out, so a copy of
	// the cookie stops working on every node at once; without it a
	// sign-out only drops the browser's cookie.
	SignOuts SignOuts
	// AdminToken signs an operator in; empty leaves tenant sign-in only.
	AdminToken string
	// Metrics writes the server's Prometheus text (what /metrics serves);
	// the overview samples it for its rates. Nil hides the overview charts.
	Metrics func(w io.Writer)
	// Clock is the time of sessions and the overview (SystemClock when nil).
	Clock engine.Clock
	Log   zerolog.Logger
}

// Console is the dashboard's HTTP handler. It is safe for concurrent use.
type Console struct {
	cfg     Config
	sealer  *sealer
	signins *signinLimiter
	samples *sampler
	pages   map[string]*pageTemplate
	mux     *http.ServeMux
	static  http.Handler
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Prefix is the path the console is served under.
const Prefix = "/console"

// New builds the console.
func New(cfg Config) *Console {
	if cfg.Clock == nil {
		cfg.Clock = engine.SystemClock{}
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err) // embedded at build time: cannot fail
	}
	c := &Console{
		cfg:     cfg,
		sealer:  newSealer(cfg.AdminToken),
		signins: newSigninLimiter(),
		samples: newSampler(),
		pages:   parsePages(),
		mux:     http.NewServeMux(),
		static:  http.StripPrefix(Prefix+"/static/", http.FileServerFS(sub)),
	}
	c.routes()
	return c
}

// ServeHTTP answers every /console request with the security headers first.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No script runs at all; styles only from the embedded file.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	// Under fasthttpadaptor the request's context is fasthttp's RequestCtx,
	// whose Done reads server state that Shutdown writes unguarded: a
	// context derived from it (whose goroutine watches Done) races with
	// shutdown. It signals only shutdown, not a client gone, so the console
	// keeps its values but not its cancellation, and bounds each request on
	// its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), requestTimeout)
	defer cancel()
	c.mux.ServeHTTP(w, r.WithContext(ctx))
}

// serveStatic serves the embedded stylesheet; a directory is a 404, not a
// listing.
func (c *Console) serveStatic(w http.ResponseWriter, r *http.Request) {
	if strings.HasSuffix(r.URL.Path, "/") {
		c.notFound(w, r)
		return
	}
	// The stylesheet changes only with the binary.
	w.Header().Set("Cache-Control", "public, max-age=3600")
	c.static.ServeHTTP(w, r)
}

func (c *Console) routes() {
	m := c.mux
	m.HandleFunc("GET "+Prefix+"/static/", c.serveStatic)
	m.HandleFunc("GET "+Prefix, c.home)
	m.HandleFunc("GET "+Prefix+"/{$}", c.home)
	m.HandleFunc("GET "+Prefix+"/login", c.loginPage)
	m.HandleFunc("POST "+Prefix+"/login", c.login)
	m.HandleFunc("POST "+Prefix+"/logout", c.signedIn(c.logout))

	m.HandleFunc("GET "+Prefix+"/overview", c.operator(c.overview))
	m.HandleFunc("GET "+Prefix+"/tenants", c.operator(c.tenantsPage))
	m.HandleFunc("POST "+Prefix+"/tenants", c.operator(c.createTenant))
	m.HandleFunc("GET "+Prefix+"/tenants/{tenant}", c.operator(c.tenantPage))
	m.HandleFunc("POST "+Prefix+"/tenants/{tenant}/keys", c.operator(c.createKey))
	m.HandleFunc("POST "+Prefix+"/tenants/{tenant}/keys/{key}/revoke", c.operator(c.revokeKey))
	m.HandleFunc("POST "+Prefix+"/tenants/{tenant}/rate-limit", c.operator(c.setRateLimit))
	m.HandleFunc("POST "+Prefix+"/tenants/{tenant}/webhook", c.operator(c.setWebhook))
	m.HandleFunc("POST "+Prefix+"/tenants/{tenant}/webhook/rotate", c.operator(c.rotateSecret))

	scoped := Prefix + "/t/{tenant}/{env}"
	m.HandleFunc("GET "+scoped+"/customers", c.inScope(c.customersPage))
	m.HandleFunc("GET "+scoped+"/customers/{customer}", c.inScope(c.customerPage))
	m.HandleFunc("POST "+scoped+"/customers/{customer}/grant", c.inScope(c.grant))
	m.HandleFunc("POST "+scoped+"/customers/{customer}/credit-line", c.inScope(c.creditLine))
	m.HandleFunc("POST "+scoped+"/customers/{customer}/budgets", c.inScope(c.setBudget))
	m.HandleFunc("POST "+scoped+"/customers/{customer}/parent", c.inScope(c.setParent))
	m.HandleFunc("POST "+scoped+"/customers/{customer}/budgets/remove", c.inScope(c.removeBudget))
	m.HandleFunc("GET "+scoped+"/webhook", c.inScope(c.webhookPage))
	m.HandleFunc("POST "+scoped+"/webhook/test", c.inScope(c.testPing))
	m.HandleFunc("POST "+scoped+"/webhook/events/{event}/redeliver", c.inScope(c.redeliver))
	m.HandleFunc("GET "+scoped+"/settings", c.inScope(c.settingsPage))
	m.HandleFunc("POST "+scoped+"/settings", c.inScope(c.saveSettings))
	m.HandleFunc("GET "+scoped+"/plans", c.inScope(c.plansPage))
	m.HandleFunc("POST "+scoped+"/plans", c.inScope(c.createPlan))
	m.HandleFunc("POST "+scoped+"/plans/{plan}", c.inScope(c.updatePlan))
	m.HandleFunc("POST "+scoped+"/plans/{plan}/variants", c.inScope(c.createVariant))
	m.HandleFunc("POST "+scoped+"/plans/{plan}/variants/{variant}", c.inScope(c.updateVariant))
	m.HandleFunc("POST "+scoped+"/plans/{plan}/variants/{variant}/grants", c.inScope(c.createGrant))
	m.HandleFunc(Prefix+"/", c.notFound)
}
