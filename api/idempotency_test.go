package api

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

const grantBody = `{"credits":5000,"source":"manual","reason":"welcome"}`

// TestIdempotencyKeyRequired: a POST or PATCH without a usable key is a 422
// naming Idempotency-Key and changes nothing; reads and DELETE need none.
func TestIdempotencyKeyRequired(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for _, tc := range []struct {
		name, method, path, body, key string
	}{
		{"create customer", "POST", "/v1/customers", `{"external_id":"k1"}`, ""},
		{"grant", "POST", "/v1/customers/k1/credits/grant", grantBody, ""},
		{"patch tenant", "PATCH", "/v1/tenant", `{"default_overage_policy":"allow"}`, ""},
		{"key too long", "POST", "/v1/customers", `{"external_id":"k1"}`, strings.Repeat("k", 257)},
		{"bad body still 422 for key first", "POST", "/v1/customers", `{not json`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := h.key()
			if tc.key != "" {
				hdr = h.idemKey(tc.key)
			}
			wantProblem(t, h.do(tc.method, tc.path, tc.body, hdr...), 422, "validation-error", "Idempotency-Key")
		})
	}
	if len(h.dir.customers) != 0 || h.blocks.grants.Load() != 0 {
		t.Fatal("a request without Idempotency-Key changed state")
	}
	if r := h.do("POST", "/v1/customers", `{"external_id":"k1"}`, h.idemKey(strings.Repeat("é", 256))...); r.status != 201 {
		t.Fatalf("256-character key: %d %s", r.status, r.body)
	}
	if r := h.do("DELETE", "/v1/customers/k1", "", h.key()...); r.status != 204 {
		t.Fatalf("DELETE without key: %d %s", r.status, r.body)
	}
}

