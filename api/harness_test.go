package api

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency/idempotencytest"
)

const testAdminToken = "s3cret-admin-token"

// harness is one server over fresh fakes and one tenant with both keys.
type harness struct {
	t       *testing.T
	srv     *Server
	dir     *fakeDirectory
	blocks  *fakeBlocks
	idem    *idempotencytest.Records
	tenants *engine.Tenants
	tenant  uuid.UUID
	live    string
	sandbox string
}

// setup builds a harness; mutate adjusts the Config before New.
func setup(t *testing.T, mutate ...func(*Config)) *harness {
	t.Helper()
	clock := &fakeClock{now: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	dir := newFakeDirectory()
	ledger := &fakeLedger{}
	blocks := &fakeBlocks{accounts: map[uuid.UUID]*fakeAccount{}, ledger: ledger}
	keys := engine.NewCachedKeys(engine.NewKeyLookup(dir))
	tenants := engine.NewTenants(keys.ForgettingDirectory(dir), keys, clock, true)
	customers := engine.NewCustomers(dir, clock)
	credits := engine.NewCredits(customers, blocks, ledger, clock, nil)
	idem := idempotencytest.New()
	cfg := Config{
		Tenants: tenants, Customers: customers, Credits: credits, Idempotency: idem,
		AdminToken: testAdminToken, Log: zerolog.New(io.Discard),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	res, err := tenants.Create(context.Background(), "Acme")
	if err != nil {
		t.Fatal(err)
	}
	return &harness{
		t: t, srv: New(cfg), dir: dir, blocks: blocks, idem: idem, tenants: tenants,
		tenant: res.Tenant.ID, live: res.APIKeys.Live, sandbox: res.APIKeys.Sandbox,
	}
}

// response is what a test reads back from one request.
type response struct {
	status int
	header *fasthttp.ResponseHeader
	body   []byte
}

func (r response) json() map[string]any { return mustJSON(r.body) }

func (r response) get(name string) string { return string(r.header.Peek(name)) }

// do runs one request through Handler() with headers as name, value pairs.
func (h *harness) do(method, uri, body string, headers ...string) response {
	h.t.Helper()
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(uri)
	if body != "" {
		req.SetBodyString(body)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, nil)
	h.srv.Handler()(&ctx)
	out := response{status: ctx.Response.StatusCode(), header: new(fasthttp.ResponseHeader), body: append([]byte(nil), ctx.Response.Body()...)}
	ctx.Response.Header.CopyTo(out.header)
	return out
}

// key returns the headers of a live-key request, plus extra pairs.
func (h *harness) key(extra ...string) []string {
	return append([]string{"X-API-Key", h.live}, extra...)
}

// idemKey returns live-key headers with an Idempotency-Key.
func (h *harness) idemKey(k string) []string { return h.key("Idempotency-Key", k) }

// admin returns the operator's headers.
func admin() []string { return []string{"Authorization", "Bearer " + testAdminToken} }

// wantProblem asserts the RFC 9457 shape of an error response.
func wantProblem(t *testing.T, r response, status int, typ, field string) map[string]any {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d, want %d; body %s", r.status, status, r.body)
	}
	if ct := r.get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type = %q, want application/problem+json", ct)
	}
	p := r.json()
	if p["type"] != typ || p["status"] != float64(status) || p["title"] == "" || p["detail"] == "" {
		t.Fatalf("problem = %v, want type %s status %d with title and detail", p, typ, status)
	}
	if rid := r.get("X-Request-Id"); rid == "" || p["request_id"] != rid {
		t.Fatalf("request_id %v does not match X-Request-Id %q", p["request_id"], rid)
	}
	got, _ := p["field"].(string)
	if got != field {
		t.Fatalf("field = %q, want %q; body %s", got, field, r.body)
	}
	if field != "" {
		errs, _ := p["errors"].([]any)
		if len(errs) != 1 || errs[0].(map[string]any)["field"] != field {
			t.Fatalf("errors = %v, want one naming %s", p["errors"], field)
		}
	}
	return p
}
