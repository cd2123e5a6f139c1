package api

import (
	"bytes"
	"fmt"
	"math/rand"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/creditd/creditd/engine"
)

// TestDecodeBody: bad bodies are 400, wrong-typed members 422 naming the
// member (nested ones by their path), unknown members ignored.
func TestDecodeBody(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body string
		kind       engine.Kind
		field      string
	}{
		{"empty", "", engine.KindBadRequest, ""},
		{"blank", "  \n", engine.KindBadRequest, ""},
		{"unparseable", `{"credits":`, engine.KindBadRequest, ""},
		{"trailing garbage", `{"credits":1} x`, engine.KindBadRequest, ""},
		{"array", `[1,2]`, engine.KindBadRequest, ""},
		{"string", `"credits"`, engine.KindBadRequest, ""},
		{"null", `null`, engine.KindBadRequest, ""},
		{"string for int64", `{"credits":"abc"}`, engine.KindValidation, "credits"},
		{"fraction for int64", `{"credits":1.5}`, engine.KindValidation, "credits"},
		{"int64 overflow", `{"credits":9223372036854775808}`, engine.KindValidation, "credits"},
		{"int64 underflow", `{"priority":-9223372036854775809}`, engine.KindValidation, "priority"},
		{"number for string", `{"source":5}`, engine.KindValidation, "source"},
		{"string for object", `{"metadata":"x"}`, engine.KindValidation, "metadata"},
		{"nested wrong type", `{"stack_after":{"fallback":7}}`, engine.KindValidation, "stack_after.fallback"},
		{"object for struct", `{"stack_after":[]}`, engine.KindValidation, "stack_after"},
		{"unknown members ignored", `{"credits":1,"idempotency_key":"old","zzz":{"a":[1]}}`, "", ""},
		{"max int64", `{"credits":9223372036854775807}`, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var in GrantPayload
			err := decodeBody([]byte(tc.body), &in)
			if tc.kind == "" {
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				return
			}
			e, ok := engine.AsError(err)
			if !ok || e.Kind != tc.kind || e.Field != tc.field {
				t.Fatalf("err = %v, want kind %s field %q", err, tc.kind, tc.field)
			}
		})
	}
}

// TestBodyErrorsOverHTTP: the decoding rules reach the client as problems,
// and the missing-field 422 comes from the engine naming the field.
func TestBodyErrorsOverHTTP(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for i, tc := range []struct {
		name, path, body string
		status           int
		typ, field       string
	}{
		{"unparseable", "/v1/customers", `{"external_id":`, 400, "bad-request", ""},
		{"empty", "/v1/customers", ``, 400, "bad-request", ""},
		{"not an object", "/v1/customers", `["a"]`, 400, "bad-request", ""},
		{"missing external_id", "/v1/customers", `{}`, 422, "validation-error", "external_id"},
		{"wrong type threshold", "/v1/customers", `{"external_id":"a","low_balance_threshold_mc":"abc"}`, 422, "validation-error", "low_balance_threshold_mc"},
		{"missing credits", "/v1/customers/c1/credits/grant", `{"source":"manual","reason":"r"}`, 422, "validation-error", "credits"},
		{"credits as text", "/v1/customers/c1/credits/grant", `{"credits":"abc","source":"manual","reason":"r"}`, 422, "validation-error", "credits"},
		{"delta overflow", "/v1/customers/c1/credits/adjust", `{"delta":99999999999999999999,"source":"manual","reason":"r"}`, 422, "validation-error", "delta"},
		{"tenant policy type", "/v1/tenant", `{"default_overage_policy":1}`, 422, "validation-error", "default_overage_policy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := "POST"
			if tc.path == "/v1/tenant" {
				method = "PATCH"
			}
			r := h.do(method, tc.path, tc.body, h.idemKey("decode-"+string(rune('a'+i)))...)
			wantProblem(t, r, tc.status, tc.typ, tc.field)
		})
	}
	if n := len(h.dir.customers); n != 0 {
		t.Fatalf("bad input created %d customers", n)
	}
	// A 4xx is a completed answer (Common rules 1): stored for replay.
	for _, k := range h.idem.Refs() {
		if rec, _ := h.idem.Record(k.Tenant, k.Key); !rec.Done || rec.Status < 400 || rec.Status > 499 {
			t.Fatalf("record %s = %+v, want a finished 4xx", k, rec)
		}
	}
}

