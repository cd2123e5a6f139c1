package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestOpenAPIMatchesRoutes: /openapi.json is valid JSON, OpenAPI 3.1, lists
// exactly the registered routes, and every $ref in it resolves.
func TestOpenAPIMatchesRoutes(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.do("GET", "/openapi.json", "")
	if r.status != 200 || r.get("Content-Type") != "application/json" {
		t.Fatalf("GET /openapi.json: %d %s", r.status, r.get("Content-Type"))
	}
	var doc map[string]any
	if err := json.Unmarshal(r.body, &doc); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if doc["openapi"] != "3.1.0" {
		t.Fatalf("openapi = %v", doc["openapi"])
	}
	var documented []string
	for path, item := range doc["paths"].(map[string]any) {
		for method := range item.(map[string]any) {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	sort.Strings(documented)
	if got, want := strings.Join(documented, "\n"), strings.Join(h.srv.Routes(), "\n"); got != want {
		t.Fatalf("openapi.json paths differ from the routes\ndocumented:\n%s\nregistered:\n%s", got, want)
	}
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if ref, ok := x["$ref"].(string); ok {
				if !resolves(doc, ref) {
					t.Errorf("$ref %s does not resolve", ref)
				}
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(doc)
}

func resolves(doc map[string]any, ref string) bool {
	if !strings.HasPrefix(ref, "#/") {
		return false
	}
	var cur any = doc
	for _, part := range strings.Split(ref[2:], "/") {
		m, ok := cur.(map[string]any)
		if !ok {
			return false
		}
		if cur, ok = m[part]; !ok {
			return false
		}
	}
	return true
}

// TestHealthAndReadiness: /healthz is always 200; /readyz is 503 naming
// each failing check and 200 when all pass or only advisory ones fail;
// only NotReady text is shown, any other error (it may name hosts and
// ports) reads "unavailable".
func TestHealthAndReadiness(t *testing.T) {
	okCheck := func(context.Context) error { return nil }
	t.Parallel()
	for _, tc := range []struct {
		name   string
		checks []HealthCheck
		status int
		want   map[string]string
	}{
		{"no checks", nil, 200, map[string]string{}},
		{"all ok", []HealthCheck{{Name: "redis", Check: okCheck}, {Name: "postgres", Check: okCheck}}, 200, map[string]string{"redis": "ok", "postgres": "ok"}},
		{"one failing", []HealthCheck{{Name: "redis", Check: okCheck}, {Name: "persister_lag", Check: func(context.Context) error { return NotReady("lag 12s over 5s") }}}, 503, map[string]string{"redis": "ok", "persister_lag": "lag 12s over 5s"}},
		{"internal text hidden", []HealthCheck{{Name: "postgres", Check: func(context.Context) error { return errors.New("dial tcp 10.0.0.7:5432: connect: connection refused") }}}, 503, map[string]string{"postgres": "unavailable"}},
		{"advisory failing stays ready", []HealthCheck{{Name: "redis", Check: okCheck}, {Name: "scheduler", Advisory: true, Check: func(context.Context) error { return NotReady("stalled") }}}, 200, map[string]string{"redis": "ok", "scheduler": "stalled"}},
		{"advisory and required failing", []HealthCheck{{Name: "redis", Check: func(context.Context) error { return NotReady("down") }}, {Name: "scheduler", Advisory: true, Check: func(context.Context) error { return NotReady("stalled") }}}, 503, map[string]string{"redis": "down", "scheduler": "stalled"}},
		{"advisory internal text hidden", []HealthCheck{{Name: "reservation_sweep", Advisory: true, Check: func(context.Context) error { return errors.New("dial tcp 10.0.0.7:6379") }}}, 200, map[string]string{"reservation_sweep": "unavailable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := setup(t, func(c *Config) { c.Ready = tc.checks })
			if r := h.do("GET", "/healthz", ""); r.status != 200 || string(r.body) != `{"status":"ok"}` {
				t.Fatalf("healthz: %d %s", r.status, r.body)
			}
			r := h.do("GET", "/readyz", "")
			var body readyBody
			if err := json.Unmarshal(r.body, &body); err != nil || r.status != tc.status {
				t.Fatalf("readyz: %d %s", r.status, r.body)
			}
			if fmt.Sprint(body.Checks) != fmt.Sprint(tc.want) {
				t.Fatalf("checks = %v, want %v", body.Checks, tc.want)
			}
		})
	}
}

// TestMetrics: /metrics counts requests per route, method and status
// class, has a histogram per route, and serves every family of the
// registry it was given.
func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	lag := prometheus.NewGauge(prometheus.GaugeOpts{Name: "creditd_persister_lag_seconds", Help: "test"})
	lag.Set(0.25)
	reg.MustRegister(lag)
	h := setup(t, func(c *Config) { c.Registry = reg })
	h.do("GET", "/v1/tenant", "", h.key()...)
	h.do("GET", "/v1/tenant", "", h.key()...)
	h.do("GET", "/v1/tenant", "")
	h.do("GET", "/nowhere", "")
	r := h.do("GET", "/metrics", "")
	text := string(r.body)
	for _, want := range []string{
		`creditd_http_requests_total{method="GET",route="/v1/tenant",status="2xx"} 2`,
		`creditd_http_requests_total{method="GET",route="/v1/tenant",status="4xx"} 1`,
		`creditd_http_requests_total{method="GET",route="/v1/tenant",status="5xx"} 0`,
		`creditd_http_requests_total{method="GET",route="unmatched",status="4xx"} 1`,
		`creditd_http_request_duration_seconds_bucket{method="GET",route="/v1/tenant",le="+Inf"} 3`,
		`creditd_http_request_duration_seconds_bucket{method="GET",route="/v1/tenant",le="0.001"} `,
		`creditd_http_request_duration_seconds_count{method="GET",route="/v1/tenant"} 3`,
		"# TYPE creditd_http_request_duration_seconds histogram",
		"creditd_http_requests_in_flight 1",
		"creditd_persister_lag_seconds 0.25",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(text, "tenant_id") {
		t.Errorf("metrics carry a tenant label")
	}
	if !strings.HasPrefix(r.get("Content-Type"), "text/plain") {
		t.Fatalf("Content-Type = %q", r.get("Content-Type"))
	}
}
