package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// reservationBooks checks invariant 1 for customer cust once the persister has
// drained: the API balance, the ledger sum and the account row in Postgres
// agree, and the reserved balance is what the active reservations still hold
// (estimated_cost less what partial commits took, the released column
// while active).
func reservationBooks(t *testing.T, s *Stack, a api, cust string, balance, reserved int64) {
	t.Helper()
	s.Drain()
	c := a.credits(cust)
	if Int(t, c["balance"]) != balance || Int(t, c["reserved_balance"]) != reserved {
		t.Errorf("credits %v, want balance %d reserved %d", c, balance, reserved)
	}
	var ledger, row, held int64
	if err := s.Pool.QueryRow(context.Background(), `SELECT
			(SELECT COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1),
			(SELECT balance FROM credit_accounts WHERE customer_id = $1),
			(SELECT COALESCE(SUM(estimated_cost - released), 0) FROM reservations WHERE customer_id = $1 AND status = 'active')`,
		cust).Scan(&ledger, &row, &held); err != nil {
		t.Fatal(err)
	}
	if ledger != balance || row != balance || held != reserved {
		t.Errorf("Postgres: ledger sum %d, account row %d, held by active reservations %d; want %d, %d, %d", ledger, row, held, balance, balance, reserved)
	}
}

// checkSettled compares a reservation body's settlement figures.
func checkSettled(t *testing.T, body map[string]any, what string, units, cost, remaining int64) {
	t.Helper()
	if Int(t, body["settled_units"]) != units || Int(t, body["settled_cost"]) != cost || Int(t, body["remaining_cost"]) != remaining {
		t.Errorf("%s: settled_units %v settled_cost %v remaining_cost %v, want %d %d %d", what,
			body["settled_units"], body["settled_cost"], body["remaining_cost"], units, cost, remaining)
	}
}

