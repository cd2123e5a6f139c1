package e2e

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// newSubscription puts customer (own id) on variant and returns the
// subscription id, and whether it went through POST /v1/subscriptions.
// Until that route exists the row is written through the store, the way
// the subscription service would.
func (a api) newSubscription(customer string, plan, variant map[string]any) (string, bool) {
	a.t.Helper()
	r := a.post("/v1/subscriptions", map[string]any{"customer_id": customer, "plan_variant_id": variant["id"]})
	if r.Status == 201 {
		return str(a.t, r.Body["id"], "subscription id"), true
	}
	if r.Status != 404 || !strings.Contains(string(r.Raw), "no route") {
		a.t.Fatalf("create subscription: %d %s", r.Status, r.Raw)
	}
	c := a.get("/v1/customers/" + customer)
	wantStatus(a.t, c, 200, "customer")
	now := time.Now().UTC().Truncate(time.Millisecond)
	end := now.AddDate(0, 1, 0)
	env := engine.Environment(str(a.t, c.Body["environment"], "environment"))
	rec := engine.SubscriptionRecord{Subscription: engine.Subscription{
		ID: uuid.Must(uuid.NewV7()), TenantID: uuid.MustParse(str(a.t, c.Body["tenant_id"], "tenant_id")), Environment: env,
		CustomerID: uuid.MustParse(str(a.t, c.Body["id"], "id")), PlanID: uuid.MustParse(str(a.t, plan["id"], "plan id")),
		PlanVariantID: uuid.MustParse(str(a.t, variant["id"], "variant id")), Status: engine.SubscriptionActive,
		BillingMode: engine.BillingPrepaid, CurrentPeriodStart: now, CurrentPeriodEnd: &end, Metadata: engine.Metadata{},
		CreatedAt: now, UpdatedAt: now}, ActivatedAt: &now}
	if err := a.s.App.DB.CreateSubscription(context.Background(), rec); err != nil {
		a.t.Fatalf("CreateSubscription: %v", err)
	}
	return rec.ID.String(), false
}

