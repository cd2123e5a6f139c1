package e2e

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// budgetCustomer creates a customer of policy with budgets and grants it
// credits; it returns the customer's id.
func (a api) budgetCustomer(policy string, credits int64, budgets []map[string]any) string {
	a.t.Helper()
	c := a.createCustomer(map[string]any{"external_id": uniq("bud"), "overage_policy": policy, "budgets": budgets})
	if got := arr(a.t, c["budgets"], "budgets"); len(got) != len(budgets) {
		a.t.Fatalf("created customer: %v, want %d budgets", c, len(budgets))
	}
	id := c["id"].(string)
	if credits > 0 {
		a.grant(id, map[string]any{"credits": credits})
	}
	return id
}

// budgetEvents waits for want credit.budget_reached events of customer.
func (a api) budgetEvents(customer string, want int) []map[string]any {
	a.t.Helper()
	var out []map[string]any
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		out = out[:0]
		for _, e := range arr(a.t, a.get("/v1/webhooks/events?limit=100&event_type=credit.budget_reached").Body["data"], "events") {
			ev := obj(a.t, e, "event")
			if body, ok := ev["payload"].(map[string]any); ok && body["customer_id"] == customer {
				out = append(out, body)
			}
		}
		if len(out) >= want || time.Now().After(deadline) {
			return out
		}
	}
}

// budgetProblem asserts r is the 409 budget-exceeded naming the budget of
// period and metric (nil: every metric) at limit with spent counted.
func budgetProblem(t *testing.T, r Response, period string, metric any, limit, spent int64, what string) {
	t.Helper()
	checkProblem(t, r, 409, "budget-exceeded", "", what)
	b, ok := r.Body["budget"].(map[string]any)
	if !ok {
		t.Errorf("%s: no budget member: %s", what, r.Raw)
		return
	}
	if b["period"] != period || b["billable_metric_key"] != metric || Int(t, b["limit_mc"]) != limit || Int(t, b["spent_mc"]) != spent {
		t.Errorf("%s: budget %v, want %s %v limit %d spent %d", what, b, period, metric, limit, spent)
	}
	resets, err := time.Parse(time.RFC3339Nano, fmt.Sprint(b["resets_at"]))
	if err != nil || !resets.After(time.Now()) {
		t.Errorf("%s: resets_at %v (%v), want an instant ahead", what, b["resets_at"], err)
	}
}

