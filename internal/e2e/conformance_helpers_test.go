package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/testenv"
)

// The conformance tests drive creditd over HTTP exactly as a tenant reading
// docs/spec/interface.md, docs/spec/addendum.md and docs/decisions.md would; every assertion names
// the spec line it checks.

// api is one tenant key speaking to one stack from one test goroutine.
type api struct {
	t   testing.TB
	s   *Stack
	key string
}

func (s *Stack) as(t testing.TB, key string) api { return api{t: t, s: s, key: key} }

// do sends a request with the key and, when idem is not empty, an
// Idempotency-Key; extra are header name, value pairs.
func (a api) do(method, path, idem string, body any, extra ...string) Response {
	a.t.Helper()
	h := []string{}
	if a.key != "" {
		h = append(h, "X-API-Key", a.key)
	}
	if idem != "" {
		h = append(h, "Idempotency-Key", idem)
	}
	h = append(h, extra...)
	return Call(a.t, a.s.HTTP, a.s.URL, method, path, body, h...)
}

func (a api) get(path string) Response { a.t.Helper(); return a.do("GET", path, "", nil) }

// post sends a write with a fresh Idempotency-Key.
func (a api) post(path string, body any) Response {
	a.t.Helper()
	return a.do("POST", path, idemKey(), body)
}

func (a api) patch(path string, body any) Response {
	a.t.Helper()
	return a.do("PATCH", path, idemKey(), body)
}

// adminCall calls the operator API with the given bearer token.
func adminCall(t testing.TB, s *Stack, token, method, path string, body any) Response {
	t.Helper()
	h := []string{}
	if token != "" {
		h = append(h, "Authorization", "Bearer "+token)
	}
	return Call(t, s.HTTP, s.URL, method, path, body, h...)
}

var idemSeq atomic.Int64

// idemKey is a fresh, never reused Idempotency-Key.
func idemKey() string {
	return fmt.Sprintf("conf-%s-%d", testenv.RandomSuffix(), idemSeq.Add(1))
}

// uniq is a fresh name for external ids and tenants.
func uniq(prefix string) string { return prefix + "-" + testenv.RandomSuffix() }

func wantStatus(t testing.TB, r Response, want int, what string) {
	t.Helper()
	if r.Status != want {
		t.Fatalf("%s: status %d, want %d; body %s", what, r.Status, want, r.Raw)
	}
}

// checkStatus is wantStatus that goes on after a mismatch.
func checkStatus(t testing.TB, r Response, want int, what string) bool {
	t.Helper()
	if r.Status != want {
		t.Errorf("%s: status %d, want %d; body %s", what, r.Status, want, r.Raw)
		return false
	}
	return true
}

// checkProblem asserts an RFC 9457 problem (docs/spec/addendum.md §3): the status, the
// problem+json content type, type, title, detail, status member and, when
// field is not empty, the field named.
func checkProblem(t testing.TB, r Response, status int, typ, field, what string) {
	t.Helper()
	if !checkStatus(t, r, status, what) {
		return
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
		t.Errorf("%s: Content-Type %q, want application/problem+json", what, ct)
	}
	if r.Body == nil {
		t.Errorf("%s: body is not a JSON object: %s", what, r.Raw)
		return
	}
	if got, _ := r.Body["type"].(string); got != typ {
		t.Errorf("%s: problem type %q, want %q; body %s", what, got, typ, r.Raw)
	}
	if n, ok := r.Body["status"].(json.Number); !ok || n.String() != fmt.Sprint(status) {
		t.Errorf("%s: problem status member %v, want %d", what, r.Body["status"], status)
	}
	if s, _ := r.Body["title"].(string); s == "" {
		t.Errorf("%s: problem has no title: %s", what, r.Raw)
	}
	if s, _ := r.Body["detail"].(string); s == "" {
		t.Errorf("%s: problem has no detail: %s", what, r.Raw)
	}
	if field != "" && !namesField(r.Body, field) {
		t.Errorf("%s: problem does not name field %q: %s", what, field, r.Raw)
	}
}

// namesField reports whether a problem names field in `field` or in one of
// its `errors` (docs/spec/addendum.md §3).
func namesField(body map[string]any, field string) bool {
	if f, _ := body["field"].(string); f == field {
		return true
	}
	errs, _ := body["errors"].([]any)
	for _, e := range errs {
		if m, ok := e.(map[string]any); ok && m["field"] == field {
			return true
		}
	}
	return false
}

