package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/testenv"
)

// doorRaw sends only the request head (no body) to the stack and reads the
// answer (testenv.HeadOnly).
func doorRaw(t *testing.T, s *Stack, head string) (int, []byte) {
	t.Helper()
	res, b := testenv.HeadOnly(t, strings.TrimPrefix(s.URL, "http://"), head)
	return res.StatusCode, b
}

// TestDoorRefusesBeforeTheBody: on the real server, a Content-Length over
// the 1 MiB limit is a 413 and a 512 KiB body without a valid key a 401,
// both answered from the headers alone; a Go client streaming 8 MiB reads
// the 413 instead of a reset; nothing is created.
func TestDoorRefusesBeforeTheBody(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("door"))
	head := func(n int, headers ...string) string {
		h := fmt.Sprintf("POST /v1/customers HTTP/1.1\r\nHost: creditd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", n)
		for i := 0; i+1 < len(headers); i += 2 {
			h += headers[i] + ": " + headers[i+1] + "\r\n"
		}
		return h + "\r\n"
	}
	for _, tc := range []struct {
		name   string
		head   string
		status int
		typ    string
	}{
		{"100 MB with a valid key", head(100<<20, "X-API-Key", tn.Live, "Idempotency-Key", idemKey()), 413, "bad-request"},
		{"8 MB without a key", head(8 << 20), 413, "bad-request"},
		{"512 KiB without a key", head(512<<10, "Idempotency-Key", idemKey()), 401, "unauthorized"},
		{"512 KiB with an unknown key", head(512<<10, "X-API-Key", "ck_live_"+strings.Repeat("z", 32)), 401, "unauthorized"},
		{"512 KiB with a revoked-looking sandbox key", head(512<<10, "X-API-Key", "ck_test_"+strings.Repeat("q", 32)), 401, "unauthorized"},
	} {
		st, b := doorRaw(t, s, tc.head)
		if st != tc.status || !bytes.Contains(b, []byte(`"type":"`+tc.typ+`"`)) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, st, b, tc.status, tc.typ)
		}
	}

	big := make([]byte, 8<<20)
	for i := 0; i < 5; i++ {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", s.URL+"/v1/customers", bytes.NewReader(big))
		req.Header.Set("X-API-Key", tn.Live)
		req.Header.Set("Idempotency-Key", idemKey())
		res, err := s.HTTP.Do(req)
		if err != nil {
			t.Fatalf("8 MiB POST %d: %v (the refusal did not reach the client)", i, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 413 {
			t.Fatalf("8 MiB POST %d: %d %s", i, res.StatusCode, b)
		}
	}

	// A normal request with the key still works, on a fresh connection.
	a := s.as(t, tn.Live)
	lr := a.get("/v1/customers")
	wantStatus(t, lr, 200, "list")
	if data, _, _ := page(t, lr); len(data) != 0 {
		t.Errorf("refused requests created %d customers", len(data))
	}
	a.createCustomer(map[string]any{"external_id": uniq("after")})
}

// TestDoorIdempotencyReplaysRefusals: Common rules 1 on real Redis: a
// consume refused with 409 insufficient-credits and an adjust refused the
// same way are replayed, status and body, after a grant that would let
// them pass; nothing is charged.
func TestDoorIdempotencyReplaysRefusals(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("replay409"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(100)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 500})

	consumeKey, adjustKey := idemKey(), idemKey()
	consume := map[string]any{"customer_id": ext, "billable_metric_key": metric, "units": 8}
	adjust := map[string]any{"delta": -2000, "source": "manual", "reason": "r"}
	c1 := a.do("POST", "/v1/entitlements/consume", consumeKey, consume)
	checkProblem(t, c1, 409, "insufficient-credits", "", "consume past the balance")
	d1 := a.do("POST", "/v1/customers/"+id+"/credits/adjust", adjustKey, adjust)
	checkProblem(t, d1, 409, "insufficient-credits", "", "adjust past the balance")

	a.grant(id, map[string]any{"credits": 10_000})
	for _, tc := range []struct {
		name, path, key string
		body            any
		first           Response
	}{
		{"consume", "/v1/entitlements/consume", consumeKey, consume, c1},
		{"adjust", "/v1/customers/" + id + "/credits/adjust", adjustKey, adjust, d1},
	} {
		again := a.do("POST", tc.path, tc.key, tc.body)
		if again.Status != 409 || !bytes.Equal(again.Raw, tc.first.Raw) || again.Header.Get("X-Idempotent-Replayed") != "true" {
			t.Errorf("%s retried after a grant: %d replayed=%q %s, want the first 409 %s", tc.name, again.Status,
				again.Header.Get("X-Idempotent-Replayed"), again.Raw, tc.first.Raw)
		}
	}
	if bal := a.balance(id); bal != 10_500 {
		t.Errorf("balance %d after replayed refusals, want 10500 (nothing charged)", bal)
	}
	// A new key runs.
	wantStatus(t, a.do("POST", "/v1/entitlements/consume", idemKey(), consume), 200, "consume with a new key")
	if bal := a.balance(id); bal != 9_700 {
		t.Errorf("balance %d after the new consume, want 9700", bal)
	}
}