// TestBodyLimit: a body over BodyLimitBytes is a 413 problem, through
// Handler() and through the real server (where fasthttp refuses it first).
func TestBodyLimit(t *testing.T) {
	t.Parallel()
	h := setup(t, func(c *Config) { c.BodyLimitBytes = 64 })
	big := `{"external_id":"` + strings.Repeat("x", 100) + `"}`
	r := h.do("POST", "/v1/customers", big, h.idemKey("big")...)
	p := wantProblem(t, r, 413, "bad-request", "")
	if p["title"] != "Payload Too Large" {
		t.Fatalf("title = %v", p["title"])
	}

	ln := fasthttputil.NewInmemoryListener()
	go func() { _ = h.srv.Serve(ln) }()
	t.Cleanup(func() { _ = h.srv.Shutdown() })
	client := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}
	for _, tc := range []struct {
		body   string
		status int
	}{
		{big, 413},
		{`{"external_id":"small"}`, 201},
	} {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		req.SetRequestURI("http://creditd/v1/customers")
		req.Header.SetMethod("POST")
		req.Header.Set("X-API-Key", h.live)
		req.Header.Set("Idempotency-Key", "over-the-wire-"+tc.body[:5]+string(rune('0'+tc.status%10)))
		req.SetBodyString(tc.body)
		if err := client.DoTimeout(req, resp, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != tc.status {
			t.Fatalf("status = %d, want %d: %s", resp.StatusCode(), tc.status, resp.Body())
		}
		if len(resp.Header.Peek("X-Request-Id")) == 0 {
			t.Fatal("no X-Request-Id")
		}
		if tc.status == 413 && (!bytes.Contains(resp.Body(), []byte(`"status":413`)) || string(resp.Header.ContentType()) != "application/problem+json") {
			t.Fatalf("413 is not a problem: %s", resp.Body())
		}
		fasthttp.ReleaseRequest(req)
		fasthttp.ReleaseResponse(resp)
	}
}

// TestQueryParams: limit must be an integer 1..100 and include_blocks a
// boolean; anything else is a 400 naming the parameter.
func TestQueryParams(t *testing.T) {
	t.Parallel()
	h := setup(t)
	if r := h.do("POST", "/v1/customers", `{"external_id":"q1"}`, h.idemKey("q1")...); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	for _, tc := range []struct {
		uri    string
		status int
		field  string
	}{
		{"/v1/customers?limit=0", 400, "limit"},
		{"/v1/customers?limit=101", 400, "limit"},
		{"/v1/customers?limit=abc", 400, "limit"},
		{"/v1/customers?limit=", 400, "limit"},
		{"/v1/customers?limit=1.5", 400, "limit"},
		{"/v1/customers?limit=1", 200, ""},
		{"/v1/customers?limit=100", 200, ""},
		{"/v1/customers/q1/credits/history?limit=0", 400, "limit"},
		{"/v1/customers/q1/credits?include_blocks=yes", 400, "include_blocks"},
		{"/v1/customers/q1/credits?include_blocks=1", 200, ""},
		{"/v1/customers/q1/credits?include_blocks=false", 200, ""},
		{"/v1/customers/q1/credits?as_of=yesterday", 400, "as_of"},
		{"/v1/customers/q1/credits?as_of=2026-01-01", 400, "as_of"},
		{"/v1/customers/q1/credits?as_of=2020-01-01T00:00:00Z", 200, ""},
		{"/v1/customers?cursor=bogus", 400, "cursor"},
	} {
		t.Run(tc.uri, func(t *testing.T) {
			r := h.do("GET", tc.uri, "", h.key()...)
			if tc.status != 200 {
				wantProblem(t, r, tc.status, "bad-request", tc.field)
				return
			}
			if r.status != 200 {
				t.Fatalf("status = %d: %s", r.status, r.body)
			}
		})
	}
}

