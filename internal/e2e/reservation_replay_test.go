package e2e

import (
	"bytes"
	"context"
	"testing"

	"github.com/creditd/creditd/internal/app"
)

// TestReservationReplayFromPostgres (invariant 4; docs/decisions.md
// "Reservations keep no operations row (issue 26)"): every shape of a
// reservation's operations answers a retry byte for byte once Redis has
// forgotten its op key and its HTTP record, from whichever record Postgres
// keeps: a reserve (with metadata holding the head's separator, and
// without), a partial commit, a final commit merging metadata after it, a
// commit of 0 units, a commit past the reservation under allow (overage),
// a release after a partial commit, an extend, and a multi-metric reserve,
// commit and release. The single-metric reserve, commit and release keep
// no operations row (their ledger entry carries an op head); an extend and
// the multi-metric reserve and commit keep theirs. With full records (the
// release before, CREDITD_FULL_RECORDS) every one keeps its row and answers
// the same way.
func TestReservationReplayFromPostgres(t *testing.T) {
	t.Run("lean", func(t *testing.T) { reservationReplay(t, false) })
	t.Run("full records", func(t *testing.T) { reservationReplay(t, true) })
}

// reservationReplay is TestReservationReplayFromPostgres on a stack writing
// full records or not.
func reservationReplay(t *testing.T, full bool) {
	s := NewStack(t, WithConfig(func(c *app.Config) { c.FullRecords = full }))
	tn := s.NewTenant(uniq("resreplay"))
	a := s.as(t, tn.Live)
	metric, other := a.perUnit(10), a.perUnit(3)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 100_000})
	allow := str(t, a.createCustomer(map[string]any{"external_id": uniq("allow"), "overage_policy": "allow"})["id"], "id")
	a.grant(allow, map[string]any{"credits": 100})

	type call struct {
		name, path string
		body       map[string]any
		status     int
		lean       bool // recorded on its ledger entry, no operations row
	}
	reserve := func(name string, body map[string]any, lean bool) call {
		return call{name: name, path: "/v1/reservations", body: body, status: 201, lean: lean}
	}
	settle := func(name, reservation, verb string, body map[string]any, lean bool) call {
		return call{name: name, path: "/v1/reservations/" + reservation + "/" + verb, body: body, status: 200, lean: lean}
	}
	keys := map[string]string{}
	firsts := map[string]Response{}
	var done []call
	run := func(c call) Response {
		t.Helper()
		keys[c.name] = idemKey()
		r := a.do("POST", c.path, keys[c.name], c.body)
		wantStatus(t, r, c.status, c.name)
		firsts[c.name] = r
		done = append(done, c)
		return r
	}
	single := func(units int64, meta map[string]any) map[string]any {
		b := map[string]any{"customer_id": id, "billable_metric_key": metric, "estimated_units": units, "ttl_seconds": 3600}
		if meta != nil {
			b["metadata"] = meta
		}
		return b
	}

	withMeta := str(t, run(reserve("reserve with metadata", single(40, map[string]any{"job": "a|b", "n": 7}), true)).Body["id"], "id")
	plain := str(t, run(reserve("reserve", single(30, nil), true)).Body["id"], "id")
	zero := str(t, run(reserve("reserve to commit 0", single(5, nil), true)).Body["id"], "id")
	released := str(t, run(reserve("reserve to release", single(20, nil), true)).Body["id"], "id")
	extended := str(t, run(reserve("reserve to extend", single(10, nil), true)).Body["id"], "id")
	over := str(t, run(reserve("reserve under allow", map[string]any{"customer_id": allow, "billable_metric_key": metric,
		"estimated_units": 5, "ttl_seconds": 3600}, true)).Body["id"], "id")
	multi := str(t, run(reserve("multi-metric reserve", map[string]any{"customer_id": id, "ttl_seconds": 3600,
		"items": []map[string]any{{"billable_metric_key": metric, "estimated_units": 2}, {"billable_metric_key": other, "estimated_units": 4}}},
		false)).Body["id"], "id")
	multiReleased := str(t, run(reserve("multi-metric reserve to release", map[string]any{"customer_id": id, "ttl_seconds": 3600,
		"items": []map[string]any{{"billable_metric_key": metric, "estimated_units": 1}, {"billable_metric_key": other, "estimated_units": 1}}},
		false)).Body["id"], "id")

	run(settle("partial commit", withMeta, "commit", map[string]any{"actual_units": 12, "final": false}, true))
	run(settle("final commit merging metadata", withMeta, "commit", map[string]any{"actual_units": 9, "metadata": map[string]any{"done": true}}, true))
	run(settle("commit", plain, "commit", map[string]any{"actual_units": 31}, true))
	run(settle("commit of 0 units", zero, "commit", map[string]any{"actual_units": 0}, true))
	run(settle("partial commit before a release", released, "commit", map[string]any{"actual_units": 3, "final": false}, true))
	run(settle("release", released, "release", map[string]any{}, true))
	run(settle("extend", extended, "extend", map[string]any{"additional_units": 5, "ttl_seconds": 7200}, false))
	run(settle("commit past the reservation with overage", over, "commit", map[string]any{"actual_units": 50}, true))
	run(settle("multi-metric commit", multi, "commit", map[string]any{"items": []map[string]any{
		{"billable_metric_key": metric, "actual_units": 3}, {"billable_metric_key": other, "actual_units": 1}}}, false))
	run(settle("multi-metric release", multiReleased, "release", map[string]any{}, true))
	if Int(t, firsts["commit past the reservation with overage"].Body["actual_cost"]) != 500 {
		t.Fatalf("the overage commit: %s", firsts["commit past the reservation with overage"].Raw)
	}
	s.Drain()

	for _, c := range done {
		var ops, heads int
		if err := s.Pool.QueryRow(context.Background(), `SELECT
			(SELECT count(*) FROM operations WHERE idempotency_key = $1),
			(SELECT count(*) FROM ledger_entries WHERE idempotency_key = $1 AND op_head IS NOT NULL)`,
			keys[c.name]).Scan(&ops, &heads); err != nil {
			t.Fatal(err)
		}
		if want := map[bool][2]int{true: {0, 1}, false: {1, 0}}[c.lean && !full]; ops != want[0] || heads != want[1] {
			t.Errorf("%s: %d operations rows and %d op heads, want %d and %d", c.name, ops, heads, want[0], want[1])
		}
	}

	balances := map[string]int64{id: a.balance(id), allow: a.balance(allow)}
	// The op keys and the HTTP records are gone: Postgres answers.
	dropKeys(t, s, redisKeys(t, s, ":p*}:op:*"))
	dropKeys(t, s, redisKeys(t, s, ":i:*"))
	for _, c := range done {
		again := a.do("POST", c.path, keys[c.name], c.body)
		if again.Status != c.status || !bytes.Equal(again.Raw, firsts[c.name].Raw) {
			t.Errorf("%s, from Postgres: %d %s\nwant %d %s", c.name, again.Status, again.Raw, c.status, firsts[c.name].Raw)
		}
	}
	s.Drain()
	for cust, b := range balances {
		if got := a.balance(cust); got != b {
			t.Errorf("customer %s: balance %d after the retries, want %d (no second effect)", cust, got, b)
		}
	}
	if n := len(redisKeys(t, s, ":p*}:op:*")); n != 0 {
		t.Errorf("%d op keys written by the retries", n)
	}
}
