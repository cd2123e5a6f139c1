package e2e

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestConformanceCreditsNoAccount: Credit account: a customer without an
// account row reads as zero balances, id "", updated_at 0001-01-01, blocks
// []; an unknown customer is a 404 and is not created (Common rules 4).
func TestConformanceCreditsNoAccount(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("noacct"))
	a := s.as(t, tn.Sandbox)
	id, ext := a.newCustomer()
	for _, p := range []string{
		"/v1/customers/" + id + "/credits",
		"/v1/customers/" + ext + "/credits?include_blocks=true",
		"/v1/customer-by-external-id/" + ext + "/credits",
	} {
		r := a.get(p)
		if !checkStatus(t, r, 200, p) {
			continue
		}
		b := r.Body
		for _, k := range []string{"balance", "reserved_balance", "pending_balance", "effective_balance", "lifetime_earned", "version"} {
			if v, ok := b[k].(json.Number); !ok || v.String() != "0" {
				t.Errorf("%s: %s = %v, want 0", p, k, b[k])
			}
		}
		if v, ok := b["id"]; !ok || v != "" {
			t.Errorf("%s: id = %#v, want \"\"", p, v)
		}
		if b["updated_at"] != "0001-01-01T00:00:00Z" {
			t.Errorf("%s: updated_at = %v, want 0001-01-01T00:00:00Z", p, b["updated_at"])
		}
		if blocks, ok := b["blocks"].([]any); !ok || len(blocks) != 0 {
			t.Errorf("%s: blocks = %#v, want []", p, b["blocks"])
		}
		if b["customer_id"] != id || b["tenant_id"] != tn.ID || b["environment"] != "sandbox" {
			t.Errorf("%s: customer_id %v tenant_id %v environment %v", p, b["customer_id"], b["tenant_id"], b["environment"])
		}
	}
	ghost := uniq("ghost")
	checkProblem(t, a.get("/v1/customers/"+ghost+"/credits"), 404, "not-found", "", "credits of unknown")
	checkProblem(t, a.get("/v1/customer-by-external-id/"+ghost+"/credits"), 404, "not-found", "", "strict credits of unknown")
	checkProblem(t, a.get("/v1/customers/"+ghost), 404, "not-found", "", "unknown after credit reads (not auto-created)")
}

