package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestConformanceCustomerCreate: docs/spec/interface.md Customer fields and POST
// /v1/customers: 201 with every field, 409 taken external_id, 422 naming the
// field, 400 unparseable JSON; refused requests create nothing.
func TestConformanceCustomerCreate(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("cust"))
	a := s.as(t, tn.Live)

	before := time.Now().Add(-time.Minute)
	ext := uniq("full")
	r := a.post("/v1/customers", map[string]any{
		"external_id": ext, "display_name": "Ada Lovelace", "overage_policy": "allow",
		"low_balance_threshold_mc": 1500, "metadata": map[string]any{"plan": "pro", "seats": 3},
	})
	wantStatus(t, r, 201, "create full customer")
	c := r.Body
	checkUUID(t, c["id"], "id")
	if c["tenant_id"] != tn.ID {
		t.Errorf("tenant_id %v, want %s", c["tenant_id"], tn.ID)
	}
	want := map[string]any{"environment": "live", "external_id": ext, "display_name": "Ada Lovelace", "overage_policy": "allow"}
	for k, v := range want {
		if c[k] != v {
			t.Errorf("%s = %v, want %v", k, c[k], v)
		}
	}
	if Int(t, c["low_balance_threshold_mc"]) != 1500 {
		t.Errorf("low_balance_threshold_mc %v", c["low_balance_threshold_mc"])
	}
	md := obj(t, c["metadata"], "metadata")
	if md["plan"] != "pro" || fmt.Sprint(md["seats"]) != "3" {
		t.Errorf("metadata %v", md)
	}
	ca, ua := checkTime(t, c["created_at"], "created_at"), checkTime(t, c["updated_at"], "updated_at")
	if ca.Before(before) || ca.After(time.Now().Add(time.Minute)) || ua.Before(ca) {
		t.Errorf("created_at %v updated_at %v", ca, ua)
	}
	if _, ok := c["deleted_at"]; ok && c["deleted_at"] != nil {
		t.Errorf("a new customer has deleted_at %v", c["deleted_at"])
	}

	// Minimal body: optional fields null, metadata {}.
	m := a.createCustomer(map[string]any{"external_id": uniq("min")})
	for _, k := range []string{"display_name", "overage_policy", "low_balance_threshold_mc"} {
		if v, ok := m[k]; !ok || v != nil {
			t.Errorf("minimal customer %s = %v (present %v), want null", k, v, ok)
		}
	}
	if md, ok := m["metadata"].(map[string]any); !ok || len(md) != 0 {
		t.Errorf("minimal customer metadata %v, want {}", m["metadata"])
	}
	// A new customer has no credit (Grants no credits).
	if bal := a.balance(m["id"].(string)); bal != 0 {
		t.Errorf("a new customer has balance %d", bal)
	}
	// 200 characters is the limit, inclusive; threshold 0 is allowed.
	checkStatus(t, a.post("/v1/customers", map[string]any{"external_id": uniq("n200"), "display_name": strings.Repeat("é", 200), "low_balance_threshold_mc": 0}), 201, "200-character name")

	checkProblem(t, a.post("/v1/customers", map[string]any{"external_id": ext}), 409, "conflict", "", "taken external_id")

	for _, tc := range []struct {
		name  string
		body  any
		field string
	}{
		{"missing external_id", map[string]any{"display_name": "x"}, "external_id"},
		{"empty external_id", map[string]any{"external_id": ""}, "external_id"},
		{"201-character display_name", map[string]any{"external_id": uniq("long"), "display_name": strings.Repeat("n", 201)}, "display_name"},
		{"negative threshold", map[string]any{"external_id": uniq("neg"), "low_balance_threshold_mc": -1}, "low_balance_threshold_mc"},
		{"bad overage_policy", map[string]any{"external_id": uniq("pol"), "overage_policy": "sometimes"}, "overage_policy"},
	} {
		checkProblem(t, a.post("/v1/customers", tc.body), 422, "validation-error", tc.field, tc.name)
	}
	for _, tc := range []struct{ name, body string }{
		{"truncated JSON", `{"external_id": "x"`},
		{"not JSON", `external_id=x`},
	} {
		checkProblem(t, a.post("/v1/customers", tc.body), 400, "bad-request", "", tc.name)
	}
	lr := a.get("/v1/customers")
	wantStatus(t, lr, 200, "list")
	if data, _, _ := page(t, lr); len(data) != 3 {
		t.Errorf("%d customers after refused creates, want 3", len(data))
	}
}