// TestConformanceOverrides: docs/spec/interface.md Override, Overrides and States
// "Override": list (live only, no paging), create 201 with every field,
// 400 for a metered metric, a missing field or a value not shaped for the
// type, 404 unknown metric or subscription, 409 a second live override; an
// expired override is replaced with a new id; PATCH keeps an omitted
// expires_at and null makes it permanent, 400 mismatch, 404; DELETE 204 with
// an Idempotency-Key, soft, then 404; the other environment and another
// tenant get 404; missing key 422; no API key 401.
func TestConformanceOverrides(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("ovr"))
	a, sb := s.as(t, tn.Live), s.as(t, tn.Sandbox)
	other := s.as(t, s.NewTenant(uniq("other")).Live)
	p := uniq("k")
	seats, flag, limits, metered := p+"-seats", p+"-sso", p+"-limits", p+"-api"
	seatsMetric := a.newMetric(seats, "gauge", map[string]any{"cap": 5})
	a.newMetric(flag, "boolean", nil)
	a.newMetric(limits, "static", map[string]any{"config": map[string]any{"a": 1}})
	a.newMetric(metered, "metered", nil)
	a.newRule(metered, map[string]any{"cost_type": "per_unit", "unit_cost": 1})
	plan := a.newPlan(map[string]any{"name": "Pro"})
	variant := a.newVariant(plan["id"].(string), map[string]any{"billing_cycle": "monthly"})
	cust, _ := a.newCustomer()
	sub, viaAPI := a.newSubscription(cust, plan, variant)
	t.Logf("subscription through POST /v1/subscriptions: %v", viaAPI)
	base := "/v1/subscriptions/" + sub + "/overrides"

	r := a.get(base)
	wantStatus(t, r, 200, "empty list")
	if list := arr(t, r.Body["overrides"], "overrides"); len(list) != 0 {
		t.Fatalf("overrides of a new subscription %v", list)
	}

	// Create.
	key := idemKey()
	body := map[string]any{"billable_metric_key": seats, "value": map[string]any{"cap": 50}, "reason": "enterprise deal"}
	r = a.do("POST", base, key, body)
	wantStatus(t, r, 201, "create override")
	o := r.Body
	checkKeys(t, o, "override", "id", "tenant_id", "subscription_id", "billable_metric_id", "billable_metric_key", "value", "expires_at", "reason", "created_at", "updated_at")
	checkUUID(t, o["id"], "id")
	if o["tenant_id"] != tn.ID || o["subscription_id"] != sub || o["billable_metric_id"] != seatsMetric["id"] || o["billable_metric_key"] != seats ||
		jsonInt(obj(t, o["value"], "value")["cap"]) != 50 || o["expires_at"] != nil || o["reason"] != "enterprise deal" {
		t.Errorf("created override %v", o)
	}
	checkTime(t, o["created_at"], "created_at")
	replay := a.do("POST", base, key, body)
	if replay.Status != 201 || replay.Header.Get("X-Idempotent-Replayed") != "true" || string(replay.Raw) != string(r.Raw) {
		t.Errorf("replayed create %d %s", replay.Status, replay.Raw)
	}
	checkProblem(t, a.post(base, body), 409, "conflict", "", "a second live override")
	r = a.post(base, map[string]any{"billable_metric_key": flag, "value": map[string]any{"enabled": true}})
	wantStatus(t, r, 201, "boolean override")
	flagID := r.Body["id"]
	if r.Body["reason"] != "" || obj(t, r.Body["value"], "value")["enabled"] != true {
		t.Errorf("boolean override %v", r.Body)
	}

	for _, tc := range []struct {
		name, field string
		body        any
	}{
		{"metered metric", "billable_metric_key", map[string]any{"billable_metric_key": metered, "value": map[string]any{"enabled": false}}},
		{"missing billable_metric_key", "billable_metric_key", map[string]any{"value": map[string]any{"cap": 1}}},
		{"missing value", "value", map[string]any{"billable_metric_key": limits}},
		{"boolean without enabled", "value.enabled", map[string]any{"billable_metric_key": flag, "value": map[string]any{"cap": 1}}},
		{"static without config", "value.config", map[string]any{"billable_metric_key": limits, "value": map[string]any{"cap": 1}}},
		{"value not an object", "value", map[string]any{"billable_metric_key": limits, "value": 7}},
		{"bad expires_at", "expires_at", map[string]any{"billable_metric_key": limits, "value": map[string]any{"config": map[string]any{}}, "expires_at": "later"}},
		{"reason not a string", "reason", map[string]any{"billable_metric_key": limits, "value": map[string]any{"config": map[string]any{}}, "reason": 5}},
	} {
		checkProblem(t, a.post(base, tc.body), 400, "bad-request", tc.field, tc.name)
	}
	seats2 := p + "-seats2"
	a.newMetric(seats2, "gauge", nil)
	checkProblem(t, a.post(base, map[string]any{"billable_metric_key": seats2, "value": map[string]any{"enabled": true}}), 400, "bad-request", "value.cap", "gauge without cap")
	checkProblem(t, a.post(base, `{"billable_metric_key":`), 400, "bad-request", "", "unparseable JSON")
	checkProblem(t, a.post(base, map[string]any{"billable_metric_key": p + "-none", "value": map[string]any{"cap": 1}}), 404, "not-found", "billable_metric_key", "unknown metric")
	unknownSub := "/v1/subscriptions/" + uuid.NewString() + "/overrides"
	checkProblem(t, a.post(unknownSub, map[string]any{"billable_metric_key": seats2, "value": map[string]any{"cap": 1}}), 404, "not-found", "", "unknown subscription")
	checkProblem(t, a.get(unknownSub), 404, "not-found", "", "list of an unknown subscription")
	checkProblem(t, a.get("/v1/subscriptions/not-a-uuid/overrides"), 404, "not-found", "", "malformed subscription id")
	checkProblem(t, a.do("POST", base, "", map[string]any{"billable_metric_key": seats2, "value": map[string]any{"cap": 1}}), 422, "validation-error", "Idempotency-Key", "create without Idempotency-Key")
	checkProblem(t, s.as(t, "").get(base), 401, "unauthorized", "", "no API key")

	// The other environment and another tenant see nothing.
	for _, x := range []struct {
		who string
		api api
	}{{"sandbox", sb}, {"other tenant", other}} {
		checkProblem(t, x.api.get(base), 404, "not-found", "", x.who+" list")
		checkProblem(t, x.api.post(base, map[string]any{"billable_metric_key": seats2, "value": map[string]any{"cap": 1}}), 404, "not-found", "", x.who+" create")
		checkProblem(t, x.api.patch(base+"/"+seats, map[string]any{"reason": "x"}), 404, "not-found", "", x.who+" patch")
		checkProblem(t, x.api.do("DELETE", base+"/"+seats, idemKey(), nil), 404, "not-found", "", x.who+" delete")
	}

	r = a.get(base)
	wantStatus(t, r, 200, "list")
	if list := arr(t, r.Body["overrides"], "overrides"); len(list) != 2 || obj(t, list[0], "first")["id"] != o["id"] || obj(t, list[1], "second")["id"] != flagID {
		t.Errorf("list %s", r.Raw)
	}

	// PATCH.
	seatsPath := base + "/" + url.PathEscape(seats)
	r = a.patch(seatsPath, map[string]any{"value": map[string]any{"cap": 60}})
	wantStatus(t, r, 200, "patch value")
	if r.Body["id"] != o["id"] || jsonInt(obj(t, r.Body["value"], "value")["cap"]) != 60 || r.Body["expires_at"] != nil || r.Body["reason"] != "enterprise deal" {
		t.Errorf("patched %v", r.Body)
	}
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	r = a.patch(seatsPath, map[string]any{"expires_at": until.Format(time.RFC3339)})
	wantStatus(t, r, 200, "patch expires_at")
	if !checkTime(t, r.Body["expires_at"], "expires_at").Equal(until) {
		t.Errorf("patched expiry %v", r.Body)
	}
	r = a.patch(seatsPath, map[string]any{"reason": "renewed"})
	wantStatus(t, r, 200, "patch reason")
	if r.Body["expires_at"] == nil || r.Body["reason"] != "renewed" || jsonInt(obj(t, r.Body["value"], "value")["cap"]) != 60 {
		t.Errorf("an omitted expires_at was not kept: %v", r.Body)
	}
	r = a.patch(seatsPath, map[string]any{"expires_at": nil})
	wantStatus(t, r, 200, "patch expires_at null")
	if r.Body["expires_at"] != nil {
		t.Errorf("expires_at null did not make it permanent: %v", r.Body)
	}
	checkProblem(t, a.patch(seatsPath, map[string]any{"value": map[string]any{"enabled": true}}), 400, "bad-request", "value.cap", "patch value mismatch")
	checkProblem(t, a.patch(base+"/"+limits, map[string]any{"reason": "x"}), 404, "not-found", "", "patch without an override")
	checkProblem(t, a.patch("/v1/subscriptions/"+uuid.NewString()+"/overrides/"+seats, map[string]any{"reason": "x"}), 404, "not-found", "", "patch unknown subscription")
	checkProblem(t, a.do("PATCH", seatsPath, "", map[string]any{"reason": "x"}), 422, "validation-error", "Idempotency-Key", "patch without Idempotency-Key")

	// Overrides beat the metric default on checks and the snapshot, which
	// the write refreshes at once (needs the subscription service's PlanView).
	if viaAPI {
		snapPath := "/v1/customers/" + cust + "/entitlements"
		wantStatus(t, a.get(snapPath), 200, "warm the snapshot cache")
		wantStatus(t, a.patch(seatsPath, map[string]any{"value": map[string]any{"cap": 70}}), 200, "patch")
		ents := obj(t, a.get(snapPath).Body["entitlements"], "entitlements")
		if c := obj(t, ents[seats], "seats"); jsonInt(c["cap"]) != 70 {
			t.Errorf("the snapshot did not refresh after an override: %v", c)
		}
		if c := a.get("/v1/customers/" + cust + "/entitlements/" + seats); jsonInt(c.Body["cap"]) != 70 {
			t.Errorf("check after override: %s", c.Raw)
		}
		if c := obj(t, ents[flag], "sso"); c["enabled"] != true {
			t.Errorf("the boolean override is not in the snapshot: %v", c)
		}
	}

	// DELETE: needs a key, 204, soft, replays, then 404.
	flagPath := base + "/" + flag
	checkProblem(t, a.do("DELETE", flagPath, "", nil), 422, "validation-error", "Idempotency-Key", "delete without Idempotency-Key")
	dk := idemKey()
	r = a.do("DELETE", flagPath, dk, nil)
	if r.Status != 204 || len(r.Raw) != 0 {
		t.Fatalf("delete: %d %q", r.Status, r.Raw)
	}
	if r = a.do("DELETE", flagPath, dk, nil); r.Status != 204 || r.Header.Get("X-Idempotent-Replayed") != "true" {
		t.Errorf("replayed delete: %d %v", r.Status, r.Header)
	}
	checkProblem(t, a.do("DELETE", flagPath, idemKey(), nil), 404, "not-found", "", "second delete")
	if viaAPI {
		// The delete clears the cache: the metric default (disabled) is back at once.
		ents := obj(t, a.get("/v1/customers/" + cust + "/entitlements").Body["entitlements"], "entitlements")
		if c := obj(t, ents[flag], "sso"); c["enabled"] != false {
			t.Errorf("the snapshot kept a deleted override: %v", c)
		}
	}
	var kept int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM subscription_overrides WHERE id = $1 AND deleted_at IS NOT NULL`, flagID).Scan(&kept); err != nil || kept != 1 {
		t.Errorf("the deleted override's row: %d, %v; want kept with deleted_at", kept, err)
	}
	if list := arr(t, a.get(base).Body["overrides"], "overrides"); len(list) != 1 {
		t.Errorf("list after delete %v", list)
	}
	r = a.post(base, map[string]any{"billable_metric_key": flag, "value": map[string]any{"enabled": false}})
	wantStatus(t, r, 201, "create after delete")
	if r.Body["id"] == flagID {
		t.Error("the new override reused the deleted id")
	}

	// An expired override stops applying and is replaced by a new one.
	soon := time.Now().Add(1500 * time.Millisecond).UTC()
	r = a.post(base, map[string]any{"billable_metric_key": limits, "value": map[string]any{"config": map[string]any{"a": 2}}, "expires_at": soon.Format(time.RFC3339Nano)})
	wantStatus(t, r, 201, "expiring override")
	expiring := r.Body["id"]
	checkProblem(t, a.post(base, map[string]any{"billable_metric_key": limits, "value": map[string]any{"config": map[string]any{}}}), 409, "conflict", "", "live until it expires")
	time.Sleep(time.Until(soon) + 100*time.Millisecond)
	for _, x := range arr(t, a.get(base).Body["overrides"], "overrides") {
		if obj(t, x, "override")["id"] == expiring {
			t.Error("an expired override is listed")
		}
	}
	r = a.post(base, map[string]any{"billable_metric_key": limits, "value": map[string]any{"config": map[string]any{"a": 3}}})
	wantStatus(t, r, 201, "replace the expired override")
	if r.Body["id"] == expiring {
		t.Error("the replacement kept the expired id")
	}
}
