package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// reserve creates a reservation and requires 201.
func (a api) reserve(body map[string]any) map[string]any {
	a.t.Helper()
	r := a.post("/v1/reservations", body)
	wantStatus(a.t, r, 201, "reserve")
	return r.Body
}

// checkReservationAccount compares an account member with want balance, reserved.
func checkReservationAccount(t testing.TB, v any, what string, balance, reserved int64) {
	t.Helper()
	acct := obj(t, v, what)
	checkKeys(t, acct, what, "balance", "reserved_balance", "effective_balance")
	if Int(t, acct["balance"]) != balance || Int(t, acct["reserved_balance"]) != reserved || Int(t, acct["effective_balance"]) != balance-reserved {
		t.Errorf("%s: %v, want balance %d reserved %d", what, acct, balance, reserved)
	}
}

// TestConformanceReservationCreate: POST /v1/reservations: the 201 body,
// each customer id form, both/neither 400, 500 without an active rule, TTL
// bounds and default, 409 insufficient-credits with nothing held.
func TestConformanceReservationCreate(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("holds"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})

	h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 30})
	checkKeys(t, h, "hold", "id", "customer_id", "billable_metric_key", "estimated_units", "estimated_cost", "environment", "status",
		"expires_at", "account", "metadata", "created_at")
	checkUUID(t, h["id"], "id")
	if h["customer_id"] != id || h["billable_metric_key"] != metric || Int(t, h["estimated_units"]) != 30 || Int(t, h["estimated_cost"]) != 300 ||
		h["environment"] != "live" || h["status"] != "active" || mustJSON(h["metadata"]) != `{}` {
		t.Errorf("reservation: %v", h)
	}
	checkReservationAccount(t, h["account"], "account", 1_000, 300)
	created := checkTime(t, h["created_at"], "created_at")
	if d := checkTime(t, h["expires_at"], "expires_at").Sub(created); d != 1800*time.Second {
		t.Errorf("default ttl: expires %v after creation, want 30m", d)
	}
	c := a.credits(id)
	if Int(t, c["balance"]) != 1_000 || Int(t, c["reserved_balance"]) != 300 || Int(t, c["effective_balance"]) != 700 {
		t.Errorf("credits with a reservation: %v", c)
	}
	// A metered check sees the reservation.
	chk := a.get("/v1/customers/" + id + "/entitlements/" + metric + "?units=70")
	if Int(t, chk.Body["reserved_balance"]) != 300 || Int(t, chk.Body["balance_after"]) != 0 || chk.Body["allowed"] != true {
		t.Errorf("check with a reservation: %s", chk.Raw)
	}

	// External forms, TTL bounds and metadata.
	h2 := a.reserve(map[string]any{"external_customer_id": ext, "billable_metric_key": metric, "estimated_units": 1, "ttl_seconds": 86400,
		"metadata": map[string]any{"job": "render"}})
	if h2["customer_id"] != id || mustJSON(h2["metadata"]) != `{"job":"render"}` {
		t.Errorf("reservation by external_customer_id: %v", h2)
	}
	if d := checkTime(t, h2["expires_at"], "").Sub(checkTime(t, h2["created_at"], "")); d != 86400*time.Second {
		t.Errorf("ttl 86400: %v", d)
	}
	h3 := a.reserve(map[string]any{"customer_id": ext, "billable_metric_key": metric, "estimated_units": 1, "ttl_seconds": 1})
	if h3["customer_id"] != id {
		t.Errorf("reservation by customer_id = external id: %v", h3)
	}
	checkReservationAccount(t, h3["account"], "third reservation account", 1_000, 320)
	// A lenient unknown id creates the customer (and then has no credit).
	fresh := uniq("fresh")
	checkProblem(t, a.post("/v1/reservations", map[string]any{"customer_id": fresh, "billable_metric_key": metric, "estimated_units": 1}),
		409, "insufficient-credits", "", "new customer without credit")

	for _, tc := range []struct {
		name   string
		body   map[string]any
		status int
		typ    string
		field  string
	}{
		{"both ids", map[string]any{"customer_id": id, "external_customer_id": ext, "billable_metric_key": metric, "estimated_units": 1}, 400, "bad-request", ""},
		{"neither id", map[string]any{"billable_metric_key": metric, "estimated_units": 1}, 400, "bad-request", ""},
		{"unknown strict id", map[string]any{"external_customer_id": uniq("ghost"), "billable_metric_key": metric, "estimated_units": 1}, 400, "bad-request", ""},
		{"ttl 0", map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 1, "ttl_seconds": 0}, 422, "validation-error", "ttl_seconds"},
		{"ttl 86401", map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 1, "ttl_seconds": 86401}, 422, "validation-error", "ttl_seconds"},
		{"units 0", map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 0}, 422, "validation-error", "estimated_units"},
		{"no units", map[string]any{"customer_id": id, "billable_metric_key": metric}, 422, "validation-error", "estimated_units"},
		{"no metric", map[string]any{"customer_id": id, "estimated_units": 1}, 422, "validation-error", "billable_metric_key"},
		{"short", map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 69}, 409, "insufficient-credits", ""},
		{"no rule", map[string]any{"customer_id": id, "billable_metric_key": uniq("norule"), "estimated_units": 1}, 500, "internal", ""},
	} {
		checkProblem(t, a.post("/v1/reservations", tc.body), tc.status, tc.typ, tc.field, tc.name)
	}
	if c := a.credits(id); Int(t, c["reserved_balance"]) != 320 {
		t.Errorf("refused reservations changed reserved_balance: %v", c["reserved_balance"])
	}
}

