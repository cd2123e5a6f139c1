package api

import (
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// Fakes for the pricing and hot-path routes; the full behaviour is covered
// by the e2e conformance tests on real Redis and Postgres.

// fakeCatalog is engine.Catalog over maps.
type fakeCatalog struct {
	mu      sync.Mutex
	metrics map[string]engine.BillableMetric // by environment + key
	order   []string
	rules   []engine.MeteringRule
}

func newFakeCatalog() *fakeCatalog { return &fakeCatalog{metrics: map[string]engine.BillableMetric{}} }

func catKey(s engine.Scope, key string) string {
	return s.TenantID.String() + "/" + string(s.Environment) + "/" + key
}

func (f *fakeCatalog) CreateMetric(_ context.Context, m engine.BillableMetric) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := catKey(engine.Scope{TenantID: m.TenantID, Environment: m.Environment}, m.Key)
	if _, ok := f.metrics[k]; ok {
		return engine.Conflict("key taken")
	}
	f.metrics[k] = m
	f.order = append(f.order, k)
	return nil
}

func (f *fakeCatalog) GetMetric(_ context.Context, s engine.Scope, key string) (engine.BillableMetric, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.metrics[catKey(s, key)]
	if !ok {
		return engine.BillableMetric{}, engine.ErrNotFound
	}
	return m, nil
}

func (f *fakeCatalog) UpdateMetric(_ context.Context, m engine.BillableMetric) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.metrics[catKey(engine.Scope{TenantID: m.TenantID, Environment: m.Environment}, m.Key)] = m
	return nil
}

func (f *fakeCatalog) ListMetrics(_ context.Context, s engine.Scope, _ string, limit int) (engine.Page[engine.BillableMetric], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var p engine.Page[engine.BillableMetric]
	for _, k := range f.order {
		if m := f.metrics[k]; m.TenantID == s.TenantID && m.Environment == s.Environment && len(p.Data) < limit {
			p.Data = append(p.Data, m)
		}
	}
	return p, nil
}

func (f *fakeCatalog) AllMetrics(ctx context.Context, s engine.Scope) ([]engine.BillableMetric, error) {
	p, err := f.ListMetrics(ctx, s, "", 1<<30)
	return p.Data, err
}

func (f *fakeCatalog) CreateRule(_ context.Context, r engine.MeteringRule, missing engine.BillableMetric) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := catKey(engine.Scope{TenantID: r.TenantID, Environment: r.Environment}, r.BillableMetricKey)
	if _, ok := f.metrics[k]; !ok {
		f.metrics[k] = missing
		f.order = append(f.order, k)
	}
	for i := range f.rules {
		if f.rules[i].BillableMetricKey == r.BillableMetricKey && f.rules[i].EffectiveUntil == nil {
			at := r.EffectiveFrom
			f.rules[i].EffectiveUntil = &at
		}
	}
	f.rules = append(f.rules, r)
	return nil
}

func (f *fakeCatalog) ListRules(_ context.Context, s engine.Scope, key string, activeOnly bool, _ string, limit int) (engine.Page[engine.MeteringRule], error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var p engine.Page[engine.MeteringRule]
	for _, r := range f.rules {
		if r.TenantID == s.TenantID && r.Environment == s.Environment && (key == "" || r.BillableMetricKey == key) &&
			(!activeOnly || r.EffectiveUntil == nil) && len(p.Data) < limit {
			p.Data = append(p.Data, r)
		}
	}
	return p, nil
}

func (f *fakeCatalog) ActiveRule(_ context.Context, s engine.Scope, key string) (engine.MeteringRule, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if r.TenantID == s.TenantID && r.Environment == s.Environment && r.BillableMetricKey == key && r.EffectiveUntil == nil {
			return r, nil
		}
	}
	return engine.MeteringRule{}, engine.ErrNotFound
}

// fakeHot is an engine.MeteringStore that charges consumes in full and knows no
// reservations or gauges.
type fakeHot struct{}

func (h fakeHot) ConsumeDry(ctx context.Context, cmd engine.ConsumeCommand) (engine.MutationResult, error) {
	return h.Consume(ctx, cmd)
}

