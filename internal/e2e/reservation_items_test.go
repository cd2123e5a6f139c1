package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// reservationItems is a reservation body's items member from metric, estimated
// units pairs.
func reservationItems(pairs ...any) []any {
	out := make([]any, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, map[string]any{"billable_metric_key": pairs[i], "estimated_units": pairs[i+1]})
	}
	return out
}

// actualItems is a commit body's items member from metric, actual units
// pairs.
func actualItems(pairs ...any) []any {
	out := make([]any, 0, len(pairs)/2)
	for i := 0; i+1 < len(pairs); i += 2 {
		out = append(out, map[string]any{"billable_metric_key": pairs[i], "actual_units": pairs[i+1]})
	}
	return out
}

// TestConformanceReservationItems: a multi-metric reservation (issue 15
// item 3) over HTTP. Create holds the sum of the items' estimated costs and
// lists each; under block it is all or none; a commit with each metric's
// actual units charges each at its rule in one consumption entry whose
// metadata lists the items; a release returns everything; create and
// commit replay the same bytes; bad bodies are refused naming the field
// and move nothing.
func TestConformanceReservationItems(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("holditems"))
	a := s.as(t, tn.Live)
	m1, m2 := a.perUnit(100), a.perUnit(7)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})

	key := idemKey()
	body := map[string]any{"customer_id": ext, "items": reservationItems(m1, 3, m2, 10), "metadata": map[string]any{"job": "j1"}}
	r := a.do("POST", "/v1/reservations", key, body)
	wantStatus(t, r, 201, "multi reserve")
	wantHeld := fmt.Sprintf(`[{"actual_cost":null,"actual_units":null,"billable_metric_key":%q,"estimated_cost":300,"estimated_units":3},`+
		`{"actual_cost":null,"actual_units":null,"billable_metric_key":%q,"estimated_cost":70,"estimated_units":10}]`, m1, m2)
	if r.Body["customer_id"] != id || r.Body["billable_metric_key"] != "" || Int(t, r.Body["estimated_units"]) != 13 ||
		Int(t, r.Body["estimated_cost"]) != 370 || r.Body["status"] != "active" || mustJSON(r.Body["items"]) != wantHeld {
		t.Errorf("multi reserve body: %s", r.Raw)
	}
	checkReservationAccount(t, r.Body["account"], "multi reserve account", 1000, 370)
	hid := r.Body["id"].(string)
	rp := a.do("POST", "/v1/reservations", key, body)
	wantStatus(t, rp, 201, "reserve replay")
	if string(rp.Raw) != string(r.Raw) || rp.Header.Get("X-Idempotent-Replayed") != "true" {
		t.Errorf("reserve replay: %s, first %s", rp.Raw, r.Raw)
	}

	// block: a reservation past the effective balance (630) is refused whole.
	v := Int(t, a.credits(id)["version"])
	checkProblem(t, a.post("/v1/reservations", map[string]any{"customer_id": id, "items": reservationItems(m1, 6, m2, 10)}),
		409, "insufficient-credits", "", "block: the sum past the effective balance")
	if c := a.credits(id); Int(t, c["reserved_balance"]) != 370 || Int(t, c["version"]) != v {
		t.Errorf("after a refused multi reserve: reserved %v version %v (was 370, %d)", c["reserved_balance"], c["version"], v)
	}
	if g := a.get("/v1/reservations/" + hid); checkStatus(t, g, 200, "get multi reservation") &&
		(mustJSON(g.Body["items"]) != wantHeld || g.Body["billable_metric_key"] != "" || Int(t, g.Body["estimated_cost"]) != 370) {
		t.Errorf("get multi reservation: %s", g.Raw)
	}

	// Commit: 5 x 100 + 20 x 7 = 640, past the reservation, within reservation plus free.
	ckey := idemKey()
	cbody := map[string]any{"items": actualItems(m2, 20, m1, 5), "metadata": map[string]any{"done": true}}
	c := a.do("POST", "/v1/reservations/"+hid+"/commit", ckey, cbody)
	wantStatus(t, c, 200, "multi commit")
	wantSettled := fmt.Sprintf(`[{"actual_cost":500,"actual_units":5,"billable_metric_key":%q,"estimated_cost":300,"estimated_units":3},`+
		`{"actual_cost":140,"actual_units":20,"billable_metric_key":%q,"estimated_cost":70,"estimated_units":10}]`, m1, m2)
	if c.Body["status"] != "committed" || Int(t, c.Body["actual_units"]) != 25 || Int(t, c.Body["actual_cost"]) != 640 ||
		Int(t, c.Body["estimated_cost"]) != 370 || Int(t, c.Body["released"]) != 370 || mustJSON(c.Body["items"]) != wantSettled {
		t.Errorf("multi commit body: %s", c.Raw)
	}
	checkReservationAccount(t, c.Body["account"], "multi commit account", 360, 0)
	tx := obj(t, c.Body["transaction"], "transaction")
	if Int(t, tx["delta"]) != -640 || tx["type"] != "consumption" || tx["billable_metric_key"] != nil {
		t.Errorf("multi commit transaction: %v", tx)
	}
	cr := a.do("POST", "/v1/reservations/"+hid+"/commit", ckey, cbody)
	wantStatus(t, cr, 200, "commit replay")
	if string(cr.Raw) != string(c.Raw) || cr.Header.Get("X-Idempotent-Replayed") != "true" {
		t.Errorf("commit replay: %s, first %s", cr.Raw, c.Raw)
	}
	checkProblem(t, a.post("/v1/reservations/"+hid+"/commit", cbody), 409, "conflict", "", "commit twice")
	s.Drain()
	h := a.history(id, "?type=consumption")
	if len(h) != 1 {
		t.Fatalf("consumption entries: %d, want 1", len(h))
	}
	e := obj(t, h[0], "entry")
	wantMeta := fmt.Sprintf(`{"items":[{"billable_metric_key":%q,"cost":500,"units":5},{"billable_metric_key":%q,"cost":140,"units":20}]}`, m1, m2)
	if e["id"] != tx["id"] || Int(t, e["delta"]) != -640 || e["billable_metric_key"] != nil || e["reference_id"] != hid ||
		mustJSON(e["metadata"]) != wantMeta {
		t.Errorf("consumption entry: %v", e)
	}
	// credit.consumed lists the items, as for a multi-metric consume.
	var consumed map[string]any
	ev := a.get("/v1/events?limit=100")
	wantStatus(t, ev, 200, "events")
	for _, x := range arr(t, ev.Body["data"], "events") {
		if e := obj(t, x, "event"); e["event_type"] == "credit.consumed" {
			consumed = obj(t, e["data"], "credit.consumed data")
		}
	}
	wantEvItems := fmt.Sprintf(`[{"billable_metric_key":%q,"cost":500,"units":5},{"billable_metric_key":%q,"cost":140,"units":20}]`, m1, m2)
	if consumed == nil || consumed["reservation_id"] != hid || Int(t, consumed["credits"]) != 640 ||
		consumed["billable_metric_key"] != nil || mustJSON(consumed["items"]) != wantEvItems {
		t.Errorf("credit.consumed of the commit: %v", consumed)
	}
	if g := a.get("/v1/reservations/" + hid); checkStatus(t, g, 200, "get committed") &&
		(mustJSON(g.Body["items"]) != wantSettled || Int(t, g.Body["actual_cost"]) != 640 || mustJSON(g.Body["metadata"]) != `{"done":true,"job":"j1"}`) {
		t.Errorf("get committed multi reservation: %s", g.Raw)
	}

	// Release returns everything; under block a commit past reservation plus free
	// balance changes nothing first.
	h2 := a.reserve(map[string]any{"customer_id": id, "items": reservationItems(m1, 1, m2, 1)})
	h2id := h2["id"].(string)
	checkProblem(t, a.post("/v1/reservations/"+h2id+"/commit", map[string]any{"items": actualItems(m1, 100, m2, 1)}),
		409, "insufficient-credits", "", "commit past reservation plus free")
	rel := a.post("/v1/reservations/"+h2id+"/release", nil)
	if checkStatus(t, rel, 200, "multi release") && (Int(t, rel.Body["released"]) != 107 || rel.Body["status"] != "released") {
		t.Errorf("multi release: %s", rel.Raw)
	}
	checkReservationAccount(t, rel.Body["account"], "multi release account", 360, 0)
	if g := a.get("/v1/reservations/" + h2id); checkStatus(t, g, 200, "get released") && g.Body["items"] == nil {
		t.Errorf("a released multi reservation lost its items: %s", g.Raw)
	}

	// Bad bodies name the field and move nothing.
	var twentyOne []any
	for i := 0; i < 21; i++ {
		twentyOne = append(twentyOne, m1, 1)
	}
	for _, tc := range []struct {
		name   string
		body   map[string]any
		status int
		typ    string
		field  string
	}{
		{"both forms", map[string]any{"customer_id": id, "billable_metric_key": m1, "estimated_units": 1, "items": reservationItems(m1, 1)}, 400, "bad-request", "items"},
		{"21 items", map[string]any{"customer_id": id, "items": reservationItems(twentyOne...)}, 400, "bad-request", "items"},
		{"metric twice", map[string]any{"customer_id": id, "items": reservationItems(m1, 1, m1, 2)}, 400, "bad-request", "items[1].billable_metric_key"},
		{"unknown metric", map[string]any{"customer_id": id, "items": reservationItems(m1, 1, uniq("nope"), 1)}, 422, "validation-error", "items[1].billable_metric_key"},
		{"units 0", map[string]any{"customer_id": id, "items": reservationItems(m1, 0)}, 422, "validation-error", "items[0].estimated_units"},
	} {
		checkProblem(t, a.post("/v1/reservations", tc.body), tc.status, tc.typ, tc.field, tc.name)
	}
	single := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": m1, "estimated_units": 1})
	h3 := a.reserve(map[string]any{"customer_id": id, "items": reservationItems(m1, 1, m2, 1)})
	h3path := "/v1/reservations/" + h3["id"].(string) + "/commit"
	v = Int(t, a.credits(id)["version"])
	for _, tc := range []struct {
		name   string
		path   string
		body   map[string]any
		status int
		typ    string
		field  string
	}{
		{"items on a single reservation", "/v1/reservations/" + single["id"].(string) + "/commit", map[string]any{"items": actualItems(m1, 1)}, 400, "bad-request", "items"},
		{"actual_units on a multi reservation", h3path, map[string]any{"actual_units": 1}, 400, "bad-request", "actual_units"},
		{"neither", h3path, map[string]any{}, 422, "validation-error", "items"},
		{"a metric missing", h3path, map[string]any{"items": actualItems(m1, 1)}, 422, "validation-error", "items"},
		{"a metric not held", h3path, map[string]any{"items": actualItems(m1, 1, uniq("nope"), 1)}, 422, "validation-error", "items[1].billable_metric_key"},
		{"metric twice", h3path, map[string]any{"items": actualItems(m1, 1, m1, 1)}, 400, "bad-request", "items[1].billable_metric_key"},
		{"negative units", h3path, map[string]any{"items": actualItems(m1, -1, m2, 1)}, 422, "validation-error", "items[0].actual_units"},
		{"both forms", h3path, map[string]any{"actual_units": 1, "items": actualItems(m1, 1, m2, 1)}, 400, "bad-request", "items"},
	} {
		checkProblem(t, a.post(tc.path, tc.body), tc.status, tc.typ, tc.field, tc.name)
	}
	if c := a.credits(id); Int(t, c["version"]) != v || Int(t, c["balance"]) != 360 {
		t.Errorf("refused commits moved the account: %v", c)
	}
}

