package e2e

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"
)

// grantedEvents lists the tenant's credit.granted events of customer id
// (after a history read, which waits for the persister, so they are there).
func (a api) grantedEvents(customer string) []map[string]any {
	a.t.Helper()
	var out []map[string]any
	for _, e := range arr(a.t, a.get("/v1/webhooks/events?limit=100&event_type=credit.granted").Body["data"], "events") {
		ev := obj(a.t, e, "event")
		var body map[string]any
		switch p := ev["payload"].(type) {
		case map[string]any:
			body = p
		case string:
			_ = json.Unmarshal([]byte(p), &body)
		}
		if body != nil && body["customer_id"] == customer {
			out = append(out, body)
		}
	}
	return out
}

// TestConformanceTopups: docs/spec/addendum.md §7 topups: POST 201 {transaction, block,
// account} with ledger type and source topup and credit.granted fired;
// 422 for each bad field and a missing Idempotency-Key; 404 for an unknown
// customer (a topup never creates one); replay and key reuse; GET paged
// newest first, 404 unknown customer, 400 bad cursor.
func TestConformanceTopups(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("topups"))
	a := s.as(t, tn.Live)
	id, ext := a.newCustomer()

	expires := time.Now().Add(72 * time.Hour).UTC().Truncate(time.Second)
	body := map[string]any{"credits": 5000, "payment_reference": "pi_123", "expires_at": expires.Format(time.RFC3339),
		"priority": 3, "metadata": map[string]any{"order": "o-1"}}
	key := idemKey()
	r := a.do("POST", "/v1/customers/"+ext+"/topups", key, body)
	wantStatus(t, r, 201, "topup")
	tx, blk, acct := obj(t, r.Body["transaction"], "transaction"), obj(t, r.Body["block"], "block"), obj(t, r.Body["account"], "account")
	if tx["type"] != "topup" || tx["source"] != "topup" || jsonInt(tx["delta"]) != 5000 || tx["customer_id"] != id || tx["credit_block_id"] != blk["id"] {
		t.Errorf("transaction %v", tx)
	}
	if blk["source"] != "topup" || jsonInt(blk["original_amount"]) != 5000 || jsonInt(blk["priority"]) != 3 ||
		!checkTime(t, blk["expires_at"], "block expires_at").Equal(expires) {
		t.Errorf("block %v", blk)
	}
	if jsonInt(acct["balance"]) != 5000 || acct["customer_id"] != id || jsonInt(acct["lifetime_earned"]) != 5000 {
		t.Errorf("account %v", acct)
	}
	replay := a.do("POST", "/v1/customers/"+ext+"/topups", key, body)
	wantStatus(t, replay, 201, "replayed topup")
	if replay.Header.Get("X-Idempotent-Replayed") != "true" || string(replay.Raw) != string(r.Raw) {
		t.Errorf("replay: header %q, same body %v", replay.Header.Get("X-Idempotent-Replayed"), string(replay.Raw) == string(r.Raw))
	}
	checkProblem(t, a.do("POST", "/v1/customers/"+ext+"/topups", key, map[string]any{"credits": 1}), 409, "conflict", "", "key reused with another body")
	if b := a.balance(id); b != 5000 {
		t.Fatalf("balance %d after topup and replay, want 5000", b)
	}

	// The ledger records it as a topup; credit.granted fired with source topup.
	h := a.history(id, "?type=topup")
	if len(h) != 1 || obj(t, h[0], "entry")["id"] != tx["id"] {
		t.Errorf("topup history %v", h)
	}
	evs := a.grantedEvents(id)
	if len(evs) != 1 {
		t.Fatalf("credit.granted events %v, want 1", evs)
	}
	if d := obj(t, evs[0]["data"], "data"); d["source"] != "topup" || jsonInt(d["credits"]) != 5000 || d["transaction_id"] != tx["id"] ||
		jsonInt(d["balance_after"]) != 5000 || d["reason"] != "pi_123" || evs[0]["external_customer_id"] != ext {
		t.Errorf("credit.granted %v", evs[0])
	}

	for _, tc := range []struct {
		name, field string
		body        any
	}{
		{"missing credits", "credits", map[string]any{"payment_reference": "x"}},
		{"zero credits", "credits", map[string]any{"credits": 0}},
		{"negative credits", "credits", map[string]any{"credits": -5}},
		{"credits not an integer", "credits", map[string]any{"credits": "5"}},
		{"priority 256", "priority", map[string]any{"credits": 1, "priority": 256}},
		{"priority -1", "priority", map[string]any{"credits": 1, "priority": -1}},
		{"bad expires_at", "expires_at", map[string]any{"credits": 1, "expires_at": "soon"}},
		{"past expires_at", "expires_at", map[string]any{"credits": 1, "expires_at": "2001-01-01T00:00:00Z"}},
		{"long payment_reference", "payment_reference", map[string]any{"credits": 1, "payment_reference": strings.Repeat("x", 256)}},
	} {
		checkProblem(t, a.post("/v1/customers/"+id+"/topups", tc.body), 422, "validation-error", tc.field, tc.name)
	}
	checkProblem(t, a.post("/v1/customers/"+id+"/topups", `{"credits":`), 400, "bad-request", "", "unparseable JSON")
	checkProblem(t, a.do("POST", "/v1/customers/"+id+"/topups", "", map[string]any{"credits": 1}), 422, "validation-error", "Idempotency-Key", "no Idempotency-Key")
	checkProblem(t, s.as(t, "").post("/v1/customers/"+id+"/topups", map[string]any{"credits": 1}), 401, "unauthorized", "", "no API key")
	unknown := uniq("nobody")
	checkProblem(t, a.post("/v1/customers/"+unknown+"/topups", map[string]any{"credits": 1}), 404, "not-found", "", "unknown customer")
	checkStatus(t, a.get("/v1/customers/"+unknown), 404, "a topup never creates a customer")
	checkProblem(t, s.as(t, tn.Sandbox).post("/v1/customers/"+id+"/topups", map[string]any{"credits": 1}), 404, "not-found", "", "customer of the other environment")

	// Listing: newest first, paged, derived from the ledger.
	a.grant(id, map[string]any{"credits": 7}) // not a topup
	for _, n := range []int{1, 2, 3} {
		wantStatus(t, a.post("/v1/customers/"+id+"/topups", map[string]any{"credits": n}), 201, "more topups")
	}
	data, more, next := page(t, a.get("/v1/customers/"+ext+"/topups?limit=3"))
	if len(data) != 3 || !more || next == nil {
		t.Fatalf("first page %v more %v next %v", data, more, next)
	}
	want := []int64{3, 2, 1}
	for i, d := range data {
		tp := obj(t, d, "topup")
		checkKeys(t, tp, "topup", "id", "customer_id", "credits", "payment_reference", "credit_block_id", "expires_at", "priority", "applies_to",
			"metadata", "idempotency_key", "created_at")
		if jsonInt(tp["credits"]) != want[i] || tp["customer_id"] != id || tp["payment_reference"] != nil || tp["expires_at"] != nil {
			t.Errorf("topup %d = %v", i, tp)
		}
	}
	data, more, _ = page(t, a.get("/v1/customers/"+id+"/topups?limit=3&cursor="+url.QueryEscape(next.(string))))
	if len(data) != 1 || more {
		t.Fatalf("second page %v more %v", data, more)
	}
	first := obj(t, data[0], "oldest topup")
	if first["id"] != tx["id"] || first["payment_reference"] != "pi_123" || jsonInt(first["priority"]) != 3 ||
		!checkTime(t, first["expires_at"], "expires_at").Equal(expires) || obj(t, first["metadata"], "metadata")["order"] != "o-1" ||
		first["credit_block_id"] != blk["id"] || first["idempotency_key"] != key {
		t.Errorf("oldest topup %v", first)
	}
	checkProblem(t, a.get("/v1/customers/"+id+"/topups?cursor=garbage"), 400, "bad-request", "cursor", "bad cursor")
	checkProblem(t, a.get("/v1/customers/"+id+"/topups?limit=101"), 400, "bad-request", "limit", "limit over 100")
	checkProblem(t, a.get("/v1/customers/"+uniq("nobody")+"/topups"), 404, "not-found", "", "list of an unknown customer")
	checkProblem(t, s.as(t, "").get("/v1/customers/"+id+"/topups"), 401, "unauthorized", "", "list without a key")
}