// TestConformanceGrant: POST .../credits/grant: 201 {transaction, block,
// account}, one block and one ledger entry, auto-create on the lenient
// form, 404 on the strict form.
func TestConformanceGrant(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("grant"))
	a := s.as(t, tn.Live)
	id, ext := a.newCustomer()

	key := idemKey()
	r := a.do("POST", "/v1/customers/"+id+"/credits/grant", key, map[string]any{
		"credits": 12_345, "source": "referral", "reason": "friend joined", "duration_seconds": 3600,
		"priority": 7, "metadata": map[string]any{"campaign": "spring"}, "idempotency_key": "ignored-body-key",
	})
	wantStatus(t, r, 201, "grant")
	tx := obj(t, r.Body["transaction"], "transaction")
	blk := obj(t, r.Body["block"], "block")
	acct := obj(t, r.Body["account"], "account")

	checkUUID(t, tx["id"], "transaction.id")
	if tx["tenant_id"] != tn.ID || tx["customer_id"] != id || tx["environment"] != "live" {
		t.Errorf("transaction ids: %v", tx)
	}
	if Int(t, tx["delta"]) != 12_345 || tx["source"] != "referral" {
		t.Errorf("transaction delta %v source %v", tx["delta"], tx["source"])
	}
	// docs/decisions.md: a manual grant is an `adjustment` entry.
	if tx["type"] != "adjustment" {
		t.Errorf("transaction type %v, want adjustment (docs/decisions.md)", tx["type"])
	}
	if tx["credit_block_id"] != blk["id"] {
		t.Errorf("transaction.credit_block_id %v, block.id %v", tx["credit_block_id"], blk["id"])
	}
	if tx["idempotency_key"] != key {
		t.Errorf("transaction.idempotency_key %v, want the header value %s", tx["idempotency_key"], key)
	}
	obj(t, tx["metadata"], "transaction.metadata")
	txAt := checkTime(t, tx["created_at"], "transaction.created_at")

	checkUUID(t, blk["id"], "block.id")
	if blk["customer_id"] != id || Int(t, blk["original_amount"]) != 12_345 || Int(t, blk["remaining_amount"]) != 12_345 ||
		blk["source"] != "referral" || Int(t, blk["priority"]) != 7 || blk["applies_to"] != nil {
		t.Errorf("block %v", blk)
	}
	exp := checkTime(t, blk["expires_at"], "block.expires_at")
	if d := exp.Sub(txAt); d < 3599*time.Second || d > 3601*time.Second {
		t.Errorf("block expires %v after the grant, want 1 h (duration_seconds)", d)
	}
	checkTime(t, blk["created_at"], "block.created_at")

	if acct["customer_id"] != id || Int(t, acct["balance"]) != 12_345 || Int(t, acct["reserved_balance"]) != 0 ||
		Int(t, acct["lifetime_earned"]) != 12_345 {
		t.Errorf("account %v", acct)
	}
	v1 := Int(t, acct["version"])
	if v1 < 1 {
		t.Errorf("account.version %d after the first grant, want >= 1", v1)
	}

	// A second grant: explicit expires_at, default priority and metadata.
	expAt := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Millisecond)
	r2 := a.post("/v1/customers/"+ext+"/credits/grant", map[string]any{
		"credits": 1000, "source": "promotional", "reason": "r", "expires_at": expAt.Format(time.RFC3339Nano),
	})
	wantStatus(t, r2, 201, "second grant by external id")
	b2 := obj(t, r2.Body["block"], "block")
	if got := checkTime(t, b2["expires_at"], "expires_at"); !got.Equal(expAt) {
		t.Errorf("block.expires_at %v, want %v", got, expAt)
	}
	if Int(t, b2["priority"]) != 0 {
		t.Errorf("default priority %v, want 0", b2["priority"])
	}
	a2 := obj(t, r2.Body["account"], "account")
	if Int(t, a2["balance"]) != 13_345 || Int(t, a2["lifetime_earned"]) != 13_345 || Int(t, a2["version"]) <= v1 {
		t.Errorf("account after second grant %v (version before %d)", a2, v1)
	}
	if md, ok := obj(t, r2.Body["transaction"], "tx")["metadata"].(map[string]any); !ok || len(md) != 0 {
		t.Errorf("default transaction metadata %v, want {}", md)
	}

	// GET credits agrees, with both blocks.
	c := a.credits(id)
	if Int(t, c["balance"]) != 13_345 || Int(t, c["effective_balance"]) != 13_345 || Int(t, c["lifetime_earned"]) != 13_345 {
		t.Errorf("credits %v", c)
	}
	if c["id"] == "" {
		t.Error("account id is still empty after grants")
	}
	if u := checkTime(t, c["updated_at"], "account updated_at"); u.Year() < 2000 {
		t.Errorf("account updated_at %v after grants", c["updated_at"])
	}
	if len(arr(t, c["blocks"], "blocks")) != 2 {
		t.Errorf("blocks %v, want 2", c["blocks"])
	}
	if b := a.get("/v1/customers/" + id + "/credits"); len(arr(t, b.Body["blocks"], "blocks")) != 0 {
		t.Errorf("blocks without include_blocks: %v, want []", b.Body["blocks"])
	}

	// expires_at with an offset is the same instant.
	off := time.Now().Add(72 * time.Hour).Truncate(time.Second).In(time.FixedZone("x", 2*3600))
	ro := a.post("/v1/customers/"+id+"/credits/grant", map[string]any{"credits": 1, "source": "manual", "reason": "r", "expires_at": off.Format(time.RFC3339)})
	if checkStatus(t, ro, 201, "expires_at with offset") {
		if got := checkTime(t, obj(t, ro.Body["block"], "b")["expires_at"], "expires_at"); !got.Equal(off) {
			t.Errorf("expires_at %v, want the instant %v", got, off)
		}
	}

	// A UUID-shaped value that names nobody is an external id to create.
	ghostUUID := "0190a5c4-1111-7222-8333-444455556666"
	ug := a.post("/v1/customers/"+ghostUUID+"/credits/grant", map[string]any{"credits": 1, "source": "manual", "reason": "r"})
	if checkStatus(t, ug, 201, "grant to an unknown UUID-shaped id") {
		cr := a.get("/v1/customer-by-external-id/" + ghostUUID)
		if checkStatus(t, cr, 200, "customer created from a UUID-shaped id") && (cr.Body["external_id"] != ghostUUID || cr.Body["id"] == ghostUUID) {
			t.Errorf("created %s", cr.Raw)
		}
	}

	// Limits inclusive.
	a.grant(id, map[string]any{"credits": 1, "duration_seconds": 315360000, "priority": 255})

	// Lenient unknown id auto-creates the customer.
	auto := uniq("auto")
	ar := a.post("/v1/customers/"+auto+"/credits/grant", map[string]any{"credits": 500, "source": "manual", "reason": "r"})
	wantStatus(t, ar, 201, "grant auto-creates")
	cr := a.get("/v1/customers/" + auto)
	if checkStatus(t, cr, 200, "auto-created customer") {
		if cr.Body["external_id"] != auto || cr.Body["id"] == auto || cr.Body["display_name"] != nil {
			t.Errorf("auto-created customer %s", cr.Raw)
		}
		if obj(t, ar.Body["account"], "account")["customer_id"] != cr.Body["id"] {
			t.Errorf("grant account.customer_id %v, auto-created id %v", obj(t, ar.Body["account"], "a")["customer_id"], cr.Body["id"])
		}
	}
	if bal := a.balance(auto); bal != 500 {
		t.Errorf("auto-created balance %d, want 500", bal)
	}

	// The strict form never creates.
	strict := uniq("strict")
	checkProblem(t, a.post("/v1/customer-by-external-id/"+strict+"/credits/grant",
		map[string]any{"credits": 500, "source": "manual", "reason": "r"}), 404, "not-found", "", "strict grant unknown")
	checkProblem(t, a.get("/v1/customers/"+strict), 404, "not-found", "", "strict grant did not create")
	sr := a.post("/v1/customer-by-external-id/"+ext+"/credits/grant", map[string]any{"credits": 5, "source": "migration", "reason": "r"})
	if checkStatus(t, sr, 201, "strict grant known") && obj(t, sr.Body["account"], "a")["customer_id"] != id {
		t.Errorf("strict grant hit %v", sr.Body["account"])
	}
}

