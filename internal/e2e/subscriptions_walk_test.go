package e2e

import (
	"net/url"
	"sync"
	"testing"
	"time"
)

// settableClock is a test clock the test moves; every creditd part reads it.
type settableClock struct {
	mu sync.Mutex
	t  time.Time
}

func newSettableClock(t time.Time) *settableClock { return &settableClock{t: t.UTC()} }

// Now returns the set instant (milliseconds, UTC, like engine.SystemClock).
func (c *settableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t.Truncate(time.Millisecond)
}

// Set moves the clock to t.
func (c *settableClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t.UTC()
	c.mu.Unlock()
}

// eventually polls cond until it holds or 15 s pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// subEvents lists the events of type typ of one subscription (data.subscription_id),
// or of one customer for credit.* events.
func (a api) subEvents(typ, customer string) []map[string]any {
	a.t.Helper()
	r := a.get("/v1/webhooks/events?limit=100&event_type=" + url.QueryEscape(typ))
	wantStatus(a.t, r, 200, "list events")
	var out []map[string]any
	for _, e := range arr(a.t, r.Body["data"], "events") {
		ev := e.(map[string]any)
		p := obj(a.t, ev["payload"], "payload")
		if p["customer_id"] == customer {
			out = append(out, p)
		}
	}
	return out
}

func (a api) subscription(id string) map[string]any {
	a.t.Helper()
	r := a.get("/v1/subscriptions/" + id)
	wantStatus(a.t, r, 200, "get subscription")
	return r.Body
}

func (a api) newGrant(plan, variant string, body map[string]any) {
	a.t.Helper()
	wantStatus(a.t, a.post("/v1/plans/"+plan+"/variants/"+variant+"/grants", body), 201, "create plan grant")
}

func mustTime(t testing.TB, v any) time.Time {
	t.Helper()
	tm, err := time.Parse(time.RFC3339Nano, str(t, v, "time"))
	if err != nil {
		t.Fatalf("time %v: %v", v, err)
	}
	return tm.UTC()
}

