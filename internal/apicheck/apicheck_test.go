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
	problem := `{"type":"not-found","title":"Not Found","status":404,"detail":"customer not found","request_id":"r1"}`
	cases := []struct {
		name, method, path string
		status             int
		contentType, body  string
		wantErr            string
	}{
		{"conforming", "GET", "/healthz", 200, "application/json", `{"status":"ok"}`, ""},
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