// TestConformanceGrantValidation: Grant errors 422 naming the field; bad
// input changes nothing (invariant 9), not even auto-creating a customer.
func TestConformanceGrantValidation(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("gval"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1000, "duration_seconds": 3600, "metadata": map[string]any{"plan": "pro"}})
	before := a.credits(id)

	ok := func(extra map[string]any) map[string]any {
		b := map[string]any{"credits": 100, "source": "manual", "reason": "r"}
		for k, v := range extra {
			if v == nil {
				delete(b, k)
			} else {
				b[k] = v
			}
		}
		return b
	}
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	cases := []struct {
		name   string
		body   any
		fields []string // any of these is a correct field
	}{
		{"credits missing", ok(map[string]any{"credits": nil}), []string{"credits"}},
		{"credits 0", ok(map[string]any{"credits": 0}), []string{"credits"}},
		{"credits -1", ok(map[string]any{"credits": -1}), []string{"credits"}},
		{"credits string", ok(map[string]any{"credits": "abc"}), []string{"credits"}},
		{"credits fraction", ok(map[string]any{"credits": 1.5}), []string{"credits"}},
		{"credits 2^63", `{"credits": 9223372036854775808, "source": "manual", "reason": "r"}`, []string{"credits"}},
		{"source missing", ok(map[string]any{"source": nil}), []string{"source"}},
		{"source invalid", ok(map[string]any{"source": "gift"}), []string{"source"}},
		{"source plan_grant not a grant source", ok(map[string]any{"source": "plan_grant"}), []string{"source"}},
		{"reason missing", ok(map[string]any{"reason": nil}), []string{"reason"}},
		{"reason empty", ok(map[string]any{"reason": ""}), []string{"reason"}},
		{"expires_at and duration_seconds", ok(map[string]any{"expires_at": future, "duration_seconds": 60}), []string{"expires_at", "duration_seconds"}},
		{"duration_seconds 0", ok(map[string]any{"duration_seconds": 0}), []string{"duration_seconds"}},
		{"duration_seconds 315360001", ok(map[string]any{"duration_seconds": 315360001}), []string{"duration_seconds"}},
		{"priority 256", ok(map[string]any{"priority": 256}), []string{"priority"}},
		{"priority -1", ok(map[string]any{"priority": -1}), []string{"priority"}},
		{"stack_after without duration_seconds", ok(map[string]any{"stack_after": map[string]any{"metadata_match": map[string]any{"plan": "pro"}}}), []string{"duration_seconds", "stack_after"}},
		{"bad fallback", ok(map[string]any{"duration_seconds": 60, "stack_after": map[string]any{"metadata_match": map[string]any{"plan": "pro"}, "fallback": "later"}}), []string{"stack_after.fallback", "fallback", "stack_after"}},
		{"expires_at in the past", ok(map[string]any{"expires_at": past}), []string{"expires_at"}},
		{"expires_at not a date", ok(map[string]any{"expires_at": "next tuesday"}), []string{"expires_at"}},
	}
	for _, tc := range cases {
		for _, target := range []string{id, uniq("would-be-auto")} {
			r := a.post("/v1/customers/"+target+"/credits/grant", tc.body)
			checkProblem(t, r, 422, "validation-error", "", tc.name)
			if r.Status == 422 && !namesAny(r.Body, tc.fields) {
				t.Errorf("%s: problem names none of %v: %s", tc.name, tc.fields, r.Raw)
			}
			if target != id {
				checkProblem(t, a.get("/v1/customers/"+target), 404, "not-found", "", tc.name+": refused grant auto-created a customer")
			}
		}
	}
	after := a.credits(id)
	for _, k := range []string{"balance", "lifetime_earned", "version", "pending_balance"} {
		if fmt.Sprint(before[k]) != fmt.Sprint(after[k]) {
			t.Errorf("refused grants changed %s: %v -> %v", k, before[k], after[k])
		}
	}
	if h := a.history(id, ""); len(h) != 1 {
		t.Errorf("history has %d entries after refused grants, want 1", len(h))
	}
	checkProblem(t, a.post("/v1/customers/"+id+"/credits/grant", `{"credits": 5,`), 400, "bad-request", "", "unparseable grant")
}

func namesAny(body map[string]any, fields []string) bool {
	for _, f := range fields {
		if namesField(body, f) {
			return true
		}
	}
	return false
}