// FuzzDecodeBody: whatever the bytes, decoding never panics and fails only
// with a 400 or a 422 naming a field, never an internal error.
func FuzzDecodeBody(f *testing.F) {
	for _, seed := range []string{``, `{}`, `{"credits":1}`, `{"credits":"x"}`, `[`, `{"stack_after":{"fallback":1}}`, `{"metadata":{"a":1e400}}`, `{"credits":-0}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var in GrantPayload
		err := decodeBody(body, &in)
		if err == nil {
			return
		}
		e, ok := engine.AsError(err)
		if !ok {
			t.Fatalf("non-engine error %v", err)
		}
		switch {
		case e.Kind == engine.KindBadRequest:
		case e.Kind == engine.KindValidation && e.Field != "":
		default:
			t.Fatalf("unexpected error %+v for %q", e, body)
		}
	})
}

// TestDecodeConsumeMatchesDecodeBody: the consume fast path decodes every
// body to what decodeBody gives, and refuses what it refuses, the same way.
func TestDecodeConsumeMatchesDecodeBody(t *testing.T) {
	t.Parallel()
	bodies := []string{
		`{"customer_id":"c1","billable_metric_key":"api_calls","units":1}`,
		` {"units": 25 ,"billable_metric_key" : "a.b:c-d",	"customer_id":"0191e3c1-8b7a-7c2d-9e4f-a1b2c3d4e5f6"} ` + "\n",
		`{"customer_id":"c1","billable_metric_key":"k","units":1,"metadata":null}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":1,"metadata":{"a":1}}`,
		`{"customer_id":"c\u00e9","billable_metric_key":"k","units":1}`,
		`{"customer_id":"é","billable_metric_key":"k","units":-0}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":-12}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":1.5}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":1e3}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":9223372036854775807}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":9223372036854775808}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":"1"}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":01}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":null}`,
		`{"customer_id":null,"billable_metric_key":"k","units":1}`,
		`{"customer_id":7,"billable_metric_key":"k","units":1}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":1,"extra":[1,2]}`,
		`{"customer_id":"c1","customer_id":"c2","billable_metric_key":"k","units":1}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":1,"units":2}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":1,"metadata":null,"metadata":null}`,
		"{\"customer_id\":\"c\xff\",\"billable_metric_key\":\"k\",\"units\":1}",
		"{\"customer_id\":\"c\x7f\",\"billable_metric_key\":\"k\",\"units\":1}",
		`{"Customer_ID":"c1","billable_metric_key":"k","units":1}`,
		`{"customer_id":"c1","billable_metric_key":"k","units":1} x`,
		`{"customer_id":"c1","billable_metric_key":"k","units":1,}`,
		`{"customer_id":"c1" "billable_metric_key":"k"}`,
		`{"customer_id":"c1\u0000"}`,
		"{\"customer_id\":\"c\x01\"}",
		`{}`,
		`{ }`,
		`[]`,
		``,
		`{"customer_id":"c1","units":1`,
		// The multi-metric form always takes decodeBody's path.
		`{"customer_id":"c1","items":[{"billable_metric_key":"a","units":2},{"billable_metric_key":"b","units":3}]}`,
		`{"customer_id":"c1","items":[]}`,
		`{"customer_id":"c1","items":null}`,
		`{"customer_id":"c1","items":[{"billable_metric_key":"a","units":"2"}]}`,
		`{"customer_id":"c1","items":{"billable_metric_key":"a"}}`,
	}
	for i, body := range bodies[:3] {
		var in consumePayload
		if !flatConsume(bytes.TrimSpace([]byte(body)), &in) {
			t.Errorf("body %d takes the slow path: %s", i, body)
		}
	}
	for _, body := range bodies {
		var want, got consumePayload
		werr := decodeBody([]byte(body), &want)
		gerr := decodeConsume([]byte(body), &got)
		if fmt.Sprint(werr) != fmt.Sprint(gerr) {
			t.Errorf("%s: error %v, decodeBody says %v", body, gerr, werr)
			continue
		}
		if werr == nil && !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded %+v, decodeBody says %+v", body, got, want)
		}
	}
	// Items decode whole, and a wrong-typed item member is a 422 naming it.
	var in consumePayload
	if err := decodeConsume([]byte(bodies[len(bodies)-5]), &in); err != nil || len(in.Items) != 2 ||
		*in.Items[1].BillableMetricKey != "b" || *in.Items[1].Units != 3 || in.BillableMetricKey != nil {
		t.Errorf("items: %v %+v", err, in)
	}
	err := decodeConsume([]byte(bodies[len(bodies)-2]), &in)
	if e, ok := engine.AsError(err); !ok || e.Kind != engine.KindValidation || !strings.HasPrefix(e.Field, "items") {
		t.Errorf("string units in an item: %v", err)
	}
}

