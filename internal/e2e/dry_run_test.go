package e2e

import (
	"testing"
)

// TestConsumeDryRun (issue 28 item 5): a consume with dry_run true answers
// what the charge would do (the cost, the balance after, the blocks it
// would drain in spend order, the events it would fire, or the refusal it
// would get) and changes nothing: the balance, the account version and the
// history stay, and the Idempotency-Key it carried is not consumed.
func TestConsumeDryRun(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("dry"))
	a := s.as(t, tn.Live)
	m := a.perUnit(10)
	m2 := a.perUnit(3)
	id, _ := a.newCustomer()
	// Two blocks: the one expiring first pays first.
	a.grant(id, map[string]any{"credits": 30, "expires_at": "2099-01-01T00:00:00Z"})
	a.grant(id, map[string]any{"credits": 50})
	before := a.credits(id)
	history := len(a.history(id, ""))

	unchanged := func(t *testing.T, what string) {
		t.Helper()
		c := a.credits(id)
		if Int(t, c["balance"]) != Int(t, before["balance"]) || Int(t, c["version"]) != Int(t, before["version"]) {
			t.Errorf("%s: balance %v version %v, want %v %v (nothing changed)", what, c["balance"], c["version"], before["balance"], before["version"])
		}
		if n := len(a.history(id, "")); n != history {
			t.Errorf("%s: %d history entries, want %d", what, n, history)
		}
	}

	t.Run("a charge over two blocks", func(t *testing.T) {
		// No Idempotency-Key: a dry run needs none.
		r := a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": id, "billable_metric_key": m, "units": 4, "dry_run": true})
		if !checkStatus(t, r, 200, "dry run") {
			return
		}
		if r.Body["dry_run"] != true || r.Body["transaction_id"] != nil || Int(t, r.Body["cost"]) != 40 ||
			Int(t, r.Body["charged"]) != 40 || Int(t, r.Body["balance_after"]) != 40 {
			t.Errorf("dry run answer: %s", r.Raw)
		}
		draws := arr(t, r.Body["draws"], "draws")
		if len(draws) != 2 || Int(t, obj(t, draws[0], "draw")["amount"]) != 30 || Int(t, obj(t, draws[1], "draw")["amount"]) != 10 {
			t.Errorf("draws %v, want 30 from the expiring block then 10", draws)
		}
		evs := arr(t, r.Body["events"], "events")
		if len(evs) == 0 || evs[0] != "credit.consumed" {
			t.Errorf("events %v, want credit.consumed first", evs)
		}
		unchanged(t, "after a dry run")
	})

	t.Run("the key is not consumed", func(t *testing.T) {
		key := idemKey()
		r := a.do("POST", "/v1/entitlements/consume", key, map[string]any{"customer_id": id, "billable_metric_key": m, "units": 1, "dry_run": true})
		checkStatus(t, r, 200, "dry run with a key")
		unchanged(t, "after a dry run with a key")
		// The same key with another body is a first use, not a mismatch.
		real := a.do("POST", "/v1/entitlements/consume", key, map[string]any{"customer_id": id, "billable_metric_key": m2, "units": 1})
		if checkStatus(t, real, 200, "real consume under the dry run's key") && (real.Body["dry_run"] != nil || real.Body["transaction_id"] == nil) {
			t.Errorf("real consume answer: %s", real.Raw)
		}
		if b := a.balance(id); b != Int(t, before["balance"])-3 {
			t.Errorf("balance %d after the real consume, want %d", b, Int(t, before["balance"])-3)
		}
		before = a.credits(id)
		history = len(a.history(id, ""))
	})

	t.Run("the refusal it would get", func(t *testing.T) {
		r := a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": id, "billable_metric_key": m, "units": 100, "dry_run": true})
		checkProblem(t, r, 409, "insufficient-credits", "", "dry run past the balance")
		if r.Body["dry_run"] != true {
			t.Errorf("refusal lacks dry_run true: %s", r.Raw)
		}
		arr(t, r.Body["events"], "events")
		unchanged(t, "after a refused dry run")
	})

	t.Run("items", func(t *testing.T) {
		r := a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": id, "items": items(m, 1, m2, 2), "dry_run": true})
		if checkStatus(t, r, 200, "dry run of items") && (Int(t, r.Body["cost"]) != 16 || len(arr(t, r.Body["items"], "items")) != 2 || r.Body["dry_run"] != true) {
			t.Errorf("items dry run: %s", r.Raw)
		}
		unchanged(t, "after a dry run of items")
	})

	t.Run("an unknown customer is not created", func(t *testing.T) {
		ext := uniq("nobody")
		checkProblem(t, a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": ext, "billable_metric_key": m, "units": 1, "dry_run": true}),
			404, "not-found", "", "dry run for an unknown customer")
		wantStatus(t, a.get("/v1/customer-by-external-id/"+ext), 404, "the customer a dry run named")
	})

	t.Run("bad input", func(t *testing.T) {
		checkProblem(t, a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": id, "billable_metric_key": m, "units": 1, "dry_run": "yes"}),
			422, "validation-error", "dry_run", "dry_run not a boolean")
		// dry_run false is an ordinary consume: it needs its key.
		checkProblem(t, a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": id, "billable_metric_key": m, "units": 1, "dry_run": false}),
			422, "validation-error", "Idempotency-Key", "dry_run false without a key")
		unchanged(t, "after refused dry runs")
	})
}

