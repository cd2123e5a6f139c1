package e2e

import (
	"context"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/testenv"
)

// TestPostgresOutageAnswersNo500 (issue 25): with Postgres stopped (as
// `pg_ctl stop -m immediate` does) under checks, consumes and reads of
// customers already in Redis, no answer is a 500: each is a 2xx, or a 503
// problem with Retry-After. When Postgres is back the loops resume by
// themselves, money calls succeed again, and every consume that was
// acknowledged (during the outage or after) is in the ledger exactly once.
// Usage batches are charged meanwhile too (their event ids checked by the
// seen filter), each charged event exactly once, and an event re-sent
// after the outage is a duplicate.
func TestPostgresOutageAnswersNo500(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	s := NewStack(t, SingleNode(), WithDatabase(pg.URL()))
	tn := s.NewTenant(uniq("pg-outage"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	metric := a.perUnit(1)
	a.grant(id, map[string]any{"credits": 1_000_000})
	check := "/v1/entitlements/check?customer_id=" + id + "&billable_metric_key=" + metric + "&units=1"
	wantStatus(t, a.get(check), 200, "check before the outage")

	acked := map[string]bool{}
	n := 0
	consume := func() Response {
		n++
		key := "pgo-" + strconv.Itoa(n)
		r := a.do("POST", "/v1/entitlements/consume", key,
			map[string]any{"customer_id": id, "billable_metric_key": metric, "units": 1})
		if r.Status == 200 {
			acked[key] = true
		}
		return r
	}
	wantStatus(t, consume(), 200, "consume before the outage")
	charged := map[string]map[string]any{} // usage event id -> its event
	u := 0
	usage := func() Response {
		u++
		ev := map[string]any{"event_id": "pgu-" + strconv.Itoa(u), "customer_id": id, "billable_metric_key": metric, "units": 2}
		r := a.do("POST", "/v1/usage", "pgu-batch-"+strconv.Itoa(u), map[string]any{"events": []any{ev}})
		if r.Status == 200 {
			res := obj(t, r.Body["results"].([]any)[0], "result")
			if res["status"] == "charged" {
				charged[ev["event_id"].(string)] = ev
			} else {
				t.Errorf("usage event %s: %v", ev["event_id"], res)
			}
		}
		return r
	}
	wantStatus(t, usage(), 200, "usage before the outage")

	// The seen filters answer "never seen" without Postgres only once the
	// seeder has marked them (it reads Postgres at start); until then a
	// new key or event id asks Postgres, which the outage refuses.
	waitUsageSeeded(t, s)
	pg.Stop()
	counts := map[string]map[int]int{}
	tally := func(what string, r Response) {
		if counts[what] == nil {
			counts[what] = map[int]int{}
		}
		counts[what][r.Status]++
		switch {
		case r.Status >= 200 && r.Status < 300:
		case r.Status == 503:
			if r.Header.Get("Retry-After") == "" || r.Body["type"] != "unavailable" {
				t.Errorf("%s: 503 without Retry-After or problem type: %s %v", what, r.Raw, r.Header)
			}
		default:
			t.Errorf("%s during the outage: %d %s", what, r.Status, r.Raw)
		}
	}
	// Long enough for the key and customer caches' entries to need a
	// refresh, which found Postgres gone.
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); {
		tally("check", a.get(check))
		tally("consume", consume())
		tally("usage", usage())
		tally("history", a.get("/v1/customers/"+id+"/credits/history?limit=5"))
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("answers during the outage: %v", counts)
	if counts["usage"][200] == 0 || counts["usage"][503] > 0 {
		t.Errorf("usage batches during the outage: %v, want every one 200", counts["usage"])
	}

	pg.Start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if r := consume(); r.Status == 200 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("consumes still fail 30 s after Postgres came back: %d %s", r.Status, r.Raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	wantStatus(t, a.get(check), 200, "check after the outage")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.App.Persister.Drain(ctx, 30*time.Second); err != nil {
		t.Fatalf("drain after the outage: %v", err)
	}
	// Every page of the history: with the money path off Postgres an 8 s
	// outage acknowledges hundreds of consumes.
	seen, seenUsage := map[string]int{}, map[string]int{}
	for q := "?type=consumption&limit=100"; ; {
		r := a.get("/v1/customers/" + id + "/credits/history" + q)
		wantStatus(t, r, 200, "history "+q)
		data, more, next := page(t, r)
		for _, e := range data {
			if k, ok := obj(t, e, "entry")["idempotency_key"].(string); ok {
				if ev := strings.TrimPrefix(k, "usage:"); strings.HasPrefix(ev, "pgu-") {
					seenUsage[ev]++
					continue
				}
				seen[k]++
			}
		}
		if !more {
			break
		}
		q = "?type=consumption&limit=100&cursor=" + url.QueryEscape(next.(string))
	}
	for key := range acked {
		if seen[key] != 1 {
			t.Errorf("acknowledged consume %s is in the ledger %d times", key, seen[key])
		}
	}
	for key, c := range seen {
		if !acked[key] {
			t.Errorf("consume %s is in the ledger (%d times) but was never acknowledged", key, c)
		}
	}
	for ev := range charged {
		if seenUsage[ev] != 1 {
			t.Errorf("charged usage event %s is in the ledger %d times", ev, seenUsage[ev])
		}
	}
	for ev, c := range seenUsage {
		if charged[ev] == nil {
			t.Errorf("usage event %s is in the ledger (%d times) but was never charged", ev, c)
		}
	}
	// An event charged during the outage, re-sent: a duplicate, not a charge.
	for _, ev := range charged {
		r := a.do("POST", "/v1/usage", "pgu-resend", map[string]any{"events": []any{ev}})
		wantStatus(t, r, 200, "usage re-sent after the outage")
		if res := obj(t, r.Body["results"].([]any)[0], "result"); res["status"] != "duplicate" {
			t.Errorf("re-sent usage event %s: %v, want duplicate", ev["event_id"], res)
		}
		break
	}
}