// TestSubscriptionPrepaidWalk walks a prepaid subscription through trial,
// renewal warning, the renew that ends the trial, early renewals with
// rollover (bounded by max_rollover_cycles), past_due (usage refused) and
// expiry, on a test clock, checking balances and events at every step.
func TestSubscriptionPrepaidWalk(t *testing.T) {
	t0 := time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC)
	clock := newSettableClock(t0)
	s := NewStack(t, WithClock(clock), WithSchedulerInterval(20*time.Millisecond))
	tn := s.NewTenant(uniq("subs"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)

	plan := str(t, a.newPlan(map[string]any{"name": "Pro"})["id"], "plan id")
	v := a.newVariant(plan, map[string]any{"billing_cycle": "monthly", "billing_mode": "prepaid", "trial_days": 7,
		"renewal_due_days": 3, "grace_period_days": 3, "allow_usage_while_overdue": false})
	vid := str(t, v["id"], "variant id")
	a.newGrant(plan, vid, map[string]any{"credits": 100, "grant_interval": "on_activation", "grant_type": "trial"})
	a.newGrant(plan, vid, map[string]any{"credits": 50, "grant_interval": "on_activation", "grant_type": "one_time"})
	a.newGrant(plan, vid, map[string]any{"credits": 1000, "grant_interval": "billing_period", "grant_type": "recurring",
		"rollover_percentage": 50, "max_rollover_cycles": 1, "expires_after_seconds": 120 * 86400})

	cust, ext := a.newCustomer()
	// Unknown customer and variant are 404; missing fields 422.
	checkProblem(t, a.post("/v1/subscriptions", map[string]any{"customer_id": "nobody-" + uniq("x"), "plan_variant_id": vid}), 404, "not-found", "", "unknown customer")
	checkProblem(t, a.post("/v1/subscriptions", map[string]any{"customer_id": cust, "plan_variant_id": "5f0c3a9e-1111-4a4a-8b8b-000000000000"}), 404, "not-found", "", "unknown variant")
	checkProblem(t, a.post("/v1/subscriptions", map[string]any{"customer_id": cust}), 422, "validation-error", "plan_variant_id", "no variant")

	// 1. Create: trialing, the trial grant fires.
	r := a.post("/v1/subscriptions", map[string]any{"customer_id": ext, "plan_variant_id": vid, "metadata": map[string]any{"k": "v"}})
	wantStatus(t, r, 201, "create subscription")
	sub := r.Body
	id := str(t, sub["id"], "id")
	if sub["status"] != "trialing" || sub["customer_id"] != cust || sub["billing_mode"] != "prepaid" || sub["plan_id"] != plan {
		t.Fatalf("created %v", sub)
	}
	if !mustTime(t, sub["trial_ends_at"]).Equal(t0.AddDate(0, 0, 7)) || !mustTime(t, sub["current_period_end"]).Equal(t0.AddDate(0, 0, 7)) {
		t.Fatalf("trial end %v", sub)
	}
	if b := a.balance(cust); b != 100 {
		t.Fatalf("balance after create %d, want 100 (trial grant)", b)
	}
	checkStatus(t, a.post("/v1/subscriptions", map[string]any{"customer_id": cust, "plan_variant_id": vid}), 409, "second live subscription")
	list, _, _ := page(t, a.get("/v1/customers/"+cust+"/subscriptions"))
	if len(list) != 1 {
		t.Fatalf("list %v", list)
	}

	// 2. Renewal warning 3 days before the trial ends.
	clock.Set(t0.AddDate(0, 0, 4).Add(time.Minute))
	eventually(t, "renewal_due", func() bool { return len(a.subEvents("subscription.renewal_due", cust)) == 1 })

	// 3. Renew ends the trial: activation (50) and recurring (1000) fire.
	r = a.post("/v1/subscriptions/"+id+"/renew", nil)
	wantStatus(t, r, 200, "renew from trialing")
	if r.Body["status"] != "active" || !mustTime(t, r.Body["current_period_start"]).Equal(t0.AddDate(0, 0, 7)) ||
		!mustTime(t, r.Body["current_period_end"]).Equal(time.Date(2026, 3, 7, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("renewed %v", r.Body)
	}
	if b := a.balance(cust); b != 1150 {
		t.Fatalf("balance after activation %d, want 1150", b)
	}
	// Spend 400: the recurring block expires first, so it spends first.
	wantStatus(t, a.post("/v1/customers/"+cust+"/credits/adjust", map[string]any{"delta": -400, "source": "manual", "reason": "use"}), 200, "adjust")

	// 4. Early renew: 50% of the 600 left rolls over, the old block expires, 1000 more.
	r = a.post("/v1/subscriptions/"+id+"/renew", nil)
	wantStatus(t, r, 200, "renew 2")
	if !mustTime(t, r.Body["current_period_start"]).Equal(time.Date(2026, 3, 7, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("second period %v", r.Body)
	}
	if b := a.balance(cust); b != 150+300+1000 {
		t.Fatalf("balance after rollover %d, want 1450", b)
	}
	// 5. max_rollover_cycles 1: this renew carries nothing, the old blocks expire.
	wantStatus(t, a.post("/v1/subscriptions/"+id+"/renew", nil), 200, "renew 3")
	if b := a.balance(cust); b != 150+1000 {
		t.Fatalf("balance after capped rollover cycles %d, want 1150", b)
	}
	if n := len(a.subEvents("subscription.renewed", cust)); n != 3 {
		t.Fatalf("%d subscription.renewed, want 3", n)
	}
	check := "/v1/entitlements/check?customer_id=" + cust + "&billable_metric_key=" + metric
	if r := a.get(check); r.Body["allowed"] != true || r.Body["subscription_status"] != "active" {
		t.Fatalf("check while active %s", r.Raw)
	}

	// 6. The period (Apr 7 - May 7) ends without a renew: its renewal warning
	// (May 4) and then past_due, usage refused.
	end := time.Date(2026, 5, 7, 0, 0, 0, 0, time.UTC)
	clock.Set(end.Add(time.Minute))
	eventually(t, "past_due", func() bool { return a.subscription(id)["status"] == "past_due" })
	if g := mustTime(t, a.subscription(id)["grace_ends_at"]); !g.Equal(end.AddDate(0, 0, 3)) {
		t.Fatalf("grace_ends_at %v", g)
	}
	if r := a.get(check); r.Body["allowed"] != false || r.Body["subscription_status"] != "past_due" {
		t.Fatalf("check while past_due %s", r.Raw)
	}
	checkStatus(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": cust, "billable_metric_key": metric, "units": 1}), 409, "consume while past_due")

	// 7. Grace ends: expired; renew is then 409.
	clock.Set(end.AddDate(0, 0, 3).Add(time.Minute))
	eventually(t, "expired", func() bool { return a.subscription(id)["status"] == "expired" })
	checkStatus(t, a.post("/v1/subscriptions/"+id+"/renew", nil), 409, "renew expired")
	if b := a.balance(cust); b != 1150 {
		t.Fatalf("balance after expiry %d, want 1150", b)
	}

	// Credit events come through the write-behind persister, which may
	// still hold the last grant in its group-commit linger.
	eventually(t, "5 credit.granted events", func() bool { return len(a.subEvents("credit.granted", cust)) >= 5 })
	for typ, want := range map[string]int{"subscription.created": 1, "subscription.renewal_due": 2, "subscription.renewed": 3,
		"subscription.past_due": 1, "subscription.expired": 1, "credit.granted": 5} {
		evs := a.subEvents(typ, cust)
		if len(evs) != want {
			t.Errorf("%d %s events, want %d", len(evs), typ, want)
		}
		if typ == "subscription.renewed" && len(evs) > 0 {
			d := obj(t, evs[0]["data"], "data")
			if d["subscription_id"] != id || d["plan_variant_id"] != vid || d["period_start"] == nil || d["period_end"] == nil {
				t.Errorf("renewed data %v", d)
			}
		}
	}
	// Rolled-over credit: one rollover block in the history (entry type plan_grant, metadata rollover).
	s.Drain()
	hist := a.history(cust, "?type=expiry&limit=100")
	if len(hist) != 3 {
		t.Errorf("%d expiry entries, want 3 (one per rolled block)", len(hist))
	}
}

// TestSubscriptionPostpaidWalk: a postpaid trial ends by itself, periods
// advance on the clock, the accumulation cap limits each firing, usage is
// reported per period, and a cancel at period end lands on time.
func TestSubscriptionPostpaidWalk(t *testing.T) {
	t0 := time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC)
	clock := newSettableClock(t0)
	s := NewStack(t, WithClock(clock), WithSchedulerInterval(20*time.Millisecond))
	tn := s.NewTenant(uniq("subs"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)

	plan := str(t, a.newPlan(map[string]any{"name": "Usage"})["id"], "plan id")
	vid := str(t, a.newVariant(plan, map[string]any{"billing_cycle": "monthly", "billing_mode": "postpaid", "trial_days": 2})["id"], "variant")
	a.newGrant(plan, vid, map[string]any{"credits": 100, "grant_interval": "on_activation", "grant_type": "trial"})
	a.newGrant(plan, vid, map[string]any{"credits": 1000, "grant_interval": "billing_period", "grant_type": "recurring", "accumulation_cap": 1500})
	cust, _ := a.newCustomer()

	r := a.post("/v1/subscriptions", map[string]any{"customer_id": cust, "plan_variant_id": vid})
	wantStatus(t, r, 201, "create")
	id := str(t, r.Body["id"], "id")
	if b := a.balance(cust); b != 100 {
		t.Fatalf("trial balance %d", b)
	}
	checkStatus(t, a.post("/v1/subscriptions/"+id+"/renew", nil), 409, "renew postpaid")

	// The trial ends by itself: active, period Feb 2 - Mar 2, 1000 granted (room 1400).
	trialEnd := t0.AddDate(0, 0, 2)
	clock.Set(trialEnd.Add(time.Second))
	eventually(t, "trial end", func() bool { return a.subscription(id)["status"] == "active" })
	sub := a.subscription(id)
	if !mustTime(t, sub["current_period_start"]).Equal(trialEnd) || !mustTime(t, sub["current_period_end"]).Equal(time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC)) {
		t.Fatalf("first period %v", sub)
	}
	if b := a.balance(cust); b != 1100 {
		t.Fatalf("balance after activation %d, want 1100", b)
	}
	wantStatus(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": cust, "billable_metric_key": metric, "units": 30}), 200, "consume")
	if b := a.balance(cust); b != 800 {
		t.Fatalf("balance after consume %d", b)
	}
	u := a.get("/v1/subscriptions/" + id + "/usage")
	wantStatus(t, u, 200, "usage")
	lines := arr(t, u.Body["data"], "usage data")
	if len(lines) != 1 || Int(t, obj(t, lines[0], "line")["units"]) != 30 || Int(t, obj(t, lines[0], "line")["credits"]) != 300 {
		t.Fatalf("usage %s", u.Raw)
	}

	// Next period: the cap lets 700 in (800 -> 1500).
	clock.Set(time.Date(2026, 3, 2, 0, 0, 1, 0, time.UTC))
	eventually(t, "renewal 1", func() bool { return len(a.subEvents("subscription.renewed", cust)) == 1 })
	if b := a.balance(cust); b != 1500 {
		t.Fatalf("balance after capped renewal %d, want 1500", b)
	}
	// At the cap: the next firing grants nothing.
	clock.Set(time.Date(2026, 4, 2, 0, 0, 1, 0, time.UTC))
	eventually(t, "renewal 2", func() bool { return len(a.subEvents("subscription.renewed", cust)) == 2 })
	if b := a.balance(cust); b != 1500 {
		t.Fatalf("balance at the cap %d, want 1500", b)
	}
	u = a.get("/v1/subscriptions/" + id + "/usage?period_start=" + url.QueryEscape(trialEnd.Format(time.RFC3339)))
	wantStatus(t, u, 200, "usage of the first period")
	if lines := arr(t, u.Body["data"], "data"); len(lines) != 1 {
		t.Fatalf("first period usage %s", u.Raw)
	}
	if lines := arr(t, a.get("/v1/subscriptions/" + id + "/usage").Body["data"], "data"); len(lines) != 0 {
		t.Fatalf("current period usage %v", lines)
	}
	if n := len(a.subEvents("credit.granted", cust)); n != 3 {
		t.Fatalf("%d credit.granted, want 3 (trial, first period, capped renewal)", n)
	}

	// Cancel at period end: still active until May 2, then canceled.
	r = a.post("/v1/subscriptions/"+id+"/cancel", map[string]any{"at_period_end": true})
	wantStatus(t, r, 200, "cancel at period end")
	if r.Body["status"] != "active" || r.Body["cancel_at_period_end"] != true {
		t.Fatalf("cancel at period end %v", r.Body)
	}
	clock.Set(time.Date(2026, 5, 2, 0, 0, 1, 0, time.UTC))
	eventually(t, "canceled", func() bool { return a.subscription(id)["status"] == "canceled" })
	if len(a.subEvents("subscription.canceled", cust)) != 1 {
		t.Fatal("no subscription.canceled")
	}
	checkStatus(t, a.post("/v1/subscriptions/"+id+"/cancel", nil), 409, "cancel canceled")
	// A new subscription may follow a canceled one.
	wantStatus(t, a.post("/v1/subscriptions", map[string]any{"customer_id": cust, "plan_variant_id": vid}), 201, "resubscribe")
}