// TestReservationDryRun (issue 28 item 5): a reservation with dry_run true
// answers 200 with the reservation as it would be taken (no id: it does not
// exist), or the refusal it would get, and takes nothing.
func TestReservationDryRun(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("dry-hold"))
	a := s.as(t, tn.Live)
	m := a.perUnit(10)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 100})
	before := a.credits(id)
	reservations := func() int {
		r := a.get("/v1/customers/" + id + "/reservations")
		wantStatus(t, r, 200, "list reservations")
		return len(arr(t, r.Body["data"], "reservations"))
	}

	r := a.do("POST", "/v1/reservations", "", map[string]any{"customer_id": id, "billable_metric_key": m, "estimated_units": 3,
		"ttl_seconds": 60, "dry_run": true})
	if checkStatus(t, r, 200, "dry run reservation") {
		acct := obj(t, r.Body["account"], "account")
		if r.Body["dry_run"] != true || r.Body["id"] != nil || r.Body["status"] != "active" || Int(t, r.Body["estimated_cost"]) != 30 ||
			Int(t, acct["reserved_balance"]) != 30 || Int(t, acct["effective_balance"]) != 70 {
			t.Errorf("dry run reservation: %s", r.Raw)
		}
		arr(t, r.Body["events"], "events")
	}
	checkProblem(t, a.do("POST", "/v1/reservations", "", map[string]any{"customer_id": id, "billable_metric_key": m, "estimated_units": 11,
		"ttl_seconds": 60, "dry_run": true}), 409, "insufficient-credits", "", "dry run past the balance")
	checkProblem(t, a.do("POST", "/v1/reservations", "", map[string]any{"customer_id": id, "billable_metric_key": m, "estimated_units": 1,
		"ttl_seconds": 60, "dry_run": 1}), 422, "validation-error", "dry_run", "dry_run not a boolean")
	checkProblem(t, a.do("POST", "/v1/reservations", "", map[string]any{"customer_id": uniq("nobody"), "billable_metric_key": m,
		"estimated_units": 1, "ttl_seconds": 60, "dry_run": true}), 404, "not-found", "", "dry run for an unknown customer")

	c := a.credits(id)
	if Int(t, c["reserved_balance"]) != 0 || Int(t, c["version"]) != Int(t, before["version"]) {
		t.Errorf("after dry runs: reserved %v version %v, want 0 and %v", c["reserved_balance"], c["version"], before["version"])
	}
	if n := reservations(); n != 0 {
		t.Errorf("%d reservations after dry runs, want none", n)
	}
	// A real reservation still goes through, and is listed.
	wantStatus(t, a.post("/v1/reservations", map[string]any{"customer_id": id, "billable_metric_key": m, "estimated_units": 3, "ttl_seconds": 60}),
		201, "real reservation")
	if n := reservations(); n != 1 {
		t.Errorf("%d reservations after a real one, want 1", n)
	}
}