// TestReservationExtend: POST /v1/reservations/{id}/extend over HTTP (issue
// 27). A top-up holds the additional units' cost on top (estimated units
// and cost grow, reserved_balance with them); one the effective balance
// cannot cover is 409 insufficient-credits and changes nothing; ttl_seconds
// moves expires_at later and a shorter one is a 422 naming ttl_seconds; a
// replay answers the first body; bad input is a 422 naming the field;
// another body under the same key is a 409; a multi-metric reservation is a 409.
func TestReservationExtend(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("extend"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})

	h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 30, "ttl_seconds": 600})
	hid := h["id"].(string)
	path := "/v1/reservations/" + hid + "/extend"
	expires := checkTime(t, h["expires_at"], "expires_at")

	key := idemKey()
	r := a.do("POST", path, key, map[string]any{"additional_units": 50})
	wantStatus(t, r, 200, "extend")
	if Int(t, r.Body["estimated_units"]) != 80 || Int(t, r.Body["estimated_cost"]) != 800 || r.Body["status"] != "active" ||
		r.Body["id"] != hid || !checkTime(t, r.Body["expires_at"], "expires_at").Equal(expires) || r.Body["actual_units"] != nil {
		t.Errorf("extend body: %s", r.Raw)
	}
	checkSettled(t, r.Body, "extend", 0, 0, 800)
	checkReservationAccount(t, r.Body["account"], "extend account", 1_000, 800)
	again := a.do("POST", path, key, map[string]any{"additional_units": 50})
	wantStatus(t, again, 200, "extend replay")
	if mustJSON(again.Body) != mustJSON(r.Body) {
		t.Errorf("extend replay answered\n%s\nnot the first body\n%s", again.Raw, r.Raw)
	}
	checkProblem(t, a.do("POST", path, key, map[string]any{"additional_units": 51}), 409, "conflict", "", "same key, other body")

	// 21 units cost 210, the effective balance is 200.
	checkProblem(t, a.post(path, map[string]any{"additional_units": 21}), 409, "insufficient-credits", "", "top-up past the effective balance")
	if c := a.credits(id); Int(t, c["reserved_balance"]) != 800 {
		t.Errorf("a refused top-up changed reserved_balance: %v", c)
	}

	r = a.post(path, map[string]any{"ttl_seconds": 7200})
	wantStatus(t, r, 200, "prolong")
	later := checkTime(t, r.Body["expires_at"], "expires_at")
	if d := later.Sub(expires); d < 6000*time.Second || Int(t, r.Body["estimated_cost"]) != 800 {
		t.Errorf("prolong: expires_at moved by %v: %s", d, r.Raw)
	}
	for _, tc := range []struct {
		name  string
		body  any
		field string
	}{
		{"empty body", map[string]any{}, "additional_units"},
		{"units 0", map[string]any{"additional_units": 0}, "additional_units"},
		{"negative units", map[string]any{"additional_units": -5}, "additional_units"},
		{"ttl 0", map[string]any{"ttl_seconds": 0}, "ttl_seconds"},
		{"ttl 86401", map[string]any{"ttl_seconds": 86401}, "ttl_seconds"},
		{"shorter ttl", map[string]any{"ttl_seconds": 60}, "ttl_seconds"},
		{"units and shorter ttl", map[string]any{"additional_units": 1, "ttl_seconds": 60}, "ttl_seconds"},
	} {
		checkProblem(t, a.post(path, tc.body), 422, "validation-error", tc.field, tc.name)
	}
	checkProblem(t, a.do("POST", path, "", map[string]any{"additional_units": 1}), 422, "validation-error", "Idempotency-Key", "no key")
	checkProblem(t, a.post("/v1/reservations/"+idemKey()+"/extend", map[string]any{"additional_units": 1}), 404, "not-found", "", "unknown reservation")
	checkProblem(t, a.post(path, nil), 400, "bad-request", "", "no body")
	// Another tenant's key learns nothing of the reservation (invariant 8).
	other := s.as(t, s.NewTenant(uniq("other")).Live)
	checkProblem(t, other.post(path, map[string]any{"ttl_seconds": 7200}), 404, "not-found", "", "another tenant's reservation")
	checkProblem(t, other.post("/v1/reservations/"+hid+"/commit", map[string]any{"actual_units": 1, "final": false}), 404, "not-found", "", "another tenant's partial commit")

	g := a.get("/v1/reservations/" + hid)
	wantStatus(t, g, 200, "get")
	if Int(t, g.Body["estimated_units"]) != 80 || !checkTime(t, g.Body["expires_at"], "expires_at").Equal(later) {
		t.Errorf("get after extends: %s", g.Raw)
	}
	checkSettled(t, g.Body, "get", 0, 0, 800)

	// A multi-metric reservation is not extended.
	m2 := a.perUnit(1)
	multi := a.reserve(map[string]any{"customer_id": id, "items": reservationItems(metric, 1, m2, 1)})
	checkProblem(t, a.post("/v1/reservations/"+multi["id"].(string)+"/extend", map[string]any{"ttl_seconds": 3600}), 409, "conflict", "", "multi-metric reservation")

	// Once committed, an extend is a 409.
	wantStatus(t, a.post("/v1/reservations/"+hid+"/commit", map[string]any{"actual_units": 80}), 200, "commit")
	checkProblem(t, a.post(path, map[string]any{"ttl_seconds": 7200}), 409, "conflict", "", "extend of a committed reservation")
	reservationBooks(t, s, a, id, 200, 11)
}