// TestIdempotencyReplay: the same key and body replays the first status and
// body with X-Idempotent-Replayed; another body or path is a 409; a failed
// first try leaves no record, so the retry runs afresh.
func TestIdempotencyReplay(t *testing.T) {
	t.Parallel()
	h := setup(t)
	first := h.do("POST", "/v1/customers/cust-1/credits/grant", grantBody, h.idemKey("g-1")...)
	if first.status != 201 || first.get("X-Idempotent-Replayed") != "" {
		t.Fatalf("first grant: %d %s", first.status, first.body)
	}
	again := h.do("POST", "/v1/customers/cust-1/credits/grant", grantBody, h.idemKey("g-1")...)
	if again.status != 201 || !bytes.Equal(again.body, first.body) || again.get("X-Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d replayed=%q %s", again.status, again.get("X-Idempotent-Replayed"), again.body)
	}
	if again.get("Content-Type") != "application/json" || again.get("X-Request-Id") == first.get("X-Request-Id") {
		t.Fatalf("replay headers: %v", again.header.String())
	}
	if n := h.blocks.grants.Load(); n != 1 {
		t.Fatalf("grants applied = %d, want 1", n)
	}
	for _, tc := range []struct {
		name, path, body string
	}{
		{"other body", "/v1/customers/cust-1/credits/grant", `{"credits":1,"source":"manual","reason":"welcome"}`},
		{"other path", "/v1/customers/cust-2/credits/grant", grantBody},
		{"other endpoint", "/v1/customers", `{"external_id":"x"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantProblem(t, h.do("POST", tc.path, tc.body, h.idemKey("g-1")...), 409, "conflict", "")
		})
	}
	// The key is per tenant: another tenant may use the same value.
	other, err := h.tenants.Create(t.Context(), "Other")
	if err != nil {
		t.Fatal(err)
	}
	if r := h.do("POST", "/v1/customers/cust-1/credits/grant", grantBody, "X-API-Key", other.APIKeys.Live, "Idempotency-Key", "g-1"); r.status != 201 || r.get("X-Idempotent-Replayed") != "" {
		t.Fatalf("other tenant same key: %d %s", r.status, r.body)
	}

	// A refused request is a completed one: the key keeps its answer, so a
	// corrected body under the same key is a reuse (409), and a new key runs.
	bad := h.do("POST", "/v1/customers/cust-1/credits/adjust", `{"delta":-999999,"source":"manual","reason":"r"}`, h.idemKey("a-1")...)
	wantProblem(t, bad, 409, "insufficient-credits", "")
	reused := h.do("POST", "/v1/customers/cust-1/credits/adjust", `{"delta":-1000,"source":"manual","reason":"r"}`, h.idemKey("a-1")...)
	wantProblem(t, reused, 409, "conflict", "")
	fixed := h.do("POST", "/v1/customers/cust-1/credits/adjust", `{"delta":-1000,"source":"manual","reason":"r"}`, h.idemKey("a-2")...)
	if fixed.status != 200 || fixed.get("X-Idempotent-Replayed") != "" {
		t.Fatalf("new key after a refusal: %d %s", fixed.status, fixed.body)
	}
}

// TestIdempotencyStoresCompletedResponses: Common rules 1 replays "the first
// status and body": a 4xx answered under a claimed key is stored and
// replayed (even after the state changed, so a refused debit never charges
// later), a 5xx is not (the claim is dropped and the retry runs), and
// refusals before the claim (auth, missing key, rate limit) leave nothing.
func TestIdempotencyStoresCompletedResponses(t *testing.T) {
	t.Parallel()
	h := setup(t)
	grant := func(key, credits string) response {
		return h.do("POST", "/v1/customers/c-1/credits/grant", `{"credits":`+credits+`,"source":"manual","reason":"r"}`, h.idemKey(key)...)
	}
	if r := grant("g-seed", "1000"); r.status != 201 {
		t.Fatalf("seed grant: %d %s", r.status, r.body)
	}
	debit := `{"delta":-5000,"source":"manual","reason":"r"}`
	for _, tc := range []struct {
		name, path, body, typ, field string
		status                       int
	}{
		{"409 insufficient", "/v1/customers/c-1/credits/adjust", debit, "insufficient-credits", "", 409},
		{"422 validation", "/v1/customers/c-1/credits/grant", `{"credits":0,"source":"manual","reason":"r"}`, "validation-error", "credits", 422},
		{"404 unknown customer", "/v1/customers/nobody/credits/adjust", debit, "not-found", "", 404},
		{"400 bad body", "/v1/customers", `{"external_id":`, "bad-request", "", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "k-" + tc.name
			first := h.do("POST", tc.path, tc.body, h.idemKey(key)...)
			wantProblem(t, first, tc.status, tc.typ, tc.field)
			if tc.status == 409 {
				// The state changes so that a fresh run would succeed.
				if r := grant("g-topup", "100000"); r.status != 201 {
					t.Fatalf("top-up: %d %s", r.status, r.body)
				}
			}
			again := h.do("POST", tc.path, tc.body, h.idemKey(key)...)
			if again.status != tc.status || !bytes.Equal(again.body, first.body) || again.get("X-Idempotent-Replayed") != "true" {
				t.Fatalf("retry: %d replayed=%q %s, want the first %d replayed: %s", again.status, again.get("X-Idempotent-Replayed"), again.body, tc.status, first.body)
			}
			if ct := again.get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("replayed Content-Type = %q", ct)
			}
		})
	}
	if r := h.do("GET", "/v1/customers/c-1/credits", "", h.key()...); r.status != 200 || r.json()["balance"] != float64(101000) {
		t.Fatalf("balance after replayed refusal: %d %s, want 101000 (nothing charged)", r.status, r.body)
	}

	// A 5xx is not an answer: the claim goes and the retry runs.
	h.blocks.fail = errors.New("store down")
	wantProblem(t, grant("g-5xx", "7"), 500, "internal", "")
	h.blocks.fail = nil
	if r := grant("g-5xx", "7"); r.status != 201 || r.get("X-Idempotent-Replayed") != "" {
		t.Fatalf("retry after a 500: %d %s, want a fresh 201", r.status, r.body)
	}

	// Refused before the claim: no record under these keys.
	before := len(h.idem.Refs())
	h.do("POST", "/v1/customers/c-1/credits/grant", grantBody, "Idempotency-Key", "no-auth")
	h.do("POST", "/v1/customers/c-1/credits/grant", grantBody, "X-API-Key", "ck_live_wrongwrongwrongwrongwrongwrong", "Idempotency-Key", "bad-auth")
	if after := len(h.idem.Refs()); after != before {
		t.Fatalf("refusals before the claim stored %d records", after-before)
	}
}

// TestIdempotencyEnvironment: the fingerprint includes the environment
// (engine/idempotency TestFingerprint), so the sandbox key reusing a live
// request's key never replays the live answer: the key is one per tenant
// (docs/spec/addendum.md §12), so it is a 409.
func TestIdempotencyEnvironment(t *testing.T) {
	t.Parallel()
	h := setup(t)
	live := h.do("POST", "/v1/customers/env-1/credits/grant", grantBody, h.idemKey("env-key")...)
	if live.status != 201 {
		t.Fatalf("live grant: %d %s", live.status, live.body)
	}
	sandbox := h.do("POST", "/v1/customers/env-1/credits/grant", grantBody, "X-API-Key", h.sandbox, "Idempotency-Key", "env-key")
	wantProblem(t, sandbox, 409, "conflict", "")
	if bytes.Contains(sandbox.body, []byte(`"live"`)) || h.blocks.grants.Load() != 1 {
		t.Fatalf("sandbox reuse: grants=%d body %s", h.blocks.grants.Load(), sandbox.body)
	}
}

// TestIdempotencyRace: identical requests racing on one key produce one
// effect and the same answer (invariant 4 at the HTTP layer).
func TestIdempotencyRace(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.blocks.delay = 50 * time.Millisecond
	const n = 8
	var wg sync.WaitGroup
	out := make([]response, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = h.do("POST", "/v1/customers/racer/credits/grant", grantBody, h.idemKey("race-1")...)
		}()
	}
	wg.Wait()
	if g := h.blocks.grants.Load(); g != 1 {
		t.Fatalf("grants applied = %d, want exactly 1", g)
	}
	replayed := 0
	for i, r := range out {
		if r.status != 201 || !bytes.Equal(r.body, out[0].body) {
			t.Fatalf("response %d: %d %s, want 201 %s", i, r.status, r.body, out[0].body)
		}
		if r.get("X-Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Fatalf("replayed = %d, want %d", replayed, n-1)
	}
}

// TestIdempotencyRerun: a money route's 2xx is remembered as a bare "done,
// re-run" mark; its retry runs the endpoint again, which replays from the
// store's op memory (one effect, the first body, X-Idempotent-Replayed). A
// re-run that cannot answer 2xx any more answers what it got, unmarked.
// Other routes, and a money route's 4xx, keep their body.
func TestIdempotencyRerun(t *testing.T) {
	t.Parallel()
	h := setup(t)
	first := h.do("POST", "/v1/customers/re-1/credits/grant", grantBody, h.idemKey("re-g")...)
	if first.status != 201 {
		t.Fatalf("grant: %d %s", first.status, first.body)
	}
	created := h.do("POST", "/v1/customers", `{"external_id":"re-2"}`, h.idemKey("re-c")...)
	if created.status != 201 {
		t.Fatalf("create: %d %s", created.status, created.body)
	}
	refused := h.do("POST", "/v1/customers/re-1/credits/adjust", `{"delta":-99999999,"source":"manual","reason":"r"}`, h.idemKey("re-a")...)
	wantProblem(t, refused, 409, "insufficient-credits", "")
	for _, tc := range []struct {
		key         string
		rerun, body bool
	}{
		{"re-g", true, false},
		{"re-c", false, true},
		{"re-a", false, true},
	} {
		rec, _ := h.idem.Record(h.tenant, tc.key)
		for i := 0; tc.rerun && !rec.Done && i < 200; i++ { // the mark is written after the answer
			time.Sleep(5 * time.Millisecond)
			rec, _ = h.idem.Record(h.tenant, tc.key)
		}
		if !rec.Done || rec.Rerun != tc.rerun || (len(rec.Body) > 0) != tc.body {
			t.Errorf("%s: record %+v, want rerun=%v body=%v", tc.key, rec, tc.rerun, tc.body)
		}
	}

	again := h.do("POST", "/v1/customers/re-1/credits/grant", grantBody, h.idemKey("re-g")...)
	if again.status != 201 || !bytes.Equal(again.body, first.body) || again.get("X-Idempotent-Replayed") != "true" ||
		again.get("Content-Type") != first.get("Content-Type") {
		t.Fatalf("re-run replay: %d replayed=%q %s, want %s", again.status, again.get("X-Idempotent-Replayed"), again.body, first.body)
	}
	if n := h.blocks.grants.Load(); n != 1 {
		t.Fatalf("grants applied = %d, want 1", n)
	}
	wantProblem(t, h.do("POST", "/v1/customers/re-1/credits/grant", `{"credits":1,"source":"manual","reason":"welcome"}`, h.idemKey("re-g")...), 409, "conflict", "")
	wantProblem(t, h.do("POST", "/v1/customers/re-1/credits/adjust", grantBody, h.idemKey("re-g")...), 409, "conflict", "")

	// The re-run fails (a store outage): its 500 goes out unmarked and the
	// mark stays, so the next retry replays.
	h.blocks.fail = errors.New("store down")
	down := h.do("POST", "/v1/customers/re-1/credits/grant", grantBody, h.idemKey("re-g")...)
	h.blocks.fail = nil
	if down.status != 500 || down.get("X-Idempotent-Replayed") != "" {
		t.Fatalf("re-run during an outage: %d replayed=%q", down.status, down.get("X-Idempotent-Replayed"))
	}
	if r := h.do("POST", "/v1/customers/re-1/credits/grant", grantBody, h.idemKey("re-g")...); r.status != 201 || !bytes.Equal(r.body, first.body) {
		t.Fatalf("replay after the outage: %d %s", r.status, r.body)
	}
}

// TestIdempotencyRecordUnavailable (issue 25: another shard's failover is
// felt only there): when the HTTP record's Redis slot has no master, a
// money route still runs on the customer's own op key (the store keeps one
// effect per key and customer) and answers 2xx, storing nothing; a route
// whose effect the record alone keeps once answers 503, and so does a
// failure that is not unavailability.
func TestIdempotencyRecordUnavailable(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.idem.FailBegins(fmt.Errorf("lua: idempotency begin: %w", engine.ErrUnavailable))
	for _, tc := range []struct {
		name, path, body string
		want             int
	}{
		{"grant (money)", "/v1/customers/ru-1/credits/grant", grantBody, 201},
		{"create customer (not money)", "/v1/customers", `{"external_id":"ru-2"}`, 503},
	} {
		r := h.do("POST", tc.path, tc.body, h.idemKey("ru-"+tc.name)...)
		if r.status != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, r.status, r.body, tc.want)
		}
		if tc.want == 503 && r.get("Retry-After") == "" {
			t.Errorf("%s: 503 without Retry-After", tc.name)
		}
	}
	if n := h.blocks.grants.Load(); n != 1 {
		t.Errorf("grants applied = %d, want 1", n)
	}
	if n := len(h.idem.Refs()); n != 0 {
		t.Errorf("%d records stored while the record's slot was down, want 0", n)
	}
	h.idem.FailBegins(errors.New("lua: idempotency begin: WRONGTYPE"))
	if r := h.do("POST", "/v1/customers/ru-1/credits/grant", grantBody, h.idemKey("ru-other")...); r.status != 500 {
		t.Errorf("grant under a failure that is not unavailability: %d %s, want 500", r.status, r.body)
	}
}

// TestReplaysByRerunRoutes: the routes internal/e2e TestReplayByRerunIdentical
// checks byte for byte are registered with optRerun (a renamed route or a
// lost flag would silently store bodies again), and the routes with effects
// outside one money script are not (TestMoneyRoutesDeclareIdempotency
// checks that every money route says one way or the other).
func TestReplaysByRerunRoutes(t *testing.T) {
	t.Parallel()
	h := setup(t)
	registered := map[string]*route{}
	for _, rt := range h.srv.routes {
		registered[rt.method+" "+rt.path] = rt
	}
	for _, p := range []string{"/v1/entitlements/consume",
		"/v1/customers/{id}/credits/grant", "/v1/customer-by-external-id/{external_id}/credits/grant",
		"/v1/customers/{id}/credits/adjust", "/v1/customer-by-external-id/{external_id}/credits/adjust",
		"/v1/reservations", "/v1/reservations/{id}/commit", "/v1/reservations/{id}/release",
		"/v1/customers/{id}/entitlements/{billable_metric_key}/increment",
		"/v1/customer-by-external-id/{external_id}/entitlements/{billable_metric_key}/decrement"} {
		rt, ok := registered["POST "+p]
		if !ok {
			t.Errorf("POST %s is not a route", p)
			continue
		}
		if !replaysByRerun(rt) || rt.opts&optIdem == 0 {
			t.Errorf("POST %s: replaysByRerun=%v, idempotent=%v", p, replaysByRerun(rt), rt.opts&optIdem != 0)
		}
	}
	for _, p := range []string{"/v1/usage", "/v1/customers", "/v1/customers/{id}/topups", "/v1/subscriptions", "/v1/import",
		"/v1/customers/{id}/entitlements/{billable_metric_key}/leases/{lease_id}/renew"} {
		if rt, ok := registered["POST "+p]; ok && replaysByRerun(rt) {
			t.Errorf("POST %s replays by re-running", p)
		}
	}
}