func (fakeHot) Consume(_ context.Context, cmd engine.ConsumeCommand) (engine.MutationResult, error) {
	cost, err := engine.Price(engine.MeteringRule{CostType: cmd.Terms.CostType, BaseCost: cmd.Terms.BaseCost,
		UnitCost: cmd.Terms.UnitCost, TierConfig: cmd.Terms.TierConfig}, cmd.Units)
	if err != nil {
		return engine.MutationResult{}, err
	}
	metric, units := cmd.Metric, cmd.Units
	return engine.MutationResult{Mutation: engine.Mutation{OpID: cmd.OpID, Kind: engine.MutationConsume, CustomerID: cmd.Customer.CustomerID,
		AtMS: cmd.Now.UnixMilli(), Account: engine.MutationAccount{Balance: 1_000_000 - cost},
		Entries: []engine.MutationEntry{{Role: engine.RoleMain, Delta: -cost, Type: engine.EntryConsumption, Metric: &metric, Units: &units}},
		Usage:   &engine.MutationUsage{Metric: metric, Units: units, Cost: cost, Charged: cost}}}, nil
}

func (h fakeHot) ConsumeBatch(ctx context.Context, cmds []engine.ConsumeCommand) ([]engine.MutationResult, []error) {
	out, errs := make([]engine.MutationResult, len(cmds)), make([]error, len(cmds))
	for i, cmd := range cmds {
		out[i], errs[i] = h.Consume(ctx, cmd)
	}
	return out, errs
}

func (h fakeHot) ReserveDry(ctx context.Context, cmd engine.ReserveCommand) (engine.MutationResult, error) {
	return h.Reserve(ctx, cmd)
}

func (fakeHot) Reserve(context.Context, engine.ReserveCommand) (engine.MutationResult, error) {
	return engine.MutationResult{}, engine.ErrInsufficientCredits
}

func (fakeHot) Commit(context.Context, engine.CommitCommand) (engine.MutationResult, error) {
	return engine.MutationResult{}, engine.ErrReservationNotFound
}

func (fakeHot) Release(context.Context, engine.ReleaseCommand) (engine.MutationResult, error) {
	return engine.MutationResult{}, engine.ErrReservationNotFound
}

func (fakeHot) Gauge(_ context.Context, cmd engine.GaugeCommand) (engine.MutationResult, error) {
	if cmd.Delta > cmd.Cap && !cmd.Allow {
		return engine.MutationResult{}, engine.GaugeCapError(0, cmd.Cap, cmd.Delta-cmd.Cap)
	}
	return engine.MutationResult{Mutation: engine.Mutation{Gauge: &engine.MutationGauge{Metric: cmd.Metric, Current: cmd.Delta}}}, nil
}

func (fakeHot) GaugeValue(context.Context, engine.CustomerKey, string) (int64, error) { return 0, nil }

func (fakeHot) DueReservations(context.Context, int, time.Time, int) ([]engine.DueReservation, error) {
	return nil, nil
}

func (fakeHot) ReservationRef(context.Context, uuid.UUID) (engine.ReservationRef, bool, error) {
	return engine.ReservationRef{}, false, nil
}

func (fakeHot) ReservationMetadata(context.Context, engine.CustomerKey, uuid.UUID) (engine.Metadata, bool, error) {
	return nil, false, nil
}

// fakeReservations is an engine.ReservationReader that holds nothing.
type fakeReservations struct{}

func (fakeReservations) GetReservation(context.Context, uuid.UUID, uuid.UUID) (engine.Reservation, error) {
	return engine.Reservation{}, engine.ErrNotFound
}

func (fakeReservations) ListReservations(context.Context, engine.CustomerKey, string, string, int) (engine.Page[engine.Reservation], error) {
	return engine.Page[engine.Reservation]{}, nil
}

func (fakeReservations) ReservationCustomer(context.Context, uuid.UUID, uuid.UUID) (engine.CustomerKey, error) {
	return engine.CustomerKey{}, engine.ErrNotFound
}