// TestFlatConsumeScans: every body the consume fast path reads is one
// engine.ScanJSON passes, since decodeConsume skips the scan for it: on
// bodies cut and altered at random from plain ones.
func TestFlatConsumeScans(t *testing.T) {
	t.Parallel()
	seeds := []string{
		`{"customer_id":"c1","billable_metric_key":"api_calls","units":1}`,
		`{"units": 25 ,"billable_metric_key" : "a.b:c-d",	"customer_id":"x","metadata":null}`,
	}
	alphabet := []byte("{}[]\",:0123456789-.eE \t\nunitsmetadnl\\\x00\x7f\xc3\xa9\xff")
	rng := rand.New(rand.NewSource(26))
	accepted := 0
	for n := 0; n < 200000; n++ {
		trimmed := mutatedBody(rng, seeds, alphabet)
		if trimmed == nil {
			continue
		}
		var in consumePayload
		if !flatConsume(trimmed, &in) {
			continue
		}
		accepted++
		if err := engine.ScanJSON(trimmed, "", consumeShape, engine.MaxJSONDepth); err != nil {
			t.Fatalf("flatConsume reads %q, ScanJSON refuses it: %v", trimmed, err)
		}
	}
	if accepted < 1000 {
		t.Fatalf("only %d altered bodies took the fast path", accepted)
	}
}

// TestDecodeReservationItems: the items forms of a reservation and its
// commit decode whole through decodeBody, and a wrong-typed item member is
// a 422 naming it.
func TestDecodeReservationItems(t *testing.T) {
	var in reservePayload
	if err := decodeBody([]byte(`{"customer_id":"c1","items":[{"billable_metric_key":"a","estimated_units":2},{"billable_metric_key":"b","estimated_units":3}]}`), &in); err != nil ||
		len(in.Items) != 2 || *in.Items[1].BillableMetricKey != "b" || *in.Items[1].EstimatedUnits != 3 || in.BillableMetricKey != nil {
		t.Errorf("reserve items: %v %+v", err, in)
	}
	var cin commitPayload
	if err := decodeBody([]byte(`{"items":[{"billable_metric_key":"a","actual_units":0}]}`), &cin); err != nil ||
		len(cin.Items) != 1 || *cin.Items[0].ActualUnits != 0 || cin.ActualUnits != nil {
		t.Errorf("commit items: %v %+v", err, cin)
	}
	for _, tc := range []struct {
		body string
		into any
	}{
		{`{"customer_id":"c1","items":[{"billable_metric_key":"a","estimated_units":"2"}]}`, &reservePayload{}},
		{`{"items":[{"billable_metric_key":1,"actual_units":2}]}`, &commitPayload{}},
	} {
		err := decodeBody([]byte(tc.body), tc.into)
		if e, ok := engine.AsError(err); !ok || e.Kind != engine.KindValidation || !strings.HasPrefix(e.Field, "items") {
			t.Errorf("%s: %v", tc.body, err)
		}
	}
}