// TestConformanceCustomerLookup: Common rules 3: lenient ids try external_id
// first, then the UUID; the strict form never matches a UUID.
func TestConformanceCustomerLookup(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("look"))
	a := s.as(t, tn.Live)
	first := a.createCustomer(map[string]any{"external_id": uniq("first")})
	fid := first["id"].(string)
	// A second customer whose external_id is the first one's UUID.
	second := a.createCustomer(map[string]any{"external_id": fid})
	sid := second["id"].(string)

	for _, tc := range []struct{ name, path, wantID string }{
		{"by UUID", "/v1/customers/" + sid, sid},
		{"by external id", "/v1/customers/" + url.PathEscape(first["external_id"].(string)), fid},
		{"external id wins over UUID", "/v1/customers/" + fid, sid},
		{"strict by external id", "/v1/customer-by-external-id/" + fid, sid},
	} {
		r := a.get(tc.path)
		if checkStatus(t, r, 200, tc.name) && r.Body["id"] != tc.wantID {
			t.Errorf("%s: got customer %v, want %s", tc.name, r.Body["id"], tc.wantID)
		}
	}
	checkProblem(t, a.get("/v1/customer-by-external-id/"+sid), 404, "not-found", "", "strict by UUID")
	checkProblem(t, a.get("/v1/customers/no-such-customer"), 404, "not-found", "", "unknown id")
	checkProblem(t, a.get("/v1/customers/00000000-0000-7000-8000-000000000000"), 404, "not-found", "", "unknown UUID")
	// Reads never create a customer.
	checkProblem(t, a.get("/v1/customers/no-such-customer/credits"), 404, "not-found", "", "credits of unknown")
	checkProblem(t, a.get("/v1/customers/no-such-customer"), 404, "not-found", "", "still unknown")

	// Strict PATCH and DELETE.
	ext := first["external_id"].(string)
	p := a.patch("/v1/customer-by-external-id/"+ext, map[string]any{"display_name": "Strict"})
	if checkStatus(t, p, 200, "strict patch") && p.Body["display_name"] != "Strict" {
		t.Errorf("strict patch answer %s", p.Raw)
	}
	checkProblem(t, a.patch("/v1/customer-by-external-id/"+sid, map[string]any{"display_name": "x"}), 404, "not-found", "", "strict patch by UUID")
	checkProblem(t, a.do("DELETE", "/v1/customer-by-external-id/"+sid, "", nil), 404, "not-found", "", "strict delete by UUID")
	checkStatus(t, a.do("DELETE", "/v1/customer-by-external-id/"+ext, "", nil), 204, "strict delete")
	checkProblem(t, a.get("/v1/customers/"+url.PathEscape(ext)), 404, "not-found", "", "lenient get of the deleted customer")
	if r := a.get("/v1/customers/" + fid); checkStatus(t, r, 200, "deleted UUID as the other's external id") && r.Body["id"] != sid {
		t.Errorf("GET %s after delete found %v, want %s", fid, r.Body["id"], sid)
	}
}

