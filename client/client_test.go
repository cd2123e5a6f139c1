package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creditd/creditd/client"
)

// script is an httptest server that answers each request with the next
// canned answer and records what it got.
type script struct {
	mu      sync.Mutex
	answers []answer
	got     []*http.Request
	bodies  []string
	srv     *httptest.Server
}

type answer struct {
	status     int
	retryAfter string
	body       string
}

func newScript(t *testing.T, answers ...answer) *script {
	s := &script{answers: answers}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.got = append(s.got, r.Clone(context.Background()))
		s.bodies = append(s.bodies, string(b))
		a := s.answers[min(len(s.got), len(s.answers))-1]
		s.mu.Unlock()
		if a.retryAfter != "" {
			w.Header().Set("Retry-After", a.retryAfter)
		}
		if a.status >= 400 && strings.HasPrefix(a.body, "{") {
			w.Header().Set("Content-Type", "application/problem+json")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, a.body)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *script) requests() []*http.Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*http.Request(nil), s.got...)
}

func problemBody(status int, typ, detail string) string {
	b, _ := json.Marshal(map[string]any{"type": typ, "title": http.StatusText(status), "status": status, "detail": detail, "request_id": "req-1"})
	return string(b)
}

const customerJSON = `{"id":"7b0c5a4e-4f5e-4a0e-9a57-1f0b3c1d2e3f","tenant_id":"0b0c5a4e-4f5e-4a0e-9a57-1f0b3c1d2e3f","environment":"live","external_id":"ada","display_name":null,"overage_policy":null,"low_balance_threshold_mc":null,"metadata":{},"created_at":"2026-01-02T03:04:05.678Z","updated_at":"2026-01-02T03:04:05.678Z"}`

var busy = problemBody(409, "conflict", "a request with this Idempotency-Key is still in progress; retry with the same key later")

// TestRetries: 503 and 429 are retried after their Retry-After, 409 "still
// in progress" after a back-off, each with the call's one Idempotency-Key;
// other problems are returned at once.
func TestRetries(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		answers  []answer
		attempts int
		minWait  time.Duration
		wantType string // "" for success
	}{
		{"503 Retry-After then 200", []answer{{503, "1", problemBody(503, "unavailable", "replica lag")}, {201, "", customerJSON}}, 2, time.Second, ""},
		{"429 Retry-After then 200", []answer{{429, "1", problemBody(429, "rate-limited", "slow down")}, {201, "", customerJSON}}, 2, time.Second, ""},
		{"409 in progress then 200", []answer{{409, "", busy}, {409, "", busy}, {201, "", customerJSON}}, 3, 0, ""},
		{"503 until attempts run out", []answer{{503, "0", problemBody(503, "unavailable", "down")}}, 4, 0, client.ProblemUnavailable},
		{"409 conflict is final", []answer{{409, "", problemBody(409, "conflict", "external_id taken")}, {201, "", customerJSON}}, 1, 0, client.ProblemConflict},
		{"422 is final", []answer{{422, "", problemBody(422, "validation-error", "external_id is required")}, {201, "", customerJSON}}, 1, 0, client.ProblemValidation},
		{"500 is final", []answer{{500, "", problemBody(500, "internal", "oops")}, {201, "", customerJSON}}, 1, 0, client.ProblemInternal},
		{"Retry-After past the max delay is final", []answer{{503, "120", problemBody(503, "unavailable", "down")}, {201, "", customerJSON}}, 1, 0, client.ProblemUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newScript(t, tc.answers...)
			c := client.New(s.srv.URL+"/", "ck_live_x", client.WithRetry(4, 5*time.Millisecond, 30*time.Second))
			var info client.Response
			start := time.Now()
			cust, err := c.CreateCustomer(context.Background(), client.CreateCustomerInput{ExternalID: "ada"}, client.WithResponse(&info))
			elapsed := time.Since(start)
			reqs := s.requests()
			if len(reqs) != tc.attempts || info.Attempts != tc.attempts {
				t.Fatalf("sent %d times (Response.Attempts %d), want %d", len(reqs), info.Attempts, tc.attempts)
			}
			if elapsed < tc.minWait {
				t.Fatalf("retried after %v, before the Retry-After of %v", elapsed, tc.minWait)
			}
			key := reqs[0].Header.Get("Idempotency-Key")
			if len(key) != 36 || info.IdempotencyKey != key {
				t.Fatalf("Idempotency-Key %q (Response says %q), want a generated UUID", key, info.IdempotencyKey)
			}
			for i, r := range reqs {
				if got := r.Header.Get("Idempotency-Key"); got != key {
					t.Fatalf("attempt %d sent key %q, attempt 1 %q", i+1, got, key)
				}
				if r.Header.Get("X-API-Key") != "ck_live_x" || r.URL.Path != "/v1/customers" || r.Method != "POST" {
					t.Fatalf("attempt %d: %s %s key %q", i+1, r.Method, r.URL.Path, r.Header.Get("X-API-Key"))
				}
				if s.bodies[i] != `{"external_id":"ada"}` {
					t.Fatalf("attempt %d body %s", i+1, s.bodies[i])
				}
			}
			if tc.wantType == "" {
				if err != nil || cust.ExternalID != "ada" || cust.CreatedAt.IsZero() || cust.DisplayName != nil {
					t.Fatalf("CreateCustomer = %+v, %v", cust, err)
				}
				return
			}
			p, ok := client.AsProblem(err)
			if !ok || p.Type != tc.wantType || p.Status != tc.answers[0].status || p.RequestID != "req-1" || cust != nil {
				t.Fatalf("error %#v (%v), want a %s problem", p, err, tc.wantType)
			}
		})
	}
}