// TestReservationPartialCommitThenCommit: a partial commit (final: false)
// charges its units as a commit does and keeps the rest held; a part past
// what is held takes the rest from the free balance; the final commit's
// actual_units are its own part and the reservation's actual_units the
// total; each part is one consumption entry; replays answer the first
// body; the books balance (invariant 1).
func TestReservationPartialCommitThenCommit(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("partial"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})
	h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 30})
	hid := h["id"].(string)
	path := "/v1/reservations/" + hid + "/commit"

	key := idemKey()
	r := a.do("POST", path, key, map[string]any{"actual_units": 10, "final": false})
	wantStatus(t, r, 200, "partial commit")
	if r.Body["status"] != "active" || Int(t, r.Body["actual_units"]) != 10 || Int(t, r.Body["actual_cost"]) != 100 ||
		Int(t, r.Body["released"]) != 0 || Int(t, r.Body["estimated_cost"]) != 300 {
		t.Errorf("partial commit body: %s", r.Raw)
	}
	tx := obj(t, r.Body["transaction"], "transaction")
	if tx["type"] != "consumption" || Int(t, tx["delta"]) != -100 || Int(t, tx["cost_units"]) != 10 || tx["reference_id"] != hid {
		t.Errorf("partial commit transaction: %v", tx)
	}
	checkSettled(t, r.Body, "partial commit", 10, 100, 200)
	checkReservationAccount(t, r.Body["account"], "partial commit account", 900, 200)
	again := a.do("POST", path, key, map[string]any{"actual_units": 10, "final": false})
	wantStatus(t, again, 200, "partial commit replay")
	if mustJSON(again.Body) != mustJSON(r.Body) {
		t.Errorf("partial commit replay answered\n%s\nnot\n%s", again.Raw, r.Raw)
	}
	if c := a.credits(id); Int(t, c["balance"]) != 900 {
		t.Errorf("a replay charged again: %v", c)
	}
	g := a.get("/v1/reservations/" + hid)
	if g.Body["status"] != "active" || g.Body["actual_units"] != nil || g.Body["actual_cost"] != nil || g.Body["committed_at"] != nil {
		t.Errorf("get after a partial commit: %s", g.Raw)
	}
	checkSettled(t, g.Body, "get after a partial commit", 10, 100, 200)

	for _, tc := range []struct {
		name  string
		body  any
		field string
	}{
		{"partial of 0 units", map[string]any{"actual_units": 0, "final": false}, "actual_units"},
		{"partial without units", map[string]any{"final": false}, "actual_units"},
		{"partial with items", map[string]any{"items": actualItems(metric, 1), "final": false}, "final"},
	} {
		checkProblem(t, a.post(path, tc.body), 422, "validation-error", tc.field, tc.name)
	}
	checkProblem(t, a.do("POST", path, "", map[string]any{"actual_units": 1, "final": false}), 422, "validation-error", "Idempotency-Key", "no key")
	// Past the reservation (200) plus the free balance (700) under block.
	checkProblem(t, a.post(path, map[string]any{"actual_units": 91, "final": false}), 409, "insufficient-credits", "", "partial past reservation and balance")

	// 25 units cost 250: the 200 still held and 50 of the free balance.
	r = a.post(path, map[string]any{"actual_units": 25, "final": false})
	wantStatus(t, r, 200, "second partial commit")
	checkSettled(t, r.Body, "second partial commit", 35, 350, 0)
	checkReservationAccount(t, r.Body["account"], "second partial commit account", 650, 0)

	r = a.post(path, map[string]any{"actual_units": 5})
	wantStatus(t, r, 200, "final commit")
	if r.Body["status"] != "committed" || Int(t, r.Body["actual_units"]) != 5 || Int(t, r.Body["actual_cost"]) != 50 || Int(t, r.Body["released"]) != 0 {
		t.Errorf("final commit body: %s", r.Raw)
	}
	checkSettled(t, r.Body, "final commit", 40, 400, 0)
	checkReservationAccount(t, r.Body["account"], "final commit account", 600, 0)
	g = a.get("/v1/reservations/" + hid)
	if g.Body["status"] != "committed" || Int(t, g.Body["actual_units"]) != 40 || Int(t, g.Body["actual_cost"]) != 400 {
		t.Errorf("get after the final commit: %s", g.Raw)
	}
	checkSettled(t, g.Body, "get after the final commit", 40, 400, 0)
	checkProblem(t, a.post(path, map[string]any{"actual_units": 1, "final": false}), 409, "conflict", "", "partial commit of a committed reservation")

	s.Drain()
	var parts, units int64
	if err := s.Pool.QueryRow(context.Background(), `SELECT COUNT(*), COALESCE(SUM(cost_units), 0) FROM ledger_entries
		WHERE customer_id = $1 AND reference_id = $2 AND type = 'consumption'`, id, hid).Scan(&parts, &units); err != nil {
		t.Fatal(err)
	}
	if parts != 3 || units != 40 {
		t.Errorf("consumption entries of the reservation: %d for %d units, want 3 for 40", parts, units)
	}
	reservationBooks(t, s, a, id, 600, 0)

	// Each part fires credit.consumed as a commit does, naming the
	// reservation, with its own units and credits.
	var got []string
	for _, e := range ofType(a.alertEvents(), "credit.consumed", id) {
		d := obj(t, e["data"], "credit.consumed data")
		if d["reservation_id"] != hid {
			t.Errorf("credit.consumed without the reservation: %v", d)
		}
		got = append(got, fmt.Sprintf("%d/%d", Int(t, d["units"]), Int(t, d["credits"])))
	}
	if strings.Join(got, " ") != "10/100 25/250 5/50" {
		t.Errorf("credit.consumed units/credits of the parts: %v, want [10/100 25/250 5/50]", got)
	}
}