// TestDecodeFastPathsMatchDecodeBody: the fast paths of a reservation's
// create and commit, a gauge move and a usage batch decode every body to what
// decodeBody gives, and refuse what it refuses, the same way; the plain
// bodies take the fast path.
func TestDecodeFastPathsMatchDecodeBody(t *testing.T) {
	t.Parallel()
	reserves := []string{
		`{"customer_id":"c1","billable_metric_key":"api_calls","estimated_units":10,"ttl_seconds":600}`,
		` {"ttl_seconds" : 60, "estimated_units":1,"billable_metric_key":"k","external_customer_id":"ext-1","metadata":null,"dry_run":true} `,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":3,"dry_run":false}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":3,"dry_run":"true"}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":3,"dry_run":truex}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":3,"dry_run":null}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":3,"metadata":{"a":1}}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":3,"metadata":nullx}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":1.5}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":"3"}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":3,"ttl_seconds":1e3}`,
		`{"customer_id":null,"billable_metric_key":"k","estimated_units":3}`,
		`{"customer_id":"c1","customer_id":"c2","billable_metric_key":"k","estimated_units":3}`,
		`{"Customer_ID":"c1","billable_metric_key":"k","estimated_units":3}`,
		`{"customer_id":"c\u00e9","billable_metric_key":"k","estimated_units":3}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":3,"other":1}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":3,}`,
		`{"customer_id":"c1","billable_metric_key":"k","estimated_units":3} x`,
		`{"customer_id":"c1","items":[{"billable_metric_key":"a","estimated_units":2}]}`,
		`{}`,
		`[]`,
		``,
	}
	commits := []string{
		`{"actual_units":8}`,
		` { "final" : false , "actual_units" : 0, "metadata" : null } `,
		`{"actual_units":8,"final":true}`,
		`{"actual_units":8,"final":1}`,
		`{"actual_units":-1}`,
		`{"actual_units":8.0}`,
		`{"actual_units":8,"actual_units":9}`,
		`{"actual_units":8,"metadata":{"k":"v"}}`,
		`{"items":[{"billable_metric_key":"a","actual_units":2}]}`,
		`{"Actual_Units":8}`,
		`{}`,
		`{"actual_units":8`,
	}
	usages := []string{
		`{"events":[{"event_id":"e1","customer_id":"c1","billable_metric_key":"api_calls","units":1}]}`,
		` { "events" : [ {"units":2,"metadata":null,"billable_metric_key":"k","customer_id":"c","event_id":"e"} , {"event_id":"e2"} ] } `,
		`{"events":[]}`,
		`{"events":[{"event_id":"e1","units":1},{"event_id":"e1","units":1}]}`,
		`{"events":[{"event_id":"e1","units":1},]}`,
		`{"events":[{"event_id":"e1","units":1}`,
		`{"events":[{"event_id":"e1","event_id":"e2"}]}`,
		`{"events":[{"event_id":"e1","metadata":{"a":1}}]}`,
		`{"events":[{"event_id":"e1","units":"1"}]}`,
		`{"events":[{"event_id":null}]}`,
		`{"events":[1]}`,
		`{"events":null}`,
		`{"events":{}}`,
		`{"events":[{"event_id":"e1"}],"events":[]}`,
		`{"Events":[]}`,
		`{"events":[{"Event_ID":"e1"}]}`,
		`{"events":[{"event_id":"e\u00e9"}]}`,
		`{"events":[{}]}`,
		`{}`,
	}
	checkFastPath(t, "usage", usages, flatUsage, func(i int, body string) bool {
		return i < 4 || body == `{"events":[{}]}` || body == `{}`
	})
	many := `{"events":[` + strings.Repeat(`{"event_id":"e","units":1},`, engine.MaxUsageEvents) + `{"event_id":"e","units":1}]}`
	var in usagePayload
	if flatUsage([]byte(many), &in) {
		t.Errorf("a batch of %d events takes the fast path", engine.MaxUsageEvents+1)
	}
	gauges := []string{
		`{"amount":1,"policy":"allow"}`,
		` {"policy" : "block", "amount": 3, "lease_seconds": 60, "metadata": null} `,
		`{"amount":2}`,
		`{"amount":"2"}`,
		`{"amount":2,"metadata":{"a":1}}`,
		`{"amount":2,"metadata":"x"}`,
		`{"amount":2,"policy":null}`,
		`{"amount":2,"lease_seconds":1.5}`,
		`{"amount":2,"amount":3}`,
		`{"Amount":2}`,
		`{}`,
	}
	checkFastPath(t, "gauge", gauges, flatGauge, func(i int, body string) bool { return i < 3 || body == `{}` })
	checkFastPath(t, "reserve", reserves, flatReserve, func(i int, body string) bool { return i < 3 || body == `{}` })
	checkFastPath(t, "commit", commits, flatCommit, func(i int, body string) bool { return i < 3 || i == 4 || body == `{}` })
}

