package api

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// serveTCP serves h on a loopback port and returns its address.
func serveTCP(t *testing.T, h *harness) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = h.srv.Serve(ln) }()
	t.Cleanup(func() { _ = h.srv.Shutdown() })
	return ln.Addr().String()
}

func postHead(path string, contentLength int, headers ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "POST %s HTTP/1.1\r\nHost: creditd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", path, contentLength)
	for i := 0; i+1 < len(headers); i += 2 {
		fmt.Fprintf(&b, "%s: %s\r\n", headers[i], headers[i+1])
	}
	b.WriteString("\r\n")
	return b.String()
}

// TestDoorRefusesBeforeTheBody: a Content-Length over the limit is a 413,
// and a body over 64 KiB without a valid API key or admin token a 401,
// both answered from the headers alone (the test never sends the body).
func TestDoorRefusesBeforeTheBody(t *testing.T) {
	t.Parallel()
	h := setup(t)
	addr := serveTCP(t, h)
	const mid = 512 << 10 // under the 1 MiB limit, over the anonymous cap
	for _, tc := range []struct {
		name    string
		head    string
		status  int
		typ     string
		bearer  bool
		expect  bool
		title   string
		noRetry bool
	}{
		{name: "over the limit with a valid key", head: postHead("/v1/customers", 100<<20, "X-API-Key", h.live, "Idempotency-Key", "k"), status: 413, typ: "bad-request", title: "Payload Too Large"},
		{name: "over the limit without a key", head: postHead("/v1/customers", 1<<30), status: 413, typ: "bad-request"},
		{name: "large body, no key", head: postHead("/v1/customers", mid, "Idempotency-Key", "k"), status: 401, typ: "unauthorized"},
		{name: "large body, unknown key", head: postHead("/v1/customers", mid, "X-API-Key", "ck_live_unknownunknownunknownunknown00"), status: 401, typ: "unauthorized"},
		{name: "large body, malformed key", head: postHead("/v1/customers/x/credits/grant", mid, "X-API-Key", "nope"), status: 401, typ: "unauthorized"},
		{name: "large admin body, wrong token", head: postHead("/admin/v1/tenants", mid, "Authorization", "Bearer wrong"), status: 401, typ: "unauthorized", bearer: true},
		{name: "expect 100-continue over the limit", head: postHead("/v1/customers", 100<<20, "X-API-Key", h.live, "Expect", "100-continue"), status: 413, typ: "bad-request", expect: true},
		{name: "expect 100-continue, no key", head: postHead("/v1/customers", mid, "Expect", "100-continue"), status: 401, typ: "unauthorized", expect: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, body := testenv.HeadOnly(t, addr, tc.head)
			if res.StatusCode != tc.status {
				t.Fatalf("status = %d, want %d: %s", res.StatusCode, tc.status, body)
			}
			if ct := res.Header.Get("Content-Type"); ct != "application/problem+json" || !bytes.Contains(body, []byte(`"type":"`+tc.typ+`"`)) {
				t.Fatalf("not a %s problem: %s %s", tc.typ, ct, body)
			}
			if res.Header.Get("X-Request-Id") == "" || !bytes.Contains(body, []byte(res.Header.Get("X-Request-Id"))) {
				t.Fatalf("request id missing: %v %s", res.Header, body)
			}
			if tc.bearer && res.Header.Get("WWW-Authenticate") == "" {
				t.Fatal("admin 401 without WWW-Authenticate")
			}
		})
	}
	if n := len(h.dir.customers); n != 0 {
		t.Fatalf("refused requests created %d customers", n)
	}
}

