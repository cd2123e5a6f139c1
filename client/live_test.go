package client_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creditd/creditd/client"
	"github.com/creditd/creditd/internal/e2e"
	"github.com/creditd/creditd/internal/testenv"
)

// delivery is one webhook request a receiver got.
type delivery struct {
	header http.Header
	body   []byte
}

// receiver is a webhook endpoint that records what creditd delivers.
type receiver struct {
	mu  sync.Mutex
	got []delivery
	srv *httptest.Server
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		r.got = append(r.got, delivery{header: req.Header.Clone(), body: b})
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// waitFor returns the delivery whose webhook-id is id, waiting up to 20 s.
func (r *receiver) waitFor(t *testing.T, id string) delivery {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		r.mu.Lock()
		for _, d := range r.got {
			if d.header.Get("webhook-id") == id {
				r.mu.Unlock()
				return d
			}
		}
		r.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no delivery of event %s in 20 s", id)
	return delivery{}
}

func (r *receiver) all() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}

// liveStack starts creditd (in process, real Redis and Postgres, fresh
// database and key prefix) with a tenant whose webhook points at a
// receiver; it returns the tenant's live key and the webhook's signing
// secret.
func liveStack(t *testing.T) (*e2e.Stack, string, *receiver, string) {
	t.Helper()
	s := e2e.NewStack(t)
	tn := s.NewTenant("client-" + testenv.RandomSuffix())
	rcv := newReceiver(t)
	put := e2e.Call(t, s.HTTP, s.URL, "PUT", "/admin/v1/tenants/"+tn.ID+"/webhook", map[string]any{"url": rcv.srv.URL},
		"Authorization", "Bearer "+e2e.AdminToken)
	secret, _ := put.Body["secret"].(string)
	if put.Status != 200 || secret == "" {
		t.Fatalf("set webhook: %d %s", put.Status, put.Raw)
	}
	return s, tn.Live, rcv, secret
}

// recorder is an http.RoundTripper that notes the method and path of
// every request the client sends, then sends it through next.
type recorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	sent []string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.sent = append(r.sent, req.Method+" "+req.URL.EscapedPath())
	r.mu.Unlock()
	return r.next.RoundTrip(req)
}

