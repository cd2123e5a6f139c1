package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
)

// idemRecord reads the raw HTTP idempotency record of tenant's key (the
// layout of lua/idempotency.go: "{prefix:i:" and base64url of the first
// 12 bytes of sha256(tenant id bytes, key); the value's first byte is its
// state) and its PTTL, once it is finished (a rerun mark is written after
// the answer).
func idemRecord(t testing.TB, s *Stack, tenant, key string) (string, time.Duration) {
	t.Helper()
	id := uuid.MustParse(tenant)
	sum := sha256.Sum256(append(id[:], key...))
	k := "{" + s.Prefix + ":i:" + base64.RawURLEncoding.EncodeToString(sum[:12])
	ctx := context.Background()
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		v, err := s.Redis.Get(ctx, k).Result()
		if err != nil {
			t.Fatalf("idempotency record %q: %v", k, err)
		}
		if v[0] != 'p' || time.Now().After(deadline) {
			return v, s.Redis.PTTL(ctx, k).Val()
		}
	}
}

// headersOf is h without the headers that differ on every answer.
func headersOf(h http.Header) string {
	var out []string
	for name, vs := range h {
		switch name {
		case "Date", "X-Request-Id", "X-Idempotent-Replayed",
			// The rate budget moves with every request, replays included.
			"Ratelimit-Limit", "Ratelimit-Remaining", "Ratelimit-Reset":
			continue
		}
		for _, v := range vs {
			out = append(out, name+": "+v)
		}
	}
	sort.Strings(out)
	var b bytes.Buffer
	for _, l := range out {
		b.WriteString(l + "\n")
	}
	return b.String()
}