// TestConformanceReservationLifecycle: GET (404 for a non-UUID, another
// tenant's reservation; any environment of the tenant), commit > 0 and = 0,
// release, the 409 types, listing with status filter and its 500.
func TestConformanceReservationLifecycle(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("life"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})

	h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 30, "metadata": map[string]any{"a": 1}})
	hid := h["id"].(string)

	g := a.get("/v1/reservations/" + hid)
	wantStatus(t, g, 200, "get reservation")
	checkKeys(t, g.Body, "reservation", "id", "tenant_id", "customer_id", "environment", "billable_metric_key", "estimated_units",
		"estimated_cost", "actual_units", "actual_cost", "status", "reference_id", "expires_at", "metadata", "created_at", "committed_at", "released_at",
		"settled_units", "settled_cost", "remaining_cost") // the last three: issue 27, additive
	checkSettled(t, g.Body, "fresh reservation", 0, 0, 300)
	if g.Body["tenant_id"] != tn.ID || g.Body["customer_id"] != id || g.Body["status"] != "active" || g.Body["actual_units"] != nil ||
		g.Body["actual_cost"] != nil || g.Body["committed_at"] != nil || g.Body["released_at"] != nil || Int(t, g.Body["estimated_cost"]) != 300 {
		t.Errorf("reservation: %s", g.Raw)
	}
	checkUUID(t, g.Body["reference_id"], "reference_id")
	// Not scoped by environment: the sandbox key of the tenant reads it.
	sb := s.as(t, tn.Sandbox)
	if r := sb.get("/v1/reservations/" + hid); checkStatus(t, r, 200, "sandbox key reads a live reservation") && r.Body["environment"] != "live" {
		t.Errorf("sandbox read: %s", r.Raw)
	}
	other := s.as(t, s.NewTenant(uniq("other")).Live)
	checkProblem(t, other.get("/v1/reservations/"+hid), 404, "not-found", "", "another tenant's reservation")
	checkProblem(t, other.post("/v1/reservations/"+hid+"/release", nil), 404, "not-found", "", "another tenant releases")
	checkProblem(t, a.get("/v1/reservations/not-a-uuid"), 404, "not-found", "", "non-UUID id")
	checkProblem(t, a.get("/v1/reservations/"+uuid.NewString()), 404, "not-found", "", "unknown id")
	checkProblem(t, a.post("/v1/reservations/"+uuid.NewString()+"/commit", map[string]any{"actual_units": 1}), 404, "not-found", "", "commit unknown")
	checkProblem(t, a.post("/v1/reservations/not-a-uuid/release", nil), 404, "not-found", "", "release non-UUID")

	// Commit validation leaves the reservation active.
	checkProblem(t, a.post("/v1/reservations/"+hid+"/commit", map[string]any{"actual_units": -1}), 422, "validation-error", "actual_units", "negative")
	checkProblem(t, a.post("/v1/reservations/"+hid+"/commit", map[string]any{}), 422, "validation-error", "actual_units", "missing")

	// Commit > 0 (from the sandbox key: commit is not environment scoped either).
	cm := sb.post("/v1/reservations/"+hid+"/commit", map[string]any{"actual_units": 20, "metadata": map[string]any{"b": 2}})
	wantStatus(t, cm, 200, "commit")
	checkKeys(t, cm.Body, "commit", "reservation_id", "status", "estimated_units", "actual_units", "estimated_cost", "actual_cost", "released", "transaction", "account",
		"settled_units", "settled_cost", "remaining_cost")
	checkSettled(t, cm.Body, "commit", 20, 200, 0)
	if cm.Body["reservation_id"] != hid || cm.Body["status"] != "committed" || Int(t, cm.Body["estimated_units"]) != 30 || Int(t, cm.Body["actual_units"]) != 20 ||
		Int(t, cm.Body["estimated_cost"]) != 300 || Int(t, cm.Body["actual_cost"]) != 200 || Int(t, cm.Body["released"]) != 300 {
		t.Errorf("commit: %s", cm.Raw)
	}
	tx := obj(t, cm.Body["transaction"], "transaction")
	checkUUID(t, tx["id"], "transaction.id")
	if tx["customer_id"] != id || Int(t, tx["delta"]) != -200 || tx["type"] != "consumption" || tx["billable_metric_key"] != metric || Int(t, tx["cost_units"]) != 20 {
		t.Errorf("commit transaction: %v", tx)
	}
	checkTime(t, tx["created_at"], "transaction.created_at")
	checkReservationAccount(t, cm.Body["account"], "commit account", 800, 0)
	g = a.get("/v1/reservations/" + hid)
	if g.Body["status"] != "committed" || Int(t, g.Body["actual_units"]) != 20 || Int(t, g.Body["actual_cost"]) != 200 || g.Body["released_at"] != nil ||
		mustJSON(g.Body["metadata"]) != `{"a":1,"b":2}` {
		t.Errorf("committed reservation: %s", g.Raw)
	}
	checkTime(t, g.Body["committed_at"], "committed_at")
	// Not active any more: 409 conflict.
	checkProblem(t, a.post("/v1/reservations/"+hid+"/commit", map[string]any{"actual_units": 1}), 409, "conflict", "", "commit twice")
	checkProblem(t, a.post("/v1/reservations/"+hid+"/release", nil), 409, "conflict", "", "release committed")

	// Commit = 0: a release entry, status committed, nothing charged.
	h0 := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 5, "metadata": map[string]any{"a": 1}})
	c0 := a.post("/v1/reservations/"+h0["id"].(string)+"/commit", map[string]any{"actual_units": 0, "metadata": map[string]any{"dropped": true}})
	wantStatus(t, c0, 200, "commit 0")
	if c0.Body["status"] != "committed" || Int(t, c0.Body["actual_units"]) != 0 || Int(t, c0.Body["actual_cost"]) != 0 || Int(t, c0.Body["released"]) != 50 {
		t.Errorf("commit 0: %s", c0.Raw)
	}
	tx0 := obj(t, c0.Body["transaction"], "transaction")
	checkKeys(t, tx0, "commit 0 transaction", "id", "delta", "type", "reference_id", "created_at")
	if Int(t, tx0["delta"]) != 0 || tx0["type"] != "release" {
		t.Errorf("commit 0 transaction: %v", tx0)
	}
	checkReservationAccount(t, c0.Body["account"], "commit 0 account", 800, 0)
	if g := a.get("/v1/reservations/" + h0["id"].(string)); mustJSON(g.Body["metadata"]) != `{"a":1}` || g.Body["committed_at"] == nil {
		t.Errorf("commit 0 reservation: %s", g.Raw)
	}

	// Release.
	hr := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 7})
	rl := a.post("/v1/reservations/"+hr["id"].(string)+"/release", nil)
	wantStatus(t, rl, 200, "release")
	checkKeys(t, rl.Body, "release", "reservation_id", "status", "estimated_cost", "released", "transaction", "account")
	if rl.Body["status"] != "released" || Int(t, rl.Body["estimated_cost"]) != 70 || Int(t, rl.Body["released"]) != 70 {
		t.Errorf("release: %s", rl.Raw)
	}
	txr := obj(t, rl.Body["transaction"], "transaction")
	checkKeys(t, txr, "release transaction", "id", "delta", "type", "reference_id", "created_at")
	if Int(t, txr["delta"]) != 0 || txr["type"] != "release" {
		t.Errorf("release transaction: %v", txr)
	}
	checkReservationAccount(t, rl.Body["account"], "release account", 800, 0)
	checkProblem(t, a.post("/v1/reservations/"+hr["id"].(string)+"/release", nil), 409, "conflict", "", "release twice")
	if g := a.get("/v1/reservations/" + hr["id"].(string)); g.Body["status"] != "released" || g.Body["committed_at"] != nil || g.Body["released_at"] == nil {
		t.Errorf("released reservation: %s", g.Raw)
	}

	// Commit beyond reservation plus free balance: 409 insufficient-credits, still active.
	hs := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 10})
	checkProblem(t, a.post("/v1/reservations/"+hs["id"].(string)+"/commit", map[string]any{"actual_units": 81}), 409, "insufficient-credits", "", "commit short")
	if g := a.get("/v1/reservations/" + hs["id"].(string)); g.Body["status"] != "active" {
		t.Errorf("reservation after a short commit: %s", g.Raw)
	}
	// Reservation plus free balance covers exactly 80 units.
	if cm := a.post("/v1/reservations/"+hs["id"].(string)+"/commit", map[string]any{"actual_units": 80}); checkStatus(t, cm, 200, "commit past the reservation") {
		checkReservationAccount(t, cm.Body["account"], "commit past the reservation", 0, 0)
	}

	// Listing: newest first, status filter, the documented 500, 404 unknown.
	for _, p := range []string{"/v1/customers/" + id + "/reservations", "/v1/customers/" + ext + "/reservations", "/v1/customer-by-external-id/" + ext + "/reservations"} {
		r := a.get(p)
		wantStatus(t, r, 200, p)
		data, _, _ := page(t, r)
		want := []any{hs["id"], hr["id"], h0["id"], hid}
		if len(data) != len(want) {
			t.Errorf("%s: %d reservations, want %d", p, len(data), len(want))
			continue
		}
		for i := range want {
			if obj(t, data[i], "hold")["id"] != want[i] {
				t.Errorf("%s: hold %d is %v, want %v (newest first)", p, i, obj(t, data[i], "hold")["id"], want[i])
			}
		}
		cr := a.get(p + "?status=committed")
		if data, _, _ := page(t, cr); len(data) != 3 {
			t.Errorf("%s?status=committed: %s", p, cr.Raw)
		}
		rr := a.get(p + "?status=released&limit=1")
		if data, more, _ := page(t, rr); len(data) != 1 || more || obj(t, data[0], "hold")["id"] != hr["id"] {
			t.Errorf("%s?status=released: %s", p, rr.Raw)
		}
		pg := a.get(p + "?limit=3")
		if data, more, next := page(t, pg); len(data) != 3 || !more || next == nil {
			t.Errorf("%s?limit=3: %s", p, pg.Raw)
		} else {
			rest := a.get(p + "?limit=3&cursor=" + str(t, next, "next_cursor"))
			if data, more, _ := page(t, rest); len(data) != 1 || more || obj(t, data[0], "hold")["id"] != hid {
				t.Errorf("%s second page: %s", p, rest.Raw)
			}
		}
		checkProblem(t, a.get(p+"?status=pending"), 500, "internal", "", p+" unknown status")
		checkProblem(t, a.get(p+"?limit=0"), 400, "bad-request", "limit", p+" limit 0")
	}
	ghost := uniq("ghost")
	checkProblem(t, a.get("/v1/customers/"+ghost+"/reservations"), 404, "not-found", "", "unknown customer")
	checkProblem(t, a.get("/v1/customer-by-external-id/"+ghost+"/reservations"), 404, "not-found", "", "strict unknown customer")
	checkProblem(t, a.get("/v1/customers/"+ghost), 404, "not-found", "", "listing did not create")
	// Reservations are listed in the customer's environment only.
	checkProblem(t, sb.get("/v1/customers/"+id+"/reservations"), 404, "not-found", "", "sandbox lists a live customer")
}