// TestRetryWaitEndsWithContext: a call waiting out a Retry-After returns
// as soon as its context ends, with both the context's error and the
// problem.
func TestRetryWaitEndsWithContext(t *testing.T) {
	t.Parallel()
	s := newScript(t, answer{503, "10", problemBody(503, "unavailable", "down")})
	c := client.New(s.srv.URL, "k")
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := c.GetCustomer(ctx, "ada")
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("returned after %v, not when the context ended", d)
	}
	if !errors.Is(err, context.Canceled) || !client.IsProblem(err, client.ProblemUnavailable) {
		t.Fatalf("err = %v, want context.Canceled and the 503 problem", err)
	}
	// A deadline sooner than the Retry-After gives up at once.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	start = time.Now()
	if _, err := c.GetCustomer(ctx2, "ada"); !client.IsProblem(err, client.ProblemUnavailable) || time.Since(start) > time.Second {
		t.Fatalf("err = %v after %v, want the problem at once", err, time.Since(start))
	}
}

// TestCallOptions: a given Idempotency-Key is sent as is, extra headers
// and query parameters go out, a GET sends no key, and a replay is seen.
func TestCallOptions(t *testing.T) {
	t.Parallel()
	s := newScript(t, answer{200, "", `{"data":[],"pagination":{"has_more":false,"next_cursor":null}}`})
	c := client.New(s.srv.URL, "k", client.WithUserAgent("acme/1.2"))
	ctx := context.Background()
	page, err := c.ListCustomers(ctx, &client.ListCustomersParams{Search: client.Ptr("a b"), Limit: client.Ptr(5)}, client.WithHeader("X-Trace", "t1"))
	if err != nil || page.Pagination.HasMore || page.Pagination.NextCursor != nil {
		t.Fatalf("ListCustomers = %+v, %v", page, err)
	}
	from := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := c.Overage(ctx, "ada/1", client.OverageParams{From: from, To: from.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateCustomer(ctx, "ada", client.UpdateCustomerInput{DisplayName: client.Ptr("")}, client.WithIdempotencyKey("my-key")); err != nil {
		t.Fatal(err)
	}
	reqs := s.requests()
	if q := reqs[0].URL.Query(); q.Get("search") != "a b" || q.Get("limit") != "5" || q.Has("cursor") {
		t.Fatalf("query %v", q)
	}
	if reqs[0].Header.Get("X-Trace") != "t1" || reqs[0].Header.Get("Idempotency-Key") != "" || !strings.HasPrefix(reqs[0].Header.Get("User-Agent"), "acme/1.2 creditd-go/") {
		t.Fatalf("GET headers %v", reqs[0].Header)
	}
	if reqs[1].URL.EscapedPath() != "/v1/customers/ada%2F1/overage" || reqs[1].URL.Query().Get("from") != "2026-01-02T03:04:05Z" || reqs[1].URL.Query().Get("to") != "2026-01-02T04:04:05Z" {
		t.Fatalf("overage request %s", reqs[1].URL)
	}
	if reqs[2].Header.Get("Idempotency-Key") != "my-key" || s.bodies[2] != `{"display_name":""}` {
		t.Fatalf("PATCH key %q body %s", reqs[2].Header.Get("Idempotency-Key"), s.bodies[2])
	}
}

// TestProblemDecoding: RFC 9457 bodies become *Problem with every member,
// the gauge 409's extras included; a body that is not a problem still
// gives the status.
func TestProblemDecoding(t *testing.T) {
	t.Parallel()
	gauge := `{"type":"conflict","title":"Conflict","status":409,"detail":"past the cap","request_id":"r2","current":9,"cap":10,"shortfall":2}`
	field := `{"type":"validation-error","title":"Validation Error","status":422,"detail":"units must be >= 1","field":"units","errors":[{"field":"units","message":"units must be >= 1"}],"request_id":"r3"}`
	for _, tc := range []struct {
		name string
		a    answer
		want client.Problem
	}{
		{"gauge cap", answer{409, "", gauge}, client.Problem{Type: "conflict", Title: "Conflict", Status: 409, Detail: "past the cap", RequestID: "r2", Current: client.Ptr[int64](9), Cap: client.Ptr[int64](10), Shortfall: client.Ptr[int64](2)}},
		{"field", answer{422, "", field}, client.Problem{Type: "validation-error", Title: "Validation Error", Status: 422, Detail: "units must be >= 1", Field: "units", Errors: []client.FieldError{{Field: "units", Message: "units must be >= 1"}}, RequestID: "r3"}},
		{"not a problem", answer{502, "", "<html>bad gateway</html>"}, client.Problem{Title: "Bad Gateway", Status: 502, Detail: "<html>bad gateway</html>"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newScript(t, tc.a)
			_, err := client.New(s.srv.URL, "k").IncrementGauge(context.Background(), "ada", "seats", client.GaugeInput{Amount: 3})
			p, ok := client.AsProblem(err)
			if !ok {
				t.Fatalf("err %v is no *Problem", err)
			}
			got, _ := json.Marshal(p)
			want, _ := json.Marshal(tc.want)
			if string(got) != string(want) {
				t.Fatalf("problem %s, want %s", got, want)
			}
			if !strings.Contains(p.Error(), strconv.Itoa(tc.want.Status)) {
				t.Fatalf("Error() = %q", p.Error())
			}
		})
	}
}

// TestNullable: an unset Nullable member is omitted, Null sends null and
// Value the value; decoding gives them back.
func TestNullable(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   client.UpdateOverrideInput
		want string
	}{
		{client.UpdateOverrideInput{Reason: client.Ptr("r")}, `{"reason":"r"}`},
		{client.UpdateOverrideInput{ExpiresAt: client.Null[time.Time]()}, `{"expires_at":null}`},
		{client.UpdateOverrideInput{ExpiresAt: client.Value(at)}, `{"expires_at":"2026-05-01T00:00:00Z"}`},
	} {
		b, err := json.Marshal(tc.in)
		if err != nil || string(b) != tc.want {
			t.Fatalf("marshal = %s, %v; want %s", b, err, tc.want)
		}
		var back client.UpdateOverrideInput
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if back.ExpiresAt.IsNull() != tc.in.ExpiresAt.IsNull() || back.ExpiresAt.IsZero() != tc.in.ExpiresAt.IsZero() {
			t.Fatalf("%s decoded to %+v", b, back.ExpiresAt)
		}
		if v, ok := back.ExpiresAt.Get(); ok && !v.Equal(at) {
			t.Fatalf("%s decoded to %v", b, v)
		}
	}
}

// TestNoServerImports: the client is for integrators and imports no
// package of the server.
func TestNoServerImports(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("*.go")
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); strings.HasPrefix(p, "github.com/creditd/creditd") {
				t.Errorf("%s imports %s", f, p)
			}
		}
		checked++
	}
	if checked < 5 {
		t.Fatalf("checked %d files", checked)
	}
}

