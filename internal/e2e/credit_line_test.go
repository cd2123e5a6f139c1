package e2e

import (
	"context"
	"fmt"
	"net/url"
	"testing"
)

// lineCustomer creates a block customer with credit line limit and grants
// it credits; it returns the customer's id.
func (a api) lineCustomer(limit, credits int64) string {
	a.t.Helper()
	c := a.createCustomer(map[string]any{"external_id": uniq("line"), "overage_policy": "block", "credit_limit_mc": limit})
	if Int(a.t, c["credit_limit_mc"]) != limit {
		a.t.Fatalf("created customer: %v, want credit_limit_mc %d", c, limit)
	}
	id := c["id"].(string)
	if credits > 0 {
		a.grant(id, map[string]any{"credits": credits})
	}
	return id
}

// consumeUnits consumes units of metric m for customer id.
func (a api) consumeUnits(id, m string, units int64) Response {
	a.t.Helper()
	return a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "billable_metric_key": m, "units": units})
}

// checkLine asserts the customer's balance and debt in the credits answer.
func (a api) checkLine(id string, balance, debt int64, what string) map[string]any {
	a.t.Helper()
	c := a.credits(id)
	if Int(a.t, c["balance"]) != balance || Int(a.t, c["debt_mc"]) != debt || Int(a.t, c["effective_balance"]) != balance {
		a.t.Errorf("%s: credits %v, want balance %d debt_mc %d", what, c, balance, debt)
	}
	return c
}