// TestConformanceReservationExpiry: committing after expires_at but before
// the sweep is 409 reservation-expired and leaves the reservation active; release
// still works then; the sweep marks the rest expired and returns the reservation.
func TestConformanceReservationExpiry(t *testing.T) {
	s := NewStack(t, WithReservationSweep(time.Hour))
	tn := s.NewTenant(uniq("expiry"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})
	h1 := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 10, "ttl_seconds": 1})
	h2 := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 20, "ttl_seconds": 1})
	time.Sleep(1200 * time.Millisecond)

	checkProblem(t, a.post("/v1/reservations/"+h1["id"].(string)+"/commit", map[string]any{"actual_units": 1}), 409, "reservation-expired", "", "commit after expires_at")
	if g := a.get("/v1/reservations/" + h1["id"].(string)); g.Body["status"] != "active" {
		t.Errorf("reservation after a late commit: %s", g.Raw)
	}
	rl := a.post("/v1/reservations/"+h2["id"].(string)+"/release", nil)
	if checkStatus(t, rl, 200, "release after expires_at") && rl.Body["status"] != "released" {
		t.Errorf("late release: %s", rl.Raw)
	}
	if n := s.App.ReservationSweeper.SweepOnce(context.Background()); n != 1 {
		t.Errorf("sweep expired %d reservations, want 1", n)
	}
	g := a.get("/v1/reservations/" + h1["id"].(string))
	if g.Body["status"] != "expired" || g.Body["released_at"] == nil || g.Body["committed_at"] != nil {
		t.Errorf("swept reservation: %s", g.Raw)
	}
	c := a.credits(id)
	if Int(t, c["balance"]) != 1_000 || Int(t, c["reserved_balance"]) != 0 {
		t.Errorf("credits after the sweep: %v", c)
	}
	checkProblem(t, a.post("/v1/reservations/"+h1["id"].(string)+"/commit", map[string]any{"actual_units": 1}), 409, "conflict", "", "commit expired")
	checkProblem(t, a.post("/v1/reservations/"+h1["id"].(string)+"/release", nil), 409, "conflict", "", "release expired")
	if r := a.get("/v1/customers/" + id + "/reservations?status=expired"); len(arr(t, r.Body["data"], "data")) != 1 {
		t.Errorf("expired list: %s", r.Raw)
	}
}