// TestReservationItemsSurviveRebuild: a multi-metric reservation outlives the
// loss of Redis: after FLUSHALL and `creditd rebuild` it still holds its
// sum, a retry of its create replays the first answer, and a commit with each metric's units charges each at its rule;
// after another FLUSHALL the lazy load brings a second hold back and its
// release returns it all.
func TestReservationItemsSurviveRebuild(t *testing.T) {
	t.Parallel()
	rb := newRebuildable(t, "ri", "holdrebuild")
	s, a, rdb := rb.s, rb.a, rb.rdb
	m1, m2 := a.perUnit(100), a.perUnit(7)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})
	key := idemKey()
	body := map[string]any{"customer_id": id, "items": reservationItems(m1, 3, m2, 10), "ttl_seconds": 3600}
	first := a.do("POST", "/v1/reservations", key, body)
	wantStatus(t, first, 201, "multi reserve")
	h1 := first.Body
	h2 := a.reserve(map[string]any{"customer_id": id, "items": reservationItems(m1, 1, m2, 1), "ttl_seconds": 3600})
	rb.flushAndRebuild(t)
	ctx := context.Background()
	// The retry of the create, its op key gone with Redis, is answered from
	// Postgres with the same bytes.
	if rp := a.do("POST", "/v1/reservations", key, body); rp.Status != 201 || string(rp.Raw) != string(first.Raw) {
		t.Errorf("reserve replay after the rebuild: %d %s, first %s", rp.Status, rp.Raw, first.Raw)
	}
	if c := a.credits(id); Int(t, c["balance"]) != 1000 || Int(t, c["reserved_balance"]) != 477 {
		t.Fatalf("after the rebuild: %v, want balance 1000 reserved 477", c)
	}
	c := a.post("/v1/reservations/"+h1["id"].(string)+"/commit", map[string]any{"items": actualItems(m1, 2, m2, 10)})
	if checkStatus(t, c, 200, "commit after the rebuild") && (Int(t, c.Body["actual_cost"]) != 270 || len(arr(t, c.Body["items"], "items")) != 2) {
		t.Errorf("commit after the rebuild: %s", c.Raw)
	}
	checkReservationAccount(t, c.Body["account"], "commit after the rebuild", 730, 107)
	s.Drain()

	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		rel := a.post("/v1/reservations/"+h2["id"].(string)+"/release", nil)
		if rel.Status == 200 {
			if Int(t, rel.Body["released"]) != 107 {
				t.Errorf("release after the lazy load: %s", rel.Raw)
			}
			checkReservationAccount(t, rel.Body["account"], "release after the lazy load", 730, 0)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("release after FLUSHALL: %d %s", rel.Status, rel.Raw)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
