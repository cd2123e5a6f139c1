package e2e

import (
	"encoding/json"
	"testing"
	"time"
)

// eventsOfType lists the tenant's events of type typ for customer id, as
// delivered bodies (payload), newest first.
func (a api) eventsOfType(typ, customer string) []map[string]any {
	a.t.Helper()
	var out []map[string]any
	for _, e := range arr(a.t, a.get("/v1/webhooks/events?limit=100&event_type=" + typ).Body["data"], "events") {
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

// TestConformanceCreditExpiredEvent: docs/spec/addendum.md §8 "Also emitted: ...
// credit.expired (a block expired with credit left)": a block that expires
// with credit left fires one credit.expired naming its expiry ledger entry,
// the block, the credit it took and its source; a block that expires spent
// fires nothing, and the credit that stays fires nothing.
func TestConformanceCreditExpiredEvent(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("expired"))
	a := s.as(t, tn.Live)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 250})
	g := a.grant(id, map[string]any{"credits": 1000, "source": "referral", "duration_seconds": 2})
	bid := obj(t, g["block"], "block")["id"]
	spent := a.grant(id, map[string]any{"credits": 100, "duration_seconds": 1})
	spentID := obj(t, spent["block"], "block")["id"]
	// Equal priorities spend the soonest expiry first: the debit drains the 100 block.
	wantStatus(t, a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{
		"delta": -100, "source": "manual", "reason": "spend"}), 200, "spend")

	deadline := time.Now().Add(8 * time.Second)
	var expiries []any
	for time.Now().Before(deadline) {
		if expiries = a.history(id, "?type=expiry"); len(expiries) > 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(expiries) == 0 {
		t.Fatal("no expiry entry in history")
	}
	byBlock := map[any]map[string]any{}
	for _, e := range expiries {
		en := obj(t, e, "entry")
		byBlock[en["credit_block_id"]] = en
	}
	var evs []map[string]any
	for time.Now().Before(deadline) {
		if evs = a.eventsOfType("credit.expired", id); len(evs) >= len(expiries) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(evs) != len(expiries) {
		t.Fatalf("%d credit.expired events for %d expiry entries", len(evs), len(expiries))
	}
	for _, ev := range evs {
		if ev["event_type"] != "credit.expired" || ev["external_customer_id"] != ext || ev["customer_id"] != id {
			t.Errorf("envelope %v", ev)
		}
		d := obj(t, ev["data"], "data")
		en, ok := byBlock[d["credit_block_id"]]
		if !ok {
			t.Errorf("credit.expired names block %v, which has no expiry entry", d["credit_block_id"])
			continue
		}
		if d["transaction_id"] != en["id"] || Int(t, d["credits"]) != -Int(t, en["delta"]) || d["source"] != en["source"] {
			t.Errorf("credit.expired data %v, expiry entry %v", d, en)
		}
		if d["credit_block_id"] == spentID {
			t.Errorf("credit.expired for a block that expired spent: %v", d)
		}
	}
	if en, ok := byBlock[bid]; !ok || Int(t, en["delta"]) >= 0 {
		t.Errorf("no expiry entry for the 1000 block: %v", byBlock)
	}
}