// TestConformanceSpendOrder: Credit block priority: lower priority first,
// ties by soonest expiry (a block without expiry last), then oldest; a
// negative adjust writes one entry per block drained (Credits adjust).
func TestConformanceSpendOrder(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("order"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	in1h := time.Now().Add(time.Hour).UTC().Truncate(time.Second).Format(time.RFC3339)
	in2h := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Second).Format(time.RFC3339)
	type g struct {
		name string
		body map[string]any
	}
	grants := []g{
		{"A p5 never", map[string]any{"credits": 1000, "priority": 5}},
		{"B p1 2h", map[string]any{"credits": 1000, "priority": 1, "expires_at": in2h}},
		{"C p1 1h", map[string]any{"credits": 1000, "priority": 1, "expires_at": in1h}},
		{"D p1 1h newer", map[string]any{"credits": 1000, "priority": 1, "expires_at": in1h}},
		{"E p0 never", map[string]any{"credits": 1000}},
		{"F p1 never", map[string]any{"credits": 1000, "priority": 1}},
	}
	blk := map[string]string{}
	name := map[string]string{}
	for _, gr := range grants {
		b := a.grant(id, gr.body)
		bid := obj(t, b["block"], "block")["id"].(string)
		blk[gr.name[:1]], name[bid] = bid, gr.name[:1]
		time.Sleep(3 * time.Millisecond)
	}
	// Spend order: E, C, D, B, F, A.
	steps := []struct {
		delta   int64
		drained []string // blocks touched, in order
		deltas  []int64
	}{
		{-2500, []string{"E", "C", "D"}, []int64{-1000, -1000, -500}},
		{-1000, []string{"D", "B"}, []int64{-500, -500}},
		{-1200, []string{"B", "F"}, []int64{-500, -700}},
	}
	balance := int64(6000)
	for i, st := range steps {
		r := a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": st.delta, "source": "manual", "reason": "spend"})
		wantStatus(t, r, 200, fmt.Sprintf("adjust %d", st.delta))
		if v, ok := r.Body["block"]; !ok || v != nil {
			t.Errorf("negative adjust block = %v, want null", v)
		}
		txs := arr(t, r.Body["transactions"], "transactions")
		var got []string
		var deltas []int64
		for _, x := range txs {
			e := obj(t, x, "tx")
			got = append(got, name[fmt.Sprint(e["credit_block_id"])])
			deltas = append(deltas, Int(t, e["delta"]))
			if e["type"] != "adjustment" || e["source"] != "manual" {
				t.Errorf("step %d entry type %v source %v", i, e["type"], e["source"])
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(st.drained) || fmt.Sprint(deltas) != fmt.Sprint(st.deltas) {
			t.Errorf("step %d (%d): drained %v %v, want %v %v", i, st.delta, got, deltas, st.drained, st.deltas)
		}
		balance += st.delta
		if Int(t, obj(t, r.Body["account"], "account")["balance"]) != balance {
			t.Errorf("step %d: account %v, want balance %d", i, r.Body["account"], balance)
		}
	}
	// Left: F 300, A 1000 (docs/decisions.md: the snapshot lists live
	// blocks in spend order).
	c := a.credits(id)
	blocks := arr(t, c["blocks"], "blocks")
	var live []string
	remaining := map[string]int64{}
	for _, b := range blocks {
		m := obj(t, b, "block")
		n := name[fmt.Sprint(m["id"])]
		live = append(live, n)
		remaining[n] = Int(t, m["remaining_amount"])
		if Int(t, m["original_amount"]) != 1000 {
			t.Errorf("block %s original_amount %v changed", n, m["original_amount"])
		}
	}
	if fmt.Sprint(live) != "[F A]" || remaining["F"] != 300 || remaining["A"] != 1000 {
		t.Errorf("live blocks %v remaining %v, want [F A] F=300 A=1000", live, remaining)
	}
	if Int(t, c["balance"]) != 1300 || Int(t, c["lifetime_earned"]) != 6000 {
		t.Errorf("balance %v lifetime %v, want 1300/6000", c["balance"], c["lifetime_earned"])
	}
}

// TestConformanceAdjust: POST .../credits/adjust: positive makes one block
// (priority 0, no expiry); negative past the effective balance is 409
// insufficient-credits with nothing changed; 404 without an account and for
// unknown customers (never auto-creates); 422 for delta 0.
func TestConformanceAdjust(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("adj"))
	a := s.as(t, tn.Live)
	id, ext := a.newCustomer()
	adj := func(cust string, delta any) Response {
		t.Helper()
		return a.post("/v1/customers/"+cust+"/credits/adjust", map[string]any{"delta": delta, "source": "compensation", "reason": "r"})
	}

	// Negative on a customer that never had an account: 404.
	checkProblem(t, adj(id, -1), 404, "not-found", "", "negative adjust without account")

	r := adj(id, 2500)
	wantStatus(t, r, 200, "positive adjust")
	txs := arr(t, r.Body["transactions"], "transactions")
	blk := obj(t, r.Body["block"], "block")
	if len(txs) != 1 {
		t.Fatalf("positive adjust: %d transactions, want 1", len(txs))
	}
	tx := obj(t, txs[0], "tx")
	if Int(t, tx["delta"]) != 2500 || tx["credit_block_id"] != blk["id"] || tx["source"] != "compensation" || tx["customer_id"] != id {
		t.Errorf("positive adjust entry %v block %v", tx, blk)
	}
	if Int(t, blk["priority"]) != 0 || Int(t, blk["original_amount"]) != 2500 || blk["source"] != "compensation" {
		t.Errorf("positive adjust block %v", blk)
	}
	if v, ok := blk["expires_at"]; !ok || v != nil {
		t.Errorf("positive adjust block expires_at %v, want null", v)
	}
	acct := obj(t, r.Body["account"], "account")
	if Int(t, acct["balance"]) != 2500 || Int(t, acct["lifetime_earned"]) != 2500 || acct["customer_id"] != id {
		t.Errorf("account %v", acct)
	}
	version := Int(t, acct["version"])

	// Too large: 409, nothing changed.
	checkProblem(t, adj(id, -2501), 409, "insufficient-credits", "", "negative larger than the balance")
	c := a.credits(id)
	if Int(t, c["balance"]) != 2500 || Int(t, c["version"]) != version {
		t.Errorf("after refused debit: balance %v version %v, want 2500/%d", c["balance"], c["version"], version)
	}

	// Strict form, exact drain.
	r = a.post("/v1/customer-by-external-id/"+ext+"/credits/adjust", map[string]any{"delta": -2500, "source": "manual", "reason": "r"})
	if checkStatus(t, r, 200, "strict negative adjust to zero") {
		if a := obj(t, r.Body["account"], "account"); Int(t, a["balance"]) != 0 || Int(t, a["lifetime_earned"]) != 2500 {
			t.Errorf("after draining: %v", a)
		}
	}
	checkProblem(t, adj(id, -1), 409, "insufficient-credits", "", "negative on an emptied account")

	for _, tc := range []struct {
		name  string
		body  any
		field string
	}{
		{"delta 0", map[string]any{"delta": 0, "source": "manual", "reason": "r"}, "delta"},
		{"delta missing", map[string]any{"source": "manual", "reason": "r"}, "delta"},
		{"delta string", map[string]any{"delta": "5", "source": "manual", "reason": "r"}, "delta"},
		{"source missing", map[string]any{"delta": 5, "reason": "r"}, "source"},
		{"source invalid", map[string]any{"delta": 5, "source": "topup", "reason": "r"}, "source"},
		{"reason missing", map[string]any{"delta": 5, "source": "manual"}, "reason"},
	} {
		checkProblem(t, a.post("/v1/customers/"+id+"/credits/adjust", tc.body), 422, "validation-error", tc.field, tc.name)
	}

	// Unknown customers: 404 on both forms and both signs, never created.
	ghost := uniq("ghost")
	checkProblem(t, adj(ghost, 100), 404, "not-found", "", "positive adjust unknown")
	checkProblem(t, adj(ghost, -100), 404, "not-found", "", "negative adjust unknown")
	checkProblem(t, a.post("/v1/customer-by-external-id/"+ghost+"/credits/adjust", map[string]any{"delta": 5, "source": "manual", "reason": "r"}), 404, "not-found", "", "strict adjust unknown")
	checkProblem(t, a.get("/v1/customers/"+ghost), 404, "not-found", "", "adjust did not auto-create")
	if c := a.credits(id); Int(t, c["balance"]) != 0 {
		t.Errorf("balance %v after refused adjusts, want 0", c["balance"])
	}
}

// TestConformanceStackAfter: stack_after starts the new block when the
// latest-expiring matching block ends; its credits are pending until then;
// fallback reject is a 409 with nothing granted; fallback now starts now.
func TestConformanceStackAfter(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("stack"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1000, "duration_seconds": 3600, "metadata": map[string]any{"plan": "pro", "n": 1}})
	late := a.grant(id, map[string]any{"credits": 500, "duration_seconds": 7200, "metadata": map[string]any{"plan": "pro", "n": 2}})
	lateExp := checkTime(t, obj(t, late["block"], "block")["expires_at"], "late expires_at")
	a.grant(id, map[string]any{"credits": 4000, "duration_seconds": 20000, "metadata": map[string]any{"plan": "basic"}})
	a.grant(id, map[string]any{"credits": 100, "metadata": map[string]any{"plan": "pro"}}) // no expiry: never a stack target

	r := a.post("/v1/customers/"+id+"/credits/grant", map[string]any{
		"credits": 300, "source": "promotional", "reason": "next period", "duration_seconds": 600,
		"stack_after": map[string]any{"metadata_match": map[string]any{"plan": "pro"}},
	})
	wantStatus(t, r, 201, "stacked grant")
	blk := obj(t, r.Body["block"], "block")
	if exp := checkTime(t, blk["expires_at"], "stacked expires_at"); exp.Sub(lateExp) < 599*time.Second || exp.Sub(lateExp) > 601*time.Second {
		t.Errorf("stacked block expires %v, want 600 s after the latest matching block's end %v", exp, lateExp)
	}
	if sa, ok := blk["starts_at"]; ok {
		if st := checkTime(t, sa, "starts_at"); st.Sub(lateExp).Abs() > time.Second {
			t.Errorf("stacked block starts_at %v, want %v", st, lateExp)
		}
	}
	acct := obj(t, r.Body["account"], "account")
	if Int(t, acct["balance"]) != 5900 {
		t.Errorf("account balance %v, want 5900 (pending counts in balance)", acct["balance"])
	}
	// docs/decisions.md: the grant's account also carries pending and effective.
	if fmt.Sprint(acct["pending_balance"]) != "300" || fmt.Sprint(acct["effective_balance"]) != "5600" {
		t.Errorf("grant account pending %v effective %v, want 300/5600", acct["pending_balance"], acct["effective_balance"])
	}
	c := a.credits(id)
	if Int(t, c["balance"]) != 5900 || Int(t, c["pending_balance"]) != 300 || Int(t, c["effective_balance"]) != 5600 {
		t.Errorf("after stacked grant: balance %v pending %v effective %v, want 5900/300/5600", c["balance"], c["pending_balance"], c["effective_balance"])
	}

	// docs/decisions.md: a negative adjust spends only the effective balance.
	checkProblem(t, a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": -5601, "source": "manual", "reason": "r"}),
		409, "insufficient-credits", "", "debit into pending credit")

	// No match, fallback reject: 409 and nothing granted.
	before := a.credits(id)
	r = a.post("/v1/customers/"+id+"/credits/grant", map[string]any{
		"credits": 50, "source": "promotional", "reason": "r", "duration_seconds": 60,
		"stack_after": map[string]any{"metadata_match": map[string]any{"plan": "enterprise"}, "fallback": "reject"},
	})
	checkProblem(t, r, 409, "conflict", "", "stack_after reject without match")
	after := a.credits(id)
	if fmt.Sprint(before["balance"], before["version"], before["lifetime_earned"]) != fmt.Sprint(after["balance"], after["version"], after["lifetime_earned"]) {
		t.Errorf("rejected stack changed the account: %v -> %v", before, after)
	}

	// No match, fallback now (explicit and default): starts now, not pending.
	for _, fb := range []any{"now", nil} {
		sa := map[string]any{"metadata_match": map[string]any{"plan": "enterprise"}}
		if fb != nil {
			sa["fallback"] = fb
		}
		now := time.Now()
		r = a.post("/v1/customers/"+id+"/credits/grant", map[string]any{
			"credits": 50, "source": "promotional", "reason": "r", "duration_seconds": 60, "stack_after": sa,
		})
		wantStatus(t, r, 201, fmt.Sprintf("fallback %v", fb))
		if exp := checkTime(t, obj(t, r.Body["block"], "block")["expires_at"], "fallback expires_at"); exp.Sub(now) < 55*time.Second || exp.Sub(now) > 65*time.Second {
			t.Errorf("fallback %v block expires %v from now, want ~60 s", fb, exp.Sub(now))
		}
	}
	c = a.credits(id)
	if Int(t, c["balance"]) != 6000 || Int(t, c["pending_balance"]) != 300 || Int(t, c["effective_balance"]) != 5700 {
		t.Errorf("after fallback grants: balance %v pending %v effective %v, want 6000/300/5700", c["balance"], c["pending_balance"], c["effective_balance"])
	}
}