// TestConformanceCustomerPatch: PATCH merges metadata key by key, empty
// display_name and overage_policy clear to null, omitted fields are kept.
func TestConformanceCustomerPatch(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("patch"))
	a := s.as(t, tn.Live)
	c := a.createCustomer(map[string]any{
		"external_id": uniq("p"), "display_name": "Before", "overage_policy": "notify",
		"low_balance_threshold_mc": 100, "metadata": map[string]any{"a": "1", "b": map[string]any{"x": 1}},
	})
	id := c["id"].(string)
	created := checkTime(t, c["created_at"], "created_at")
	time.Sleep(5 * time.Millisecond)

	r := a.patch("/v1/customers/"+id, map[string]any{"metadata": map[string]any{"b": "replaced", "c": true}})
	wantStatus(t, r, 200, "patch metadata")
	md := obj(t, r.Body["metadata"], "metadata")
	if md["a"] != "1" || md["b"] != "replaced" || md["c"] != true || len(md) != 3 {
		t.Errorf("merged metadata %v, want {a:1, b:replaced, c:true}", md)
	}
	if r.Body["display_name"] != "Before" || r.Body["overage_policy"] != "notify" || Int(t, r.Body["low_balance_threshold_mc"]) != 100 {
		t.Errorf("omitted fields changed: %s", r.Raw)
	}
	if u := checkTime(t, r.Body["updated_at"], "updated_at"); !u.After(created) {
		t.Errorf("updated_at %v not after created_at %v", u, created)
	}
	if checkTime(t, r.Body["created_at"], "created_at") != created {
		t.Errorf("created_at changed: %v", r.Body["created_at"])
	}

	// "a key cannot be removed": a null value does not drop the key.
	r = a.patch("/v1/customers/"+id, map[string]any{"metadata": map[string]any{"a": nil}})
	wantStatus(t, r, 200, "patch metadata null")
	if md := obj(t, r.Body["metadata"], "metadata"); len(md) != 3 {
		t.Errorf("metadata after {a: null} = %v, want the key a kept (3 keys)", md)
	} else if _, ok := md["a"]; !ok {
		t.Errorf("metadata key a removed: %v", md)
	}
	if g := a.get("/v1/customers/" + id); len(obj(t, g.Body["metadata"], "md")) != 3 {
		t.Errorf("GET metadata after {a: null} = %v", g.Body["metadata"])
	}

	r = a.patch("/v1/customers/"+id, map[string]any{"display_name": "", "overage_policy": ""})
	wantStatus(t, r, 200, "clear")
	for _, k := range []string{"display_name", "overage_policy"} {
		if v, ok := r.Body[k]; !ok || v != nil {
			t.Errorf("%s after clearing = %v, want null", k, v)
		}
	}
	if Int(t, r.Body["low_balance_threshold_mc"]) != 100 || len(obj(t, r.Body["metadata"], "metadata")) != 3 {
		t.Errorf("clear changed other fields: %s", r.Raw)
	}

	r = a.patch("/v1/customers/"+id, map[string]any{"display_name": "After", "overage_policy": "block", "low_balance_threshold_mc": 0})
	wantStatus(t, r, 200, "set")
	if r.Body["display_name"] != "After" || r.Body["overage_policy"] != "block" || Int(t, r.Body["low_balance_threshold_mc"]) != 0 {
		t.Errorf("set answer %s", r.Raw)
	}
	// GET shows what PATCH answered.
	g := a.get("/v1/customers/" + id)
	wantStatus(t, g, 200, "get after patch")
	if g.Body["display_name"] != "After" || g.Body["overage_policy"] != "block" || len(obj(t, g.Body["metadata"], "md")) != 3 {
		t.Errorf("GET after PATCH %s", g.Raw)
	}

	for _, tc := range []struct {
		name  string
		body  any
		field string
	}{
		{"201-char name", map[string]any{"display_name": strings.Repeat("n", 201)}, "display_name"},
		{"bad policy", map[string]any{"overage_policy": "maybe"}, "overage_policy"},
		{"negative threshold", map[string]any{"low_balance_threshold_mc": -5}, "low_balance_threshold_mc"},
	} {
		checkProblem(t, a.patch("/v1/customers/"+id, tc.body), 422, "validation-error", tc.field, tc.name)
	}
	checkProblem(t, a.patch("/v1/customers/"+id, `{"display_name":`), 400, "bad-request", "", "unparseable PATCH")
	checkProblem(t, a.patch("/v1/customers/nobody", map[string]any{"display_name": "x"}), 404, "not-found", "", "PATCH unknown")
	g2 := a.get("/v1/customers/" + id)
	if !jsonEqual(g.Raw, g2.Raw) {
		t.Errorf("refused PATCHes changed the customer:\n%s\n%s", g.Raw, g2.Raw)
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}