func obj(t testing.TB, v any, what string) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s: not an object: %#v", what, v)
	}
	return m
}

func arr(t testing.TB, v any, what string) []any {
	t.Helper()
	a, ok := v.([]any)
	if !ok {
		t.Fatalf("%s: not an array: %#v", what, v)
	}
	return a
}

func str(t testing.TB, v any, what string) string {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Fatalf("%s: not a string: %#v", what, v)
	}
	return s
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func checkUUID(t testing.TB, v any, what string) {
	t.Helper()
	if s, _ := v.(string); !uuidRE.MatchString(s) {
		t.Errorf("%s: %#v is not a UUID", what, v)
	}
}

func checkTime(t testing.TB, v any, what string) time.Time {
	t.Helper()
	s, _ := v.(string)
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Errorf("%s: %#v is not an RFC 3339 date-time", what, v)
	}
	return ts
}

// createCustomer POSTs a customer and returns its body (201 required).
func (a api) createCustomer(body map[string]any) map[string]any {
	a.t.Helper()
	r := a.post("/v1/customers", body)
	wantStatus(a.t, r, 201, "create customer")
	return r.Body
}

// newCustomer creates a customer with a fresh external id; it returns the
// id and external id.
func (a api) newCustomer() (id, ext string) {
	a.t.Helper()
	ext = uniq("cust")
	c := a.createCustomer(map[string]any{"external_id": ext})
	return c["id"].(string), ext
}

// grant grants credits to a customer (lenient id) and requires 201.
func (a api) grant(cust string, body map[string]any) map[string]any {
	a.t.Helper()
	if body["source"] == nil {
		body["source"] = "promotional"
	}
	if body["reason"] == nil {
		body["reason"] = "test grant"
	}
	r := a.post("/v1/customers/"+url.PathEscape(cust)+"/credits/grant", body)
	wantStatus(a.t, r, 201, "grant")
	return r.Body
}

// credits reads the account snapshot with blocks.
func (a api) credits(cust string) map[string]any {
	a.t.Helper()
	r := a.get("/v1/customers/" + url.PathEscape(cust) + "/credits?include_blocks=true")
	wantStatus(a.t, r, 200, "get credits")
	return r.Body
}

func (a api) balance(cust string) int64 {
	a.t.Helper()
	return Int(a.t, a.credits(cust)["balance"])
}

// history reads one page of a customer's ledger with query q.
func (a api) history(cust, q string) []any {
	a.t.Helper()
	r := a.get("/v1/customers/" + url.PathEscape(cust) + "/credits/history" + q)
	wantStatus(a.t, r, 200, "history "+q)
	return arr(a.t, r.Body["data"], "history data")
}

// page reads data and pagination of a list response.
func page(t testing.TB, r Response) (data []any, hasMore bool, next any) {
	t.Helper()
	data = arr(t, r.Body["data"], "data")
	p := obj(t, r.Body["pagination"], "pagination")
	hm, ok := p["has_more"].(bool)
	if !ok {
		t.Fatalf("pagination.has_more is not a boolean: %s", r.Raw)
	}
	nc, present := p["next_cursor"]
	if !present {
		t.Fatalf("pagination.next_cursor is missing: %s", r.Raw)
	}
	return data, hm, nc
}

// raceConsumes sends n consumes at once as key's tenant, the i-th with
// body(i) and an Idempotency-Key of its own, and returns the answers in
// order: the race tests count what passed and what was refused.
func raceConsumes(s *Stack, key string, n int, body func(i int) map[string]any) []Response {
	out := make([]Response, n)
	run := randomID()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = s.Do("POST", "/v1/entitlements/consume", key, fmt.Sprintf("race-%s-%d", run, i), body(i))
		}()
	}
	wg.Wait()
	return out
}

// raceTally counts the race's answers: 200 passed, 409 refused (and, with
// refusal set, only the 409s it accepts); any other is an error.
func raceTally(t *testing.T, rs []Response, refusal func(Response) bool) (ok, refused int) {
	t.Helper()
	for i, r := range rs {
		switch {
		case r.Status == 200:
			ok++
		case r.Status == 409 && (refusal == nil || refusal(r)):
			refused++
		default:
			t.Errorf("racer %d: %d %s", i, r.Status, r.Raw)
		}
	}
	return ok, refused
}