// setupPricing is setup with the pricing services on fakes.
func setupPricing(t *testing.T) *harness {
	t.Helper()
	return setup(t, func(cfg *Config) {
		clock := engine.SystemClock{}
		catalog := engine.NewCachedCatalog(newFakeCatalog())
		cfg.Metering = engine.NewMetering(catalog, catalog, clock)
		// The hot path resolves customers through the cache, as in creditd.
		lookup := engine.NewCachedCustomers(cfg.Customers)
		cfg.Entitlements = engine.NewEntitlements(engine.EntitlementsDeps{Customers: lookup, Metering: cfg.Metering, Credits: cfg.Credits, Hot: fakeHot{}, Clock: clock})
		cfg.Reservations = engine.NewReservations(engine.ReservationsDeps{Entitlements: cfg.Entitlements, Credits: cfg.Credits,
			Customers: cfg.Customers, Lookup: lookup, Metering: cfg.Metering, Hot: fakeHot{}, Reservations: fakeReservations{}, Clock: clock})
	})
}

// TestPricingRoutes drives the new routes' decoding and error mapping.
func TestPricingRoutes(t *testing.T) {
	t.Parallel()
	h := setupPricing(t)
	must := func(r response, status int, what string) map[string]any {
		t.Helper()
		if r.status != status {
			t.Fatalf("%s: %d, want %d: %s", what, r.status, status, r.body)
		}
		return r.json()
	}
	m := must(h.do("POST", "/v1/billable-metrics", `{"key":"seats","type":"gauge","default_value":{"cap":2}}`, h.idemKey("m1")...), 201, "create metric")
	if m["key"] != "seats" || m["type"] != "gauge" {
		t.Fatalf("metric %v", m)
	}
	wantProblem(t, h.do("POST", "/v1/billable-metrics", `{"key":"x","type":"nope"}`, h.idemKey("m2")...), 422, "validation-error", "type")
	must(h.do("GET", "/v1/billable-metrics/seats", "", h.key()...), 200, "get metric")
	wantProblem(t, h.do("GET", "/v1/billable-metrics/none", "", h.key()...), 404, "not-found", "")
	wantProblem(t, h.do("PATCH", "/v1/billable-metrics/seats", `{"type":"static"}`, h.idemKey("m3")...), 422, "validation-error", "type")
	if l := must(h.do("GET", "/v1/billable-metrics", "", h.key()...), 200, "list metrics"); len(l["data"].([]any)) != 1 {
		t.Fatalf("list: %v", l)
	}

	must(h.do("POST", "/v1/metering-rules", `{"billable_metric_key":"tok","cost_type":"per_unit","unit_cost":3}`, h.idemKey("r1")...), 201, "rule")
	wantProblem(t, h.do("POST", "/v1/metering-rules", `{"billable_metric_key":"tok","cost_type":"tiered","tier_config":{"mode":"volume","tiers":[{"up_to":5,"unit_cost":1}]}}`, h.idemKey("r2")...),
		422, "validation-error", "tier_config.tiers.up_to")
	wantProblem(t, h.do("GET", "/v1/metering-rules?active_only=yes", "", h.key()...), 400, "bad-request", "active_only")

	wantProblem(t, h.do("GET", "/v1/entitlements/check?billable_metric_key=tok", "", h.key()...), 400, "bad-request", "customer_id")
	wantProblem(t, h.do("GET", "/v1/entitlements/check?customer_id=c1", "", h.key()...), 400, "bad-request", "billable_metric_key")
	wantProblem(t, h.do("GET", "/v1/entitlements/check?customer_id=c1&billable_metric_key=tok&units=0", "", h.key()...), 400, "bad-request", "units")
	wantProblem(t, h.do("GET", "/v1/customers/c1/entitlements/tok?units=x", "", h.key()...), 400, "bad-request", "units")
	c := must(h.do("GET", "/v1/entitlements/check?customer_id=c1&billable_metric_key=tok&units=4", "", h.key()...), 200, "check")
	if c["estimated_cost"] != float64(12) || c["balance_after"] != float64(-12) || c["allowed"] != false {
		t.Fatalf("check %v", c)
	}
	g := must(h.do("GET", "/v1/customers/c1/entitlements/seats", "", h.key()...), 200, "gauge check")
	if g["cap"] != float64(2) || g["headroom"] != float64(2) {
		t.Fatalf("gauge check %v", g)
	}
	wantProblem(t, h.do("GET", "/v1/customer-by-external-id/ghost/entitlements/seats", "", h.key()...), 404, "not-found", "")

	p := wantProblem(t, h.do("POST", "/v1/customers/c1/entitlements/seats/increment", `{"amount":5}`, h.idemKey("g1")...), 409, "conflict", "")
	if p["current"] != float64(0) || p["cap"] != float64(2) || p["shortfall"] != float64(3) {
		t.Fatalf("gauge 409 members: %v", p)
	}
	must(h.do("POST", "/v1/customers/c1/entitlements/seats/increment", `{"amount":5,"policy":"allow"}`, h.idemKey("g2")...), 200, "gauge allow")
	wantProblem(t, h.do("POST", "/v1/customers/c1/entitlements/tok/decrement", `{"amount":1}`, h.idemKey("g3")...), 400, "bad-request", "billable_metric_key")

	res := must(h.do("POST", "/v1/entitlements/consume", `{"customer_id":"c1","billable_metric_key":"tok","units":2}`, h.idemKey("c1")...), 200, "consume")
	if res["cost"] != float64(6) || res["reason"] != nil {
		t.Fatalf("consume %v", res)
	}
	u := must(h.do("POST", "/v1/usage", `{"events":[]}`, h.idemKey("u1")...), 200, "usage")
	if r, ok := u["results"].([]any); !ok || len(r) != 0 {
		t.Fatalf("usage %v", u)
	}

	wantProblem(t, h.do("GET", "/v1/reservations/not-a-uuid", "", h.key()...), 404, "not-found", "")
	wantProblem(t, h.do("POST", "/v1/reservations/"+uuid.NewString()+"/release", "", h.idemKey("x1")...), 404, "not-found", "")
	wantProblem(t, h.do("POST", "/v1/reservations", `{"billable_metric_key":"tok","estimated_units":1}`, h.idemKey("x2")...), 400, "bad-request", "customer_id")
	wantProblem(t, h.do("GET", "/v1/customers/c1/reservations?status=bogus", "", h.key()...), 500, "internal", "")
}