// TestCreditLine (issue 28 item 2): a block customer with credit_limit_mc
// may spend its effective balance down to minus the limit and no further
// (consume, dry run, check, reservation and commit agree on the bound); the
// debt shows in the credits answer and the ledger, the next grant pays it
// first (a debt_repayment entry), credit.exhausted fires when the line is
// used up, and bad limits are 422s naming credit_limit_mc that change
// nothing.
func TestCreditLine(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("line"))
	a := s.as(t, tn.Live)
	m := a.perUnit(100)

	t.Run("bad limits", func(t *testing.T) {
		for _, bad := range []any{-1, 1_000_000_000_000_001, "10", 1.5} {
			r := a.post("/v1/customers", map[string]any{"external_id": uniq("bad"), "credit_limit_mc": bad})
			checkProblem(t, r, 422, "validation-error", "credit_limit_mc", fmt.Sprintf("create with %v", bad))
		}
		id := a.lineCustomer(100, 0)
		r := a.patch("/v1/customers/"+id, map[string]any{"credit_limit_mc": -5})
		checkProblem(t, r, 422, "validation-error", "credit_limit_mc", "patch with -5")
		if c := a.get("/v1/customers/" + id); Int(t, c.Body["credit_limit_mc"]) != 100 {
			t.Errorf("a refused patch changed the limit: %s", c.Raw)
		}
	})

	id := a.lineCustomer(500, 1000)
	t.Run("a charge into the line", func(t *testing.T) {
		r := a.consumeUnits(id, m, 12)
		if !checkStatus(t, r, 200, "consume 1200 of 1000 + 500") {
			return
		}
		if Int(t, r.Body["charged"]) != 1200 || Int(t, r.Body["balance_after"]) != -200 || Int(t, r.Body["overage_mc"]) != 0 {
			t.Errorf("consume answer: %s", r.Raw)
		}
		c := a.checkLine(id, -200, 200, "after 1200")
		if Int(t, c["credit_limit_mc"]) != 500 {
			t.Errorf("credits credit_limit_mc %v, want 500", c["credit_limit_mc"])
		}
		// The entry debits the whole cost; its draw says what the block paid.
		e := obj(t, a.history(id, "?type=consumption")[0], "entry")
		draws := arr(t, e["draws"], "draws")
		if Int(t, e["delta"]) != -1200 || len(draws) != 1 || Int(t, obj(t, draws[0], "draw")["amount"]) != 1000 {
			t.Errorf("consumption entry %v, want delta -1200 with one draw of 1000", e)
		}
	})

	t.Run("the bound, as check, dry run and consume see it", func(t *testing.T) {
		chk := a.get("/v1/customers/" + id + "/entitlements/" + url.PathEscape(m) + "?units=3")
		if checkStatus(t, chk, 200, "check 3") && (chk.Body["allowed"] != true || Int(t, chk.Body["available_mc"]) != 300 ||
			Int(t, chk.Body["credit_limit_mc"]) != 500) {
			t.Errorf("check of 3 units: %s", chk.Raw)
		}
		chk = a.get("/v1/customers/" + id + "/entitlements/" + url.PathEscape(m) + "?units=4")
		if checkStatus(t, chk, 200, "check 4") && chk.Body["allowed"] != false {
			t.Errorf("check of 4 units: %s", chk.Raw)
		}
		dry := a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": id, "billable_metric_key": m, "units": 4, "dry_run": true})
		checkProblem(t, dry, 409, "insufficient-credits", "", "dry run past the line")
		dry = a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": id, "billable_metric_key": m, "units": 3, "dry_run": true})
		if checkStatus(t, dry, 200, "dry run to the line") && Int(t, dry.Body["balance_after"]) != -500 {
			t.Errorf("dry run to the line: %s", dry.Raw)
		}
		checkProblem(t, a.consumeUnits(id, m, 4), 409, "insufficient-credits", "", "consume past the line")
		a.checkLine(id, -200, 200, "after the refusals")
		r := a.consumeUnits(id, m, 3)
		if checkStatus(t, r, 200, "consume to the line") && Int(t, r.Body["balance_after"]) != -500 {
			t.Errorf("consume to the line: %s", r.Raw)
		}
		checkProblem(t, a.consumeUnits(id, m, 1), 409, "insufficient-credits", "", "one more past the line")
		a.checkLine(id, -500, 500, "at the line")
		// The line used up fired credit.exhausted with the effective balance.
		found := false
		for _, ev := range a.exhaustedEvents(id, 1) {
			if d, ok := ev["data"].(map[string]any); ok && d["balance_mc"] != nil && Int(t, d["balance_mc"]) == -500 {
				found = true
			}
		}
		if !found {
			t.Errorf("no credit.exhausted with balance_mc -500 for %s", id)
		}
	})

	t.Run("the next grant pays the debt first", func(t *testing.T) {
		g := a.grant(id, map[string]any{"credits": 700})
		if acct := obj(t, g["account"], "account"); Int(t, acct["balance"]) != 200 {
			t.Errorf("grant account %v, want balance 200", acct)
		}
		c := a.checkLine(id, 200, 0, "after a grant of 700")
		blocks := arr(t, c["blocks"], "blocks")
		if len(blocks) != 1 || Int(t, obj(t, blocks[0], "block")["remaining_amount"]) != 200 {
			t.Errorf("blocks %v, want one of 200 left", blocks)
		}
		rep := a.history(id, "?type=debt_repayment")
		if len(rep) != 1 {
			t.Fatalf("debt_repayment entries %v, want 1", rep)
		}
		e := obj(t, rep[0], "entry")
		draws := arr(t, e["draws"], "draws")
		if Int(t, e["delta"]) != 0 || len(draws) != 1 || Int(t, obj(t, draws[0], "draw")["amount"]) != 500 {
			t.Errorf("repayment entry %v, want delta 0 and one draw of 500", e)
		}
	})

	t.Run("a reservation leans on the line", func(t *testing.T) {
		// Effective 200 + line 500: a reservation of 700 fits, 800 does not.
		over := a.post("/v1/reservations", map[string]any{"customer_id": id, "billable_metric_key": m, "estimated_units": 8})
		checkProblem(t, over, 409, "insufficient-credits", "", "reserve past the line")
		h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": m, "estimated_units": 7})
		if c := a.credits(id); Int(t, c["effective_balance"]) != -500 || Int(t, c["balance"]) != 200 {
			t.Errorf("after the reservation: %v", c)
		}
		past := a.post("/v1/reservations/"+h["id"].(string)+"/commit", map[string]any{"actual_units": 8})
		checkProblem(t, past, 409, "insufficient-credits", "", "commit past the line")
		r := a.post("/v1/reservations/"+h["id"].(string)+"/commit", map[string]any{"actual_units": 7})
		if checkStatus(t, r, 200, "commit to the line") && Int(t, obj(t, r.Body["account"], "account")["balance"]) != -500 {
			t.Errorf("commit: %s", r.Raw)
		}
		a.checkLine(id, -500, 500, "after the commit")
	})

	t.Run("a lower line refuses, it cancels no debt", func(t *testing.T) {
		r := a.patch("/v1/customers/"+id, map[string]any{"credit_limit_mc": 0})
		if checkStatus(t, r, 200, "patch the line to 0") && Int(t, r.Body["credit_limit_mc"]) != 0 {
			t.Errorf("patch: %s", r.Raw)
		}
		a.grant(id, map[string]any{"credits": 600})
		a.checkLine(id, 100, 0, "after a grant of 600")
		checkProblem(t, a.consumeUnits(id, m, 2), 409, "insufficient-credits", "", "past the balance without a line")
	})

	t.Run("reconcile finds the books balanced", func(t *testing.T) {
		wantReconciled(t, s, "at the end")
		var debt int64
		if err := s.Pool.QueryRow(context.Background(), `SELECT debt FROM credit_accounts WHERE customer_id = $1`, id).Scan(&debt); err != nil || debt != 0 {
			t.Errorf("credit_accounts.debt %d %v, want 0", debt, err)
		}
	})
}

