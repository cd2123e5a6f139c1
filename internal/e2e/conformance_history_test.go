package e2e

import (
	"fmt"
	"net/url"
	"testing"
	"time"
)

// TestConformanceHistory: GET .../credits/history: newest first, every
// Ledger entry field, filters type, source, billable_metric_key, from
// (inclusive), to (exclusive), cursor paging; 400 for bad from/to, cursor
// and limit; 404 for unknown customers, which are not created.
func TestConformanceHistory(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("hist"))
	a := s.as(t, tn.Sandbox)
	id, ext := a.newCustomer()

	type op struct {
		path string
		body map[string]any
	}
	ops := []op{
		{"grant", map[string]any{"credits": 1000, "source": "promotional", "reason": "r", "metadata": map[string]any{"n": "1"}}},
		{"grant", map[string]any{"credits": 2000, "source": "referral", "reason": "r"}},
		{"adjust", map[string]any{"delta": -500, "source": "manual", "reason": "r"}},
		{"adjust", map[string]any{"delta": 300, "source": "compensation", "reason": "r", "metadata": map[string]any{"n": "4"}}},
	}
	var keys []string
	for _, o := range ops {
		k := idemKey()
		keys = append(keys, k)
		r := a.do("POST", "/v1/customers/"+id+"/credits/"+o.path, k, o.body)
		if r.Status != 200 && r.Status != 201 {
			t.Fatalf("%s: %d %s", o.path, r.Status, r.Raw)
		}
		time.Sleep(5 * time.Millisecond)
	}

	all := a.history(id, "")
	if len(all) != 4 {
		t.Fatalf("history has %d entries, want 4", len(all))
	}
	wantDeltas := []int64{300, -500, 2000, 1000} // newest first
	wantSources := []string{"compensation", "manual", "referral", "promotional"}
	var at []time.Time
	for i, e := range all {
		m := obj(t, e, "entry")
		checkUUID(t, m["id"], "entry id")
		if m["tenant_id"] != tn.ID || m["customer_id"] != id || m["environment"] != "sandbox" {
			t.Errorf("entry %d: tenant_id %v customer_id %v environment %v", i, m["tenant_id"], m["customer_id"], m["environment"])
		}
		if Int(t, m["delta"]) != wantDeltas[i] || m["source"] != wantSources[i] || m["type"] != "adjustment" {
			t.Errorf("entry %d: delta %v source %v type %v, want %d %s adjustment", i, m["delta"], m["source"], m["type"], wantDeltas[i], wantSources[i])
		}
		if m["idempotency_key"] != keys[len(keys)-1-i] {
			t.Errorf("entry %d: idempotency_key %v, want %s", i, m["idempotency_key"], keys[len(keys)-1-i])
		}
		if _, ok := m["metadata"].(map[string]any); !ok {
			t.Errorf("entry %d: metadata %#v is not an object", i, m["metadata"])
		}
		checkUUID(t, m["credit_block_id"], "entry credit_block_id")
		at = append(at, checkTime(t, m["created_at"], "entry created_at"))
		if i > 0 && at[i].After(at[i-1]) {
			t.Errorf("entry %d is newer than entry %d: not newest first", i, i-1)
		}
	}
	if md := obj(t, obj(t, all[3], "e")["metadata"], "md"); md["n"] != "1" {
		t.Errorf("grant metadata not on its entry: %v", md)
	}
	// Lenient external id works for history too.
	if h := a.history(ext, ""); len(h) != 4 {
		t.Errorf("history by external id: %d entries", len(h))
	}

	q := func(v url.Values) string { return "?" + v.Encode() }
	ts := func(x time.Time) string { return x.UTC().Format(time.RFC3339Nano) }
	for _, tc := range []struct {
		name  string
		query string
		want  []int64
	}{
		{"type adjustment", q(url.Values{"type": {"adjustment"}}), wantDeltas},
		{"type expiry", q(url.Values{"type": {"expiry"}}), nil},
		{"source referral", q(url.Values{"source": {"referral"}}), []int64{2000}},
		{"source manual", q(url.Values{"source": {"manual"}}), []int64{-500}},
		{"billable_metric_key", q(url.Values{"billable_metric_key": {"api_calls"}}), nil},
		{"from inclusive", q(url.Values{"from": {ts(at[2])}}), []int64{300, -500, 2000}},
		{"to exclusive", q(url.Values{"to": {ts(at[1])}}), []int64{2000, 1000}},
		{"from and to", q(url.Values{"from": {ts(at[2])}, "to": {ts(at[0])}}), []int64{-500, 2000}},
		{"from in the future", q(url.Values{"from": {ts(time.Now().Add(time.Hour))}}), nil},
		{"source and from", q(url.Values{"source": {"promotional"}, "from": {ts(at[2])}}), nil},
	} {
		var got []int64
		for _, e := range a.history(id, tc.query) {
			got = append(got, Int(t, obj(t, e, "e")["delta"]))
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s (%s): deltas %v, want %v", tc.name, tc.query, got, tc.want)
		}
	}

	// Paging by 3: 3 then 1, no duplicates.
	seen := map[string]bool{}
	r := a.get("/v1/customers/" + id + "/credits/history?limit=3")
	wantStatus(t, r, 200, "page 1")
	data, more, next := page(t, r)
	if len(data) != 3 || !more || next == nil {
		t.Fatalf("page 1: %d items has_more %v next %v", len(data), more, next)
	}
	for _, e := range data {
		seen[obj(t, e, "e")["id"].(string)] = true
	}
	r = a.get("/v1/customers/" + id + "/credits/history?limit=3&cursor=" + url.QueryEscape(fmt.Sprint(next)))
	wantStatus(t, r, 200, "page 2")
	data, more, next = page(t, r)
	if len(data) != 1 || more || next != nil {
		t.Errorf("page 2: %d items has_more %v next %v, want 1/false/null", len(data), more, next)
	}
	for _, e := range data {
		eid := obj(t, e, "e")["id"].(string)
		if seen[eid] {
			t.Errorf("entry %s on both pages", eid)
		}
		seen[eid] = true
	}
	if len(seen) != 4 {
		t.Errorf("paging saw %d entries, want 4", len(seen))
	}

	for _, tc := range []struct{ name, query, field string }{
		{"bad from", "?from=yesterday", "from"},
		{"bad to", "?to=2024-13-45", "to"},
		{"bad cursor", "?cursor=%21%21not-a-cursor", ""},
		{"limit 0", "?limit=0", "limit"},
		{"limit 101", "?limit=101", "limit"},
		{"limit abc", "?limit=abc", "limit"},
	} {
		checkProblem(t, a.get("/v1/customers/"+id+"/credits/history"+tc.query), 400, "bad-request", tc.field, tc.name)
	}
	ghost := uniq("ghost")
	checkProblem(t, a.get("/v1/customers/"+ghost+"/credits/history"), 404, "not-found", "", "history of unknown")
	checkProblem(t, a.get("/v1/customers/"+ghost), 404, "not-found", "", "history did not create the customer")
	// A customer with no account has an empty history.
	empty, _ := a.newCustomer()
	r = a.get("/v1/customers/" + empty + "/credits/history")
	wantStatus(t, r, 200, "empty history")
	if data, more, next := page(t, r); len(data) != 0 || more || next != nil {
		t.Errorf("empty history: %s", r.Raw)
	}
}

