package api

import (
	"errors"
	"strings"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestAuthentication: every /v1 route refuses a missing, malformed, unknown
// or revoked key with a 401 problem, and the operational routes need none.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	h := setup(t)
	revoked, err := h.tenants.CreateKey(t.Context(), h.tenant, engine.EnvironmentLive)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.tenants.RevokeKey(t.Context(), h.tenant, revoked.ID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, method, path string
		headers            []string
	}{
		{"missing key", "GET", "/v1/tenant", nil},
		{"malformed key", "GET", "/v1/customers", []string{"X-API-Key", "nope"}},
		{"unknown key", "GET", "/v1/customers/c1", []string{"X-API-Key", "ck_live_unknownunknownunknownunknown00"}},
		{"revoked key", "GET", "/v1/tenant", []string{"X-API-Key", revoked.Key}},
		{"post without key", "POST", "/v1/customers", []string{"Idempotency-Key", "k"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(tc.method, tc.path, `{"external_id":"x"}`, tc.headers...)
			wantProblem(t, r, 401, "unauthorized", "")
		})
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/openapi.json"} {
		if r := h.do("GET", path, ""); r.status != 200 {
			t.Errorf("GET %s without a key = %d, want 200", path, r.status)
		}
	}
	if r := h.do("GET", "/v1/tenant", "", "X-API-Key", h.sandbox); r.status != 200 {
		t.Fatalf("sandbox key: %d %s", r.status, r.body)
	}
}

// TestRequestID: a sane incoming X-Request-Id is echoed, anything else is
// replaced by a fresh id, and every response carries one.
func TestRequestID(t *testing.T) {
	t.Parallel()
	h := setup(t)
	long := strings.Repeat("a", 129)
	for _, tc := range []struct {
		name, in string
		reused   bool
	}{
		{"none", "", false},
		{"sane", "req-123_abc.def:9", true},
		{"max length", strings.Repeat("b", 128), true},
		{"too long", long, false},
		{"space inside", "a b", false},
		{"quote inside", `a"b`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hdr []string
			if tc.in != "" {
				hdr = []string{"X-Request-Id", tc.in}
			}
			r := h.do("GET", "/healthz", "", hdr...)
			got := r.get("X-Request-Id")
			if tc.reused && got != tc.in {
				t.Fatalf("X-Request-Id = %q, want %q", got, tc.in)
			}
			if !tc.reused && (got == "" || got == tc.in || !saneRequestID([]byte(got))) {
				t.Fatalf("X-Request-Id = %q, want a fresh sane id", got)
			}
		})
	}
	a, b := h.do("GET", "/healthz", "").get("X-Request-Id"), h.do("GET", "/healthz", "").get("X-Request-Id")
	if a == b {
		t.Fatalf("two requests share request id %q", a)
	}
}

// TestRoutingProblems: unknown paths are 404 problems, known paths with the
// wrong method 405 problems with Allow; nothing redirects.
func TestRoutingProblems(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for _, tc := range []struct {
		method, path string
		status       int
		typ          string
	}{
		{"GET", "/nope", 404, "not-found"},
		{"GET", "/v1/customers/", 404, "not-found"},
		{"GET", "/V1/TENANT", 404, "not-found"},
		{"POST", "/healthz", 405, "bad-request"},
		{"PUT", "/v1/customers", 405, "bad-request"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			r := h.do(tc.method, tc.path, "", h.key()...)
			wantProblem(t, r, tc.status, tc.typ, "")
			if tc.status == 405 && r.get("Allow") == "" {
				t.Fatal("405 without Allow header")
			}
		})
	}
}

// TestInternalErrorsDoNotLeak: a panic or a non-engine error is a 500
// problem whose detail says nothing about the cause.
func TestInternalErrorsDoNotLeak(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.srv.handle("GET", "/test/panic", 0, func(*call) error { panic("secret panic text") })
	h.srv.handle("GET", "/test/error", 0, func(*call) error { return errors.New("dial tcp 10.0.0.7:5432: secret") })
	h.srv.handle("GET", "/test/engine-internal", 0, func(*call) error {
		return &engine.Error{Kind: engine.KindInternal, Detail: "secret internal"}
	})
	for _, path := range []string{"/test/panic", "/test/error", "/test/engine-internal"} {
		t.Run(path, func(t *testing.T) {
			r := h.do("GET", path, "")
			p := wantProblem(t, r, 500, "internal", "")
			if strings.Contains(string(r.body), "secret") || p["detail"] != internalDetail {
				t.Fatalf("500 leaks its cause: %s", r.body)
			}
		})
	}
}

// TestProblemKinds maps each engine kind to its status and keeps extra members.
func TestProblemKinds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind   engine.Kind
		status int
	}{
		{engine.KindBadRequest, 400},
		{engine.KindUnauthorized, 401},
		{engine.KindNotFound, 404},
		{engine.KindConflict, 409},
		{engine.KindInsufficientCredits, 409},
		{engine.KindReservationExpired, 409},
		{engine.KindValidation, 422},
		{engine.KindRateLimited, 429},
		{engine.KindInternal, 500},
		{engine.Kind("something-new"), 500},
	} {
		if got := statusOf(tc.kind); got != tc.status {
			t.Errorf("statusOf(%s) = %d, want %d", tc.kind, got, tc.status)
		}
	}
	h := setup(t)
	h.srv.handle("GET", "/test/gauge", 0, func(*call) error {
		return &engine.Error{Kind: engine.KindConflict, Detail: "over the cap", Extra: map[string]any{"current": 9, "cap": 10, "shortfall": 1, "type": "ignored"}}
	})
	p := wantProblem(t, h.do("GET", "/test/gauge", ""), 409, "conflict", "")
	if p["current"] != float64(9) || p["cap"] != float64(10) || p["shortfall"] != float64(1) {
		t.Fatalf("extra members missing: %v", p)
	}
}
