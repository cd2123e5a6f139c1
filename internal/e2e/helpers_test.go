package e2e

import (
	"net/http"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/testenv"
)

// randomID is a short random suffix for unique names and keys.
func randomID() string { return testenv.RandomSuffix() }

// createCustomer creates a customer with externalID through the API at base
// and returns its service id.
func createCustomer(t testing.TB, client *http.Client, base, apiKey, externalID string) string {
	t.Helper()
	r := Call(t, client, base, "POST", "/v1/customers", map[string]any{"external_id": externalID},
		"X-API-Key", apiKey, "Idempotency-Key", "create-"+externalID)
	if r.Status != 201 {
		t.Fatalf("create customer %s: %d %s", externalID, r.Status, r.Raw)
	}
	id, _ := r.Body["id"].(string)
	if id == "" {
		t.Fatalf("create customer %s: no id in %s", externalID, r.Raw)
	}
	return id
}

// raiseRateLimit lifts a tenant's per-key token bucket so a load test
// measures creditd, not the limiter (429s are still retried).
func raiseRateLimit(t testing.TB, client *http.Client, base, tenantID string) {
	t.Helper()
	r := Call(t, client, base, "PATCH", "/admin/v1/tenants/"+tenantID,
		map[string]any{"rate_limit_per_second": 1000000, "rate_limit_burst": 10000000},
		"Authorization", "Bearer "+AdminToken)
	if r.Status != 200 {
		t.Fatalf("raise rate limit: %d %s", r.Status, r.Raw)
	}
}

// loadClient is an HTTP client for many concurrent requests to one host;
// its timeout outlasts the server's 10 s wait on an in-flight idempotency key.
func loadClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 256
	tr.MaxIdleConnsPerHost = 256
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}