// TestConformanceCustomerDelete: soft delete; 204 (docs/decisions.md); later
// reads 404; a second delete 404; list skips it; a new customer may take the
// external_id and gets a new id; the credit history stays in Postgres.
func TestConformanceCustomerDelete(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("del"))
	a := s.as(t, tn.Live)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 2000})
	other, _ := a.newCustomer()

	r := a.do("DELETE", "/v1/customers/"+id, "", nil)
	wantStatus(t, r, 204, "delete")
	if len(r.Raw) != 0 {
		t.Errorf("204 with a body: %s", r.Raw)
	}
	for _, p := range []string{"/v1/customers/" + id, "/v1/customers/" + ext, "/v1/customer-by-external-id/" + ext,
		"/v1/customers/" + id + "/credits", "/v1/customers/" + id + "/credits/history"} {
		checkProblem(t, a.get(p), 404, "not-found", "", "GET "+p+" after delete")
	}
	checkProblem(t, a.do("DELETE", "/v1/customers/"+id, "", nil), 404, "not-found", "", "second delete")
	checkProblem(t, a.patch("/v1/customers/"+id, map[string]any{"display_name": "x"}), 404, "not-found", "", "patch deleted")
	checkProblem(t, a.post("/v1/customers/"+id+"/credits/adjust", map[string]any{"delta": 5, "source": "manual", "reason": "r"}), 404, "not-found", "", "adjust deleted")

	lr := a.get("/v1/customers")
	wantStatus(t, lr, 200, "list")
	data, _, _ := page(t, lr)
	if len(data) != 1 || obj(t, data[0], "c")["id"] != other {
		t.Errorf("list after delete: %s", lr.Raw)
	}

	n := a.createCustomer(map[string]any{"external_id": ext})
	if n["id"] == id {
		t.Errorf("the new customer reuses the deleted id %s", id)
	}
	if bal := a.balance(ext); bal != 0 {
		t.Errorf("the new customer inherits balance %d", bal)
	}

	// The deleted customer's ledger stays in Postgres.
	s.Drain()
	var rows int
	if err := s.Pool.QueryRow(t.Context(), "SELECT count(*) FROM ledger_entries WHERE customer_id = $1", id).Scan(&rows); err != nil {
		t.Errorf("count ledger rows: %v", err)
	} else if rows != 1 {
		t.Errorf("deleted customer has %d ledger rows in Postgres, want 1", rows)
	}
	var deleted bool
	if err := s.Pool.QueryRow(t.Context(), "SELECT deleted_at IS NOT NULL FROM customers WHERE id = $1", id).Scan(&deleted); err != nil || !deleted {
		t.Errorf("deleted customer row: deleted_at set %v, err %v (soft delete keeps the row)", deleted, err)
	}
}

