package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestConformanceImport: docs/spec/addendum.md §7 import: 200 {created, skipped, errors};
// customers created with migration blocks; an existing external_id is
// skipped and keeps its balance; a bad entry is reported by index and never
// stops the others; no credit.granted even with emit_webhooks; dry_run
// writes nothing; 422 for a missing or oversized list and a missing
// Idempotency-Key; replay.
func TestConformanceImport(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("import"))
	a := s.as(t, tn.Live)
	oldID, oldExt := a.newCustomer()
	a.grant(oldID, map[string]any{"credits": 10})

	expires := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Second)
	x1, x2 := uniq("imp"), uniq("imp")
	body := map[string]any{
		"customers": []any{
			map[string]any{"external_id": x1, "display_name": "One", "metadata": map[string]any{"crm": "7"},
				"credits": []any{map[string]any{"credits": 1000, "priority": 2}, map[string]any{"credits": 500, "expires_at": expires.Format(time.RFC3339)}}},
			map[string]any{"external_id": oldExt, "credits": []any{map[string]any{"credits": 99}}},
			map[string]any{"external_id": x2},
			map[string]any{"display_name": "no external id"},
			map[string]any{"external_id": uniq("bad"), "credits": []any{map[string]any{"credits": 0}}},
			map[string]any{"external_id": uniq("bad"), "credits": []any{map[string]any{"credits": 1, "priority": 300}}},
			map[string]any{"external_id": x1},
		},
		"options": map[string]any{"emit_webhooks": true},
	}

	// dry_run: the same counts, nothing written.
	dry := map[string]any{"customers": body["customers"], "options": map[string]any{"dry_run": true}}
	r := a.post("/v1/import", dry)
	wantStatus(t, r, 200, "dry run")
	if jsonInt(r.Body["created"]) != 2 || jsonInt(r.Body["skipped"]) != 2 || len(arr(t, r.Body["errors"], "errors")) != 3 {
		t.Errorf("dry run %s", r.Raw)
	}
	checkStatus(t, a.get("/v1/customers/"+x1), 404, "dry run created nothing")

	key := idemKey()
	r = a.do("POST", "/v1/import", key, body)
	wantStatus(t, r, 200, "import")
	checkKeys(t, r.Body, "import result", "created", "skipped", "errors")
	if jsonInt(r.Body["created"]) != 2 || jsonInt(r.Body["skipped"]) != 2 {
		t.Errorf("import %s", r.Raw)
	}
	errs := arr(t, r.Body["errors"], "errors")
	wantIdx := []int64{3, 4, 5}
	wantField := []string{"external_id", "credits[0].credits", "credits[0].priority"}
	if len(errs) != 3 {
		t.Fatalf("errors %v", errs)
	}
	for i, e := range errs {
		m := obj(t, e, "error")
		if jsonInt(m["index"]) != wantIdx[i] || !strings.Contains(str(t, m["error"], "error"), wantField[i]) {
			t.Errorf("error %d = %v, want index %d naming %s", i, m, wantIdx[i], wantField[i])
		}
	}
	replay := a.do("POST", "/v1/import", key, body)
	if replay.Status != 200 || replay.Header.Get("X-Idempotent-Replayed") != "true" || string(replay.Raw) != string(r.Raw) {
		t.Errorf("replay %d %s", replay.Status, replay.Raw)
	}

	c := a.get("/v1/customers/" + x1)
	wantStatus(t, c, 200, "imported customer")
	if c.Body["display_name"] != "One" || obj(t, c.Body["metadata"], "metadata")["crm"] != "7" {
		t.Errorf("imported customer %v", c.Body)
	}
	acct := a.credits(x1)
	if Int(t, acct["balance"]) != 1500 {
		t.Errorf("imported balance %v", acct["balance"])
	}
	for _, b := range arr(t, acct["blocks"], "blocks") {
		blk := obj(t, b, "block")
		if blk["source"] != "migration" {
			t.Errorf("imported block %v", blk)
		}
		if jsonInt(blk["original_amount"]) == 500 && !checkTime(t, blk["expires_at"], "expires_at").Equal(expires) {
			t.Errorf("imported block expiry %v", blk)
		}
		if jsonInt(blk["original_amount"]) == 1000 && jsonInt(blk["priority"]) != 2 {
			t.Errorf("imported block priority %v", blk)
		}
	}
	for _, e := range a.history(x1, "") {
		if en := obj(t, e, "entry"); en["source"] != "migration" || en["type"] != "adjustment" {
			t.Errorf("imported entry %v", en)
		}
	}
	if a.balance(x2) != 0 {
		t.Errorf("x2 balance")
	}
	if b := a.balance(oldID); b != 10 {
		t.Errorf("the skipped customer's balance is %d, want 10 untouched", b)
	}
	// No credit.granted for the import, even with emit_webhooks: true.
	a.history(oldID, "")
	if evs := a.grantedEvents(str(t, c.Body["id"], "id")); len(evs) != 0 {
		t.Errorf("import fired credit.granted: %v", evs)
	}
	if evs := a.grantedEvents(oldID); len(evs) != 1 {
		t.Errorf("the manual grant's credit.granted: %v", evs)
	}

	too := make([]any, 1001)
	for i := range too {
		too[i] = map[string]any{"external_id": "x"}
	}
	checkProblem(t, a.post("/v1/import", map[string]any{"customers": too}), 422, "validation-error", "customers", "1001 customers")
	checkProblem(t, a.post("/v1/import", map[string]any{"options": map[string]any{}}), 422, "validation-error", "customers", "no customers")
	blocks := make([]any, 101)
	for i := range blocks {
		blocks[i] = map[string]any{"credits": 1}
	}
	r = a.post("/v1/import", map[string]any{"customers": []any{map[string]any{"external_id": uniq("many"), "credits": blocks}}})
	wantStatus(t, r, 200, "101 blocks")
	if jsonInt(r.Body["created"]) != 0 || len(arr(t, r.Body["errors"], "errors")) != 1 {
		t.Errorf("101 blocks: %s", r.Raw)
	}
	checkProblem(t, a.post("/v1/import", `[1]`), 400, "bad-request", "", "not an object")
	checkProblem(t, a.do("POST", "/v1/import", "", map[string]any{"customers": []any{}}), 422, "validation-error", "Idempotency-Key", "no Idempotency-Key")
	checkProblem(t, s.as(t, "").post("/v1/import", map[string]any{"customers": []any{}}), 401, "unauthorized", "", "no API key")
	r = a.post("/v1/import", map[string]any{"customers": []any{}})
	if r.Status != 200 || jsonInt(r.Body["created"]) != 0 || len(arr(t, r.Body["errors"], "errors")) != 0 {
		t.Errorf("empty import %d %s", r.Status, r.Raw)
	}
}
