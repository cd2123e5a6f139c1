package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

// TestConformanceBodyLimit: docs/decisions.md: bodies over 1 MiB get 413 and
// change nothing; a body just under passes the limit.
func TestConformanceBodyLimit(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("body"))
	a := s.as(t, tn.Live)
	big := `{"external_id": "too-big", "metadata": {"pad": "` + strings.Repeat("x", 1<<20) + `"}}`
	// Several tries, each after a small request on the same keep-alive
	// connection, as a client would: every one must get its 413 (a reset
	// connection instead of the answer is a failure too).
	const tries = 12
	var lost, wrong []string
	for i := 0; i < tries; i++ {
		a.get("/v1/customers")
		req, err := http.NewRequest("POST", s.URL+"/v1/customers", strings.NewReader(big))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-API-Key", tn.Live)
		req.Header.Set("Idempotency-Key", idemKey())
		req.Header.Set("Content-Type", "application/json")
		res, err := s.HTTP.Do(req)
		if err != nil {
			lost = append(lost, err.Error())
			continue
		}
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 413 {
			wrong = append(wrong, fmt.Sprintf("%d %s", res.StatusCode, raw))
		} else if res.Header.Get("X-Request-Id") == "" {
			t.Error("413 without X-Request-Id")
		}
	}
	if len(lost) > 0 {
		t.Errorf("%d of %d over-limit requests got no 413 (transport error, e.g. %s)", len(lost), tries, lost[0])
	}
	if len(wrong) > 0 {
		t.Errorf("%d of %d over-limit requests got another status: %v", len(wrong), tries, wrong)
	}
	checkProblem(t, a.get("/v1/customers/too-big"), 404, "not-found", "", "413 created nothing")

	// Comfortably under the limit: accepted (in an ignored member, since
	// metadata has its own 4 KiB bound).
	ok := `{"external_id": "big-ok", "pad": "` + strings.Repeat("y", 500_000) + `"}`
	checkStatus(t, a.post("/v1/customers", ok), 201, "500 kB body")
}

// TestConformanceRateLimit: docs/spec/addendum.md §10: a per-key token bucket set per
// tenant through the operator API; 429 `rate-limited` with Retry-After and
// RateLimit-* headers; docs/decisions.md: every /v1 response carries the
// RateLimit headers.
func TestConformanceRateLimit(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("rl"))
	a := s.as(t, tn.Live)

	r := a.get("/v1/customers")
	wantStatus(t, r, 200, "before limit")
	for _, h := range []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
		if r.Header.Get(h) == "" {
			t.Errorf("200 lacks %s", h)
		}
	}

	p := adminCall(t, s, AdminToken, "PATCH", "/admin/v1/tenants/"+tn.ID, map[string]any{"rate_limit_per_second": 1, "rate_limit_burst": 2})
	wantStatus(t, p, 200, "admin PATCH rate limit")
	checkProblem(t, adminCall(t, s, AdminToken, "PATCH", "/admin/v1/tenants/"+tn.ID, map[string]any{"rate_limit_per_second": 0}),
		422, "validation-error", "rate_limit_per_second", "rate limit 0")

	var got []Response
	for i := 0; i < 3; i++ {
		got = append(got, a.get("/v1/customers"))
	}
	checkStatus(t, got[0], 200, "request 1 of burst 2")
	checkStatus(t, got[1], 200, "request 2 of burst 2")
	lim := got[2]
	checkProblem(t, lim, 429, "rate-limited", "", "request 3")
	if ra, err := strconv.Atoi(lim.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q, want a positive number of seconds", lim.Header.Get("Retry-After"))
	}
	for _, h := range []string{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} {
		if lim.Header.Get(h) == "" {
			t.Errorf("429 lacks %s", h)
		}
	}
	if v := lim.Header.Get("RateLimit-Remaining"); v != "0" {
		t.Errorf("429 RateLimit-Remaining %q, want 0", v)
	}
	// A limited write changes nothing.
	w := a.post("/v1/customers", map[string]any{"external_id": "limited"})
	checkStatus(t, w, 429, "limited write")

	// The bucket is per key: the sandbox key of the same tenant still works.
	checkStatus(t, s.as(t, tn.Sandbox).get("/v1/customers"), 200, "other key of the tenant")
	// Other tenants are unaffected.
	other := s.NewTenant(uniq("rl-other"))
	checkStatus(t, s.as(t, other.Live).get("/v1/customers"), 200, "other tenant")
	// /v1/tenant shows the new limit.
	cfg := s.as(t, tn.Sandbox).get("/v1/tenant")
	if checkStatus(t, cfg, 200, "GET /v1/tenant") && Int(t, cfg.Body["rate_limit_per_second"]) != 1 {
		t.Errorf("rate_limit_per_second %v, want 1", cfg.Body["rate_limit_per_second"])
	}
}

// TestConformanceOps: docs/spec/addendum.md §11: /healthz, /readyz, /metrics (with the
// persister lag), /openapi.json (OpenAPI 3.1 listing /v1/customers), all
// without a key.
func TestConformanceOps(t *testing.T) {
	s := NewStack(t)
	n := s.as(t, "")
	checkStatus(t, n.get("/healthz"), 200, "/healthz")
	checkStatus(t, n.get("/readyz"), 200, "/readyz")

	m := n.get("/metrics")
	if checkStatus(t, m, 200, "/metrics") {
		if !strings.Contains(string(m.Raw), "creditd_persister_lag_seconds") {
			t.Errorf("/metrics lacks creditd_persister_lag_seconds")
		}
		if ct := m.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
			t.Errorf("/metrics Content-Type %q, want text/plain (Prometheus text)", ct)
		}
	}

	o := n.get("/openapi.json")
	if !checkStatus(t, o, 200, "/openapi.json") {
		return
	}
	var doc struct {
		OpenAPI string                     `json:"openapi"`
		Paths   map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(o.Raw, &doc); err != nil {
		t.Fatalf("/openapi.json is not JSON: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1.") {
		t.Errorf("openapi %q, want 3.1.x", doc.OpenAPI)
	}
	for _, p := range []string{"/v1/customers", "/v1/tenant", "/admin/v1/tenants"} {
		if _, ok := doc.Paths[p]; !ok {
			t.Errorf("/openapi.json does not list %s", p)
		}
	}
	if len(doc.Paths) < 10 {
		t.Errorf("/openapi.json lists only %d paths", len(doc.Paths))
	}
}

// TestConformanceUnknownRoute: a path outside the API is a 404 problem, and
// an unknown /v1 path needs no special treatment beyond that.
func TestConformanceUnknownRoute(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("route"))
	checkProblem(t, s.as(t, tn.Live).get("/v1/no-such-resource"), 404, "not-found", "", "unknown /v1 path")
	checkProblem(t, s.as(t, tn.Live).get("/v2/customers"), 404, "not-found", "", "unknown version")
}
