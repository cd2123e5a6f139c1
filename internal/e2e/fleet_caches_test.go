package e2e

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/internal/testenv"
)

// secondNode starts another node on s's Redis prefix and database, its
// background work off (s's node runs it), and returns s as seen through it.
func secondNode(t *testing.T, s *Stack, configs ...func(*app.Config)) *Stack {
	t.Helper()
	cfg := app.Config{RedisPrefix: s.Prefix, AdminToken: AdminToken, AllowPrivate: true,
		ReplicaAckTimeout: testenv.ReplicaAckTimeout}
	for _, f := range configs {
		f(&cfg)
	}
	a := app.New(s.Redis, s.Pool, cfg, zerolog.New(io.Discard))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.Serve(ln) }()
	t.Cleanup(func() { _ = a.Server.Shutdown() })
	b := *s
	b.App, b.URL = a, "http://"+ln.Addr().String()
	return &b
}

// TestFleetCachesFresh guards invariant 15 ("a setting, key or rule changed
// by one request governs the next on every node", issue 25): two nodes on
// one Redis and one Postgres; node B answers a request (so its caches hold
// the tenant, key, customer, metric and rule), node A takes a change, and
// B's very next request answers under it, with no wait: the tenant's
// change stamps in Redis, moved by A before it answered, make B read the
// change afresh.
func TestFleetCachesFresh(t *testing.T) {
	s := NewStack(t, SingleNode()) // the test starts its own second node
	b := secondNode(t, s)
	type fixture struct {
		tn     Tenant
		cust   string
		metric string
		// plan, variant and sub: the customer's subscription, for the
		// cases that set one up.
		plan, variant map[string]any
		sub           string
	}
	// subscribe puts f's customer on a fresh plan's variant (through A).
	subscribe := func(t *testing.T, f *fixture) {
		t.Helper()
		a := s.as(t, f.tn.Live)
		f.plan = a.newPlan(map[string]any{"name": "Pro"})
		f.variant = a.newVariant(f.plan["id"].(string), map[string]any{"billing_cycle": "monthly"})
		f.sub, _ = a.newSubscription(f.cust, f.plan, f.variant)
	}
	feature := func(t *testing.T, n *Stack, f *fixture, key string) Response {
		t.Helper()
		r := n.as(t, f.tn.Live).get("/v1/entitlements/check?customer_id=" + f.cust + "&billable_metric_key=" + key)
		wantStatus(t, r, 200, "check "+key)
		return r
	}
	check := func(t *testing.T, n *Stack, key string, f *fixture, units string) Response {
		t.Helper()
		return n.as(t, key).get("/v1/entitlements/check?customer_id=" + f.cust + "&billable_metric_key=" + f.metric + "&units=" + units)
	}
	consume := func(t *testing.T, n *Stack, key string, f *fixture, units int) Response {
		t.Helper()
		return n.as(t, key).post("/v1/entitlements/consume", map[string]any{"customer_id": f.cust, "billable_metric_key": f.metric, "units": units})
	}
	cases := []struct {
		name string
		// warm runs on B before the change; change on A; then runs on B
		// right after it and asserts what it answers.
		warm, change, then func(t *testing.T, f *fixture)
	}{
		{
			name: "default overage policy set to notify",
			warm: func(t *testing.T, f *fixture) {
				r := check(t, b, f.tn.Live, f, "50")
				wantStatus(t, r, 200, "check on B")
				if r.Body["allowed"] != false || r.Body["overage_policy"] != "block" {
					t.Fatalf("before the change B answered allowed %v under %v, want false under block", r.Body["allowed"], r.Body["overage_policy"])
				}
			},
			change: func(t *testing.T, f *fixture) {
				wantStatus(t, s.as(t, f.tn.Live).patch("/v1/tenant", map[string]any{"default_overage_policy": "notify"}), 200, "PATCH /v1/tenant on A")
			},
			then: func(t *testing.T, f *fixture) {
				r := check(t, b, f.tn.Live, f, "50")
				wantStatus(t, r, 200, "check on B")
				if r.Body["allowed"] != true || r.Body["overage_policy"] != "notify" {
					t.Errorf("B's next check answered allowed %v under %v, want true under notify", r.Body["allowed"], r.Body["overage_policy"])
				}
				wantStatus(t, consume(t, b, f.tn.Live, f, 50), 200, "consume past the balance on B under notify")
			},
		},
		{
			// The door takes from the rate budget under the cached tenant's
			// limits, fenced on its stamp (api/door.go): the first request
			// after the change must not pass under the old limits.
			name: "rate limit lowered",
			warm: func(t *testing.T, f *fixture) {
				for range 3 {
					wantStatus(t, b.as(t, f.tn.Live).get("/v1/customers/"+f.cust), 200, "GET on B")
				}
			},
			change: func(t *testing.T, f *fixture) {
				wantStatus(t, adminCall(t, s, AdminToken, "PATCH", "/admin/v1/tenants/"+f.tn.ID,
					map[string]any{"rate_limit_per_second": 1, "rate_limit_burst": 2}), 200, "admin PATCH rate limit on A")
			},
			then: func(t *testing.T, f *fixture) {
				// The first request after the change is the one the fence
				// guards: its RateLimit-Limit says which limits it passed
				// under. The budget refills one request a second, so three
				// requests spread over more than that on a loaded machine may
				// all pass under burst 2: such a round is tried again after
				// the budget is full (at most three rounds).
				var got []int
				for round := 0; round < 3; round++ {
					got = got[:0]
					began := time.Now()
					for range 3 {
						r := b.as(t, f.tn.Live).get("/v1/customers/" + f.cust)
						got = append(got, r.Status)
						if r.Status == 200 && r.Header.Get("RateLimit-Limit") != "2" {
							t.Errorf("B answered RateLimit-Limit %q, want 2 (the new burst)", r.Header.Get("RateLimit-Limit"))
						}
					}
					if got[0] == 200 && got[1] == 200 && got[2] == 429 || time.Since(began) < 900*time.Millisecond {
						break
					}
					time.Sleep(2100 * time.Millisecond)
				}
				if got[0] != 200 || got[1] != 200 || got[2] != 429 {
					t.Errorf("B's next three requests answered %v, want [200 200 429] under burst 2", got)
				}
			},
		},
		{
			name: "customer overage policy set to allow",
			warm: func(t *testing.T, f *fixture) {
				checkProblem(t, consume(t, b, f.tn.Live, f, 50), 409, "insufficient-credits", "", "consume on B under block")
			},
			change: func(t *testing.T, f *fixture) {
				wantStatus(t, s.as(t, f.tn.Live).patch("/v1/customers/"+f.cust, map[string]any{"overage_policy": "allow"}), 200, "PATCH the customer on A")
			},
			then: func(t *testing.T, f *fixture) {
				wantStatus(t, consume(t, b, f.tn.Live, f, 50), 200, "consume past the balance on B under allow")
			},
		},
		{
			name: "metering rule replaced",
			warm: func(t *testing.T, f *fixture) {
				r := consume(t, b, f.tn.Live, f, 2)
				wantStatus(t, r, 200, "consume on B")
				if c := Int(t, r.Body["cost"]); c != 2 {
					t.Fatalf("B charged %d for 2 units at 1 each", c)
				}
			},
			change: func(t *testing.T, f *fixture) {
				s.as(t, f.tn.Live).newRule(f.metric, map[string]any{"cost_type": "per_unit", "unit_cost": 3})
			},
			then: func(t *testing.T, f *fixture) {
				r := consume(t, b, f.tn.Live, f, 2)
				wantStatus(t, r, 200, "consume on B")
				if c := Int(t, r.Body["cost"]); c != 6 {
					t.Errorf("B's next consume cost %d, want 6 (2 units at the new rule's 3)", c)
				}
			},
		},
		{
			name: "API key revoked",
			warm: func(t *testing.T, f *fixture) {
				wantStatus(t, check(t, b, f.tn.Live, f, "1"), 200, "check on B with the key")
			},
			change: func(t *testing.T, f *fixture) {
				wantStatus(t, adminCall(t, s, AdminToken, "DELETE", "/admin/v1/tenants/"+f.tn.ID+"/api-keys/"+keyID(t, s, f.tn), nil), 204, "revoke on A")
			},
			then: func(t *testing.T, f *fixture) {
				checkProblem(t, check(t, b, f.tn.Live, f, "1"), 401, "unauthorized", "", "B's next request with the revoked key")
			},
		},
		{
			// A money call on B, whose door runs inside its script on a
			// single Redis (the fused door), is refused as the check is.
			name: "API key revoked, then a consume",
			warm: func(t *testing.T, f *fixture) {
				wantStatus(t, consume(t, b, f.tn.Live, f, 1), 200, "consume on B with the key")
			},
			change: func(t *testing.T, f *fixture) {
				wantStatus(t, adminCall(t, s, AdminToken, "DELETE", "/admin/v1/tenants/"+f.tn.ID+"/api-keys/"+keyID(t, s, f.tn), nil), 204, "revoke on A")
			},
			then: func(t *testing.T, f *fixture) {
				checkProblem(t, consume(t, b, f.tn.Live, f, 1), 401, "unauthorized", "", "B's next consume with the revoked key")
				lk := adminCall(t, s, AdminToken, "POST", "/admin/v1/tenants/"+f.tn.ID+"/api-keys", map[string]any{"environment": "live"})
				wantStatus(t, lk, 201, "a new live key")
				if r := s.as(t, str(t, lk.Body["key"], "key")).get("/v1/customers/" + f.cust + "/credits"); Int(t, r.Body["balance"]) != 9 {
					t.Errorf("balance %v after the refused consume, want 9 (one consume of 1 before the revoke)", r.Body["balance"])
				}
			},
		},
		{
			name: "rate limit lowered, then consumes",
			warm: func(t *testing.T, f *fixture) {
				for range 3 {
					wantStatus(t, consume(t, b, f.tn.Live, f, 1), 200, "consume on B")
				}
			},
			change: func(t *testing.T, f *fixture) {
				wantStatus(t, adminCall(t, s, AdminToken, "PATCH", "/admin/v1/tenants/"+f.tn.ID,
					map[string]any{"rate_limit_per_second": 1, "rate_limit_burst": 2}), 200, "admin PATCH rate limit on A")
			},
			then: func(t *testing.T, f *fixture) {
				var got []int
				for range 3 {
					r := consume(t, b, f.tn.Live, f, 1)
					got = append(got, r.Status)
					if r.Header.Get("RateLimit-Limit") != "2" {
						t.Errorf("B answered %d with RateLimit-Limit %q, want 2 (the new burst)", r.Status, r.Header.Get("RateLimit-Limit"))
					}
				}
				if got[0] != 200 || got[1] != 200 || got[2] != 429 {
					t.Errorf("B's next three consumes answered %v, want [200 200 429] under burst 2", got)
				}
			},
		},
		{
			name: "override created",
			warm: func(t *testing.T, f *fixture) {
				s.as(t, f.tn.Live).newMetric("sso", "boolean", nil)
				subscribe(t, f)
				if r := feature(t, b, f, "sso"); r.Body["enabled"] != false {
					t.Fatalf("before the override B answered enabled %v", r.Body["enabled"])
				}
			},
			change: func(t *testing.T, f *fixture) {
				wantStatus(t, s.as(t, f.tn.Live).post("/v1/subscriptions/"+f.sub+"/overrides",
					map[string]any{"billable_metric_key": "sso", "value": map[string]any{"enabled": true}}), 201, "override on A")
			},
			then: func(t *testing.T, f *fixture) {
				if r := feature(t, b, f, "sso"); r.Body["enabled"] != true || r.Body["allowed"] != true {
					t.Errorf("B's next check answered enabled %v allowed %v, want true (the override)", r.Body["enabled"], r.Body["allowed"])
				}
			},
		},
		{
			name: "variant entitlement set",
			warm: func(t *testing.T, f *fixture) {
				subscribe(t, f)
				if r := feature(t, b, f, f.metric); r.Body["allowed"] != true {
					t.Fatalf("before the entitlement B answered allowed %v", r.Body["allowed"])
				}
			},
			change: func(t *testing.T, f *fixture) {
				wantStatus(t, s.as(t, f.tn.Live).post("/v1/plans/"+f.plan["id"].(string)+"/variants/"+f.variant["id"].(string)+"/entitlements",
					map[string]any{"billable_metric_key": f.metric, "value": map[string]any{"enabled": false}}), 201, "variant entitlement on A")
			},
			then: func(t *testing.T, f *fixture) {
				if r := feature(t, b, f, f.metric); r.Body["allowed"] != false {
					t.Errorf("B's next check answered allowed %v, want false (the variant denies the metric)", r.Body["allowed"])
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tn := s.NewTenant(uniq("fleet-fresh"))
			a := s.as(t, tn.Live)
			f := &fixture{tn: tn, metric: a.perUnit(1)}
			f.cust, _ = a.newCustomer()
			a.grant(f.cust, map[string]any{"credits": 10})
			tc.warm(t, f)
			tc.change(t, f)
			tc.then(t, f)
		})
	}
}

// keyID is the id of tn's live key, from the admin API.
func keyID(t *testing.T, s *Stack, tn Tenant) string {
	t.Helper()
	r := adminCall(t, s, AdminToken, "GET", "/admin/v1/tenants/"+tn.ID+"/api-keys", nil)
	wantStatus(t, r, 200, "list keys")
	for _, k := range arr(t, r.Body["data"], "keys") {
		m := obj(t, k, "key")
		if m["environment"] == "live" && m["revoked_at"] == nil {
			return str(t, m["id"], "key id")
		}
	}
	t.Fatal("no live key")
	return ""
}

// TestFleetAlertSettingsFresh guards invariant 15 for credit alert
// settings (issue 25): node A's persister has just read its list of the
// scopes with alert settings; a threshold set through node B governs the
// next operation A stores, though the list is younger than its 1 s
// lifetime, because B moved the fleet's alert stamp before it answered.
func TestFleetAlertSettingsFresh(t *testing.T) {
	s := NewStack(t, SingleNode()) // the test starts its own second node
	b := secondNode(t, s)
	tn := s.NewTenant(uniq("fleet-alerts"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1000})
	debit := func(delta int64) {
		t.Helper()
		wantStatus(t, a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": -delta, "source": "manual", "reason": "use"}), 200, "adjust on A")
	}
	debit(10) // A's persister reads the list for this batch
	s.Drain()
	wantStatus(t, b.as(t, tn.Live).do("PUT", "/v1/customers/"+id+"/credits/alerts", "", map[string]any{"thresholds": []any{
		map[string]any{"type": "absolute", "amount_mc": 500},
	}}), 200, "PUT customer alerts on B")
	debit(600) // 990 -> 390: crosses 500
	s.Drain()
	crossed := ofType(a.alertEvents(), "credit.threshold_crossed", id)
	if got := thresholdsOf(t, crossed); !equalInts(got, []int64{500}) {
		t.Fatalf("threshold_crossed after a setting made on B: %v, want [500]", got)
	}
}
