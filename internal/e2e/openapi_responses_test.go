package e2e

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	creditdapi "github.com/creditd/creditd/api"
	"github.com/creditd/creditd/internal/apicheck"
)

// openAPISamples, when set, is a file TestOpenAPIResponses writes the first
// request and response body of every operation to: the raw material of
// api/openapi.json's examples when an operation is added or changed.
var openAPISamples = flag.String("openapi.samples", "", "write the request and response samples of TestOpenAPIResponses to this JSON file")

// TestOpenAPIResponses drives every route group (operations, operator API,
// tenant, customers, credits, pricing, entitlements, usage, gauges,
// reservations, plans, subscriptions, overrides, top-ups, import, webhooks)
// with the response check of the Stack's client on, whatever
// CREDITD_E2E_OPENAPI says: every answer's status, Content-Type, headers and
// body must conform to api/openapi.json. It then asserts every operation of
// the document was answered with a documented success status at least once
// (redeliver, whose 200 needs a dead letter, with its 409), so a new route
// cannot go unchecked.
func TestOpenAPIResponses(t *testing.T) {
	checker, err := apicheck.New(creditdapi.OpenAPI())
	if err != nil {
		t.Fatal(err)
	}
	s := NewStack(t)
	s.HTTP = &http.Client{Timeout: 30 * time.Second,
		Transport: checker.Transport(http.DefaultTransport, func(err error) { t.Errorf("%v", err) })}

	var hookMu sync.Mutex
	delivered := map[string]int{} // event_type -> deliveries
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err == nil {
			err = checker.CheckEvent(body)
		}
		if err != nil {
			t.Errorf("delivered webhook: %v", err)
		}
		var head struct {
			EventType string `json:"event_type"`
		}
		_ = json.Unmarshal(body, &head)
		hookMu.Lock()
		delivered[head.EventType]++
		hookMu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer hook.Close()

	w := openAPIWalk{t: t, s: s}
	w.operations()
	tn := w.operator(hook.URL)
	w.a = s.as(t, tn.Live)
	w.tenant()
	w.customers()
	w.pricing()
	w.entitlements()
	w.reservations()
	w.plansAndSubscriptions()
	w.topupsAndImport()
	w.alerts()
	w.webhooks()
	w.problems()

	// The walk raised these; each delivered body was checked against the
	// document's webhooks as it arrived.
	want := []string{"credit.granted", "credit.consumed", "test.ping", "subscription.created", "subscription.renewed", "subscription.canceled",
		"credit.threshold_crossed", "credit.topup_requested"}
	deadline := time.Now().Add(20 * time.Second)
	for {
		hookMu.Lock()
		var late []string
		for _, typ := range want {
			if delivered[typ] == 0 {
				late = append(late, typ)
			}
		}
		hookMu.Unlock()
		if len(late) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("webhook events never delivered to the test receiver: %v", late)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantStatus(t, adminCall(t, s, AdminToken, "DELETE", "/admin/v1/tenants/"+tn.ID+"/webhook", nil), 204, "DELETE webhook")

	seen := checker.Seen()
	var missing []string
	for _, op := range documentedOperations(t) {
		if !answered(seen, op) {
			missing = append(missing, op)
		}
	}
	if len(missing) > 0 {
		t.Errorf("operations of api/openapi.json this test never got a success answer from: %v", missing)
	}
	if *openAPISamples != "" {
		raw, err := json.MarshalIndent(checker.Samples(), "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*openAPISamples, raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// answered reports whether op had a 2xx answer, or, for redeliver, its 409
// (its 200 needs an event that failed seven times).
func answered(seen map[string]int, op string) bool {
	for k := range seen {
		id, status, _ := strings.Cut(k, " ")
		if id == op && (strings.HasPrefix(status, "2") || (op == "redeliverWebhookEvent" && status == "409")) {
			return true
		}
	}
	return false
}

// documentedOperations lists the operationIds of api/openapi.json, sorted.
func documentedOperations(t *testing.T) []string {
	t.Helper()
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(creditdapi.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, item := range doc.Paths {
		for _, op := range item {
			if op.OperationID != "" {
				out = append(out, op.OperationID)
			}
		}
	}
	sort.Strings(out)
	return out
}

// openAPIWalk is the state TestOpenAPIResponses carries between groups.
type openAPIWalk struct {
	t *testing.T
	s *Stack
	a api

	customer, ext string // a customer with credit
	metered       string // a metered metric with a per-unit rule
	flagKey       string // a boolean metric
	seats         string // a gauge metric, cap 10
	limits        string // a static metric
}

// want calls and requires status.
func (w *openAPIWalk) want(status int, method, path string, body any) Response {
	w.t.Helper()
	var r Response
	if method == "GET" {
		r = w.a.do(method, path, "", body)
	} else {
		r = w.a.do(method, path, idemKey(), body)
	}
	wantStatus(w.t, r, status, method+" "+path)
	return r
}

func (w *openAPIWalk) admin(status int, method, path string, body any) Response {
	w.t.Helper()
	r := adminCall(w.t, w.s, AdminToken, method, path, body)
	wantStatus(w.t, r, status, method+" "+path)
	return r
}

func (w *openAPIWalk) operations() {
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/openapi.json"} {
		wantStatus(w.t, Call(w.t, w.s.HTTP, w.s.URL, "GET", p, nil), 200, p)
	}
}

func (w *openAPIWalk) operator(hookURL string) Tenant {
	tn := w.s.NewTenant(uniq("openapi"))
	base := "/admin/v1/tenants/" + tn.ID
	w.admin(200, "GET", base, nil)
	w.admin(200, "PATCH", base, map[string]any{"rate_limit_per_second": 500, "rate_limit_burst": 1000})
	k := w.admin(201, "POST", base+"/api-keys", map[string]any{"environment": "sandbox"})
	w.admin(204, "DELETE", base+"/api-keys/"+str(w.t, k.Body["id"], "key id"), nil)
	w.admin(200, "GET", base+"/api-keys", nil)
	w.admin(200, "GET", "/admin/v1/tenants?limit=2", nil)
	w.admin(200, "PUT", base+"/webhook", map[string]any{"url": hookURL})
	w.admin(200, "POST", base+"/webhook/rotate-secret", nil)
	return tn
}

func (w *openAPIWalk) tenant() {
	w.want(200, "GET", "/v1/tenant", nil)
	w.want(200, "PATCH", "/v1/tenant", map[string]any{"default_overage_policy": "block", "default_low_balance_threshold_mc": 5000})
}

func (w *openAPIWalk) customers() {
	w.ext = uniq("acme")
	c := w.want(201, "POST", "/v1/customers", map[string]any{"external_id": w.ext, "display_name": "Acme Corp",
		"overage_policy": "block", "low_balance_threshold_mc": 20000, "metadata": map[string]any{"plan": "pro"}})
	w.customer = str(w.t, c.Body["id"], "customer id")
	w.want(200, "GET", "/v1/customers?limit=10&search=acme", nil)
	w.want(200, "GET", "/v1/customers/"+w.customer, nil)
	w.want(200, "PATCH", "/v1/customers/"+w.customer, map[string]any{"display_name": "Acme Corporation"})
	strict := "/v1/customer-by-external-id/" + url.PathEscape(w.ext)
	w.want(200, "GET", strict, nil)
	w.want(200, "PATCH", strict, map[string]any{"metadata": map[string]any{"plan": "enterprise"}})

	w.want(201, "POST", "/v1/customers/"+w.customer+"/credits/grant", map[string]any{"credits": 100000,
		"source": "promotional", "reason": "welcome bonus", "duration_seconds": 86400 * 30, "priority": 10})
	w.want(201, "POST", strict+"/credits/grant", map[string]any{"credits": 50000, "source": "manual", "reason": "support credit"})
	w.want(200, "POST", "/v1/customers/"+w.customer+"/credits/adjust", map[string]any{"delta": -2500, "source": "compensation", "reason": "billing correction"})
	w.want(200, "POST", strict+"/credits/adjust", map[string]any{"delta": 1000, "source": "manual", "reason": "goodwill"})
	w.want(200, "GET", "/v1/customers/"+w.customer+"/credits?include_blocks=true", nil)
	w.want(200, "GET", strict+"/credits", nil)
	w.want(200, "GET", "/v1/customers/"+w.customer+"/credits/history?limit=5", nil)
	from, to := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339), time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	w.want(200, "GET", "/v1/customers/"+w.customer+"/overage?from="+from+"&to="+to, nil)

	gone, _ := w.a.newCustomer()
	w.want(204, "DELETE", "/v1/customers/"+gone, nil)
	_, goneExt := w.a.newCustomer()
	w.want(204, "DELETE", "/v1/customer-by-external-id/"+url.PathEscape(goneExt), nil)
}

func (w *openAPIWalk) pricing() {
	p := uniq("m")
	w.metered, w.flagKey, w.seats, w.limits = p+"-api-calls", p+"-sso", p+"-seats", p+"-limits"
	w.want(201, "POST", "/v1/billable-metrics", map[string]any{"key": w.metered, "name": "API calls", "type": "metered"})
	w.want(201, "POST", "/v1/billable-metrics", map[string]any{"key": w.flagKey, "name": "Single sign-on", "type": "boolean", "default_value": map[string]any{"enabled": false}})
	w.want(201, "POST", "/v1/billable-metrics", map[string]any{"key": w.seats, "name": "Seats", "type": "gauge", "default_value": map[string]any{"cap": 10}})
	w.want(201, "POST", "/v1/billable-metrics", map[string]any{"key": w.limits, "name": "Limits", "type": "static", "default_value": map[string]any{"config": map[string]any{"max_projects": 3}}})
	w.want(200, "GET", "/v1/billable-metrics?limit=10", nil)
	w.want(200, "GET", "/v1/billable-metrics/"+w.metered, nil)
	w.want(200, "PATCH", "/v1/billable-metrics/"+w.metered, map[string]any{"name": "API requests", "metadata": map[string]any{"unit": "request"}})
	w.want(201, "POST", "/v1/metering-rules", map[string]any{"billable_metric_key": w.metered, "cost_type": "per_unit", "unit_cost": 250})
	w.want(200, "GET", "/v1/metering-rules?billable_metric_key="+w.metered, nil)
}

func (w *openAPIWalk) entitlements() {
	q := url.Values{"customer_id": {w.customer}, "billable_metric_key": {w.metered}, "units": {"4"}}
	w.want(200, "GET", "/v1/entitlements/check?"+q.Encode(), nil)
	w.want(200, "GET", "/v1/customers/"+w.customer+"/entitlements/"+w.flagKey, nil)
	strict := "/v1/customer-by-external-id/" + url.PathEscape(w.ext)
	w.want(200, "GET", strict+"/entitlements/"+w.metered+"?units=2", nil)
	w.want(200, "POST", "/v1/entitlements/consume", map[string]any{"customer_id": w.customer, "billable_metric_key": w.metered,
		"units": 4, "metadata": map[string]any{"endpoint": "/search"}})
	w.want(200, "POST", "/v1/usage", map[string]any{"events": []any{
		map[string]any{"event_id": uniq("evt"), "customer_id": w.customer, "billable_metric_key": w.metered, "units": 10},
		map[string]any{"event_id": uniq("evt"), "customer_id": w.ext, "billable_metric_key": w.metered, "units": 3},
	}})
	// The usage reports over today and tomorrow (UTC days), after the
	// consume and the events above.
	today := time.Now().UTC().Truncate(24 * time.Hour)
	days := url.Values{"from": {today.Format(time.RFC3339)}, "to": {today.AddDate(0, 0, 2).Format(time.RFC3339)}}
	w.want(200, "GET", "/v1/customers/"+w.customer+"/usage?granularity=day&"+days.Encode(), nil)
	w.s.Drain()
	w.want(200, "GET", "/v1/usage?billable_metric_key="+w.metered+"&"+days.Encode(), nil)
	w.want(200, "POST", "/v1/customers/"+w.customer+"/entitlements/"+w.seats+"/increment", map[string]any{"amount": 3})
	w.want(200, "POST", "/v1/customers/"+w.customer+"/entitlements/"+w.seats+"/decrement", map[string]any{"amount": 1})
	w.want(200, "POST", strict+"/entitlements/"+w.seats+"/increment", map[string]any{"amount": 2, "policy": "block"})
	w.want(200, "POST", strict+"/entitlements/"+w.seats+"/decrement", map[string]any{"amount": 1})
	// Gauge leases: a leased increment, renew and release under both forms.
	r := w.want(200, "POST", "/v1/customers/"+w.customer+"/entitlements/"+w.seats+"/increment",
		map[string]any{"amount": 1, "lease_seconds": 60})
	lease, _ := r.Body["lease"].(map[string]any)
	leaseID := str(w.t, lease["id"], "lease id")
	forms := []string{"/v1/customers/" + w.customer, strict}
	for _, base := range forms {
		w.want(200, "POST", base+"/entitlements/"+w.seats+"/leases/"+leaseID+"/renew", map[string]any{"lease_seconds": 120})
	}
	// The second release finds the lease ended: still 200 (idempotent by lease id).
	for _, base := range forms {
		w.want(200, "POST", base+"/entitlements/"+w.seats+"/leases/"+leaseID+"/release", nil)
	}
}

func (w *openAPIWalk) reservations() {
	r := w.want(201, "POST", "/v1/reservations", map[string]any{"customer_id": w.customer, "billable_metric_key": w.metered,
		"estimated_units": 20, "ttl_seconds": 300})
	id := str(w.t, r.Body["id"], "reservation id")
	w.want(200, "GET", "/v1/reservations/"+id, nil)
	w.want(200, "POST", "/v1/reservations/"+id+"/extend", map[string]any{"additional_units": 1, "ttl_seconds": 600})
	w.want(200, "POST", "/v1/reservations/"+id+"/commit", map[string]any{"actual_units": 2, "final": false})
	w.want(200, "GET", "/v1/reservations/"+id, nil)
	w.want(200, "POST", "/v1/reservations/"+id+"/commit", map[string]any{"actual_units": 12})
	r = w.want(201, "POST", "/v1/reservations", map[string]any{"external_customer_id": w.ext, "billable_metric_key": w.metered, "estimated_units": 5})
	w.want(200, "POST", "/v1/reservations/"+str(w.t, r.Body["id"], "reservation id")+"/release", nil)
	w.want(200, "GET", "/v1/customers/"+w.customer+"/reservations?status=committed", nil)
	w.want(200, "GET", "/v1/customer-by-external-id/"+url.PathEscape(w.ext)+"/reservations", nil)
}

func (w *openAPIWalk) plansAndSubscriptions() {
	plan := w.want(201, "POST", "/v1/plans", map[string]any{"name": "Pro", "metadata": map[string]any{"tier": "2"}})
	pid := str(w.t, plan.Body["id"], "plan id")
	w.want(200, "GET", "/v1/plans?include_variants=true", nil)
	w.want(200, "GET", "/v1/plans/"+pid, nil)
	w.want(200, "PATCH", "/v1/plans/"+pid, map[string]any{"name": "Pro (2026)"})
	monthly := w.want(201, "POST", "/v1/plans/"+pid+"/variants", map[string]any{"billing_cycle": "monthly", "billing_mode": "prepaid"})
	vid := str(w.t, monthly.Body["id"], "variant id")
	yearly := w.want(201, "POST", "/v1/plans/"+pid+"/variants", map[string]any{"billing_cycle": "yearly"})
	yid := str(w.t, yearly.Body["id"], "variant id")
	w.want(200, "GET", "/v1/plans/"+pid+"/variants", nil)
	w.want(200, "PATCH", "/v1/plans/"+pid+"/variants/"+vid, map[string]any{"metadata": map[string]any{"sku": "PRO-M"}})
	w.want(201, "POST", "/v1/plans/"+pid+"/variants/"+vid+"/grants", map[string]any{"credits": 500000,
		"grant_interval": "billing_period", "grant_type": "recurring", "rollover_percentage": 50, "max_rollover_cycles": 2})
	w.want(201, "POST", "/v1/plans/"+pid+"/variants/"+vid+"/entitlements", map[string]any{"billable_metric_key": w.seats, "value": map[string]any{"cap": 25}})
	w.want(201, "POST", "/v1/plans/"+pid+"/variants/"+vid+"/entitlements", map[string]any{"billable_metric_key": w.flagKey, "value": map[string]any{"enabled": true}})
	w.want(200, "GET", "/v1/plan-variants/"+vid, nil)

	cust, _ := w.a.newCustomer()
	sub := w.want(201, "POST", "/v1/subscriptions", map[string]any{"customer_id": cust, "plan_variant_id": vid})
	sid := str(w.t, sub.Body["id"], "subscription id")
	w.want(200, "GET", "/v1/subscriptions/"+sid, nil)
	w.want(200, "GET", "/v1/subscriptions/"+sid+"/usage", nil)
	w.want(200, "GET", "/v1/customers/"+cust+"/subscriptions", nil)
	ov := "/v1/subscriptions/" + sid + "/overrides"
	w.want(201, "POST", ov, map[string]any{"billable_metric_key": w.seats, "value": map[string]any{"cap": 50}, "reason": "enterprise deal"})
	w.want(200, "GET", ov, nil)
	w.want(200, "PATCH", ov+"/"+w.seats, map[string]any{"value": map[string]any{"cap": 60}})
	w.want(204, "DELETE", ov+"/"+w.seats, nil)
	w.want(200, "GET", "/v1/customers/"+cust+"/entitlements", nil)
	custExt := str(w.t, w.want(200, "GET", "/v1/customers/"+cust, nil).Body["external_id"], "external_id")
	w.want(200, "GET", "/v1/customer-by-external-id/"+url.PathEscape(custExt)+"/entitlements", nil)
	w.want(200, "POST", "/v1/subscriptions/"+sid+"/renew", nil)
	w.want(200, "POST", "/v1/subscriptions/"+sid+"/pause", nil)
	w.want(200, "POST", "/v1/subscriptions/"+sid+"/resume", nil)
	w.want(200, "POST", "/v1/subscriptions/"+sid+"/upgrade", map[string]any{"plan_variant_id": yid})
	w.want(200, "POST", "/v1/subscriptions/"+sid+"/cancel", map[string]any{"at_period_end": false})
}

func (w *openAPIWalk) topupsAndImport() {
	w.want(201, "POST", "/v1/customers/"+w.customer+"/topups", map[string]any{"credits": 250000, "payment_reference": "pi_3PqRsT2eZvKYlo2C",
		"priority": 5, "metadata": map[string]any{"invoice": "INV-2026-0042"}})
	w.want(200, "GET", "/v1/customers/"+w.customer+"/topups", nil)
	w.want(200, "POST", "/v1/import", map[string]any{"customers": []any{
		map[string]any{"external_id": uniq("legacy"), "display_name": "Legacy Co", "credits": []any{map[string]any{"credits": 75000, "priority": 1}}},
	}, "options": map[string]any{"dry_run": false}})
}

// alerts sets a customer's thresholds and top-up rule and crosses both,
// so credit.threshold_crossed and credit.topup_requested are delivered.
func (w *openAPIWalk) alerts() {
	w.want(200, "GET", "/v1/credit-alerts/default", nil)
	w.want(200, "PUT", "/v1/credit-alerts/default", map[string]any{"thresholds": []any{
		map[string]any{"type": "percent_of_last_grant", "percent": 20}}})
	cust, _ := w.a.newCustomer()
	w.a.grant(cust, map[string]any{"credits": 100000, "source": "promotional", "reason": "seed"})
	path := "/v1/customers/" + cust + "/credits/alerts"
	w.want(200, "GET", path, nil)
	w.want(200, "PUT", path, map[string]any{
		"thresholds": []any{map[string]any{"type": "absolute", "amount_mc": 50000}},
		"topup":      map[string]any{"below_mc": 50000, "amount_mc": 250000}})
	w.want(200, "POST", "/v1/customers/"+cust+"/credits/adjust", map[string]any{"delta": -60000, "source": "manual", "reason": "use"})
	// Settings apply as the persister stores an operation: let it store
	// the adjustment before they go.
	w.s.Drain()
	w.want(204, "DELETE", path, nil)
}

func (w *openAPIWalk) webhooks() {
	w.want(202, "POST", "/v1/webhooks/test", nil)
	deadline := time.Now().Add(15 * time.Second)
	for {
		r := w.want(200, "GET", "/v1/webhooks/events?status=delivered&limit=100", nil)
		if len(arr(w.t, r.Body["data"], "data")) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := w.want(200, "GET", "/v1/webhooks/events?limit=100", nil)
	events := arr(w.t, r.Body["data"], "data")
	if len(events) == 0 {
		w.t.Fatal("no webhook events")
	}
	id := str(w.t, obj(w.t, events[0], "event")["id"], "event id")
	// Only a dead letter can be redelivered; this one is not, so 409.
	w.want(409, "POST", "/v1/webhooks/events/"+id+"/redeliver", nil)
	w.want(200, "GET", "/v1/events?after_sequence=0&limit=100", nil)
	// A stream never ends: its status and headers are checked, then it is
	// closed.
	req, err := http.NewRequest("GET", w.s.URL+"/v1/customers/"+w.customer+"/credits/stream", nil)
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("X-API-Key", w.a.key)
	req.Header.Set("Last-Event-ID", "1")
	res, err := w.s.HTTP.Do(req)
	if err != nil {
		w.t.Fatalf("stream: %v", err)
	}
	_ = res.Body.Close()
	if res.StatusCode != 200 {
		w.t.Errorf("stream: %d", res.StatusCode)
	}
	// The tenant's change stream, resumed from a cursor, the same way.
	req, err = http.NewRequest("GET", w.s.URL+"/v1/changes/stream", nil)
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("X-API-Key", w.a.key)
	req.Header.Set("Last-Event-ID", "1.0-0")
	res, err = w.s.HTTP.Do(req)
	if err != nil {
		w.t.Fatalf("change stream: %v", err)
	}
	_ = res.Body.Close()
	if res.StatusCode != 200 {
		w.t.Errorf("change stream: %d", res.StatusCode)
	}
}

// problems asks for one answer of each problem status the document lists.
func (w *openAPIWalk) problems() {
	w.want(404, "GET", "/v1/customers/"+uniq("nobody"), nil)
	w.want(400, "GET", "/v1/customers?cursor=not-a-cursor", nil)
	checkStatus(w.t, w.a.do("POST", "/v1/customers", "", map[string]any{"external_id": uniq("x")}), 422, "no Idempotency-Key")
	w.want(409, "POST", "/v1/entitlements/consume", map[string]any{"customer_id": w.customer, "billable_metric_key": w.metered, "units": 1 << 40})
	checkStatus(w.t, w.s.as(w.t, "ck_live_wrong").do("GET", "/v1/tenant", "", nil), 401, "bad key")
	big := fmt.Sprintf(`{"external_id":"%s"}`, strings.Repeat("x", 2<<20))
	checkStatus(w.t, w.a.do("POST", "/v1/customers", idemKey(), big), 413, "body too large")
}