// TestReservationPartialCommitThenRelease: a release after a partial
// commit returns only what is still held; the settled part stays charged
// and the reservation shows it.
func TestReservationPartialCommitThenRelease(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("partrel"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})
	h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 30})
	hid := h["id"].(string)
	wantStatus(t, a.post("/v1/reservations/"+hid+"/commit", map[string]any{"actual_units": 10, "final": false}), 200, "partial commit")

	r := a.post("/v1/reservations/"+hid+"/release", nil)
	wantStatus(t, r, 200, "release")
	if r.Body["status"] != "released" || Int(t, r.Body["released"]) != 200 {
		t.Errorf("release body: %s", r.Raw)
	}
	checkReservationAccount(t, r.Body["account"], "release account", 900, 0)
	g := a.get("/v1/reservations/" + hid)
	if g.Body["status"] != "released" || g.Body["actual_units"] != nil {
		t.Errorf("get after release: %s", g.Raw)
	}
	checkSettled(t, g.Body, "get after release", 10, 100, 0)
	reservationBooks(t, s, a, id, 900, 0)
}

// TestReservationPartialCommitSurvivesRebuild: a partially committed reservation
// whose customer's Redis state is lost is loaded from Postgres holding only
// what the partial commit left (invariant 5), and its final commit settles
// from there.
func TestReservationPartialCommitSurvivesRebuild(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("partload"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})
	h := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": 30})
	hid := h["id"].(string)
	wantStatus(t, a.post("/v1/reservations/"+hid+"/extend", map[string]any{"additional_units": 10}), 200, "extend")
	wantStatus(t, a.post("/v1/reservations/"+hid+"/commit", map[string]any{"actual_units": 10, "final": false}), 200, "partial commit")
	s.Drain()
	if n, err := s.Redis.Del(context.Background(), accountKeyOf(s, id)).Result(); err != nil || n != 1 {
		t.Fatalf("dropping the account hash: %d %v", n, err)
	}
	if c := a.credits(id); Int(t, c["balance"]) != 900 || Int(t, c["reserved_balance"]) != 300 {
		t.Errorf("credits after the load: %v, want balance 900 reserved 300", c)
	}
	r := a.post("/v1/reservations/"+hid+"/commit", map[string]any{"actual_units": 5})
	wantStatus(t, r, 200, "final commit after the load")
	if Int(t, r.Body["released"]) != 300 || Int(t, r.Body["actual_units"]) != 5 {
		t.Errorf("final commit after the load: %s", r.Raw)
	}
	checkSettled(t, r.Body, "final commit after the load", 15, 150, 0)
	reservationBooks(t, s, a, id, 850, 0)
}