// uncovered lists the tenant operations of api/openapi.json that no
// recorded request matched.
func (r *recorder) uncovered(t *testing.T) []string {
	t.Helper()
	raw, err := os.ReadFile("../api/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	param := regexp.MustCompile(`\{[^}]+\}`)
	r.mu.Lock()
	defer r.mu.Unlock()
	var missing []string
	for path, item := range doc.Paths {
		if !strings.HasPrefix(path, "/v1/") {
			continue
		}
		parts := param.Split(path, -1)
		for i := range parts {
			parts[i] = regexp.QuoteMeta(parts[i])
		}
		re := regexp.MustCompile("^" + strings.Join(parts, `[^/]+`) + "$")
		for method, op := range item {
			hit := false
			for _, s := range r.sent {
				m, p, _ := strings.Cut(s, " ")
				if strings.EqualFold(m, method) && re.MatchString(p) {
					hit = true
					break
				}
			}
			if !hit {
				missing = append(missing, op.OperationID)
			}
		}
	}
	sort.Strings(missing)
	return missing
}

func must(t *testing.T, err error, what string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func wantProblem(t *testing.T, err error, status int, typ, what string) *client.Problem {
	t.Helper()
	p, ok := client.AsProblem(err)
	if !ok || p.Status != status || p.Type != typ || p.RequestID == "" || p.Title == "" {
		t.Fatalf("%s: error %v, want a %d %s problem with a request id", what, err, status, typ)
	}
	return p
}

// TestAgainstCreditd drives every tenant operation of the client against a
// real creditd and checks what each answer says; it fails when an
// operation of api/openapi.json was never called.
func TestAgainstCreditd(t *testing.T) {
	s, key, rcv, secret := liveStack(t)
	// Through the stack's own transport: whatever the harness checks of
	// its answers, it checks of the client's too.
	next := s.HTTP.Transport
	if next == nil {
		next = http.DefaultTransport
	}
	rec := &recorder{next: next}
	c := client.New(s.URL, key, client.WithHTTPClient(&http.Client{Transport: rec, Timeout: 30 * time.Second}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	t.Run("tenant", func(t *testing.T) {
		tc, err := c.GetTenant(ctx)
		must(t, err, "GetTenant")
		up, err := c.UpdateTenant(ctx, client.TenantConfigInput{DefaultOveragePolicy: client.Ptr("block"), DefaultLowBalanceThresholdMC: client.Ptr[int64](0)})
		must(t, err, "UpdateTenant")
		if up.ID != tc.ID || up.DefaultOveragePolicy != "block" || up.DefaultLowBalanceThresholdMC != 0 {
			t.Fatalf("UpdateTenant = %+v", up)
		}
	})

	var adaID string
	t.Run("customers", func(t *testing.T) {
		ada, err := c.CreateCustomer(ctx, client.CreateCustomerInput{ExternalID: "ada", DisplayName: client.Ptr("Ada"), Metadata: map[string]any{"tier": "gold"}})
		must(t, err, "CreateCustomer")
		adaID = ada.ID
		if ada.ExternalID != "ada" || ada.DisplayName == nil || *ada.DisplayName != "Ada" || ada.Environment != "live" || ada.Metadata["tier"] != "gold" {
			t.Fatalf("CreateCustomer = %+v", ada)
		}
		got, err := c.GetCustomer(ctx, ada.ID)
		must(t, err, "GetCustomer")
		byExt, err := c.GetCustomerByExternalID(ctx, "ada")
		must(t, err, "GetCustomerByExternalID")
		if got.ID != ada.ID || byExt.ID != ada.ID {
			t.Fatalf("reads gave %s and %s, want %s", got.ID, byExt.ID, ada.ID)
		}
		up, err := c.UpdateCustomer(ctx, "ada", client.UpdateCustomerInput{OveragePolicy: client.Ptr("allow")})
		must(t, err, "UpdateCustomer")
		up2, err := c.UpdateCustomerByExternalID(ctx, "ada", client.UpdateCustomerInput{DisplayName: client.Ptr("")})
		must(t, err, "UpdateCustomerByExternalID")
		if up.OveragePolicy == nil || *up.OveragePolicy != "allow" || up2.DisplayName != nil && *up2.DisplayName != "" {
			t.Fatalf("updates gave %+v then %+v", up, up2)
		}
		for _, ext := range []string{"bob", "cy"} {
			_, err := c.CreateCustomer(ctx, client.CreateCustomerInput{ExternalID: ext})
			must(t, err, "CreateCustomer "+ext)
		}
		page, err := c.ListCustomers(ctx, &client.ListCustomersParams{Limit: client.Ptr(2)})
		must(t, err, "ListCustomers")
		if len(page.Data) != 2 || !page.Pagination.HasMore || page.Pagination.NextCursor == nil || page.Data[0].ExternalID != "cy" {
			t.Fatalf("first page %+v", page)
		}
		next, err := c.ListCustomers(ctx, &client.ListCustomersParams{Limit: client.Ptr(2), Cursor: page.Pagination.NextCursor})
		must(t, err, "ListCustomers page 2")
		if len(next.Data) != 1 || next.Data[0].ExternalID != "ada" || next.Pagination.HasMore {
			t.Fatalf("second page %+v", next)
		}
		must(t, c.DeleteCustomer(ctx, "bob"), "DeleteCustomer")
		must(t, c.DeleteCustomerByExternalID(ctx, "cy"), "DeleteCustomerByExternalID")
		_, err = c.GetCustomer(ctx, "bob")
		wantProblem(t, err, 404, client.ProblemNotFound, "GetCustomer of a deleted customer")
		_, err = c.CreateCustomer(ctx, client.CreateCustomerInput{})
		if p := wantProblem(t, err, 422, client.ProblemValidation, "CreateCustomer without external_id"); p.Field != "external_id" || len(p.Errors) != 1 {
			t.Fatalf("problem %+v does not name external_id", p)
		}
		_, err = c.CreateCustomer(ctx, client.CreateCustomerInput{ExternalID: "ada"})
		wantProblem(t, err, 409, client.ProblemConflict, "CreateCustomer of a taken external_id")
	})

	t.Run("credits", func(t *testing.T) {
		var first, again client.Response
		g, err := c.GrantCredits(ctx, "ada", client.GrantInput{Credits: 10_000, Source: "promotional", Reason: "welcome"}, client.WithResponse(&first))
		must(t, err, "GrantCredits")
		if g.Account.Balance != 10_000 || g.Block.RemainingAmount != 10_000 || first.Replayed || first.StatusCode != 201 {
			t.Fatalf("GrantCredits = %+v (%+v)", g, first)
		}
		// The same key again replays: no second block.
		g2, err := c.GrantCredits(ctx, "ada", client.GrantInput{Credits: 10_000, Source: "promotional", Reason: "welcome"},
			client.WithIdempotencyKey(first.IdempotencyKey), client.WithResponse(&again))
		must(t, err, "GrantCredits replay")
		if !again.Replayed || g2.Transaction.ID != g.Transaction.ID || g2.Account.Balance != 10_000 {
			t.Fatalf("replay = %+v (%+v), want the first grant again", g2, again)
		}
		_, err = c.GrantCreditsByExternalID(ctx, "ada", client.GrantInput{Credits: 2_000, Source: "manual", Reason: "r", Priority: client.Ptr(5)})
		must(t, err, "GrantCreditsByExternalID")
		adj, err := c.AdjustCredits(ctx, "ada", client.AdjustInput{Delta: -1_000, Source: "manual", Reason: "fix"})
		must(t, err, "AdjustCredits")
		if adj.Block != nil || len(adj.Transactions) == 0 || adj.Account.Balance != 11_000 {
			t.Fatalf("AdjustCredits = %+v", adj)
		}
		adj2, err := c.AdjustCreditsByExternalID(ctx, "ada", client.AdjustInput{Delta: 500, Source: "compensation", Reason: "sorry"})
		must(t, err, "AdjustCreditsByExternalID")
		if adj2.Block == nil || adj2.Account.Balance != 11_500 {
			t.Fatalf("AdjustCreditsByExternalID = %+v", adj2)
		}
		_, err = c.AdjustCredits(ctx, "ada", client.AdjustInput{Delta: -1_000_000, Source: "manual", Reason: "too much"})
		wantProblem(t, err, 409, client.ProblemInsufficientCredits, "AdjustCredits past the balance")
		top, err := c.CreateTopup(ctx, "ada", client.TopupInput{Credits: 3_000, PaymentReference: client.Ptr("pi_1")})
		must(t, err, "CreateTopup")
		if top.Account.Balance != 14_500 {
			t.Fatalf("CreateTopup = %+v", top)
		}
		acct, err := c.GetCredits(ctx, "ada", &client.GetCreditsParams{IncludeBlocks: client.Ptr("true")})
		must(t, err, "GetCredits")
		byExt, err := c.GetCreditsByExternalID(ctx, "ada", nil)
		must(t, err, "GetCreditsByExternalID")
		if acct.Balance != 14_500 || len(acct.Blocks) < 3 || byExt.Balance != 14_500 || len(byExt.Blocks) != 0 {
			t.Fatalf("GetCredits = %+v, by external id %+v", acct, byExt)
		}
		s.Drain() // history and topups are read from Postgres
		hist, err := c.CreditHistory(ctx, "ada", &client.CreditHistoryParams{Limit: client.Ptr(100)})
		must(t, err, "CreditHistory")
		types := map[string]int{}
		for _, e := range hist.Data {
			types[e.Type]++
		}
		var walked []string // the same entries, two a page
		for e, err := range c.CreditHistoryAll(ctx, "ada", &client.CreditHistoryParams{Limit: client.Ptr(2)}) {
			must(t, err, "CreditHistoryAll")
			walked = append(walked, e.ID)
		}
		if len(walked) != len(hist.Data) || walked[0] != hist.Data[0].ID || walked[4] != hist.Data[4].ID {
			t.Fatalf("CreditHistoryAll walked %v, the one page holds %d entries", walked, len(hist.Data))
		}
		if len(hist.Data) != 5 || types["topup"] != 1 || types["adjustment"] != 4 {
			t.Fatalf("CreditHistory has %d entries (%v), want 4 adjustments and a topup", len(hist.Data), types)
		}
		tops, err := c.ListTopups(ctx, "ada", nil)
		must(t, err, "ListTopups")
		if len(tops.Data) != 1 || tops.Data[0].Credits == nil || *tops.Data[0].Credits != 3_000 {
			t.Fatalf("ListTopups = %+v", tops)
		}
		now := time.Now()
		ov, err := c.Overage(ctx, "ada", client.OverageParams{From: now.Add(-time.Hour), To: now.Add(time.Hour)})
		must(t, err, "Overage")
		if ov.TotalOverageMC != 0 || !ov.Period.To.After(ov.Period.From) {
			t.Fatalf("Overage = %+v", ov)
		}
		imp, err := c.ImportCustomers(ctx, client.ImportInput{Customers: []client.ImportInputCustomer{
			{ExternalID: "imported", Credits: []client.ImportInputCustomerCredit{{Credits: 700}}},
			{ExternalID: "ada"},
		}})
		must(t, err, "ImportCustomers")
		if imp.Created != 1 || imp.Skipped != 1 || len(imp.Errors) != 0 {
			t.Fatalf("ImportCustomers = %+v", imp)
		}
	})

	t.Run("pricing and entitlements", func(t *testing.T) {
		rule, err := c.CreateMeteringRule(ctx, client.RuleInput{BillableMetricKey: "api_calls", CostType: "per_unit", UnitCost: client.Ptr[int64](100)})
		must(t, err, "CreateMeteringRule")
		if rule.EffectiveUntil != nil || rule.CostType != "per_unit" {
			t.Fatalf("CreateMeteringRule = %+v", rule)
		}
		rules, err := c.ListMeteringRules(ctx, &client.ListMeteringRulesParams{BillableMetricKey: client.Ptr("api_calls"), ActiveOnly: client.Ptr("true")})
		must(t, err, "ListMeteringRules")
		if len(rules.Data) != 1 || rules.Data[0].ID != rule.ID {
			t.Fatalf("ListMeteringRules = %+v", rules)
		}
		seats, err := c.CreateBillableMetric(ctx, client.MetricInput{Key: client.Ptr("seats"), Type: client.Ptr("gauge"), DefaultValue: client.Value(map[string]any{"cap": 5})})
		must(t, err, "CreateBillableMetric")
		renamed, err := c.UpdateBillableMetric(ctx, "seats", client.MetricInput{Name: client.Ptr("Seats")})
		must(t, err, "UpdateBillableMetric")
		got, err := c.GetBillableMetric(ctx, "seats")
		must(t, err, "GetBillableMetric")
		if seats.Type != "gauge" || renamed.Name != "Seats" || got.Name != "Seats" {
			t.Fatalf("metric %+v, renamed %+v, read %+v", seats, renamed, got)
		}
		metrics, err := c.ListBillableMetrics(ctx, nil)
		must(t, err, "ListBillableMetrics")
		if len(metrics.Data) != 2 {
			t.Fatalf("ListBillableMetrics has %d metrics, want api_calls and seats", len(metrics.Data))
		}

		chk, err := c.CheckEntitlement(ctx, client.CheckEntitlementParams{CustomerID: "ada", BillableMetricKey: "api_calls", Units: client.Ptr[int64](3)})
		must(t, err, "CheckEntitlement")
		if !chk.Allowed || chk.EstimatedCost == nil || *chk.EstimatedCost != 300 {
			t.Fatalf("CheckEntitlement = %+v", chk)
		}
		chk2, err := c.CheckCustomerEntitlement(ctx, "ada", "seats", nil)
		must(t, err, "CheckCustomerEntitlement")
		chk3, err := c.CheckCustomerEntitlementByExternalID(ctx, "ada", "api_calls", &client.CheckCustomerEntitlementByExternalIDParams{Units: client.Ptr[int64](1_000_000)})
		must(t, err, "CheckCustomerEntitlementByExternalID")
		// ada's overage policy is allow: the check allows, balance_after tells.
		if chk2.Type != "gauge" || chk2.Cap == nil || *chk2.Cap != 5 || chk3.BalanceAfter == nil || *chk3.BalanceAfter >= 0 {
			t.Fatalf("gauge check %+v, big check %+v", chk2, chk3)
		}
		con, err := c.Consume(ctx, client.ConsumeInput{CustomerID: "ada", BillableMetricKey: "api_calls", Units: 2})
		must(t, err, "Consume")
		// billable_metric_key and units are nullable (null for the items
		// form); the single form fills both.
		if con.Charged != 200 || con.TransactionID == nil || con.Reason != nil ||
			con.BillableMetricKey == nil || *con.BillableMetricKey != "api_calls" || con.Units == nil || *con.Units != 2 {
			t.Fatalf("Consume = %+v", con)
		}
		use, err := c.ReportUsage(ctx, client.UsageInput{Events: []client.UsageEvent{
			{EventID: "ev-1", CustomerID: "ada", BillableMetricKey: "api_calls", Units: 1},
			{EventID: "ev-1", CustomerID: "ada", BillableMetricKey: "api_calls", Units: 1},
		}})
		must(t, err, "ReportUsage")
		if len(use.Results) != 2 || use.Results[0].Status != "charged" || use.Results[1].Status != "duplicate" {
			t.Fatalf("ReportUsage = %+v", use)
		}
		// The usage reports: the consume and the one charged event, in
		// the UTC days around now (two, should midnight fall in between).
		yesterday := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -1)
		days := client.CustomerUsageParams{From: yesterday, To: yesterday.AddDate(0, 0, 3), Granularity: client.Ptr("day")}
		rep, err := c.CustomerUsage(ctx, "ada", days)
		must(t, err, "CustomerUsage")
		if len(rep.Data) != 1 || rep.Data[0].BillableMetricKey != "api_calls" || rep.Data[0].Units != 3 ||
			rep.Data[0].Cost != 300 || rep.Data[0].Count != 2 || len(rep.Data[0].Buckets) == 0 {
			t.Fatalf("CustomerUsage = %+v", rep)
		}
		_, err = c.TenantUsage(ctx, client.TenantUsageParams{From: yesterday, To: yesterday.AddDate(0, 0, 3), BillableMetricKey: client.Ptr("api_calls")})
		must(t, err, "TenantUsage")
		inc, err := c.IncrementGauge(ctx, "ada", "seats", client.GaugeInput{Amount: 3})
		must(t, err, "IncrementGauge")
		inc2, err := c.IncrementGaugeByExternalID(ctx, "ada", "seats", client.GaugeInput{Amount: 1})
		must(t, err, "IncrementGaugeByExternalID")
		dec, err := c.DecrementGauge(ctx, "ada", "seats", client.GaugeInput{Amount: 2})
		must(t, err, "DecrementGauge")
		dec2, err := c.DecrementGaugeByExternalID(ctx, "ada", "seats", client.GaugeInput{Amount: 1})
		must(t, err, "DecrementGaugeByExternalID")
		if inc.Current != 3 || inc2.Current != 4 || dec.Current != 2 || dec2.Current != 1 || dec2.Headroom != 4 {
			t.Fatalf("gauge went %d, %d, %d, %d (headroom %d)", inc.Current, inc2.Current, dec.Current, dec2.Current, dec2.Headroom)
		}
		_, err = c.IncrementGauge(ctx, "ada", "seats", client.GaugeInput{Amount: 10})
		p := wantProblem(t, err, 409, client.ProblemConflict, "IncrementGauge past the cap")
		if p.Current == nil || *p.Current != 1 || p.Cap == nil || *p.Cap != 5 || p.Shortfall == nil || *p.Shortfall != 6 {
			t.Fatalf("gauge problem %+v, want current 1, cap 5, shortfall 6", p)
		}
		snap, err := c.EntitlementSnapshot(ctx, "ada", &client.EntitlementSnapshotParams{CacheControl: client.Ptr("no-cache")})
		must(t, err, "EntitlementSnapshot")
		snap2, err := c.EntitlementSnapshotByExternalID(ctx, "ada", nil)
		must(t, err, "EntitlementSnapshotByExternalID")
		if e, ok := snap.Entitlements["seats"]; !ok || e.Current == nil || *e.Current != 1 || snap2.CustomerID != adaID || len(snap.Entitlements) != 2 {
			t.Fatalf("snapshot %+v, by external id %+v", snap, snap2)
		}
		// Leases: a leased increment's slots return on release; renew and
		// release by id under both customer forms.
		leased, err := c.IncrementGauge(ctx, "ada", "seats", client.GaugeInput{Amount: 2, LeaseSeconds: client.Ptr(60)})
		must(t, err, "IncrementGauge with a lease")
		if leased.Lease == nil || leased.Lease.Status != "active" || leased.Current != 3 {
			t.Fatalf("leased increment %+v", leased)
		}
		ren, err := c.RenewGaugeLease(ctx, "ada", "seats", leased.Lease.ID, &client.LeaseRenewInput{LeaseSeconds: client.Ptr(120)})
		must(t, err, "RenewGaugeLease")
		ren2, err := c.RenewGaugeLeaseByExternalID(ctx, "ada", "seats", leased.Lease.ID, nil)
		must(t, err, "RenewGaugeLeaseByExternalID")
		if ren.Lease == nil || !ren.Lease.ExpiresAt.After(leased.Lease.ExpiresAt) || ren2.Lease == nil || ren2.Current != 3 {
			t.Fatalf("renew %+v, by external id %+v", ren, ren2)
		}
		rel, err := c.ReleaseGaugeLease(ctx, "ada", "seats", leased.Lease.ID)
		must(t, err, "ReleaseGaugeLease")
		rel2, err := c.ReleaseGaugeLeaseByExternalID(ctx, "ada", "seats", leased.Lease.ID)
		must(t, err, "ReleaseGaugeLeaseByExternalID")
		if rel.Current != 1 || rel.Lease == nil || rel.Lease.Status != "released" || rel2.Current != 1 || rel2.Lease == nil || rel2.Lease.Status != "released" {
			t.Fatalf("release %+v, again %+v", rel, rel2)
		}
		_, err = c.GetCustomerByExternalID(ctx, "nobody")
		wantProblem(t, err, 404, client.ProblemNotFound, "GetCustomerByExternalID of nobody")
	})

	t.Run("reservations", func(t *testing.T) {
		reservation, err := c.CreateReservation(ctx, client.ReserveInput{CustomerID: client.Ptr("ada"), BillableMetricKey: "api_calls", EstimatedUnits: 10, TTLSeconds: client.Ptr(600)})
		must(t, err, "CreateReservation")
		if reservation.Status != "active" || reservation.EstimatedCost != 1_000 || reservation.Account.ReservedBalance != 1_000 {
			t.Fatalf("CreateReservation = %+v", reservation)
		}
		got, err := c.GetReservation(ctx, reservation.ID)
		must(t, err, "GetReservation")
		if got.Status != "active" || got.ActualUnits != nil {
			t.Fatalf("GetReservation = %+v", got)
		}
		com, err := c.CommitReservation(ctx, reservation.ID, client.CommitInput{ActualUnits: client.Ptr[int64](4)})
		must(t, err, "CommitReservation")
		if com.Status != "committed" || com.ActualCost != 400 || com.Released != 1_000 || com.Account.ReservedBalance != 0 {
			t.Fatalf("CommitReservation = %+v", com)
		}
		_, err = c.CommitReservation(ctx, reservation.ID, client.CommitInput{ActualUnits: client.Ptr[int64](4)})
		if err != nil {
			// A second commit with a new key is a state clash.
			wantProblem(t, err, 409, client.ProblemConflict, "second commit")
		} else {
			t.Fatal("a second commit of a committed reservation succeeded")
		}
		reservation2, err := c.CreateReservation(ctx, client.ReserveInput{ExternalCustomerID: client.Ptr("ada"), BillableMetricKey: "api_calls", EstimatedUnits: 1})
		must(t, err, "CreateReservation by external id")
		rel, err := c.ReleaseReservation(ctx, reservation2.ID)
		must(t, err, "ReleaseReservation")
		if rel.Status != "released" || rel.Released != 100 {
			t.Fatalf("ReleaseReservation = %+v", rel)
		}
		list, err := c.ListCustomerReservations(ctx, "ada", &client.ListCustomerReservationsParams{Status: client.Ptr("committed")})
		must(t, err, "ListCustomerReservations")
		all, err := c.ListCustomerReservationsByExternalID(ctx, "ada", nil)
		must(t, err, "ListCustomerReservationsByExternalID")
		if len(list.Data) != 1 || list.Data[0].ID != reservation.ID || len(all.Data) != 2 || all.Data[0].ID != reservation2.ID {
			t.Fatalf("committed holds %+v, all %+v", list.Data, all.Data)
		}
		// Issue 27: a top-up and a longer expiry, a partial commit, then a
		// release of what is still held.
		reservation3, err := c.CreateReservation(ctx, client.ReserveInput{CustomerID: client.Ptr("ada"), BillableMetricKey: "api_calls", EstimatedUnits: 1})
		must(t, err, "CreateReservation to extend")
		ext, err := c.ExtendReservation(ctx, reservation3.ID, client.ExtendInput{AdditionalUnits: client.Ptr[int64](1), TTLSeconds: client.Ptr(3600)})
		must(t, err, "ExtendReservation")
		if ext.Status != "active" || ext.EstimatedUnits != 2 || ext.EstimatedCost != 200 || ext.RemainingCost != 200 || !ext.ExpiresAt.After(reservation3.ExpiresAt) {
			t.Fatalf("ExtendReservation = %+v", ext)
		}
		part, err := c.CommitReservation(ctx, reservation3.ID, client.CommitInput{ActualUnits: client.Ptr[int64](1), Final: client.Ptr(false)})
		must(t, err, "partial CommitReservation")
		if part.Status != "active" || part.ActualCost != 100 || part.Released != 0 || part.SettledUnits != 1 || part.RemainingCost != 100 {
			t.Fatalf("partial CommitReservation = %+v", part)
		}
		rel3, err := c.ReleaseReservation(ctx, reservation3.ID)
		must(t, err, "ReleaseReservation after a partial commit")
		if rel3.Status != "released" || rel3.Released != 100 {
			t.Fatalf("ReleaseReservation after a partial commit = %+v", rel3)
		}
		_, err = c.CreateReservation(ctx, client.ReserveInput{CustomerID: client.Ptr("ada"), BillableMetricKey: "api_calls", EstimatedUnits: 1_000_000})
		wantProblem(t, err, 409, client.ProblemInsufficientCredits, "CreateReservation past the balance")
	})

	t.Run("plans and subscriptions", func(t *testing.T) {
		plan, err := c.CreatePlan(ctx, client.CreatePlanInput{Name: "Pro"})
		must(t, err, "CreatePlan")
		up, err := c.UpdatePlan(ctx, plan.ID, client.UpdatePlanInput{Name: client.Ptr("Pro 2")})
		must(t, err, "UpdatePlan")
		got, err := c.GetPlan(ctx, plan.ID)
		must(t, err, "GetPlan")
		if plan.Status != "active" || up.Name != "Pro 2" || got.Name != "Pro 2" {
			t.Fatalf("plan %+v, updated %+v, read %+v", plan, up, got)
		}
		monthly, err := c.CreatePlanVariant(ctx, plan.ID, client.CreatePlanVariantInput{BillingCycle: "monthly"})
		must(t, err, "CreatePlanVariant")
		yearly, err := c.CreatePlanVariant(ctx, plan.ID, client.CreatePlanVariantInput{BillingCycle: "yearly", TrialDays: client.Ptr(0)})
		must(t, err, "CreatePlanVariant yearly")
		uv, err := c.UpdatePlanVariant(ctx, plan.ID, yearly.ID, client.UpdatePlanVariantInput{Metadata: map[string]any{"k": "v"}})
		must(t, err, "UpdatePlanVariant")
		if monthly.BillingMode != "prepaid" || uv.Metadata["k"] != "v" {
			t.Fatalf("variant %+v, updated %+v", monthly, uv)
		}
		grant, err := c.CreatePlanGrant(ctx, plan.ID, monthly.ID, client.CreatePlanGrantInput{Credits: 1_000, GrantInterval: "billing_period", GrantType: "recurring", AccumulationCap: client.Null[int64]()})
		must(t, err, "CreatePlanGrant")
		if grant.AccumulationCap != nil || grant.Source != "plan_grant" {
			t.Fatalf("CreatePlanGrant = %+v", grant)
		}
		ent, err := c.PutVariantEntitlement(ctx, plan.ID, monthly.ID, client.VariantEntitlementInput{BillableMetricKey: "seats", Value: map[string]any{"cap": 10}})
		must(t, err, "PutVariantEntitlement")
		if ent.Type != "gauge" {
			t.Fatalf("PutVariantEntitlement = %+v", ent)
		}
		detail, err := c.GetPlanVariant(ctx, monthly.ID)
		must(t, err, "GetPlanVariant")
		vs, err := c.ListPlanVariants(ctx, plan.ID)
		must(t, err, "ListPlanVariants")
		plans, err := c.ListPlans(ctx, &client.ListPlansParams{IncludeVariants: client.Ptr(true)})
		must(t, err, "ListPlans")
		if len(detail.Grants) != 1 || len(detail.Entitlements) != 1 || len(vs.Data) != 2 || len(plans.Data) != 1 || len(plans.Data[0].Variants) != 2 {
			t.Fatalf("variant detail %+v, variants %d, plans %+v", detail, len(vs.Data), plans.Data)
		}

		sub, err := c.CreateSubscription(ctx, client.CreateSubscriptionInput{CustomerID: "ada", PlanVariantID: monthly.ID})
		must(t, err, "CreateSubscription")
		if sub.Status != "active" || sub.CurrentPeriodEnd == nil {
			t.Fatalf("CreateSubscription = %+v", sub)
		}
		got2, err := c.GetSubscription(ctx, sub.ID)
		must(t, err, "GetSubscription")
		subs, err := c.ListCustomerSubscriptions(ctx, "ada", nil)
		must(t, err, "ListCustomerSubscriptions")
		usage, err := c.GetSubscriptionUsage(ctx, sub.ID, nil)
		must(t, err, "GetSubscriptionUsage")
		if got2.ID != sub.ID || len(subs.Data) != 1 || usage.SubscriptionID != sub.ID {
			t.Fatalf("read %+v, list %+v, usage %+v", got2, subs, usage)
		}

		ov, err := c.CreateOverride(ctx, sub.ID, client.CreateOverrideInput{BillableMetricKey: "seats", Value: map[string]any{"cap": 20}, ExpiresAt: client.Ptr(time.Now().Add(time.Hour)), Reason: client.Ptr("trial")})
		must(t, err, "CreateOverride")
		perm, err := c.UpdateOverride(ctx, sub.ID, "seats", client.UpdateOverrideInput{ExpiresAt: client.Null[time.Time]()})
		must(t, err, "UpdateOverride")
		ovs, err := c.ListOverrides(ctx, sub.ID)
		must(t, err, "ListOverrides")
		if ov.ExpiresAt == nil || perm.ExpiresAt != nil || perm.Reason != "trial" || len(ovs.Overrides) != 1 {
			t.Fatalf("override %+v, made permanent %+v, list %+v", ov, perm, ovs)
		}
		must(t, c.DeleteOverride(ctx, sub.ID, "seats"), "DeleteOverride")
		if ovs, err := c.ListOverrides(ctx, sub.ID); err != nil || len(ovs.Overrides) != 0 {
			t.Fatalf("after delete: %+v, %v", ovs, err)
		}

		for _, step := range []struct {
			name string
			call func() (*client.Subscription, error)
			want string
		}{
			{"PauseSubscription", func() (*client.Subscription, error) { return c.PauseSubscription(ctx, sub.ID) }, "paused"},
			{"ResumeSubscription", func() (*client.Subscription, error) { return c.ResumeSubscription(ctx, sub.ID) }, "active"},
			{"RenewSubscription", func() (*client.Subscription, error) { return c.RenewSubscription(ctx, sub.ID) }, "active"},
			{"UpgradeSubscription", func() (*client.Subscription, error) {
				return c.UpgradeSubscription(ctx, sub.ID, client.UpgradeSubscriptionInput{PlanVariantID: yearly.ID})
			}, "active"},
			{"CancelSubscription", func() (*client.Subscription, error) {
				return c.CancelSubscription(ctx, sub.ID, &client.CancelSubscriptionInput{AtPeriodEnd: client.Ptr(false)})
			}, "canceled"},
		} {
			got, err := step.call()
			must(t, err, step.name)
			if got.Status != step.want {
				t.Fatalf("%s: status %s, want %s", step.name, got.Status, step.want)
			}
		}
		_, err = c.PauseSubscription(ctx, sub.ID)
		wantProblem(t, err, 409, client.ProblemConflict, "PauseSubscription of a canceled subscription")
	})

	t.Run("webhooks", func(t *testing.T) {
		ping, err := c.TestWebhook(ctx)
		must(t, err, "TestWebhook")
		if ping.EventType != "test.ping" || ping.Status != "pending" {
			t.Fatalf("TestWebhook = %+v", ping)
		}
		v, err := client.NewWebhookVerifier(secret)
		must(t, err, "NewWebhookVerifier")
		d := rcv.waitFor(t, ping.EventID)
		payload, err := v.Parse(d.header, d.body)
		must(t, err, "verify the test.ping creditd signed")
		if payload.EventID != ping.EventID || payload.EventType != "test.ping" || string(payload.Data) == "" {
			t.Fatalf("payload %+v", payload)
		}
		if err := v.Verify(d.header, append(d.body, ' ')); err == nil {
			t.Fatal("a tampered delivery verified")
		}
		// Every other delivery (credit.granted, credit.consumed...) verifies too.
		for _, d := range rcv.all() {
			if _, err := v.Parse(d.header, d.body); err != nil {
				t.Fatalf("delivery %s: %v", d.header.Get("webhook-id"), err)
			}
		}
		var events *client.WebhookEventPage
		deadline := time.Now().Add(20 * time.Second)
		for {
			events, err = c.ListWebhookEvents(ctx, &client.ListWebhookEventsParams{EventType: client.Ptr("test.ping")})
			must(t, err, "ListWebhookEvents")
			if len(events.Data) == 1 && events.Data[0].Status == "delivered" || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(events.Data) != 1 || events.Data[0].ID != ping.EventID || events.Data[0].Status != "delivered" || len(events.Data[0].Deliveries) == 0 {
			t.Fatalf("ListWebhookEvents = %+v", events.Data)
		}
		_, err = c.RedeliverWebhookEvent(ctx, ping.EventID)
		wantProblem(t, err, 409, client.ProblemConflict, "RedeliverWebhookEvent of a delivered event")
	})

	t.Run("events", func(t *testing.T) {
		var all []client.WebhookEnvelope
		var after *int64
		for {
			page, err := c.ListEvents(ctx, &client.ListEventsParams{AfterSequence: after, Limit: client.Ptr(50)})
			must(t, err, "ListEvents")
			all = append(all, page.Data...)
			if !page.Pagination.HasMore {
				break
			}
			n, err := strconv.ParseInt(*page.Pagination.NextCursor, 10, 64)
			must(t, err, "next_cursor is a sequence")
			after = &n
		}
		var last *client.WebhookEnvelope
		for i := range all {
			if all[i].Sequence != int64(i+1) {
				t.Fatalf("ListEvents: event %d has sequence %d", i, all[i].Sequence)
			}
			if all[i].CustomerID != nil {
				last = &all[i]
			}
		}
		if last == nil {
			t.Fatalf("ListEvents listed no customer's event among %d", len(all))
		}
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		from := last.Sequence - 1
		st, err := c.StreamCredits(sctx, *last.CustomerID, &from)
		must(t, err, "StreamCredits")
		defer st.Close()
		e, err := st.Next()
		must(t, err, "StreamCredits Next")
		if e.ID != last.Sequence || e.Type != last.EventType || !strings.Contains(string(e.Data), last.EventID) {
			t.Fatalf("StreamCredits resumed with %+v, want event %d %s", e, last.Sequence, last.EventType)
		}

		// The tenant's change stream carries a grant made after it opened.
		cctx, cstop := context.WithTimeout(ctx, 10*time.Second)
		defer cstop()
		cs, err := c.StreamChanges(cctx, "")
		must(t, err, "StreamChanges")
		defer cs.Close()
		_, err = c.GrantCredits(ctx, "ada", client.GrantInput{Credits: 1, Source: "promotional", Reason: "seen on the change stream"})
		must(t, err, "GrantCredits for the change stream")
		for {
			ce, err := cs.Next()
			must(t, err, "StreamChanges Next")
			if ce.Type == "credit.granted" {
				if ce.ID == "" || !strings.Contains(string(ce.Data), "seen on the change stream") {
					t.Fatalf("StreamChanges: %+v", ce)
				}
				break
			}
		}
	})

	t.Run("credit alerts", func(t *testing.T) {
		def, err := c.PutDefaultCreditAlerts(ctx, client.CreditAlertsInput{Thresholds: []client.AlertThreshold{
			{Type: "percent_of_last_grant", Percent: client.Value(20)}}})
		must(t, err, "PutDefaultCreditAlerts")
		if def.Source != "default" || def.CustomerID != nil || len(def.Thresholds) != 1 || def.Topup != nil {
			t.Fatalf("PutDefaultCreditAlerts = %+v", def)
		}
		got, err := c.GetDefaultCreditAlerts(ctx)
		must(t, err, "GetDefaultCreditAlerts")
		if p, _ := got.Thresholds[0].Percent.Get(); p != 20 || got.UpdatedAt == nil {
			t.Fatalf("GetDefaultCreditAlerts = %+v", got)
		}
		own, err := c.PutCustomerCreditAlerts(ctx, "ada", client.CreditAlertsInput{
			Thresholds: []client.AlertThreshold{{Type: "absolute", AmountMC: client.Value[int64](5_000)}},
			Topup:      client.Value(client.TopupRule{BelowMC: 1_000, AmountMC: 50_000})})
		must(t, err, "PutCustomerCreditAlerts")
		if own.Source != "customer" || own.Topup == nil || own.Topup.DedupeWindowSeconds == nil || *own.Topup.DedupeWindowSeconds != 3600 {
			t.Fatalf("PutCustomerCreditAlerts = %+v", own)
		}
		must(t, c.DeleteCustomerCreditAlerts(ctx, "ada"), "DeleteCustomerCreditAlerts")
		back, err := c.GetCustomerCreditAlerts(ctx, "ada")
		must(t, err, "GetCustomerCreditAlerts")
		if back.Source != "default" || back.CustomerID == nil || *back.CustomerID != adaID {
			t.Fatalf("GetCustomerCreditAlerts after delete = %+v", back)
		}
		_, err = c.PutDefaultCreditAlerts(ctx, client.CreditAlertsInput{Thresholds: []client.AlertThreshold{{Type: "absolute"}}})
		if p := wantProblem(t, err, 422, client.ProblemValidation, "absolute without amount_mc"); p.Field != "thresholds[0].amount_mc" {
			t.Fatalf("problem field = %v", p.Field)
		}
		_, err = c.PutDefaultCreditAlerts(ctx, client.CreditAlertsInput{Thresholds: []client.AlertThreshold{}})
		must(t, err, "PutDefaultCreditAlerts (none)")
	})

	t.Run("unauthorized", func(t *testing.T) {
		_, err := client.New(s.URL, "ck_live_wrong").GetTenant(ctx)
		wantProblem(t, err, 401, client.ProblemUnauthorized, "a wrong key")
	})

	if missing := rec.uncovered(t); len(missing) > 0 {
		t.Fatalf("operations of api/openapi.json this test never called: %v", missing)
	}
}