// TestDoorReadsLargeBodiesWithCredentials: a body between the anonymous cap
// and the limit is read and served for a valid key or the admin token, and
// a chunked body without credentials stops at the anonymous cap.
func TestDoorReadsLargeBodiesWithCredentials(t *testing.T) {
	t.Parallel()
	h := setup(t)
	addr := serveTCP(t, h)
	pad := strings.Repeat(" ", 200<<10)
	client := &http.Client{Timeout: 5 * time.Second}
	post := func(path, body string, headers ...string) (int, string) {
		req, _ := http.NewRequest("POST", "http://"+addr+path, strings.NewReader(body))
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	if st, b := post("/v1/customers", `{"external_id":"big-1"}`+pad, h.idemKey("big-1")...); st != 201 {
		t.Fatalf("large body with a key: %d %s", st, b)
	}
	if st, b := post("/admin/v1/tenants", `{"name":"Big"}`+pad, admin()...); st != 201 {
		t.Fatalf("large admin body with the token: %d %s", st, b)
	}
	// Chunked (no Content-Length): the size is unknown until read, so
	// without a key fasthttp stops at the anonymous cap; it resets the
	// request then, so the answer is a 413 naming both caps.
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/customers", io.MultiReader(strings.NewReader(`{"external_id":"x"}`), strings.NewReader(pad)))
	req.ContentLength = -1
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("chunked: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 413 || !bytes.Contains(b, []byte("65536 bytes without a valid API key")) {
		t.Fatalf("chunked without a key = %d %s, want the 413 of the anonymous cap", res.StatusCode, b)
	}
	// With the key, the same chunked body is read and served.
	req, _ = http.NewRequest("POST", "http://"+addr+"/v1/customers", io.MultiReader(strings.NewReader(`{"external_id":"chunked"}`), strings.NewReader(pad)))
	req.ContentLength = -1
	req.Header.Set("X-API-Key", h.live)
	req.Header.Set("Idempotency-Key", "chunked")
	if res, err = client.Do(req); err != nil {
		t.Fatalf("chunked with a key: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != 201 {
		t.Fatalf("chunked with a key = %d, want 201", res.StatusCode)
	}
}

// TestDoorRefusalReachesGoClients: a Go client streaming an 8 MiB body gets
// the 413, not a connection reset: the server drains the unread body
// before it closes (without the drain, about half of these fail).
func TestDoorRefusalReachesGoClients(t *testing.T) {
	t.Parallel()
	h := setup(t)
	addr := serveTCP(t, h)
	client := &http.Client{Timeout: 10 * time.Second}
	big := make([]byte, 8<<20)
	for i := 0; i < 10; i++ {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/customers", bytes.NewReader(big))
		req.Header.Set("X-API-Key", h.live)
		req.Header.Set("Idempotency-Key", "big-"+strconv.Itoa(i))
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 413 || !bytes.Contains(b, []byte(`"status":413`)) {
			t.Fatalf("attempt %d: %d %s", i, res.StatusCode, b)
		}
	}
}

// TestDoorConnectionCap: one client holds at most MaxConnsPerIP connections;
// the next gets a 429 problem and is closed, and a slot frees on close.
func TestDoorConnectionCap(t *testing.T) {
	t.Parallel()
	h := setup(t, func(c *Config) { c.MaxConnsPerIP = 3 })
	addr := serveTCP(t, h)
	get := "GET /healthz HTTP/1.1\r\nHost: creditd\r\n\r\n"
	var open []net.Conn
	t.Cleanup(func() {
		for _, c := range open {
			c.Close()
		}
	})
	readStatus := func(c net.Conn) (int, []byte) {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, b
	}
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
		if _, err := io.WriteString(c, get); err != nil {
			t.Fatal(err)
		}
		if st, b := readStatus(c); st != 200 {
			t.Fatalf("connection %d: %d %s", i, st, b)
		}
	}
	extra, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if st, b := readStatus(extra); st != 429 || !bytes.Contains(b, []byte(`"type":"rate-limited"`)) {
		t.Fatalf("fourth connection: %d %s", st, b)
	}
	open[0].Close()
	open = open[1:]
	deadline := time.Now().Add(2 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, get)
		st, _ := readStatus(c)
		c.Close()
		if st == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a closed connection's slot never came back (last %d)", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClientOf: IPv4 addresses count alone, IPv6 ones by /64, mapped IPv4
// as IPv4.
func TestClientOf(t *testing.T) {
	t.Parallel()
	key := func(ip string) string {
		c, ok := clientOf(&net.TCPAddr{IP: net.ParseIP(ip), Port: 1})
		if !ok {
			t.Fatalf("%s not counted", ip)
		}
		return c.String()
	}
	for _, tc := range []struct{ a, b string }{
		{"2001:db8:1:2:aaaa::1", "2001:db8:1:2:bbbb::9"},
		{"::ffff:10.0.0.1", "10.0.0.1"},
	} {
		if key(tc.a) != key(tc.b) {
			t.Errorf("%s and %s are different clients", tc.a, tc.b)
		}
	}
	if key("10.0.0.1") == key("10.0.0.2") || key("2001:db8:1:2::1") == key("2001:db8:1:3::1") {
		t.Error("distinct clients share a key")
	}
	if _, ok := clientOf(pipeAddr{}); ok {
		t.Error("a non-TCP address is counted")
	}
}

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// TestAdminRateLimit: the admin API allows a burst per client address,
// then answers 429 with Retry-After, for good and wrong tokens alike.
func TestAdminRateLimit(t *testing.T) {
	t.Parallel()
	h := setup(t)
	path := "/admin/v1/tenants/" + h.tenant.String()
	start := time.Now()
	for i := 0; i < adminRateBurst; i++ {
		hdr := admin()
		if i%2 == 1 {
			hdr = []string{"Authorization", "Bearer wrong"}
		}
		if r := h.do("GET", path, "", hdr...); r.status == 429 {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	// The bucket refills while the burst is sent (slowly, under -race on a
	// loaded machine): a 429 must come within what the refill can explain.
	refilled := func() int { return int(time.Since(start).Seconds()*adminRatePerSecond) + 1 }
	r := h.do("GET", path, "", admin()...)
	for i := 0; r.status != 429 && i < refilled(); i++ {
		r = h.do("GET", path, "", admin()...)
	}
	wantProblem(t, r, 429, "rate-limited", "")
	if r.get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	// Tenant routes have their own, per key, bucket.
	if r := h.do("GET", "/v1/tenant", "", h.key()...); r.status != 200 {
		t.Fatalf("tenant route after admin limit: %d", r.status)
	}
}

// TestAdminFieldLimits: a tenant name over 200 characters and a webhook URL
// over 2,048 bytes are 422s naming the field; at the limit they pass.
func TestAdminFieldLimits(t *testing.T) {
	t.Parallel()
	h := setup(t)
	url := func(n int) string { return "https://example.com/" + strings.Repeat("a", n-len("https://example.com/")) }
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		field                    string
	}{
		{"name 201", "POST", "/admin/v1/tenants", `{"name":"` + strings.Repeat("é", 201) + `"}`, 422, "name"},
		{"name 100000", "POST", "/admin/v1/tenants", `{"name":"` + strings.Repeat("n", 100_000) + `"}`, 422, "name"},
		{"name 200", "POST", "/admin/v1/tenants", `{"name":"` + strings.Repeat("é", 200) + `"}`, 201, ""},
		{"url 2049", "PUT", "/admin/v1/tenants/" + h.tenant.String() + "/webhook", `{"url":"` + url(2049) + `"}`, 422, "url"},
		{"url 2048", "PUT", "/admin/v1/tenants/" + h.tenant.String() + "/webhook", `{"url":"` + url(2048) + `"}`, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do(tc.method, tc.path, tc.body, admin()...)
			if tc.field != "" {
				wantProblem(t, r, tc.status, "validation-error", tc.field)
			} else if r.status != tc.status {
				t.Fatalf("status = %d, want %d: %s", r.status, tc.status, r.body)
			}
		})
	}
}

// TestUnknownKeyCache: an unknown key costs one directory look-up per
// unknownKeyTTL, not one per request; a key created afterwards works at once.
func TestUnknownKeyCache(t *testing.T) {
	t.Parallel()
	h := setup(t)
	const unknown = "ck_live_unknownunknownunknownunknown00"
	before := h.dir.keyLookups.Load()
	for i := 0; i < 50; i++ {
		wantProblem(t, h.do("GET", "/v1/tenant", "", "X-API-Key", unknown), 401, "unauthorized", "")
	}
	if n := h.dir.keyLookups.Load() - before; n != 1 {
		t.Fatalf("50 requests with one unknown key made %d look-ups, want 1", n)
	}
	k, err := h.tenants.CreateKey(t.Context(), h.tenant, engine.EnvironmentLive)
	if err != nil {
		t.Fatal(err)
	}
	// Present the new key as unknown first would be a guess; instead show
	// that creating it leaves it usable straight away.
	if r := h.do("GET", "/v1/tenant", "", "X-API-Key", k.Key); r.status != 200 {
		t.Fatalf("new key: %d %s", r.status, r.body)
	}
}

// BenchmarkServeConsume measures a consume through the whole server, socket
// reading included (an in-memory listener): what the door checks before the
// handler (header hook, connection wrapper) cost on the hot path.
func BenchmarkServeConsume(b *testing.B) {
	h := benchHarness(b)
	ln := fasthttputil.NewInmemoryListener()
	go func() { _ = h.srv.Serve(ln) }()
	b.Cleanup(func() { _ = h.srv.Shutdown() })
	client := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}
	body := []byte(`{"customer_id":"c1","billable_metric_key":"tok","units":2}`)
	var req fasthttp.Request
	var res fasthttp.Response
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req.Reset()
		req.Header.SetMethod("POST")
		req.SetRequestURI("http://creditd/v1/entitlements/consume")
		req.Header.Set("X-API-Key", h.live)
		req.Header.Set("Idempotency-Key", "bench-"+strconv.Itoa(i))
		req.SetBodyRaw(body)
		if err := client.Do(&req, &res); err != nil || res.StatusCode() != 200 {
			b.Fatalf("consume: %v %d %s", err, res.StatusCode(), res.Body())
		}
	}
}