// TestCreditLineRace protects invariant 2 with a credit line: 50 racing
// consumes of 100 against 1,000 of credit and a line of 500 succeed exactly
// 15 times, and the effective balance ends at exactly -500, never below.
func TestCreditLineRace(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("linerace"))
	a := s.as(t, tn.Live)
	m := a.perUnit(100)
	id := a.lineCustomer(500, 1000)
	const racers = 50
	ok, refused := raceTally(t, raceConsumes(s, tn.Live, racers, func(int) map[string]any {
		return map[string]any{"customer_id": id, "billable_metric_key": m, "units": 1}
	}), nil)
	if ok != 15 || refused != racers-15 {
		t.Fatalf("%d succeeded, %d refused; want exactly 15 and %d", ok, refused, racers-15)
	}
	a.checkLine(id, -500, 500, "after the race")
	wantReconciled(t, s, "after the race")
}

// TestCreditLineSurvivesRebuild: the debt is part of the state a rebuild
// restores from Postgres (credit_accounts.debt), and the limit lives on the
// customer: after FLUSHALL and `creditd rebuild` the account owes the same,
// the line still bounds the next consume, and a grant still pays the debt
// first.
func TestCreditLineSurvivesRebuild(t *testing.T) {
	t.Parallel()
	rb := newRebuildable(t, "cl", "linerebuild")
	s, a := rb.s, rb.a
	m := a.perUnit(100)
	id := a.lineCustomer(500, 1000)
	wantStatus(t, a.consumeUnits(id, m, 13), 200, "consume 1300")
	before := a.checkLine(id, -300, 300, "before the flush")
	rb.flushAndRebuild(t)
	after := a.checkLine(id, -300, 300, "after the rebuild")
	if Int(t, after["version"]) != Int(t, before["version"]) {
		t.Errorf("version %v after the rebuild, want %v", after["version"], before["version"])
	}
	if rep := reconcileOf(t, s, false); rep.Found != 0 {
		t.Errorf("reconcile after the rebuild: %+v", rep.First)
	}
	checkProblem(t, a.consumeUnits(id, m, 3), 409, "insufficient-credits", "", "past the line after the rebuild")
	wantStatus(t, a.consumeUnits(id, m, 2), 200, "to the line after the rebuild")
	a.grant(id, map[string]any{"credits": 1000})
	a.checkLine(id, 500, 0, "after a grant")
}