// TestReplayByRerunIdentical: a money route's 2xx keeps no body in its HTTP
// record (a 12-byte "done, re-run" mark for exactly 24 h); its retry re-runs
// the endpoint, whose script replays from its op key. Per route, the
// retry's status, headers and body are byte for byte the first ones plus
// X-Idempotent-Replayed: true, at once and after the account changed, and
// the effect happened once. A key reused with another body or path is a 409
// (the mark keeps the fingerprint: the scope is tenant and key alone).
func TestReplayByRerunIdentical(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("rerun"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000_000})
	reservationA := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 30})
	reservationB := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 20})
	seats := uniq("seats")
	a.newMetric(seats, "gauge", map[string]any{"cap": 100})
	gauge := "/entitlements/" + seats

	type call struct {
		name, path string
		body       map[string]any
		status     int
	}
	calls := []call{
		{"grant", "/v1/customers/" + id + "/credits/grant", map[string]any{"credits": 5000, "source": "promotional", "reason": "r",
			"expires_at": time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339), "metadata": map[string]any{"k": "v"}}, 201},
		{"grant by external id", "/v1/customer-by-external-id/" + ext + "/credits/grant", map[string]any{"credits": 7, "source": "manual", "reason": "r"}, 201},
		{"adjust up", "/v1/customers/" + id + "/credits/adjust", map[string]any{"delta": 300, "source": "manual", "reason": "r"}, 200},
		{"adjust down by external id", "/v1/customer-by-external-id/" + ext + "/credits/adjust", map[string]any{"delta": -4321, "source": "manual", "reason": "r"}, 200},
		{"consume", "/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 3}, 200},
		{"consume with metadata", "/v1/entitlements/consume", map[string]any{"customer_id": ext, "billable_metric_key": metric, "units": 1, "metadata": map[string]any{"run": "x"}}, 200},
		{"reserve", "/v1/reservations", map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 5, "metadata": map[string]any{"job": "j"}}, 201},
		{"commit", "/v1/reservations/" + reservationA["id"].(string) + "/commit", map[string]any{"actual_units": 12, "metadata": map[string]any{"done": "yes"}}, 200},
		{"release", "/v1/reservations/" + reservationB["id"].(string) + "/release", map[string]any{}, 200},
		{"gauge increment", "/v1/customers/" + id + gauge + "/increment", map[string]any{"amount": 5}, 200},
		{"leased gauge increment", "/v1/customers/" + id + gauge + "/increment", map[string]any{"amount": 2, "lease_seconds": 600}, 200},
		{"gauge decrement by external id", "/v1/customer-by-external-id/" + ext + gauge + "/decrement", map[string]any{"amount": 1}, 200},
	}
	keys := make([]string, len(calls))
	firsts := make([]Response, len(calls))
	check := func(i int, when string) {
		t.Helper()
		c, first := calls[i], firsts[i]
		again := a.do("POST", c.path, keys[i], c.body)
		if again.Status != first.Status || !bytes.Equal(again.Raw, first.Raw) || headersOf(again.Header) != headersOf(first.Header) {
			t.Errorf("%s, replay %s: %d\n%s%s\nwant %d\n%s%s", c.name, when, again.Status, headersOf(again.Header), again.Raw,
				first.Status, headersOf(first.Header), first.Raw)
		}
		if h := again.Header.Get("X-Idempotent-Replayed"); h != "true" {
			t.Errorf("%s, replay %s: X-Idempotent-Replayed %q", c.name, when, h)
		}
	}
	for i, c := range calls {
		keys[i] = idemKey()
		firsts[i] = a.do("POST", c.path, keys[i], c.body)
		wantStatus(t, firsts[i], c.status, c.name)
		if h := firsts[i].Header.Get("X-Idempotent-Replayed"); h != "" {
			t.Errorf("%s: first answer has X-Idempotent-Replayed %q", c.name, h)
		}
		rec, ttl := idemRecord(t, s, tn.ID, keys[i])
		if len(rec) != 12 || rec[0] != 'r' {
			t.Errorf("%s: record %q (%d bytes), want the 12-byte rerun mark", c.name, rec, len(rec))
		}
		if ttl > 24*time.Hour || ttl < 24*time.Hour-10*time.Second {
			t.Errorf("%s: record TTL %s, want 24h", c.name, ttl)
		}
		check(i, "at once")
	}
	balance := a.balance(id)
	history := len(a.history(id, ""))
	// A gauge's replay answers the cap it moved under, not today's.
	wantStatus(t, a.do("PATCH", "/v1/billable-metrics/"+seats, idemKey(), map[string]any{"default_value": map[string]any{"cap": 50}}),
		200, "lower the gauge's cap")
	// The account moved since most of the first runs: a replay still
	// answers the first figures, and changes nothing.
	for i := range calls {
		check(i, "after later writes")
	}
	if b := a.balance(id); b != balance {
		t.Errorf("balance %d after the replays, want %d (no second effect)", b, balance)
	}
	if h := len(a.history(id, "")); h != history {
		t.Errorf("history has %d entries after the replays, want %d", h, history)
	}

	// Same key, other body or other path: 409, nothing runs.
	consume := calls[4]
	checkProblem(t, a.do("POST", consume.path, keys[4], map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 4}),
		409, "conflict", "", "consume key, other body")
	checkProblem(t, a.do("POST", calls[0].path, keys[4], calls[0].body), 409, "conflict", "", "consume key on the grant path")
	checkProblem(t, a.do("POST", "/v1/customers", keys[2], map[string]any{"external_id": uniq("x")}), 409, "conflict", "", "adjust key on create customer")
	if b := a.balance(id); b != balance {
		t.Errorf("balance %d after refused reuses, want %d", b, balance)
	}

	// A 4xx of a money route keeps its body: it is replayed even after the
	// state changed so that a fresh run would succeed.
	key := idemKey()
	big := map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 10_000_000}
	refused := a.do("POST", "/v1/entitlements/consume", key, big)
	wantStatus(t, refused, 409, "consume past the balance")
	if rec, _ := idemRecord(t, s, tn.ID, key); rec[0] != 'd' || !bytes.HasSuffix([]byte(rec), refused.Raw) {
		t.Errorf("refused consume's record %q, want its stored body", rec)
	}
	a.grant(id, map[string]any{"credits": 200_000_000})
	again := a.do("POST", "/v1/entitlements/consume", key, big)
	if again.Status != 409 || !bytes.Equal(again.Raw, refused.Raw) || again.Header.Get("X-Idempotent-Replayed") != "true" {
		t.Errorf("refused consume replay: %d %s", again.Status, again.Raw)
	}
}
