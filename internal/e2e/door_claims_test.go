package e2e

import (
	"testing"
	"time"
)

// TestDoorGivesClaimsBack (issue 26): a request whose API key is cached
// claims its Idempotency-Key in its first Redis round trip, with its rate
// take and its tenant's stamps, before it knows whether the rate limit or
// a revocation refuses it. A refused request must leave the key free: the
// same key sent again once the limit allows (or with a valid key) runs at
// once, as if the refused request had never come, not 409 "still in
// progress" for the claim's 30 s.
func TestDoorGivesClaimsBack(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("door-claims"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	grant := func(a api, key string) Response {
		return a.do("POST", "/v1/customers/"+id+"/credits/grant", key,
			map[string]any{"credits": 10, "source": "promotional", "reason": "door"})
	}
	wantStatus(t, grant(a, "warm"), 201, "grant with the key cached")

	// Refused by the rate limit after its claim was taken.
	wantStatus(t, adminCall(t, s, AdminToken, "PATCH", "/admin/v1/tenants/"+tn.ID,
		map[string]any{"rate_limit_per_second": 1, "rate_limit_burst": 1}), 200, "lower the limit")
	refusedKey := ""
	for i := 0; i < 5 && refusedKey == ""; i++ {
		key := "limited-" + string(rune('a'+i))
		switch r := grant(a, key); r.Status {
		case 429:
			refusedKey = key
		default:
			wantStatus(t, r, 201, "grant under the limit")
		}
	}
	if refusedKey == "" {
		t.Fatal("the limit of 1/s never refused a request")
	}
	r := grant(a, refusedKey)
	for deadline := time.Now().Add(5 * time.Second); r.Status == 429 && time.Now().Before(deadline); r = grant(a, refusedKey) {
		time.Sleep(200 * time.Millisecond)
	}
	wantStatus(t, r, 201, "a key whose first send was refused (429), sent again within the limit")

	// Refused by a revocation seen at the door's stamps.
	wantStatus(t, adminCall(t, s, AdminToken, "PATCH", "/admin/v1/tenants/"+tn.ID,
		map[string]any{"rate_limit_per_second": 1000000, "rate_limit_burst": 10000000}), 200, "raise the limit")
	lk := adminCall(t, s, AdminToken, "POST", "/admin/v1/tenants/"+tn.ID+"/api-keys", map[string]any{"environment": "live"})
	wantStatus(t, lk, 201, "key to revoke")
	doomed := s.as(t, lk.Body["key"].(string))
	wantStatus(t, grant(doomed, "warm-doomed"), 201, "the doomed key cached")
	wantStatus(t, adminCall(t, s, AdminToken, "DELETE", "/admin/v1/tenants/"+tn.ID+"/api-keys/"+lk.Body["id"].(string), nil), 204, "revoke")
	checkProblem(t, grant(doomed, "after-401"), 401, "unauthorized", "", "the revoked key")
	wantStatus(t, grant(a, "after-401"), 201, "the key a revoked request sent, with a valid API key")
}