// TestBudget (issue 28 item 3): a customer's budgets cap what consumes,
// reservations and commits spend per period whatever the balance and the policy;
// the refusal is a 409 budget-exceeded naming the cap and when it resets;
// credit.budget_reached fires once per period; a per-metric budget counts
// only its metric; bad budgets are 422s naming the member that change
// nothing.
func TestBudget(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("budget"))
	a := s.as(t, tn.Live)
	m := a.perUnit(100)
	other := a.perUnit(10)

	t.Run("bad budgets", func(t *testing.T) {
		cases := []struct {
			budget map[string]any
			field  string
		}{
			{map[string]any{"period": "week", "limit_mc": 1}, "budgets[0].period"},
			{map[string]any{"limit_mc": 1}, "budgets[0].period"},
			{map[string]any{"period": "day"}, "budgets[0].limit_mc"},
			{map[string]any{"period": "day", "limit_mc": -1}, "budgets[0].limit_mc"},
			{map[string]any{"period": "day", "limit_mc": 1, "time_zone": "Mars/Olympus"}, "budgets[0].time_zone"},
			{map[string]any{"period": "day", "limit_mc": 1, "billable_metric_key": "no spaces"}, "budgets[0].billable_metric_key"},
		}
		for _, c := range cases {
			r := a.post("/v1/customers", map[string]any{"external_id": uniq("bad"), "budgets": []any{c.budget}})
			checkProblem(t, r, 422, "validation-error", c.field, fmt.Sprintf("create with %v", c.budget))
		}
		id := a.budgetCustomer("block", 0, []map[string]any{{"period": "day", "limit_mc": 100}})
		dup := []any{map[string]any{"period": "month", "limit_mc": 1}, map[string]any{"period": "month", "limit_mc": 2}}
		checkProblem(t, a.patch("/v1/customers/"+id, map[string]any{"budgets": dup}), 422, "validation-error",
			"budgets[1].period", "two monthly budgets of every metric")
		if c := a.get("/v1/customers/" + id); len(arr(t, c.Body["budgets"], "budgets")) != 1 {
			t.Errorf("a refused patch changed the budgets: %s", c.Raw)
		}
	})

	// Under allow the balance never refuses: only the budget does.
	id := a.budgetCustomer("allow", 10_000, []map[string]any{
		{"period": "day", "limit_mc": 1000},
		{"period": "month", "time_zone": "America/New_York", "limit_mc": 5000, "billable_metric_key": other},
	})
	t.Run("a consume past the cap is refused", func(t *testing.T) {
		wantStatus(t, a.consumeUnits(id, m, 7), 200, "700 of 1000")
		// A dry run answers the refusal and the event it would fire, and
		// changes nothing: the real refusal still fires it.
		dry := a.do("POST", "/v1/entitlements/consume", "", map[string]any{"customer_id": id, "billable_metric_key": m, "units": 4, "dry_run": true})
		budgetProblem(t, dry, "day", nil, 1000, 700, "dry run of 1100 of 1000")
		if evs, _ := dry.Body["events"].([]any); dry.Body["dry_run"] != true || len(evs) != 1 || evs[0] != "credit.budget_reached" {
			t.Errorf("dry run refusal: %s, want dry_run and events [credit.budget_reached]", dry.Raw)
		}
		budgetProblem(t, a.consumeUnits(id, m, 4), "day", nil, 1000, 700, "1100 of 1000")
		// The refusal changed nothing: 300 still fit.
		if c := a.credits(id); Int(t, c["balance"]) != 9300 {
			t.Errorf("balance after the refusal: %v, want 9300", c["balance"])
		}
		// A per-metric budget counts only its metric; the daily one counts all.
		wantStatus(t, a.consumeUnits(id, other, 20), 200, "200 of metric other")
		budgetProblem(t, a.consumeUnits(id, m, 2), "day", nil, 1000, 900, "900 + 200")
		// A check knows the budget: 100 left, so 1 unit is allowed, 2 are not,
		// whatever the balance (10,000) and the policy (allow).
		for _, c := range []struct {
			units   int
			allowed bool
		}{{1, true}, {2, false}} {
			chk := a.get(fmt.Sprintf("/v1/customers/%s/entitlements/%s?units=%d", id, url.PathEscape(m), c.units))
			if checkStatus(t, chk, 200, "check") && (chk.Body["allowed"] != c.allowed || Int(t, chk.Body["budget_remaining_mc"]) != 100) {
				t.Errorf("check of %d units: %s, want allowed %v and budget_remaining_mc 100", c.units, chk.Raw, c.allowed)
			}
		}
		wantStatus(t, a.consumeUnits(id, m, 1), 200, "to the cap")
		budgetProblem(t, a.consumeUnits(id, other, 1), "day", nil, 1000, 1000, "past the cap")
		ev := a.budgetEvents(id, 1)
		if len(ev) != 1 {
			t.Fatalf("credit.budget_reached events %v, want exactly 1", ev)
		}
		d := obj(t, ev[0]["data"], "data")
		// The first refusal of the period fired it, at the spend then counted.
		if d["period"] != "day" || Int(t, d["limit_mc"]) != 1000 || Int(t, d["spent_mc"]) != 700 ||
			d["billable_metric_key"] != nil || d["refused"] != true {
			t.Errorf("credit.budget_reached data %v", d)
		}
	})

	t.Run("reservations are checked, commits counted", func(t *testing.T) {
		id := a.budgetCustomer("block", 10_000, []map[string]any{{"period": "month", "limit_mc": 1000, "billable_metric_key": m}})
		over := a.post("/v1/reservations", map[string]any{"customer_id": id, "billable_metric_key": m, "estimated_units": 11})
		budgetProblem(t, over, "month", m, 1000, 0, "a reservation past the cap")
		h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": m, "estimated_units": 6})
		r := a.post("/v1/reservations/"+h["id"].(string)+"/commit", map[string]any{"actual_units": 5})
		wantStatus(t, r, 200, "commit 500")
		budgetProblem(t, a.consumeUnits(id, m, 6), "month", m, 1000, 500, "600 after a commit of 500")
		wantStatus(t, a.consumeUnits(id, m, 5), 200, "500 to the cap")
		// The refusal came first in the period, so it fired the event, once.
		ev := a.budgetEvents(id, 1)
		if len(ev) != 1 || obj(t, ev[0]["data"], "data")["refused"] != true {
			t.Errorf("credit.budget_reached events %v, want one, refused", ev)
		}
		// No credit.exhausted for a budget's refusal.
		if ex := a.exhaustedEvents(id, 0); len(ex) != 0 {
			t.Errorf("credit.exhausted events %v, want none", ex)
		}
	})

	t.Run("usage events and multi-metric consumes respect budgets", func(t *testing.T) {
		// Per-metric daily 300 on other (10 a unit), every-metric daily 1000.
		id := a.budgetCustomer("block", 10_000, []map[string]any{
			{"period": "day", "limit_mc": 300, "billable_metric_key": other},
			{"period": "day", "limit_mc": 1000},
		})
		// 200 of other and 300 of m: both budgets allow it.
		wantStatus(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "items": items(other, 20, m, 3)}), 200, "multi 500")
		// Another 200 of other would take its budget to 400: all or nothing.
		r := a.post("/v1/entitlements/consume", map[string]any{"customer_id": id, "items": items(m, 1, other, 20)})
		budgetProblem(t, r, "day", other, 300, 200, "multi past other's cap")
		events := []any{
			map[string]any{"event_id": uniq("ev"), "customer_id": id, "billable_metric_key": m, "units": 4},
			map[string]any{"event_id": uniq("ev"), "customer_id": id, "billable_metric_key": m, "units": 2},
			map[string]any{"event_id": uniq("ev"), "customer_id": id, "billable_metric_key": other, "units": 10},
		}
		u := a.post("/v1/usage", map[string]any{"events": events})
		if !checkStatus(t, u, 200, "usage") {
			return
		}
		res := arr(t, u.Body["results"], "results")
		want := []string{"charged", "refused", "charged"} // 900, then 1100 > 1000, then 1000
		for i, w := range want {
			if got := obj(t, res[i], "result"); got["status"] != w {
				t.Errorf("usage event %d: %v, want %s", i, got, w)
			}
		}
		// The first budget of the list that refuses is named: other's is full too.
		budgetProblem(t, a.consumeUnits(id, other, 1), "day", other, 300, 300, "other after the usage events")
		budgetProblem(t, a.consumeUnits(id, m, 1), "day", nil, 1000, 1000, "m after the usage events")
	})

	t.Run("a raised limit keeps the count; removing the budgets lifts the cap", func(t *testing.T) {
		r := a.patch("/v1/customers/"+id, map[string]any{"budgets": []any{map[string]any{"period": "day", "limit_mc": 1500}}})
		if !checkStatus(t, r, 200, "raise the limit") {
			return
		}
		wantStatus(t, a.consumeUnits(id, m, 5), 200, "1000 + 500 of 1500")
		budgetProblem(t, a.consumeUnits(id, m, 1), "day", nil, 1500, 1500, "past the raised cap")
		wantStatus(t, a.patch("/v1/customers/"+id, map[string]any{"budgets": []any{}}), 200, "remove the budgets")
		wantStatus(t, a.consumeUnits(id, m, 1), 200, "without budgets")
	})

	t.Run("reconcile finds the counters equal", func(t *testing.T) {
		wantReconciled(t, s, "at the end")
	})
}