// TestDoorIdempotencyEnvironment: the fingerprint includes the environment:
// a sandbox request reusing a live key with the same body is a 409 (one key
// scope per tenant, docs/spec/addendum.md §12) and never shows or repeats the live effect.
func TestDoorIdempotencyEnvironment(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("idemenv"))
	live, sandbox := s.as(t, tn.Live), s.as(t, tn.Sandbox)
	ext := uniq("both")
	key := idemKey()
	body := map[string]any{"credits": 1200, "source": "manual", "reason": "r"}
	first := live.do("POST", "/v1/customers/"+ext+"/credits/grant", key, body)
	wantStatus(t, first, 201, "live grant")
	again := sandbox.do("POST", "/v1/customers/"+ext+"/credits/grant", key, body)
	checkProblem(t, again, 409, "conflict", "", "sandbox reuse of the live key")
	if bytes.Contains(again.Raw, []byte(`"live"`)) {
		t.Errorf("sandbox got the live body: %s", again.Raw)
	}
	checkProblem(t, sandbox.get("/v1/customers/"+ext), 404, "not-found", "", "sandbox customer the reuse would have made")
	if bal := live.balance(ext); bal != 1200 {
		t.Errorf("live balance %d, want 1200", bal)
	}
}

// TestDoorAdjustCrossTenant: adjust naming another tenant's (or the other
// environment's) customer UUID is a 400 naming customer_id, like grant; an
// unknown UUID stays 404; nothing moves.
func TestDoorAdjustCrossTenant(t *testing.T) {
	s := NewStack(t)
	ta, tb := s.NewTenant(uniq("adj-a")), s.NewTenant(uniq("adj-b"))
	a, b := s.as(t, ta.Live), s.as(t, tb.Live)
	bid, _ := b.newCustomer()
	b.grant(bid, map[string]any{"credits": 3000})
	aid, _ := a.newCustomer()
	a.grant(aid, map[string]any{"credits": 100})
	body := func(delta int) map[string]any {
		return map[string]any{"delta": delta, "source": "manual", "reason": "x"}
	}
	for _, tc := range []struct {
		name  string
		as    api
		path  string
		delta int
	}{
		{"other tenant, debit", a, "/v1/customers/" + bid + "/credits/adjust", -1000},
		{"other tenant, credit", a, "/v1/customers/" + bid + "/credits/adjust", 1000},
		{"other environment", s.as(t, ta.Sandbox), "/v1/customers/" + aid + "/credits/adjust", -50},
	} {
		checkProblem(t, tc.as.post(tc.path, body(tc.delta)), 400, "bad-request", "customer_id", tc.name)
	}
	checkProblem(t, a.post("/v1/customers/01900000-0000-7000-8000-000000000000/credits/adjust", body(5)), 404, "not-found", "", "unknown UUID")
	if bal := b.balance(bid); bal != 3000 {
		t.Errorf("tenant B balance %d, want 3000", bal)
	}
	if bal := a.balance(aid); bal != 100 {
		t.Errorf("live balance %d after the sandbox adjust, want 100", bal)
	}
}

// TestDoorAdminTokenTooShort: creditd serve refuses to start with an admin
// token under 32 characters and says why, before connecting to anything.
func TestDoorAdminTokenTooShort(t *testing.T) {
	bin := Binary(t) // built first: on a loaded box the build alone can take the timeout
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "serve")
	cmd.Env = []string{"CREDITD_ADMIN_TOKEN=short-token", "REDIS_URL=redis://127.0.0.1:1/0",
		"DATABASE_URL=postgres://nobody@127.0.0.1:1/x", "CREDITD_ADDR=127.0.0.1:0"}
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("serve started with an 11-character admin token:\n%s", out)
	}
	if !strings.Contains(string(out), "CREDITD_ADMIN_TOKEN is 11 characters; it must be at least 32") {
		t.Fatalf("unclear refusal:\n%s", out)
	}
}
