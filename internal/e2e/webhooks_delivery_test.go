package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// hook is one request a webhook receiver got.
type hook struct {
	Headers map[string]string `json:"headers"`
	Body    string            `json:"body"`
}

// hookReceiver is a real HTTP endpoint that records every delivery and
// answers with the status the test sets.
type hookReceiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []hook
	status int
}

func newHookReceiver(t testing.TB) *hookReceiver {
	r := &hookReceiver{status: 200}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, hook{Body: string(b), Headers: map[string]string{
			"webhook-id":        req.Header.Get("webhook-id"),
			"webhook-timestamp": req.Header.Get("webhook-timestamp"),
			"webhook-signature": req.Header.Get("webhook-signature"),
		}})
		status := r.status
		r.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *hookReceiver) setStatus(s int) {
	r.mu.Lock()
	r.status = s
	r.mu.Unlock()
}

func (r *hookReceiver) hooks() []hook {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]hook(nil), r.got...)
}

// byType is one delivery of each event type, decoded; for a type delivered
// more than once, keep picks the one wanted (nil keeps the first).
func byType(t testing.TB, hs []hook, keep func(body map[string]any) bool) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, h := range hs {
		var body map[string]any
		d := json.NewDecoder(strings.NewReader(h.Body))
		d.UseNumber()
		if err := d.Decode(&body); err != nil {
			t.Fatalf("delivered body is not JSON: %q", h.Body)
		}
		typ, _ := body["event_type"].(string)
		if _, seen := out[typ]; !seen || (keep != nil && keep(body)) {
			out[typ] = body
		}
	}
	return out
}

var (
	verifierOnce sync.Once
	verifierDir  string
	verifierErr  error
)

const verifyScript = `
const { Webhook } = require("standardwebhooks");
const input = JSON.parse(require("fs").readFileSync(process.argv[2], "utf8"));
const out = input.hooks.map(h => {
  try { new Webhook(input.secret).verify(h.body, h.headers); return "ok"; }
  catch (e) { return String(e && e.message || e); }
});
console.log(JSON.stringify(out));
`

// standardWebhooks installs the official standardwebhooks npm package in a
// temporary directory once per test process; it skips the test when npm
// cannot reach its registry.
func standardWebhooks(t testing.TB) string {
	t.Helper()
	verifierOnce.Do(func() {
		dir, err := os.MkdirTemp("", "creditd-standardwebhooks")
		if err != nil {
			verifierErr = err
			return
		}
		cmd := exec.Command("npm", "install", "--silent", "--no-audit", "--no-fund", "standardwebhooks")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			verifierErr = &npmError{string(out), err}
			return
		}
		verifierErr = os.WriteFile(filepath.Join(dir, "verify.js"), []byte(verifyScript), 0o600)
		verifierDir = dir
	})
	if e, ok := verifierErr.(*npmError); ok {
		t.Skipf("npm could not install standardwebhooks (registry unreachable?): %v\n%s", e.err, e.out)
	}
	if verifierErr != nil {
		t.Fatal(verifierErr)
	}
	return verifierDir
}

type npmError struct {
	out string
	err error
}

func (e *npmError) Error() string { return e.err.Error() }

// verifyWithStandardWebhooks runs the npm package's Webhook.verify on each
// delivery and returns "ok" or its error message per hook.
func verifyWithStandardWebhooks(t testing.TB, secret string, hs []hook) []string {
	t.Helper()
	dir := standardWebhooks(t)
	in, _ := json.Marshal(map[string]any{"secret": secret, "hooks": hs})
	f := filepath.Join(t.TempDir(), "in.json")
	if err := os.WriteFile(f, in, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", filepath.Join(dir, "verify.js"), f)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node verify: %v %s", err, out)
	}
	var res []string
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("node verify output %q: %v", out, err)
	}
	return res
}