// TestConformanceReservationSweep: the background sweep (100 ms in tests,
// once a minute by default) expires a reservation on its own.
func TestConformanceReservationSweep(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("sweep"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 100})
	h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 10, "ttl_seconds": 1})
	deadline := time.Now().Add(10 * time.Second)
	for {
		g := a.get("/v1/reservations/" + h["id"].(string))
		if g.Body["status"] == "expired" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reservation not expired by the sweep: %s", g.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if c := a.credits(id); Int(t, c["reserved_balance"]) != 0 || Int(t, c["effective_balance"]) != 100 {
		t.Errorf("credits after the sweep: %v", c)
	}
}

// TestConformanceReservationDoubleSpend: credit for exactly K reservations, 100
// concurrent reserves: exactly K succeed and reservations never exceed the
// balance; committing them all concurrently spends the balance to 0.
func TestConformanceReservationDoubleSpend(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("hspend"))
	raiseRateLimit(t, s.HTTP, s.URL, tn.ID)
	a := s.as(t, tn.Live)
	metric := a.perUnit(100)
	id, _ := a.newCustomer()
	const k, n = 23, 100
	a.grant(id, map[string]any{"credits": k * 100})
	client := loadClient()
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		ids []string
	)
	refused := 0
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := TryCall(client, s.URL, "POST", "/v1/reservations",
				map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 1},
				"X-API-Key", tn.Live, "Idempotency-Key", idemKey())
			if err != nil {
				t.Errorf("reserve %d: %v", i, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			switch {
			case r.Status == 201:
				ids = append(ids, r.Body["id"].(string))
			case r.Status == 409 && problemType(r) == "insufficient-credits":
				refused++
			default:
				t.Errorf("reserve %d: %d %s", i, r.Status, r.Raw)
			}
		}(i)
	}
	wg.Wait()
	if len(ids) != k || refused != n-k {
		t.Fatalf("%d reservations and %d refusals, want %d and %d", len(ids), refused, k, n-k)
	}
	c := a.credits(id)
	if Int(t, c["balance"]) != k*100 || Int(t, c["reserved_balance"]) != k*100 || Int(t, c["effective_balance"]) != 0 {
		t.Errorf("credits with every reservation: %v", c)
	}
	for _, hid := range ids {
		wg.Add(1)
		go func(hid string) {
			defer wg.Done()
			r, err := TryCall(client, s.URL, "POST", "/v1/reservations/"+hid+"/commit", map[string]any{"actual_units": 1},
				"X-API-Key", tn.Live, "Idempotency-Key", idemKey())
			if err != nil || r.Status != 200 {
				t.Errorf("commit %s: %v %d %s", hid, err, r.Status, r.Raw)
			}
		}(hid)
	}
	wg.Wait()
	c = a.credits(id)
	if Int(t, c["balance"]) != 0 || Int(t, c["reserved_balance"]) != 0 || Int(t, c["effective_balance"]) != 0 {
		t.Errorf("credits after every commit: %v", c)
	}
	s.Drain()
	if sum := ledgerSum(a, id); sum != 0 {
		t.Errorf("ledger deltas sum to %d, balance is 0", sum)
	}
}
