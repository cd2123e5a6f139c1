package e2e

import (
	"bytes"
	"strings"
	"sync"
	"testing"
)

// TestConformanceIdempotencyKeyRequired: Common rules 1: the key is required
// on every POST and PATCH, up to 256 characters; a missing or too long key is
// a 422 naming Idempotency-Key "before any change".
func TestConformanceIdempotencyKeyRequired(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("idem"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 10_000})
	grantBody := map[string]any{"credits": 1000, "source": "manual", "reason": "r"}

	cases := []struct {
		name, method, path, key string
		body                    any
	}{
		{"create customer, no key", "POST", "/v1/customers", "", map[string]any{"external_id": "no-key-customer"}},
		{"create customer, 257 chars", "POST", "/v1/customers", strings.Repeat("k", 257), map[string]any{"external_id": "long-key-customer"}},
		{"patch customer, no key", "PATCH", "/v1/customers/" + id, "", map[string]any{"display_name": "changed"}},
		{"grant, no key", "POST", "/v1/customers/" + id + "/credits/grant", "", grantBody},
		{"grant, 257 chars", "POST", "/v1/customers/" + id + "/credits/grant", strings.Repeat("g", 257), grantBody},
		{"adjust, no key", "POST", "/v1/customers/" + id + "/credits/adjust", "", map[string]any{"delta": -1000, "source": "manual", "reason": "r"}},
		{"strict grant, no key", "POST", "/v1/customer-by-external-id/no-key-auto/credits/grant", "", grantBody},
		{"lenient grant auto-create, no key", "POST", "/v1/customers/no-key-auto/credits/grant", "", grantBody},
	}
	for _, tc := range cases {
		checkProblem(t, a.do(tc.method, tc.path, tc.key, tc.body), 422, "validation-error", "Idempotency-Key", tc.name)
	}
	// Nothing changed: one customer, balance intact, display name unset.
	r := a.get("/v1/customers")
	wantStatus(t, r, 200, "list")
	if data, _, _ := page(t, r); len(data) != 1 {
		t.Errorf("list has %d customers after refused writes, want 1: %s", len(data), r.Raw)
	}
	if bal := a.balance(id); bal != 10_000 {
		t.Errorf("balance %d after refused writes, want 10000", bal)
	}
	if c := a.get("/v1/customers/" + id); c.Body["display_name"] != nil {
		t.Errorf("refused PATCH changed display_name: %s", c.Raw)
	}

	// Exactly 256 characters is accepted.
	r = a.do("POST", "/v1/customers", strings.Repeat("x", 240)+idemKey()[:16], map[string]any{"external_id": uniq("k256")})
	checkStatus(t, r, 201, "create customer with a 256-character key")
}