// TestBudgetRace: 50 racing consumes of 100 against a daily budget of 1,500
// (with ample credit) succeed exactly 15 times; the counter never passes
// the cap.
func TestBudgetRace(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("budrace"))
	a := s.as(t, tn.Live)
	m := a.perUnit(100)
	id := a.budgetCustomer("block", 100_000, []map[string]any{{"period": "day", "limit_mc": 1500}})
	const racers = 50
	ok, refused := raceTally(t, raceConsumes(s, tn.Live, racers, func(int) map[string]any {
		return map[string]any{"customer_id": id, "billable_metric_key": m, "units": 1}
	}), func(r Response) bool {
		return r.Body["type"] != nil && fmt.Sprint(r.Body["type"]) != "" && r.Body["budget"] != nil
	})
	if ok != 15 || refused != racers-15 {
		t.Fatalf("%d succeeded, %d refused; want exactly 15 and %d", ok, refused, racers-15)
	}
	c := a.credits(id)
	if Int(t, c["balance"]) != 100_000-1500 {
		t.Errorf("balance after the race %v, want %d", c["balance"], 100_000-1500)
	}
	// The credits answer shows the budget's spend in the period.
	if bs := arr(t, c["budgets"], "budgets"); len(bs) != 1 || Int(t, obj(t, bs[0], "budget")["spent_mc"]) != 1500 {
		t.Errorf("credits budgets %v, want one with spent_mc 1500", c["budgets"])
	}
	if ev := a.budgetEvents(id, 2); len(ev) != 1 {
		t.Errorf("credit.budget_reached events %d, want exactly 1", len(ev))
	}
	wantReconciled(t, s, "after the race")
}

