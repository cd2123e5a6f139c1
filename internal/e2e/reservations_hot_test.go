package e2e

import (
	"context"
	"testing"
	"time"
)

// TestReservationsSettleWithoutPostgres: with the persister off, so Postgres holds
// none of the reservations, commit (single, zero units, multi-metric, with and
// without metadata) and release of active reservations answer from Redis at once
// (a wait for Postgres to catch up would take its 2 s bound and then find
// nothing), a second commit or release is the 409 of the kept reservation, and
// once the persister runs Postgres holds what they answered.
func TestReservationsSettleWithoutPostgres(t *testing.T) {
	s := NewStack(t, WithoutStart())
	a := s.as(t, s.NewTenant(uniq("hothold")).Live)
	m1, m2 := a.perUnit(10), a.perUnit(7)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})
	single := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": m1, "estimated_units": 30,
		"metadata": map[string]any{"a": 1}})["id"].(string)
	zero := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": m1, "estimated_units": 5})["id"].(string)
	multi := a.reserve(map[string]any{"customer_id": id, "items": reservationItems(m1, 3, m2, 10)})["id"].(string)
	released := a.reserve(map[string]any{"customer_id": id, "billable_metric_key": m2, "estimated_units": 2})["id"].(string)

	ctx := context.Background()
	var rows int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM reservations`).Scan(&rows); err != nil || rows != 0 {
		t.Fatalf("Postgres holds %d reservations (%v) with the persister off", rows, err)
	}
	cases := []struct {
		name, path string
		body       any
		status     int
		// want: members of the answer (problem type for a 4xx)
		want map[string]any
	}{
		{"commit with metadata", single + "/commit", map[string]any{"actual_units": 20, "metadata": map[string]any{"b": 2}}, 200,
			map[string]any{"status": "committed", "actual_cost": 200, "released": 300}},
		{"commit zero units", zero + "/commit", map[string]any{"actual_units": 0}, 200,
			map[string]any{"status": "committed", "actual_cost": 0, "released": 50}},
		{"commit items", multi + "/commit", map[string]any{"items": []any{
			map[string]any{"billable_metric_key": m1, "actual_units": 5}, map[string]any{"billable_metric_key": m2, "actual_units": 0}}}, 200,
			map[string]any{"status": "committed", "actual_cost": 50, "released": 100}},
		{"release", released + "/release", nil, 200, map[string]any{"status": "released", "released": 14}},
		{"commit twice", single + "/commit", map[string]any{"actual_units": 1}, 409, map[string]any{"type": "conflict"}},
		{"release committed", zero + "/release", nil, 409, map[string]any{"type": "conflict"}},
	}
	for _, tc := range cases {
		start := time.Now()
		r := a.post("/v1/reservations/"+tc.path, tc.body)
		if took := time.Since(start); took > time.Second {
			t.Errorf("%s: took %v: it waited for Postgres", tc.name, took)
		}
		if tc.status != 200 {
			checkProblem(t, r, tc.status, tc.want["type"].(string), "", tc.name)
			continue
		}
		if !checkStatus(t, r, tc.status, tc.name) {
			continue
		}
		for k, v := range tc.want {
			if n, ok := v.(int); ok && Int(t, r.Body[k]) != int64(n) || !ok && r.Body[k] != v {
				t.Errorf("%s: %s %v, want %v; body %s", tc.name, k, r.Body[k], v, r.Raw)
			}
		}
	}

	s.App.Start()
	s.Drain()
	for _, h := range []struct {
		id, status string
		cost       any
		meta       string
	}{{single, "committed", 200, `{"a":1,"b":2}`}, {zero, "committed", 0, `{}`}, {multi, "committed", 50, `{}`},
		{released, "released", nil, `{}`}} {
		g := a.get("/v1/reservations/" + h.id)
		if !checkStatus(t, g, 200, "get "+h.id) {
			continue
		}
		if g.Body["status"] != h.status || mustJSON(g.Body["metadata"]) != h.meta ||
			(h.cost == nil) != (g.Body["actual_cost"] == nil) || (h.cost != nil && Int(t, g.Body["actual_cost"]) != int64(h.cost.(int))) {
			t.Errorf("persisted hold %s: %s", h.id, g.Raw)
		}
	}
	if c := a.credits(id); Int(t, c["balance"]) != 750 || Int(t, c["reserved_balance"]) != 0 {
		t.Errorf("account after the reservations: %v", c)
	}
}
