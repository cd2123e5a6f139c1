package apicheck

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/creditd/creditd/api"
)

// TestCheck: a conforming answer passes; a wrong body type, a missing
// required member, an undocumented status and a wrong content type fail;
// a route outside the document is not checked.
func TestCheck(t *testing.T) {
	c, err := New(api.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	credits := func(balance string) string {
		return `{"id":"01a20bc2-1459-77b7-8bca-7725054ee841","tenant_id":"01a20bc2-142d-7532-973d-3134d15f6885",` +
			`"customer_id":"01a20bc2-1448-7e81-9828-e821c6c845b6","environment":"live","balance":` + balance +
			`,"reserved_balance":0,"pending_balance":0,"effective_balance":` + balance + `,"lifetime_earned":` + balance +
			`,"debt_mc":0,"credit_limit_mc":0,"version":4,"updated_at":"2026-11-24T04:13:18.306Z","blocks":[]}`
	}
	problem := `{"type":"not-found","title":"Not Found","status":404,"detail":"customer not found","request_id":"r1"}`
	cases := []struct {
		name, method, path string
		status             int
		contentType, body  string
		wantErr            string
	}{
		{"conforming", "GET", "/healthz", 200, "application/json", `{"status":"ok"}`, ""},
		{"int64 extremes", "GET", "/v1/customers/c1/credits", 200, "application/json", credits("9223372036854775807"), ""},
		{"past int64", "GET", "/v1/customers/c1/credits", 200, "application/json", credits("92233720368547758070"), "does not conform"},
		{"fraction as int64", "GET", "/v1/customers/c1/credits", 200, "application/json", credits("1.5"), "does not conform"},
		{"wrong member type", "GET", "/healthz", 200, "application/json", `{"status":5}`, "does not conform"},
		{"undocumented status", "GET", "/healthz", 418, "application/json", `{"status":"ok"}`, "does not conform"},
		{"problem conforming", "GET", "/v1/customers/c1", 404, "application/problem+json", problem, ""},
		{"problem as plain json", "GET", "/v1/customers/c1", 404, "text/plain", problem, "does not conform"},
		{"problem without type", "GET", "/v1/customers/c1", 404, "application/problem+json", `{"title":"x","status":404,"detail":"y"}`, "does not conform"},
		{"unknown route", "GET", "/v2/nothing", 404, "text/plain", "nope", ""},
		{"unknown method", "PUT", "/healthz", 405, "text/plain", "nope", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, "http://creditd"+tc.path, nil)
			h := http.Header{"Content-Type": {tc.contentType}}
			err := c.Check(req, tc.status, h, []byte(tc.body))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected mismatch: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestOperation: literal paths win over templates, and templates match one
// segment per parameter.
func TestOperation(t *testing.T) {
	c, err := New(api.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ method, path, want string }{
		{"GET", "/v1/customers", "listCustomers"},
		{"GET", "/v1/customers/abc", "getCustomer"},
		{"GET", "/v1/customers/abc/credits/history", "creditHistory"},
		{"POST", "/v1/webhooks/test", "testWebhook"},
		{"GET", "/v1/customers/a/b/c/d/e", ""},
	}
	for _, tc := range cases {
		req := httptest.NewRequest(tc.method, "http://creditd"+tc.path, nil)
		if got := c.Operation(req); got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
}

// TestCheckEvent: a payload of a listed event conforms; a wrong data member,
// a missing envelope member and an unlisted event type do not.
func TestCheckEvent(t *testing.T) {
	c, err := New(api.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	env := func(typ, data string) string {
		return `{"sequence":7,"event_id":"01a20bc2-15a0-7c3d-8e9f-0a1b2c3d4e5f","event_type":"` + typ + `","tenant_id":"01a20bc2-142d-7532-973d-3134d15f6885",` +
			`"environment":"live","customer_id":null,"external_customer_id":null,"created_at":"2026-11-24T04:13:18.52Z","idempotency_key":"k","version":null,"data":` + data + `}`
	}
	cases := []struct {
		name, payload string
		ok            bool
	}{
		{"ping", env("test.ping", `{"message":"ping"}`), true},
		{"ping with another message", env("test.ping", `{"message":"pong"}`), false},
		{"low balance", env("credit.low_balance", `{"balance_mc":10,"threshold_mc":20}`), true},
		{"low balance without threshold", env("credit.low_balance", `{"balance_mc":10}`), false},
		{"envelope without sequence", strings.Replace(env("test.ping", `{"message":"ping"}`), `"sequence":7,`, ``, 1), false},
		{"envelope without tenant", strings.Replace(env("test.ping", `{"message":"ping"}`), `"tenant_id"`, `"tenant"`, 1), false},
		{"unlisted type", env("credit.refunded", `{}`), false},
	}
	for _, tc := range cases {
		if err := c.CheckEvent([]byte(tc.payload)); (err == nil) != tc.ok {
			t.Errorf("%s: err = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// BenchmarkCheck is the cost the response check adds to each e2e answer
// (a credit balance with two blocks).
func BenchmarkCheck(b *testing.B) {
	c, err := New(api.OpenAPI())
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"id":"01a20bc2-1459-77b7-8bca-7725054ee841","tenant_id":"01a20bc2-142d-7532-973d-3134d15f6885",` +
		`"customer_id":"01a20bc2-1448-7e81-9828-e821c6c845b6","environment":"live","balance":148500,"reserved_balance":0,` +
		`"pending_balance":0,"effective_balance":148500,"lifetime_earned":151000,"debt_mc":0,"credit_limit_mc":0,"version":4,"updated_at":"2026-11-24T04:13:18.306Z","blocks":[]}`)
	req := httptest.NewRequest("GET", "http://creditd/v1/customers/c1/credits", nil)
	h := http.Header{"Content-Type": {"application/json"}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.Check(req, 200, h, body); err != nil {
			b.Fatal(err)
		}
	}
}