// benchRequest prepares a reusable request context for one route.
func benchRequest(b *testing.B, h *harness, method, uri, body string, idem bool) {
	b.Helper()
	var req fasthttp.Request
	var ctx fasthttp.RequestCtx
	handler := h.srv.Handler()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req.Reset()
		req.Header.SetMethod(method)
		req.SetRequestURI(uri)
		req.Header.Set("X-API-Key", h.live)
		if idem {
			req.Header.Set("Idempotency-Key", "bench-"+strconv.Itoa(i))
		}
		if body != "" {
			req.SetBodyString(body)
		}
		ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, nil)
		handler(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatalf("%s %s: %d %s", method, uri, ctx.Response.StatusCode(), ctx.Response.Body())
		}
	}
}

// benchHarness is a pricing harness with a priced metric, a funded
// customer and no effective rate limit.
func benchHarness(b *testing.B) *harness {
	t := &testing.T{}
	h := setupPricing(t)
	h.t = t
	tn := h.dir.tenants[h.tenant]
	tn.RateLimitPerSecond, tn.RateLimitBurst = 1<<30, 1<<30
	h.dir.tenants[h.tenant] = tn
	for _, call := range []struct{ method, uri, body string }{
		{"POST", "/v1/metering-rules", `{"billable_metric_key":"tok","cost_type":"per_unit","unit_cost":3}`},
		{"POST", "/v1/customers/c1/credits/grant", `{"credits":1000000000,"source":"promotional","reason":"bench"}`},
	} {
		if r := h.do(call.method, call.uri, call.body, h.idemKey(call.uri)...); r.status/100 != 2 {
			b.Fatalf("%s: %d %s", call.uri, r.status, r.body)
		}
	}
	return h
}

// BenchmarkCheckHandler measures a metered check through every middleware
// (auth cache, rate limit, engine on in-memory fakes, JSON): the
// allocations per request are the handler's share of the hot path.
func BenchmarkCheckHandler(b *testing.B) {
	h := benchHarness(b)
	benchRequest(b, h, "GET", "/v1/entitlements/check?customer_id=c1&billable_metric_key=tok&units=3", "", false)
}

// BenchmarkConsumeHandler measures a consume through every middleware,
// including the idempotency record (in memory here).
func BenchmarkConsumeHandler(b *testing.B) {
	h := benchHarness(b)
	benchRequest(b, h, "POST", "/v1/entitlements/consume", `{"customer_id":"c1","billable_metric_key":"tok","units":2}`, true)
}

func (fakeHot) Extend(context.Context, engine.ExtendCommand) (engine.MutationResult, error) {
	return engine.MutationResult{}, engine.ErrReservationNotFound
}