// TestConformanceCustomerList: newest first, search over external_id and
// display_name, cursor paging, bad cursor and bad limit 400, default page 20.
func TestConformanceCustomerList(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("list"))
	a := s.as(t, tn.Live)
	var ids []string // creation order
	names := []struct{ ext, name string }{
		{"acme-1", "Alpha Corp"}, {"beta-2", "Bravo"}, {"acme-3", "Charlie"}, {"delta-4", "Acme Subsidiary"}, {"echo-5", ""},
	}
	for _, n := range names {
		body := map[string]any{"external_id": n.ext}
		if n.name != "" {
			body["display_name"] = n.name
		}
		ids = append(ids, a.createCustomer(body)["id"].(string))
		time.Sleep(3 * time.Millisecond)
	}
	newest := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}

	r := a.get("/v1/customers")
	wantStatus(t, r, 200, "list")
	data, more, next := page(t, r)
	if got := idsOf(t, data); fmt.Sprint(got) != fmt.Sprint(newest) {
		t.Errorf("list order %v, want newest first %v", got, newest)
	}
	if more || next != nil {
		t.Errorf("one page: has_more %v next_cursor %v, want false/null", more, next)
	}

	// Paging by 2.
	var seen []string
	cursor := ""
	for pageNo := 0; ; pageNo++ {
		q := "/v1/customers?limit=2"
		if cursor != "" {
			q += "&cursor=" + url.QueryEscape(cursor)
		}
		r := a.get(q)
		wantStatus(t, r, 200, "page")
		data, more, next := page(t, r)
		seen = append(seen, idsOf(t, data)...)
		if pageNo < 2 {
			if len(data) != 2 || !more {
				t.Fatalf("page %d: %d items has_more %v, want 2/true", pageNo, len(data), more)
			}
			c, ok := next.(string)
			if !ok || c == "" {
				t.Fatalf("page %d: next_cursor %v", pageNo, next)
			}
			cursor = c
			continue
		}
		if len(data) != 1 || more || next != nil {
			t.Errorf("last page: %d items has_more %v next_cursor %v, want 1/false/null", len(data), more, next)
		}
		break
	}
	if fmt.Sprint(seen) != fmt.Sprint(newest) {
		t.Errorf("paged ids %v, want %v (no duplicates, none missing)", seen, newest)
	}

	// Search matches substrings of external_id or display_name.
	for _, tc := range []struct {
		q    string
		want []string
	}{
		{"acme", []string{ids[3], ids[2], ids[0]}}, // acme-3, acme-1 by id; "Acme Subsidiary" by name
		{"Bravo", []string{ids[1]}},
		{"cho-", []string{ids[4]}},
		{"zzz-nothing", []string{}},
	} {
		r := a.get("/v1/customers?search=" + url.QueryEscape(tc.q))
		wantStatus(t, r, 200, "search "+tc.q)
		data, _, _ := page(t, r)
		got := idsOf(t, data)
		if tc.q == "acme" {
			// Case of "Acme Subsidiary" vs "acme": accept either reading, but
			// the two external-id matches must be there, newest first.
			if len(got) < 2 || !contains(got, ids[2]) || !contains(got, ids[0]) || contains(got, ids[1]) || contains(got, ids[4]) {
				t.Errorf("search acme: %v, want acme-3 and acme-1 (and maybe delta-4)", got)
			}
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("search %q: %v, want %v", tc.q, got, tc.want)
		}
	}

	checkProblem(t, a.get("/v1/customers?cursor=not-a-cursor!!"), 400, "bad-request", "", "bad cursor")
	for _, l := range []string{"0", "101", "abc", "-1"} {
		checkProblem(t, a.get("/v1/customers?limit="+l), 400, "bad-request", "limit", "limit="+l)
	}
	checkStatus(t, a.get("/v1/customers?limit=100"), 200, "limit=100")

	// Default page size 20.
	for i := 0; i < 20; i++ {
		a.createCustomer(map[string]any{"external_id": fmt.Sprintf("bulk-%02d", i)})
	}
	r = a.get("/v1/customers")
	wantStatus(t, r, 200, "default page")
	data, more, next = page(t, r)
	if len(data) != 20 || !more || next == nil {
		t.Errorf("default page: %d items has_more %v next %v, want 20/true/cursor", len(data), more, next)
	}
	r = a.get("/v1/customers?cursor=" + url.QueryEscape(fmt.Sprint(next)))
	wantStatus(t, r, 200, "second default page")
	data, more, _ = page(t, r)
	if len(data) != 5 || more {
		t.Errorf("second default page: %d items has_more %v, want 5/false", len(data), more)
	}
}