// TestBudgetSurvivesRebuild: a budget's counter is rebuilt from the ledger
// (the consumption since the period's start): after FLUSHALL and `creditd
// rebuild` the cap still refuses at the same spend.
func TestBudgetSurvivesRebuild(t *testing.T) {
	t.Parallel()
	rb := newRebuildable(t, "bu", "budrebuild")
	s, a, rdb := rb.s, rb.a, rb.rdb
	m := a.perUnit(100)
	other := a.perUnit(10)
	id := a.budgetCustomer("allow", 600, []map[string]any{
		{"period": "day", "limit_mc": 1000},
		{"period": "month", "time_zone": "Asia/Kolkata", "limit_mc": 300, "billable_metric_key": other},
	})
	// A reservation of 100 (not counted), then 800 spent today, 300 of it past the
	// balance (overage counts too).
	h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": m, "estimated_units": 1})
	wantStatus(t, a.consumeUnits(id, m, 5), 200, "500")
	r := a.consumeUnits(id, other, 30)
	if checkStatus(t, r, 200, "300 of other") && Int(t, r.Body["overage_mc"]) != 300 {
		t.Errorf("consume of other: %s, want overage 300", r.Raw)
	}
	rb.flushAndRebuild(t)
	spent := map[string]int64{}
	for _, b := range arr(t, a.credits(id)["budgets"], "budgets") {
		bo := obj(t, b, "budget")
		spent[fmt.Sprint(bo["period"])] = Int(t, bo["spent_mc"])
	}
	if spent["day"] != 800 || spent["month"] != 300 {
		t.Errorf("rebuilt spend %v, want day 800 and month 300", spent)
	}
	if rep := reconcileOf(t, s, false); rep.Found != 0 {
		t.Errorf("reconcile after the rebuild: %+v", rep.First)
	}
	budgetProblem(t, a.consumeUnits(id, other, 1), "month", other, 300, 300, "other past its cap after the rebuild")
	budgetProblem(t, a.consumeUnits(id, m, 3), "day", nil, 1000, 800, "past the daily cap after the rebuild")
	wantStatus(t, a.post("/v1/reservations/"+h["id"].(string)+"/commit", map[string]any{"actual_units": 1}), 200, "commit 100")
	wantStatus(t, a.consumeUnits(id, m, 1), 200, "to the cap after the rebuild")
	budgetProblem(t, a.consumeUnits(id, m, 1), "day", nil, 1000, 1000, "at the cap")

	// A counter that disagrees with the ledger is a difference reconcile
	// finds, and its fix restores the ledger's count.
	s.Drain()
	ctx := context.Background()
	key := accountKeyOf(s, id)
	good, err := rdb.HGet(ctx, key, "u:d:").Result()
	if err != nil {
		t.Fatalf("the daily counter: %v", err)
	}
	c, _ := engine.ParseBudgetCounter(good)
	c.SpentMC = 10
	if err := rdb.HSet(ctx, key, "u:d:", c.String()).Err(); err != nil {
		t.Fatal(err)
	}
	rep := reconcileOf(t, s, true)
	if rep.Found != 1 || len(rep.First) != 1 || !slices.Contains(rep.First[0].Kinds, engine.DivergenceBudgets) {
		t.Fatalf("reconcile of a tampered counter: %+v, want one budgets difference", rep)
	}
	if after, _ := rdb.HGet(ctx, key, "u:d:").Result(); after != good {
		t.Errorf("counter after the fix %q, want %q", after, good)
	}
	budgetProblem(t, a.consumeUnits(id, m, 1), "day", nil, 1000, 1000, "at the cap after the fix")
}
