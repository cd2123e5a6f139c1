package api

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
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

	bad := h.do("POST", "/v1/customers/cust-1/credits/adjust", `{"delta":-999999,"source":"manual","reason":"r"}`, h.idemKey("a-1")...)
	wantProblem(t, bad, 409, "insufficient-credits", "")
	fixed := h.do("POST", "/v1/customers/cust-1/credits/adjust", `{"delta":-1000,"source":"manual","reason":"r"}`, h.idemKey("a-1")...)
	if fixed.status != 200 || fixed.get("X-Idempotent-Replayed") != "" {
		t.Fatalf("retry after a failure: %d %s", fixed.status, fixed.body)
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