// checkFastPath checks a route's fast decode against decodeBody on bodies:
// the same payload or the same error, and the fast path taken exactly for
// the bodies fast names.
func checkFastPath[T any](t *testing.T, route string, bodies []string, flat func([]byte, *T) bool,
	fast func(i int, body string) bool) {
	t.Helper()
	for i, body := range bodies {
		var want, got T
		werr := decodeBody([]byte(body), &want)
		gerr := decodeFlat([]byte(body), &got, flat)
		if fmt.Sprint(werr) != fmt.Sprint(gerr) {
			t.Errorf("%s %s: error %v, decodeBody says %v", route, body, gerr, werr)
		} else if werr == nil && !reflect.DeepEqual(got, want) {
			t.Errorf("%s %s: decoded %+v, decodeBody says %+v", route, body, got, want)
		}
		var in T
		if took, want := flat(bytes.TrimSpace([]byte(body)), &in), fast(i, body); took != want {
			t.Errorf("%s %s: fast path %v, want %v", route, body, took, want)
		}
	}
}

// TestFlatBodiesScan: every body the reservation, gauge and usage fast
// paths read is one engine.ScanJSON passes, as TestFlatConsumeScans for
// the consume.
func TestFlatBodiesScan(t *testing.T) {
	t.Parallel()
	routes := []struct {
		name  string
		shape *engine.Shape
		flat  func([]byte) bool
	}{
		{"flatReserve", engine.ShapeOf(reflect.TypeOf(&reservePayload{})), func(b []byte) bool { return flatReserve(b, &reservePayload{}) }},
		{"flatCommit", engine.ShapeOf(reflect.TypeOf(&commitPayload{})), func(b []byte) bool { return flatCommit(b, &commitPayload{}) }},
		{"flatGauge", engine.ShapeOf(reflect.TypeOf(&gaugePayload{})), func(b []byte) bool { return flatGauge(b, &gaugePayload{}) }},
		{"flatUsage", engine.ShapeOf(reflect.TypeOf(&usagePayload{})), func(b []byte) bool { return flatUsage(b, &usagePayload{}) }},
	}
	seeds := []string{
		`{"customer_id":"c1","billable_metric_key":"api_calls","estimated_units":10,"ttl_seconds":600,"dry_run":false}`,
		`{"external_customer_id":"x","metadata":null, "estimated_units": 3 ,"billable_metric_key":"a.b","dry_run":true}`,
		`{"actual_units":8,"final":false,"metadata":null}`,
		`{"events":[{"event_id":"e1","customer_id":"c1","billable_metric_key":"k","units":1},{"event_id":"e2","metadata":null}]}`,
		`{"amount":1,"policy":"allow","lease_seconds":30,"metadata":null}`,
	}
	alphabet := []byte("{}[]\",:0123456789-.eE \t\ntruefalsnlvid\\\x00\x7f\xc3\xa9\xff")
	rng := rand.New(rand.NewSource(28))
	accepted := 0
	for n := 0; n < 200000; n++ {
		trimmed := mutatedBody(rng, seeds, alphabet)
		if trimmed == nil {
			continue
		}
		for _, r := range routes {
			if !r.flat(trimmed) {
				continue
			}
			accepted++
			if err := engine.ScanJSON(trimmed, "", r.shape, engine.MaxJSONDepth); err != nil {
				t.Fatalf("%s reads %q, ScanJSON refuses it: %v", r.name, trimmed, err)
			}
		}
	}
	if accepted < 1000 {
		t.Fatalf("only %d altered bodies took a fast path", accepted)
	}
}

// mutatedBody is one of seeds altered at random (a byte replaced or
// inserted from alphabet, a slice repeated, up to four times), trimmed on
// the left; nil when it no longer opens with "{".
func mutatedBody(rng *rand.Rand, seeds []string, alphabet []byte) []byte {
	b := []byte(seeds[rng.Intn(len(seeds))])
	for k := rng.Intn(4); k >= 0; k-- {
		p := rng.Intn(len(b))
		switch rng.Intn(3) {
		case 0: // replace a byte
			b[p] = alphabet[rng.Intn(len(alphabet))]
		case 1: // insert a byte
			b = append(b[:p], append([]byte{alphabet[rng.Intn(len(alphabet))]}, b[p:]...)...)
		default: // repeat a slice
			q := p + rng.Intn(len(b)-p)
			b = append(b[:q], append(append([]byte{}, b[p:q]...), b[q:]...)...)
		}
	}
	trimmed := bytes.TrimLeft(b, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil
	}
	return trimmed
}