// TestAdjustCrossTenant: adjust naming another tenant's or the other
// environment's customer UUID is a 400 naming customer_id, like grant; a
// UUID naming nobody stays 404.
func TestAdjustCrossTenant(t *testing.T) {
	t.Parallel()
	h := setup(t)
	other, err := h.tenants.Create(t.Context(), "Other")
	if err != nil {
		t.Fatal(err)
	}
	r := h.do("POST", "/v1/customers", `{"external_id":"theirs"}`, "X-API-Key", other.APIKeys.Live, "Idempotency-Key", "c")
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	theirs := r.json()["id"].(string)
	r = h.do("POST", "/v1/customers", `{"external_id":"ours"}`, h.idemKey("c")...)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	ours := r.json()["id"].(string)
	body := `{"delta":-1,"source":"manual","reason":"r"}`
	for _, tc := range []struct {
		name, id, key string
		status        int
		typ, field    string
	}{
		{"other tenant", theirs, h.live, 400, "bad-request", "customer_id"},
		{"other environment", ours, h.sandbox, 400, "bad-request", "customer_id"},
		{"nobody", "01900000-0000-7000-8000-000000000000", h.live, 404, "not-found", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do("POST", "/v1/customers/"+tc.id+"/credits/adjust", body, "X-API-Key", tc.key, "Idempotency-Key", "adj-"+tc.name)
			wantProblem(t, r, tc.status, tc.typ, tc.field)
		})
	}
}