// TestTransportErrors: a connection cut before the answer is retried for a
// GET and for a write with an Idempotency-Key, never for a key-less
// DELETE, which could have applied.
func TestTransportErrors(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Method]++
		n := seen[r.Method]
		mu.Unlock()
		if n == 1 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		if r.Method == http.MethodDelete {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		_, _ = io.WriteString(w, customerJSON)
	}))
	t.Cleanup(srv.Close)
	c := client.New(srv.URL, "k", client.WithRetry(3, time.Millisecond, time.Second))
	ctx := context.Background()
	if _, err := c.GetCustomer(ctx, "ada"); err != nil {
		t.Fatalf("GET after a cut connection: %v", err)
	}
	if _, err := c.CreateCustomer(ctx, client.CreateCustomerInput{ExternalID: "ada"}); err != nil {
		t.Fatalf("POST with a key after a cut connection: %v", err)
	}
	err := c.DeleteCustomer(ctx, "ada")
	if _, isProblem := client.AsProblem(err); err == nil || isProblem {
		t.Fatalf("key-less DELETE after a cut connection: %v, want the transport error", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if seen["GET"] != 2 || seen["POST"] != 2 || seen["DELETE"] != 1 {
		t.Fatalf("sends per method %v, want GET 2, POST 2, DELETE 1", seen)
	}
}

// TestAllIterates: the ...All iterators follow next_cursor page after
// page, yield the first error once, and stop when the loop breaks.
func TestAllIterates(t *testing.T) {
	t.Parallel()
	page := func(ids []string, next string) string {
		var items []string
		for _, id := range ids {
			items = append(items, strings.Replace(customerJSON, `"external_id":"ada"`, `"external_id":"`+id+`"`, 1))
		}
		cursor := "null"
		if next != "" {
			cursor = `"` + next + `"`
		}
		return `{"data":[` + strings.Join(items, ",") + `],"pagination":{"has_more":` + strconv.FormatBool(next != "") + `,"next_cursor":` + cursor + `}}`
	}
	s := newScript(t, answer{200, "", page([]string{"a", "b"}, "c1")}, answer{200, "", page([]string{"c"}, "c2")}, answer{404, "", problemBody(404, "not-found", "gone")})
	c := client.New(s.srv.URL, "k")
	var got []string
	var errs []error
	for cust, err := range c.ListCustomersAll(context.Background(), &client.ListCustomersParams{Limit: client.Ptr(2)}) {
		if err != nil {
			errs = append(errs, err)
			continue
		}
		got = append(got, cust.ExternalID)
	}
	if strings.Join(got, ",") != "a,b,c" || len(errs) != 1 || !client.IsProblem(errs[0], client.ProblemNotFound) {
		t.Fatalf("iterated %v, errors %v", got, errs)
	}
	reqs := s.requests()
	if len(reqs) != 3 || reqs[0].URL.Query().Has("cursor") || reqs[1].URL.Query().Get("cursor") != "c1" || reqs[2].URL.Query().Get("cursor") != "c2" || reqs[2].URL.Query().Get("limit") != "2" {
		t.Fatalf("requests %v", reqs)
	}
	for range c.ListCustomersAll(context.Background(), nil) {
		break // one more page: the script's last answer again
	}
	if n := len(s.requests()); n != 4 {
		t.Fatalf("a loop that broke at once sent %d more requests, want 1", n-3)
	}
}

// TestInProgressMarker: creditd marks its 409 for a key a twin request
// still holds only in the detail; both clients match "still in progress"
// there, so a change of the server's wording must fail here, not silently
// turn the retry off.
func TestInProgressMarker(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../api/idempotency.go")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`errIdemBusy\s*=\s*engine\.Conflict\("[^"]*still in progress`).Match(src) {
		t.Fatal(`api/idempotency.go's errIdemBusy no longer says "still in progress": update Problem.InProgress and the TypeScript client's inProgress`)
	}
	p := &client.Problem{Type: client.ProblemConflict, Status: 409, Detail: "a request with this Idempotency-Key is still in progress; retry with the same key later"}
	if !p.InProgress() {
		t.Fatal("the server's busy problem is not InProgress")
	}
}