func idsOf(t testing.TB, data []any) []string {
	t.Helper()
	out := []string{}
	for _, d := range data {
		out = append(out, str(t, obj(t, d, "item")["id"], "id"))
	}
	return out
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// TestConformanceCustomerIDsAndTypes: external ids are the tenant's own
// strings (emails, spaces, unicode) and work URL-escaped in every path;
// fields of the wrong JSON type are 422 naming the field ("missing or wrong
// field"); an empty PATCH changes nothing.
func TestConformanceCustomerIDsAndTypes(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("ids"))
	a := s.as(t, tn.Live)
	for _, ext := range []string{"ada@example.com", "name with space", "ünïcødé-顧客", "a+b=c", "123"} {
		c := a.createCustomer(map[string]any{"external_id": ext})
		p := url.PathEscape(ext)
		for _, path := range []string{"/v1/customers/" + p, "/v1/customer-by-external-id/" + p} {
			r := a.get(path)
			if checkStatus(t, r, 200, "GET "+path) && (r.Body["id"] != c["id"] || r.Body["external_id"] != ext) {
				t.Errorf("GET %s: %s", path, r.Raw)
			}
		}
		g := a.post("/v1/customer-by-external-id/"+p+"/credits/grant", map[string]any{"credits": 10, "source": "manual", "reason": "r"})
		if checkStatus(t, g, 201, "strict grant "+ext) && obj(t, g.Body["account"], "a")["customer_id"] != c["id"] {
			t.Errorf("strict grant %q reached %v", ext, g.Body["account"])
		}
	}
	// Auto-create keeps the exact presented value.
	auto := "new.user+tag@example.com"
	wantStatus(t, a.post("/v1/customers/"+url.PathEscape(auto)+"/credits/grant", map[string]any{"credits": 10, "source": "manual", "reason": "r"}), 201, "auto-create email")
	if r := a.get("/v1/customer-by-external-id/" + url.PathEscape(auto)); checkStatus(t, r, 200, "auto-created email") && r.Body["external_id"] != auto {
		t.Errorf("auto-created external_id %v, want %q", r.Body["external_id"], auto)
	}

	for _, tc := range []struct {
		name  string
		body  any
		field string
	}{
		{"external_id number", map[string]any{"external_id": 42}, "external_id"},
		{"display_name number", map[string]any{"external_id": uniq("t"), "display_name": 7}, "display_name"},
		{"threshold string", map[string]any{"external_id": uniq("t"), "low_balance_threshold_mc": "100"}, "low_balance_threshold_mc"},
		{"threshold fraction", map[string]any{"external_id": uniq("t"), "low_balance_threshold_mc": 1.5}, "low_balance_threshold_mc"},
		{"metadata array", map[string]any{"external_id": uniq("t"), "metadata": []any{1, 2}}, "metadata"},
		{"metadata string", map[string]any{"external_id": uniq("t"), "metadata": "x"}, "metadata"},
		{"external_id 256 chars", map[string]any{"external_id": strings.Repeat("e", 256)}, "external_id"},
	} {
		checkProblem(t, a.post("/v1/customers", tc.body), 422, "validation-error", tc.field, tc.name)
	}
	checkProblem(t, a.post("/v1/customers", `[{"external_id": "x"}]`), 400, "bad-request", "", "array body")

	id, _ := a.newCustomer()
	before := a.get("/v1/customers/" + id)
	r := a.patch("/v1/customers/"+id, map[string]any{})
	if checkStatus(t, r, 200, "empty PATCH") {
		for _, k := range []string{"external_id", "display_name", "overage_policy", "low_balance_threshold_mc", "created_at"} {
			if fmt.Sprint(r.Body[k]) != fmt.Sprint(before.Body[k]) {
				t.Errorf("empty PATCH changed %s: %v -> %v", k, before.Body[k], r.Body[k])
			}
		}
	}
	checkProblem(t, a.patch("/v1/customers/"+id, map[string]any{"metadata": "x"}), 422, "validation-error", "metadata", "PATCH metadata string")
	if ct := before.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("200 Content-Type %q, want application/json", ct)
	}
}