// TestConformanceOverage: GET /v1/customers/{id}/overage: 200 with data [],
// total_overage_mc 0 and the period for a customer without overage; 422 for
// missing or invalid from/to or to <= from; 404 unknown customer.
func TestConformanceOverage(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("ovg"))
	a := s.as(t, tn.Live)
	id, ext := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1000})
	from, to := "2024-01-01T00:00:00Z", "2030-01-01T00:00:00Z"

	for _, cust := range []string{id, ext} {
		r := a.get("/v1/customers/" + cust + "/overage?from=" + from + "&to=" + to)
		if !checkStatus(t, r, 200, "overage") {
			continue
		}
		if d, ok := r.Body["data"].([]any); !ok || len(d) != 0 {
			t.Errorf("overage data %#v, want []", r.Body["data"])
		}
		if Int(t, r.Body["total_overage_mc"]) != 0 {
			t.Errorf("total_overage_mc %v, want 0", r.Body["total_overage_mc"])
		}
		p := obj(t, r.Body["period"], "period")
		if f := checkTime(t, p["from"], "period.from"); !f.Equal(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("period.from %v, want %s", p["from"], from)
		}
		if tt := checkTime(t, p["to"], "period.to"); !tt.Equal(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)) {
			t.Errorf("period.to %v, want %s", p["to"], to)
		}
	}
	for _, tc := range []struct{ name, query, field string }{
		{"missing both", "", ""},
		{"missing from", "?to=" + to, "from"},
		{"missing to", "?from=" + from, "to"},
		{"to equals from", "?from=" + from + "&to=" + from, "to"},
		{"to before from", "?from=" + to + "&to=" + from, "to"},
		{"bad from", "?from=nope&to=" + to, "from"},
		{"bad to", "?from=" + from + "&to=2030-02-30", "to"},
	} {
		checkProblem(t, a.get("/v1/customers/"+id+"/overage"+tc.query), 422, "validation-error", tc.field, "overage "+tc.name)
	}
	ghost := uniq("ghost")
	checkProblem(t, a.get("/v1/customers/"+ghost+"/overage?from="+from+"&to="+to), 404, "not-found", "", "overage of unknown")
	checkProblem(t, a.get("/v1/customers/"+ghost), 404, "not-found", "", "overage did not create the customer")
}