// waitHooks waits (wall time, 15 s) until the receiver holds n deliveries.
func waitHooks(t testing.TB, r *hookReceiver, n int) []hook {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		hs := r.hooks()
		if len(hs) >= n {
			return hs
		}
		if time.Now().After(deadline) {
			t.Fatalf("receiver got %d deliveries, want %d", len(hs), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestWebhooksDeliverSignedEvents: a real receiver gets credit.granted,
// credit.consumed (negative adjust), credit.low_balance, credit.exhausted and
// test.ping, each signed so that the official standardwebhooks npm package
// verifies it (and rejects a tampered body); the events list shows them
// delivered with their attempts, in both environments.
func TestWebhooksDeliverSignedEvents(t *testing.T) {
	clock := newTestClock(time.Now())
	s := NewStack(t, WithClock(clock))
	tn := s.NewTenant(uniq("hooks"))
	rcv := newHookReceiver(t)
	put := adminCall(t, s, AdminToken, "PUT", "/admin/v1/tenants/"+tn.ID+"/webhook", map[string]any{"url": rcv.srv.URL})
	wantStatus(t, put, 200, "PUT webhook")
	secret := str(t, put.Body["secret"], "secret")
	a := s.as(t, tn.Live)

	cust := a.createCustomer(map[string]any{"external_id": uniq("c"), "low_balance_threshold_mc": 500})
	id := str(t, cust["id"], "customer id")
	ext := str(t, cust["external_id"], "external id")
	a.grant(id, map[string]any{"credits": 1000, "source": "promotional", "reason": "welcome"})
	r := a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": -600, "source": "manual", "reason": "fix"})
	wantStatus(t, r, 200, "adjust -600")
	r = a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": -400, "source": "manual", "reason": "fix"})
	wantStatus(t, r, 200, "adjust -400")
	pingKey := idemKey()
	ping := a.do("POST", "/v1/webhooks/test", pingKey, nil)
	wantStatus(t, ping, 202, "test ping")
	if ping.Body["event_type"] != "test.ping" || ping.Body["status"] != "pending" {
		t.Fatalf("ping = %s", ping.Raw)
	}
	checkUUID(t, ping.Body["event_id"], "event_id")

	// granted, consumed x2, low_balance, exhausted, ping.
	hs := waitHooks(t, rcv, 6)
	for i, v := range verifyWithStandardWebhooks(t, secret, hs) {
		if v != "ok" {
			t.Fatalf("standardwebhooks rejected delivery %d (%s): %s", i, hs[i].Body, v)
		}
	}
	tampered := hs[0]
	tampered.Body = strings.Replace(tampered.Body, "{", "{ ", 1)
	if v := verifyWithStandardWebhooks(t, secret, []hook{tampered}); v[0] == "ok" {
		t.Fatal("standardwebhooks accepted a tampered body: the check proves nothing")
	}

	// Deliveries run concurrently: of the two consumed events keep the -600.
	got := byType(t, hs, func(b map[string]any) bool {
		d, _ := b["data"].(map[string]any)
		return b["event_type"] == "credit.consumed" && d["credits"] == json.Number("600")
	})
	for _, typ := range []string{"credit.granted", "credit.consumed", "credit.low_balance", "credit.exhausted", "test.ping"} {
		ev, ok := got[typ]
		if !ok {
			t.Fatalf("no %s delivered; got %v", typ, hs)
		}
		for _, k := range []string{"event_id", "event_type", "tenant_id", "environment", "customer_id", "external_customer_id", "created_at", "idempotency_key", "data"} {
			if _, ok := ev[k]; !ok {
				t.Errorf("%s envelope lacks %s", typ, k)
			}
		}
		if ev["tenant_id"] != tn.ID || ev["environment"] != "live" {
			t.Errorf("%s envelope: %v", typ, ev)
		}
		if typ != "test.ping" && (ev["customer_id"] != id || ev["external_customer_id"] != ext) {
			t.Errorf("%s customer: %v / %v", typ, ev["customer_id"], ev["external_customer_id"])
		}
	}
	for _, h := range hs {
		var env map[string]any
		_ = json.Unmarshal([]byte(h.Body), &env)
		if h.Headers["webhook-id"] != env["event_id"] {
			t.Errorf("webhook-id %s, event_id %v", h.Headers["webhook-id"], env["event_id"])
		}
	}
	gd := obj(t, got["credit.granted"]["data"], "granted data")
	if Int(t, gd["credits"]) != 1000 || Int(t, gd["balance_after"]) != 1000 || gd["source"] != "promotional" || gd["reason"] != "welcome" {
		t.Errorf("granted data = %v", gd)
	}
	checkUUID(t, gd["transaction_id"], "granted transaction_id")
	cd := obj(t, got["credit.consumed"]["data"], "consumed data")
	if Int(t, cd["credits"]) != 600 || Int(t, cd["balance_after"]) != 400 || cd["reservation_id"] != nil {
		t.Errorf("consumed data = %v", cd)
	}
	ld := obj(t, got["credit.low_balance"]["data"], "low data")
	if Int(t, ld["balance_mc"]) != 400 || Int(t, ld["threshold_mc"]) != 500 {
		t.Errorf("low_balance data = %v", ld)
	}
	xd := obj(t, got["credit.exhausted"]["data"], "exhausted data")
	if Int(t, xd["balance_mc"]) != 0 {
		t.Errorf("exhausted data = %v", xd)
	}
	pd := obj(t, got["test.ping"]["data"], "ping data")
	if pd["message"] != "ping" || got["test.ping"]["idempotency_key"] != pingKey {
		t.Errorf("ping = %v", got["test.ping"])
	}

	// The list: newest first, delivered, each with one attempt; the sandbox
	// key sees the same events (both environments).
	var list []any
	deadline := time.Now().Add(10 * time.Second)
	for {
		list, _, _ = page(t, a.get("/v1/webhooks/events?status=delivered"))
		if len(list) == 6 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(list) != 6 {
		t.Fatalf("delivered events = %d, want 6", len(list))
	}
	for _, v := range list {
		e := obj(t, v, "event")
		ds := arr(t, e["deliveries"], "deliveries")
		if e["status"] != "delivered" || Int(t, e["attempts"]) != 1 || e["next_retry_at"] != nil || e["last_error"] != nil || len(ds) != 1 {
			t.Errorf("event %v", e)
		}
		d := obj(t, ds[0], "delivery")
		if Int(t, d["status_code"]) != 200 || d["error"] != nil {
			t.Errorf("delivery %v", d)
		}
		checkTime(t, e["delivered_at"], "delivered_at")
		obj(t, e["payload"], "payload")
	}
	sb, _, _ := page(t, s.as(t, tn.Sandbox).get("/v1/webhooks/events"))
	if len(sb) != 6 {
		t.Errorf("sandbox key lists %d events, want the same 6", len(sb))
	}
	one, _, _ := page(t, a.get("/v1/webhooks/events?event_type=credit.consumed"))
	if len(one) != 2 {
		t.Errorf("event_type=credit.consumed lists %d, want 2", len(one))
	}
	none, _, _ := page(t, a.get("/v1/webhooks/events?status=bogus"))
	if len(none) != 0 {
		t.Errorf("status=bogus lists %d, want none", len(none))
	}
	seen := map[string]bool{}
	cursor := ""
	for pages := 0; ; pages++ {
		q := "/v1/webhooks/events?limit=4"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		data, more, next := page(t, a.get(q))
		for _, v := range data {
			seen[str(t, obj(t, v, "event")["id"], "id")] = true
		}
		if !more {
			break
		}
		cursor = str(t, next, "next_cursor")
		if pages > 3 {
			t.Fatal("paging does not end")
		}
	}
	if len(seen) != 6 {
		t.Errorf("paging saw %d events, want 6", len(seen))
	}
	wantStatus(t, a.get("/v1/webhooks/events?cursor=garbage"), 400, "bad cursor")

	// Errors of redeliver and test.
	pingID := str(t, ping.Body["event_id"], "event_id")
	checkProblem(t, a.post("/v1/webhooks/events/not-a-uuid/redeliver", nil), 422, "validation-error", "id", "redeliver bad id")
	checkProblem(t, a.post("/v1/webhooks/events/"+uuid.NewString()+"/redeliver", nil), 404, "not-found", "", "redeliver unknown")
	checkProblem(t, a.post("/v1/webhooks/events/"+pingID+"/redeliver", nil), 409, "conflict", "", "redeliver delivered")
	other := s.NewTenant(uniq("other"))
	checkProblem(t, s.as(t, other.Live).post("/v1/webhooks/events/"+pingID+"/redeliver", nil), 404, "not-found", "", "redeliver other tenant's")
	wantStatus(t, a.do("POST", "/v1/webhooks/test", "", nil), 422, "test without key")
	wantStatus(t, a.do("POST", "/v1/webhooks/events/"+pingID+"/redeliver", "", nil), 422, "redeliver without key")
	checkProblem(t, s.as(t, other.Live).post("/v1/webhooks/test", nil), 409, "conflict", "", "test without a webhook")
	replay := a.do("POST", "/v1/webhooks/test", pingKey, nil)
	if replay.Status != 202 || replay.Body["event_id"] != ping.Body["event_id"] || replay.Header.Get("X-Idempotent-Replayed") != "true" {
		t.Errorf("ping replay = %d %s", replay.Status, replay.Raw)
	}
}