// TestConformanceIdempotencyReplay: Common rules 1 and invariant 4: the same
// key and body replays the first status and body with X-Idempotent-Replayed:
// true and has one effect; another body is a 409 `conflict` with no effect.
func TestConformanceIdempotencyReplay(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("replay"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()

	t.Run("grant", func(t *testing.T) {
		a := s.as(t, tn.Live)
		key := idemKey()
		body := map[string]any{"credits": 4000, "source": "promotional", "reason": "welcome"}
		path := "/v1/customers/" + id + "/credits/grant"
		first := a.do("POST", path, key, body)
		wantStatus(t, first, 201, "first grant")
		if first.Header.Get("X-Idempotent-Replayed") == "true" {
			t.Error("first answer says X-Idempotent-Replayed: true")
		}
		for i := 0; i < 2; i++ {
			again := a.do("POST", path, key, body)
			checkStatus(t, again, 201, "replayed grant")
			if !bytes.Equal(again.Raw, first.Raw) {
				t.Errorf("replayed body differs:\nfirst %s\nagain %s", first.Raw, again.Raw)
			}
			if h := again.Header.Get("X-Idempotent-Replayed"); h != "true" {
				t.Errorf("replay header %q, want true", h)
			}
		}
		if bal := a.balance(id); bal != 4000 {
			t.Errorf("balance %d after a grant sent 3 times, want 4000", bal)
		}
		if h := a.history(id, ""); len(h) != 1 {
			t.Errorf("history has %d entries, want 1", len(h))
		}
		// Same key, other body: 409 conflict and no effect.
		other := a.do("POST", path, key, map[string]any{"credits": 9000, "source": "promotional", "reason": "welcome"})
		checkProblem(t, other, 409, "conflict", "", "same key, different body")
		if bal := a.balance(id); bal != 4000 {
			t.Errorf("balance %d after a conflicting reuse, want 4000", bal)
		}
	})

	t.Run("create customer", func(t *testing.T) {
		a := s.as(t, tn.Live)
		key := idemKey()
		body := map[string]any{"external_id": uniq("replayed"), "display_name": "R"}
		first := a.do("POST", "/v1/customers", key, body)
		wantStatus(t, first, 201, "first create")
		again := a.do("POST", "/v1/customers", key, body)
		checkStatus(t, again, 201, "replayed create (not 409 external_id taken)")
		if !bytes.Equal(again.Raw, first.Raw) || again.Header.Get("X-Idempotent-Replayed") != "true" {
			t.Errorf("create replay: header %q body %s, first %s", again.Header.Get("X-Idempotent-Replayed"), again.Raw, first.Raw)
		}
	})

	t.Run("adjust", func(t *testing.T) {
		a := s.as(t, tn.Live)
		key := idemKey()
		body := map[string]any{"delta": -1500, "source": "manual", "reason": "refund"}
		path := "/v1/customers/" + id + "/credits/adjust"
		first := a.do("POST", path, key, body)
		wantStatus(t, first, 200, "adjust")
		again := a.do("POST", path, key, body)
		checkStatus(t, again, 200, "adjust replay")
		if !bytes.Equal(again.Raw, first.Raw) || again.Header.Get("X-Idempotent-Replayed") != "true" {
			t.Errorf("adjust replay differs: %s vs %s", again.Raw, first.Raw)
		}
		if bal := a.balance(id); bal != 2500 {
			t.Errorf("balance %d after an adjust sent twice, want 2500", bal)
		}
	})

	t.Run("patch", func(t *testing.T) {
		a := s.as(t, tn.Live)
		key := idemKey()
		body := map[string]any{"metadata": map[string]any{"n": 1}}
		first := a.do("PATCH", "/v1/customers/"+id, key, body)
		wantStatus(t, first, 200, "patch")
		again := a.do("PATCH", "/v1/customers/"+id, key, body)
		checkStatus(t, again, 200, "patch replay")
		if !bytes.Equal(again.Raw, first.Raw) || again.Header.Get("X-Idempotent-Replayed") != "true" {
			t.Errorf("patch replay differs: %s vs %s", again.Raw, first.Raw)
		}
	})

	t.Run("4xx answers are stored", func(t *testing.T) {
		// Common rules 1 replays "the first status and body": a 422 is the
		// key's answer, so a corrected body under the same key is a reuse
		// (409) and a new key runs.
		a := s.as(t, tn.Live)
		key := idemKey()
		path := "/v1/customers/" + id + "/credits/grant"
		badBody := map[string]any{"credits": 0, "source": "manual", "reason": "r"}
		bad := a.do("POST", path, key, badBody)
		checkProblem(t, bad, 422, "validation-error", "credits", "bad grant")
		again := a.do("POST", path, key, badBody)
		if again.Status != 422 || !bytes.Equal(again.Raw, bad.Raw) || again.Header.Get("X-Idempotent-Replayed") != "true" {
			t.Errorf("retry of a 422: %d replayed=%q %s", again.Status, again.Header.Get("X-Idempotent-Replayed"), again.Raw)
		}
		fixed := map[string]any{"credits": 500, "source": "manual", "reason": "r"}
		checkProblem(t, a.do("POST", path, key, fixed), 409, "conflict", "", "corrected body under the used key")
		checkStatus(t, a.do("POST", path, idemKey(), fixed), 201, "corrected body under a new key")
	})
}

// TestConformanceIdempotencyScope: Common rules 1 and docs/spec/addendum.md §12: a key is
// scoped by tenant and key value alone: not by path, not by environment;
// other tenants use the same key independently.
func TestConformanceIdempotencyScope(t *testing.T) {
	s := NewStack(t)
	ta, tb := s.NewTenant(uniq("sa")), s.NewTenant(uniq("sb"))
	a, b := s.as(t, ta.Live), s.as(t, tb.Live)

	// Across paths: a key used to create a customer cannot then grant.
	key := idemKey()
	wantStatus(t, a.do("POST", "/v1/customers", key, map[string]any{"external_id": uniq("p1")}), 201, "create with key")
	auto := uniq("never-created")
	r := a.do("POST", "/v1/customers/"+auto+"/credits/grant", key, map[string]any{"credits": 1000, "source": "manual", "reason": "r"})
	if r.Status < 400 {
		t.Errorf("the same key on another path ran again: %d %s", r.Status, r.Raw)
	} else {
		checkProblem(t, r, 409, "conflict", "", "same key, other path")
	}
	checkProblem(t, a.get("/v1/customers/"+auto), 404, "not-found", "", "customer the refused grant would have created")

	// Other tenants use the same key independently.
	shared := idemKey()
	ext := uniq("same-ext")
	ra := a.do("POST", "/v1/customers", shared, map[string]any{"external_id": ext})
	rb := b.do("POST", "/v1/customers", shared, map[string]any{"external_id": ext})
	wantStatus(t, ra, 201, "tenant A create")
	wantStatus(t, rb, 201, "tenant B create with the same key")
	if rb.Header.Get("X-Idempotent-Replayed") == "true" || ra.Body["id"] == rb.Body["id"] {
		t.Errorf("tenant B got tenant A's answer: %s", rb.Raw)
	}
	if rb.Body["tenant_id"] != tb.ID {
		t.Errorf("tenant B's customer has tenant_id %v, want %s", rb.Body["tenant_id"], tb.ID)
	}

	// One scope for both environments, and the environment is part of the
	// fingerprint: the sandbox key reusing a live key is a 409, never the
	// live answer, and creates nothing in sandbox.
	envKey := idemKey()
	body := map[string]any{"external_id": uniq("env")}
	live := a.do("POST", "/v1/customers", envKey, body)
	wantStatus(t, live, 201, "live create")
	sb := s.as(t, ta.Sandbox)
	again := sb.do("POST", "/v1/customers", envKey, body)
	checkProblem(t, again, 409, "conflict", "", "sandbox reuse of a live key")
	if bytes.Contains(again.Raw, []byte(`"live"`)) {
		t.Errorf("sandbox reuse shows the live answer: %s", again.Raw)
	}
	lr := sb.get("/v1/customers")
	wantStatus(t, lr, 200, "sandbox list")
	if data, _, _ := page(t, lr); len(data) != 0 {
		t.Errorf("sandbox has %d customers after reusing a live key, want 0", len(data))
	}
}

// TestConformanceIdempotencyConcurrent: invariant 4: 20 identical grants
// racing with one key make one block and one ledger entry, and every answer
// is the same (docs/decisions.md: an identical request in flight waits and
// replays).
func TestConformanceIdempotencyConcurrent(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("race"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	key := idemKey()
	body := map[string]any{"credits": 3000, "source": "promotional", "reason": "race"}
	const n = 20
	out := make([]Response, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = Call(t, s.HTTP, s.URL, "POST", "/v1/customers/"+id+"/credits/grant", body,
				"X-API-Key", tn.Live, "Idempotency-Key", key)
		}()
	}
	close(start)
	wg.Wait()
	replays := 0
	for i, r := range out {
		if r.Status != 201 {
			t.Errorf("answer %d: %d %s", i, r.Status, r.Raw)
			continue
		}
		if !bytes.Equal(r.Raw, out[0].Raw) {
			t.Errorf("answer %d differs:\n%s\n%s", i, r.Raw, out[0].Raw)
		}
		if r.Header.Get("X-Idempotent-Replayed") == "true" {
			replays++
		}
	}
	if replays != n-1 {
		t.Errorf("%d answers marked replayed, want %d", replays, n-1)
	}
	acct := a.credits(id)
	if Int(t, acct["balance"]) != 3000 || Int(t, acct["lifetime_earned"]) != 3000 {
		t.Errorf("after %d racing grants: balance %v lifetime %v, want 3000", n, acct["balance"], acct["lifetime_earned"])
	}
	if blocks := arr(t, acct["blocks"], "blocks"); len(blocks) != 1 {
		t.Errorf("%d blocks, want 1", len(blocks))
	}
	if h := a.history(id, ""); len(h) != 1 {
		t.Errorf("%d ledger entries, want 1", len(h))
	}
}

// TestConformanceIdempotencyNotOnReadsAndDelete: Common rules 1: "Reads and
// customer DELETE do not use it": a DELETE with a key is not replayed, and
// reads need no key. A replayed answer keeps its JSON content type.
func TestConformanceIdempotencyNotOnReadsAndDelete(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("idemdel"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	key := idemKey()
	wantStatus(t, a.do("DELETE", "/v1/customers/"+id, key, nil), 204, "delete with a key")
	r := a.do("DELETE", "/v1/customers/"+id, key, nil)
	checkProblem(t, r, 404, "not-found", "", "second delete with the same key")
	if r.Header.Get("X-Idempotent-Replayed") == "true" {
		t.Error("customer DELETE was replayed")
	}
	// GET with a key: not stored either (a later GET sees the change).
	id2, _ := a.newCustomer()
	gk := idemKey()
	g1 := a.do("GET", "/v1/customers/"+id2, gk, nil)
	wantStatus(t, g1, 200, "GET with key")
	wantStatus(t, a.patch("/v1/customers/"+id2, map[string]any{"display_name": "Changed"}), 200, "patch")
	g2 := a.do("GET", "/v1/customers/"+id2, gk, nil)
	if g2.Body["display_name"] != "Changed" || g2.Header.Get("X-Idempotent-Replayed") == "true" {
		t.Errorf("GET with a reused key replayed an old answer: %s", g2.Raw)
	}

	body := map[string]any{"external_id": uniq("ct")}
	k := idemKey()
	first := a.do("POST", "/v1/customers", k, body)
	again := a.do("POST", "/v1/customers", k, body)
	if ct := again.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") || ct != first.Header.Get("Content-Type") {
		t.Errorf("replay Content-Type %q, first %q", ct, first.Header.Get("Content-Type"))
	}
}