// TestConformanceExpiry: a block stops counting at expires_at, and the
// ledger records an `expiry` entry (docs/decisions.md: sweep or next
// mutation).
func TestConformanceExpiry(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("exp"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 250})
	expAt := time.Now().Add(1500 * time.Millisecond).UTC()
	g := a.grant(id, map[string]any{"credits": 1000, "expires_at": expAt.Format(time.RFC3339Nano)})
	bid := obj(t, g["block"], "block")["id"]
	if bal := Int(t, obj(t, g["account"], "account")["balance"]); bal != 1250 {
		t.Fatalf("balance in the grant answer %d, want 1250", bal)
	}
	if c := a.credits(id); time.Now().Before(expAt) && Int(t, c["balance"]) != 1250 {
		t.Fatalf("balance before expiry %v, want 1250", c["balance"])
	}
	deadline := time.Now().Add(6 * time.Second)
	var c map[string]any
	for {
		c = a.credits(id)
		if Int(t, c["balance"]) == 250 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if time.Now().Before(expAt) {
		t.Errorf("the block stopped counting before its expires_at")
	}
	if Int(t, c["balance"]) != 250 || Int(t, c["effective_balance"]) != 250 || Int(t, c["lifetime_earned"]) != 1250 {
		t.Fatalf("after expiry: balance %v effective %v lifetime %v, want 250/250/1250", c["balance"], c["effective_balance"], c["lifetime_earned"])
	}
	if blocks := arr(t, c["blocks"], "blocks"); len(blocks) != 1 {
		t.Errorf("%d live blocks after expiry, want 1", len(blocks))
	}
	var found map[string]any
	for time.Now().Before(deadline.Add(2 * time.Second)) {
		for _, e := range a.history(id, "?type=expiry") {
			found = obj(t, e, "entry")
		}
		if found != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if found == nil {
		t.Fatal("no expiry entry in history")
	}
	if Int(t, found["delta"]) != -1000 || found["credit_block_id"] != bid || found["type"] != "expiry" {
		t.Errorf("expiry entry %v, want delta -1000 on block %v", found, bid)
	}
	// Expired credit cannot be spent.
	checkProblem(t, a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": -251, "source": "manual", "reason": "r"}),
		409, "insufficient-credits", "", "debit of expired credit")
	// Books balance (invariant 1): the ledger sums to the balance.
	var sum int64
	for _, e := range a.history(id, "?limit=100") {
		sum += Int(t, obj(t, e, "e")["delta"])
	}
	if sum != 250 {
		t.Errorf("ledger sums to %d, balance 250", sum)
	}
}

// TestConformanceOverflow: invariant 7 and docs/decisions.md: int64 max is
// grantable on an empty account; one more millicredit is 422 and changes
// nothing; 2^63 is 422.
func TestConformanceOverflow(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("ovf"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	const max = "9223372036854775807"
	r := a.post("/v1/customers/"+id+"/credits/grant", `{"credits": `+max+`, "source": "migration", "reason": "max"}`)
	wantStatus(t, r, 201, "grant int64 max")
	if n := obj(t, r.Body["account"], "account")["balance"]; fmt.Sprint(n) != max {
		t.Errorf("account.balance %v, want %s", n, max)
	}
	c := a.credits(id)
	if fmt.Sprint(c["balance"]) != max || fmt.Sprint(c["effective_balance"]) != max {
		t.Errorf("credits %v / %v, want %s exactly", c["balance"], c["effective_balance"], max)
	}
	version := c["version"]
	checkProblem(t, a.post("/v1/customers/"+id+"/credits/grant", map[string]any{"credits": 1, "source": "manual", "reason": "r"}),
		422, "validation-error", "", "grant past int64")
	checkProblem(t, a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": 1, "source": "manual", "reason": "r"}),
		422, "validation-error", "", "adjust past int64")
	checkProblem(t, a.post("/v1/customers/"+id+"/credits/grant", `{"credits": 9223372036854775808, "source": "manual", "reason": "r"}`),
		422, "validation-error", "credits", "credits 2^63")
	c = a.credits(id)
	if fmt.Sprint(c["balance"]) != max || fmt.Sprint(c["version"]) != fmt.Sprint(version) {
		t.Errorf("refused overflow changed the account: balance %v version %v", c["balance"], c["version"])
	}
	// Spending from the max works exactly.
	r = a.post("/v1/customers/"+id+"/credits/adjust", `{"delta": -9223372036854775806, "source": "manual", "reason": "r"}`)
	if checkStatus(t, r, 200, "debit almost everything") {
		if b := obj(t, r.Body["account"], "account")["balance"]; fmt.Sprint(b) != "1" {
			t.Errorf("balance after debit %v, want 1", b)
		}
	}
	if h := a.history(id, ""); len(h) != 2 {
		t.Errorf("history has %d entries, want 2", len(h))
	}
}

// TestConformanceRacingAdjusts: invariant 2: N racing debits against credit
// for K succeed exactly K times and the balance never goes below zero; the
// others get 409 (insufficient-credits, or conflict retried with the same
// key as the Credits errors say). Racing grants all land.
func TestConformanceRacingAdjusts(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("racing"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	const n, k = 24, 5
	a.grant(id, map[string]any{"credits": k * 1000})

	run := func(body map[string]any) []Response {
		out := make([]Response, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := idemKey()
				<-start
				for try := 0; try < 20; try++ {
					began := time.Now()
					out[i] = Call(t, s.HTTP, s.URL, "POST", "/v1/customers/"+id+"/credits/adjust", body,
						"X-API-Key", tn.Live, "Idempotency-Key", key)
					if d := time.Since(began); d > 2*time.Second {
						t.Logf("slow adjust: %v, answer %d %s", d, out[i].Status, out[i].Raw)
					}
					if out[i].Status != 409 || out[i].Body["type"] != "conflict" {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
		}
		close(start)
		wg.Wait()
		return out
	}
	ok, insufficient := 0, 0
	for i, r := range run(map[string]any{"delta": -1000, "source": "manual", "reason": "race"}) {
		switch {
		case r.Status == 200:
			ok++
		case r.Status == 409 && r.Body["type"] == "insufficient-credits":
			insufficient++
		default:
			t.Errorf("debit %d: %d %s", i, r.Status, r.Raw)
		}
	}
	if ok != k || insufficient != n-k {
		t.Errorf("%d racing debits of 1000 against %d: %d succeeded, %d insufficient; want %d and %d", n, k*1000, ok, insufficient, k, n-k)
	}
	c := a.credits(id)
	if Int(t, c["balance"]) != 0 || Int(t, c["effective_balance"]) != 0 {
		t.Errorf("after racing debits: balance %v effective %v, want 0", c["balance"], c["effective_balance"])
	}

	for i, r := range run(map[string]any{"delta": 250, "source": "manual", "reason": "race"}) {
		checkStatus(t, r, 200, fmt.Sprintf("racing credit %d", i))
	}
	c = a.credits(id)
	if Int(t, c["balance"]) != n*250 || Int(t, c["lifetime_earned"]) != k*1000+n*250 {
		t.Errorf("after racing credits: balance %v lifetime %v, want %d/%d", c["balance"], c["lifetime_earned"], n*250, k*1000+n*250)
	}
	// Books balance: the ledger sums to the balance, one entry per effect.
	var sum int64
	began := time.Now()
	h := a.history(id, "?limit=100")
	if d := time.Since(began); d > 2*time.Second {
		t.Logf("slow history read: %v", d)
	}
	for _, e := range h {
		sum += Int(t, obj(t, e, "e")["delta"])
	}
	if sum != n*250 || len(h) != 1+k+n {
		t.Errorf("ledger: %d entries summing to %d, want %d entries summing to %d", len(h), sum, 1+k+n, n*250)
	}
}

// TestConformanceAdjustEntries: every adjust entry carries the request's
// Idempotency-Key and the adjust's source and metadata; delta -2^63 is
// refused (invariant 7).
func TestConformanceAdjustEntries(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("adjent"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1000})
	a.grant(id, map[string]any{"credits": 1000})
	key := idemKey()
	r := a.do("POST", "/v1/customers/"+id+"/credits/adjust", key, map[string]any{
		"delta": -1500, "source": "compensation", "reason": "r", "metadata": map[string]any{"ticket": "T-1"}, "idempotency_key": "body-key-ignored",
	})
	wantStatus(t, r, 200, "adjust")
	txs := arr(t, r.Body["transactions"], "transactions")
	if len(txs) != 2 {
		t.Fatalf("%d transactions, want 2 (one per block drained)", len(txs))
	}
	for i, x := range txs {
		e := obj(t, x, "tx")
		if e["idempotency_key"] != key || e["source"] != "compensation" || e["customer_id"] != id || e["environment"] != "live" {
			t.Errorf("entry %d: %v", i, e)
		}
		if md, _ := e["metadata"].(map[string]any); md["ticket"] != "T-1" {
			t.Errorf("entry %d metadata %v, want ticket T-1", i, e["metadata"])
		}
		checkUUID(t, e["credit_block_id"], "credit_block_id")
	}
	checkProblem(t, a.post("/v1/customers/"+id+"/credits/adjust", `{"delta": -9223372036854775808, "source": "manual", "reason": "r"}`),
		422, "validation-error", "", "delta -2^63")
	if bal := a.balance(id); bal != 500 {
		t.Errorf("balance %d, want 500", bal)
	}
}

// TestConformanceStackedNotSpent: a stacked block's credits are pending until
// it starts, so a debit skips it even when its priority would put it first.
func TestConformanceStackedNotSpent(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("stackspend"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	base := a.grant(id, map[string]any{"credits": 1000, "priority": 5, "duration_seconds": 3600, "metadata": map[string]any{"plan": "pro"}})
	baseID := obj(t, base["block"], "block")["id"]
	st := a.grant(id, map[string]any{"credits": 300, "priority": 0, "duration_seconds": 600,
		"stack_after": map[string]any{"metadata_match": map[string]any{"plan": "pro"}, "fallback": "reject"}})
	stID := obj(t, st["block"], "block")["id"]
	r := a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": -500, "source": "manual", "reason": "r"})
	wantStatus(t, r, 200, "debit")
	for _, x := range arr(t, r.Body["transactions"], "transactions") {
		if e := obj(t, x, "tx"); e["credit_block_id"] != baseID {
			t.Errorf("debit drained block %v, want only the started block %v (stacked %v)", e["credit_block_id"], baseID, stID)
		}
	}
	c := a.credits(id)
	if Int(t, c["balance"]) != 800 || Int(t, c["pending_balance"]) != 300 || Int(t, c["effective_balance"]) != 500 {
		t.Errorf("after debit: balance %v pending %v effective %v, want 800/300/500", c["balance"], c["pending_balance"], c["effective_balance"])
	}
	for _, b := range arr(t, c["blocks"], "blocks") {
		if m := obj(t, b, "b"); m["id"] == stID && Int(t, m["remaining_amount"]) != 300 {
			t.Errorf("stacked block remaining %v, want 300", m["remaining_amount"])
		}
	}
}

// TestConformanceBooleanQueryAnyCase: boolean query parameters
// (`include_blocks`, `active_only`) take true and false in any letter case,
// as clients write them (Python's requests sends True and False); other
// words stay a 400 naming the parameter.
func TestConformanceBooleanQueryAnyCase(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("boolq"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 100})
	for q, blocks := range map[string]int{"True": 1, "TRUE": 1, "False": 0, "FALSE": 0, "true": 1, "0": 0} {
		r := a.get("/v1/customers/" + id + "/credits?include_blocks=" + q)
		if checkStatus(t, r, 200, "include_blocks="+q) {
			if n := len(arr(t, r.Body["blocks"], "blocks")); n != blocks {
				t.Errorf("include_blocks=%s: %d blocks, want %d", q, n, blocks)
			}
		}
	}
	wantStatus(t, a.get("/v1/metering-rules?active_only=True"), 200, "active_only=True")
	checkProblem(t, a.get("/v1/customers/"+id+"/credits?include_blocks=yes"), 400, "bad-request", "include_blocks", "include_blocks=yes")
}