// TestConformanceHistoryDefaultPage: Common rules 2: history pages default
// to 20 entries and max 100.
func TestConformanceHistoryDefaultPage(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("histpage"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	for i := 0; i < 23; i++ {
		a.grant(id, map[string]any{"credits": i + 1})
	}
	r := a.get("/v1/customers/" + id + "/credits/history")
	wantStatus(t, r, 200, "history")
	data, more, next := page(t, r)
	if len(data) != 20 || !more || next == nil {
		t.Fatalf("default page: %d entries has_more %v next %v, want 20/true/cursor", len(data), more, next)
	}
	if Int(t, obj(t, data[0], "e")["delta"]) != 23 || Int(t, obj(t, data[19], "e")["delta"]) != 4 {
		t.Errorf("default page is not the newest 20: first %v last %v", obj(t, data[0], "e")["delta"], obj(t, data[19], "e")["delta"])
	}
	r = a.get("/v1/customers/" + id + "/credits/history?cursor=" + url.QueryEscape(fmt.Sprint(next)))
	wantStatus(t, r, 200, "history page 2")
	data, more, next = page(t, r)
	if len(data) != 3 || more || next != nil || Int(t, obj(t, data[2], "e")["delta"]) != 1 {
		t.Errorf("page 2: %s", r.Raw)
	}
	r = a.get("/v1/customers/" + id + "/credits/history?limit=100")
	wantStatus(t, r, 200, "limit=100")
	if data, more, _ := page(t, r); len(data) != 23 || more {
		t.Errorf("limit=100: %d entries has_more %v", len(data), more)
	}
}

// TestConformanceOveragePeriodAsSent: the overage answer's `period: {from,
// to}` is the window the client asked for, as it wrote it when it wrote it
// in UTC (a JavaScript toISOString() value such as ...T00:00:00.000Z comes
// back unchanged, not as ...T00:00:00Z); an offset form comes back in UTC.
func TestConformanceOveragePeriodAsSent(t *testing.T) {
	s := NewStack(t)
	tn := s.NewTenant(uniq("ovgp"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	for _, tc := range []struct{ from, to, wantFrom, wantTo string }{
		{"2024-01-01T00:00:00.000Z", "2030-01-01T00:00:00.120Z", "2024-01-01T00:00:00.000Z", "2030-01-01T00:00:00.120Z"},
		{"2024-01-01T00:00:00Z", "2030-01-01T00:00:00.5Z", "2024-01-01T00:00:00Z", "2030-01-01T00:00:00.5Z"},
		{"2024-01-01T01:00:00%2B01:00", "2030-01-01T00:00:00Z", "2024-01-01T00:00:00Z", "2030-01-01T00:00:00Z"},
	} {
		r := a.get("/v1/customers/" + id + "/overage?from=" + tc.from + "&to=" + tc.to)
		if !checkStatus(t, r, 200, "overage "+tc.from) {
			continue
		}
		p := obj(t, r.Body["period"], "period")
		if p["from"] != tc.wantFrom || p["to"] != tc.wantTo {
			t.Errorf("period %v for from=%s to=%s, want from %s to %s", p, tc.from, tc.to, tc.wantFrom, tc.wantTo)
		}
	}
}
