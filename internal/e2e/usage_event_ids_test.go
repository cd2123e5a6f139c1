package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
	"github.com/creditd/creditd/internal/testenv"
	"github.com/creditd/creditd/lua"
)

// usageEvent is one usage event of id for customer cust: units of metric.
func usageEvent(id, cust, metric string, units int64) map[string]any {
	return map[string]any{"event_id": id, "customer_id": cust, "billable_metric_key": metric, "units": units}
}

// sendUsage posts events as one batch and returns the first result.
func (a api) sendUsage(events ...any) map[string]any {
	a.t.Helper()
	r := a.post("/v1/usage", map[string]any{"events": events})
	wantStatus(a.t, r, 200, "usage")
	return obj(a.t, arr(a.t, r.Body["results"], "results")[0], "result")
}

const usedForAnother = "event_id was already used for a different event"

// TestUsageEventIDOtherCustomerBeforeCommit (issue 26, docs/spec/addendum.md
// §7): an event_id is the event's idempotency per tenant, forever. Sent for
// customer A, then at once for customer B, before the persister has
// committed the first (the persister is held off here), B's event fails as
// a reuse and B is not charged; re-sent for A it is a duplicate with the
// original numbers. Protects invariant 4 (a key applies once) across
// customers, with Postgres behind.
func TestUsageEventIDOtherCustomerBeforeCommit(t *testing.T) {
	t.Parallel()
	s := NewStack(t, WithoutStart())
	tn := s.NewTenant(uniq("usage-ids"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	custA, _ := a.newCustomer()
	custB, _ := a.newCustomer()
	a.grant(custA, map[string]any{"credits": 1_000})
	a.grant(custB, map[string]any{"credits": 1_000})
	ev := uniq("ev")

	first := a.sendUsage(usageEvent(ev, custA, metric, 3))
	if first["status"] != "charged" || Int(t, first["charged"]) != 30 {
		t.Fatalf("first send for A: %v", first)
	}
	other := a.sendUsage(usageEvent(ev, custB, metric, 3))
	if other["status"] != "failed" || other["error"] != usedForAnother || other["transaction_id"] != nil {
		t.Errorf("the same event_id for B: %v, want failed %q", other, usedForAnother)
	}
	if b := a.balance(custB); b != 1_000 {
		t.Errorf("B's balance %d, want 1000 (nothing charged)", b)
	}
	again := a.sendUsage(usageEvent(ev, custA, metric, 3))
	if again["status"] != "duplicate" || again["transaction_id"] != first["transaction_id"] || Int(t, again["charged"]) != 30 {
		t.Errorf("re-sent for A: %v, want a duplicate of %v", again, first)
	}
	if b := a.balance(custA); b != 970 {
		t.Errorf("A's balance %d, want 970", b)
	}

	// The persister commits the charge and shortens the claim to its
	// grace; once the claim has lapsed (deleted here) the id is still A's.
	s.App.Start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.App.Persister.Drain(ctx, 30*time.Second); err != nil {
		t.Fatalf("drain: %v", err)
	}
	claim := lua.NewStore(s.Redis, s.Prefix).UsageClaimKey(uuid.MustParse(tn.ID), engine.EnvironmentLive, ev)
	waitClaimShortened(t, s, claim)
	if err := s.Redis.Del(ctx, claim).Err(); err != nil {
		t.Fatal(err)
	}
	if r := a.sendUsage(usageEvent(ev, custB, metric, 3)); r["status"] != "failed" || r["error"] != usedForAnother {
		t.Errorf("the committed event_id for B after its claim lapsed: %v, want failed %q", r, usedForAnother)
	}
	if r := a.sendUsage(usageEvent(ev, custA, metric, 3)); r["status"] != "duplicate" || r["transaction_id"] != first["transaction_id"] {
		t.Errorf("the committed event re-sent for A after its claim lapsed: %v, want a duplicate of %v", r, first)
	}
	if ba, bb := a.balance(custA), a.balance(custB); ba != 970 || bb != 1_000 {
		t.Errorf("balances A %d, B %d, want 970 and 1000", ba, bb)
	}
}

// TestUsageEventIDRefusedFreesTheID: an event refused (credit short under
// block) charges nothing, so its event_id is not used: the same id sent
// next for another customer with credit is charged.
func TestUsageEventIDRefusedFreesTheID(t *testing.T) {
	t.Parallel()
	s := NewStack(t, WithoutStart())
	tn := s.NewTenant(uniq("usage-refused"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	custA, _ := a.newCustomer()
	custB, _ := a.newCustomer()
	a.grant(custB, map[string]any{"credits": 1_000})
	ev := uniq("ev")
	if r := a.sendUsage(usageEvent(ev, custA, metric, 3)); r["status"] != "refused" {
		t.Fatalf("A without credit: %v, want refused", r)
	}
	if r := a.sendUsage(usageEvent(ev, custB, metric, 3)); r["status"] != "charged" || Int(t, r["charged"]) != 30 {
		t.Errorf("the refused event_id for B: %v, want charged 30", r)
	}
	if b := a.balance(custB); b != 970 {
		t.Errorf("B's balance %d, want 970", b)
	}
}

// TestUsageEventIDConcurrentCustomers: batches sent at once, each with the
// same event_id for a different customer: exactly one is charged, every
// other fails as a reuse, and the customers' balances say the same.
func TestUsageEventIDConcurrentCustomers(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	tn := s.NewTenant(uniq("usage-race"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	const n = 6
	custs := make([]string, n)
	for i := range custs {
		custs[i], _ = a.newCustomer()
		a.grant(custs[i], map[string]any{"credits": 1_000})
	}
	for round := range 3 {
		ev := uniq("ev")
		results := make([]map[string]any, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := s.Do("POST", "/v1/usage", tn.Live, idemKey(), map[string]any{"events": []any{usageEvent(ev, custs[i], metric, 1)}})
				if r.Status != 200 {
					t.Errorf("racer %d: %d %s", i, r.Status, r.Raw)
					return
				}
				results[i] = obj(t, arr(t, r.Body["results"], "results")[0], "result")
			}()
		}
		wg.Wait()
		charged := 0
		for i, r := range results {
			switch {
			case r == nil:
			case r["status"] == "charged":
				charged++
			case r["status"] != "failed" || r["error"] != usedForAnother:
				t.Errorf("round %d racer %d: %v", round, i, r)
			}
		}
		if charged != 1 {
			t.Errorf("round %d: %d of %d customers charged for one event_id, want exactly 1: %v", round, charged, n, results)
		}
	}
	spent := int64(0)
	for _, c := range custs {
		spent += 1_000 - a.balance(c)
	}
	if spent != 3*10 {
		t.Errorf("spent %d over the customers, want %d (one event of 10 per round)", spent, 3*10)
	}
}

// TestUsageEventIDPostgresDown (issue 26): with Postgres stopped, a usage
// batch asks nothing of it for ids the tenant index clears: a new id is
// charged; an id committed for customer A whose claim has lapsed, re-sent
// for customer B, may have been used, so it fails alone with the
// retryable unavailable text and B is not charged (never a reuse charged,
// never a 500).
func TestUsageEventIDPostgresDown(t *testing.T) {
	t.Parallel()
	pg := testenv.StartPostgres(t)
	s := NewStack(t, SingleNode(), WithDatabase(pg.URL()))
	tn := s.NewTenant(uniq("usage-pg-down"))
	a := s.as(t, tn.Live)
	metric := a.perUnit(10)
	custA, _ := a.newCustomer()
	custB, _ := a.newCustomer()
	a.grant(custA, map[string]any{"credits": 1_000})
	a.grant(custB, map[string]any{"credits": 1_000})
	ev := uniq("ev")
	if r := a.sendUsage(usageEvent(ev, custA, metric, 3)); r["status"] != "charged" {
		t.Fatalf("first send for A: %v", r)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.App.Persister.Drain(ctx, 30*time.Second); err != nil {
		t.Fatalf("drain: %v", err)
	}
	claim := lua.NewStore(s.Redis, s.Prefix).UsageClaimKey(uuid.MustParse(tn.ID), engine.EnvironmentLive, ev)
	waitClaimShortened(t, s, claim)
	if err := s.Redis.Del(ctx, claim).Err(); err != nil {
		t.Fatal(err)
	}
	// The seeder marks the usage filters at start; wait for it. B's
	// caches (customer, subscription facts) are warmed by a first event:
	// a customer no cache holds cannot be resolved without Postgres.
	waitUsageSeeded(t, s)
	if r := a.sendUsage(usageEvent(uniq("ev"), custB, metric, 1)); r["status"] != "charged" {
		t.Fatalf("warming B: %v", r)
	}

	pg.Stop()
	r := s.Do("POST", "/v1/usage", tn.Live, idemKey(), map[string]any{"events": []any{
		usageEvent(ev, custB, metric, 3), usageEvent(uniq("ev"), custB, metric, 2)}})
	wantStatus(t, r, 200, "usage with Postgres down")
	res := arr(t, r.Body["results"], "results")
	reused, fresh := obj(t, res[0], "result"), obj(t, res[1], "result")
	if msg, _ := reused["error"].(string); reused["status"] != "failed" || !strings.Contains(msg, "retry") {
		t.Errorf("a committed id re-sent for B with Postgres down: %v, want failed, retryable", reused)
	}
	if fresh["status"] != "charged" || Int(t, fresh["charged"]) != 20 {
		t.Errorf("a new id with Postgres down: %v, want charged 20", fresh)
	}
	pg.Start()
	// A client retries the retryable answer, as its text says: the first
	// look-up after the restart may still meet the pool's dead connections.
	var back map[string]any
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		back = a.sendUsage(usageEvent(ev, custB, metric, 3))
		if back["error"] != engine.ErrAppliedUnknown.Detail || time.Now().After(deadline) {
			break
		}
	}
	if back["status"] != "failed" || back["error"] != usedForAnother {
		t.Errorf("the committed id for B once Postgres is back: %v, want failed %q", back, usedForAnother)
	}
	if b := a.balance(custB); b != 970 {
		t.Errorf("B's balance %d, want 970 (its two new events only)", b)
	}
}

// waitClaimShortened waits until the persister has shortened claim to its
// grace (idempotency.UsageClaimGrace).
func waitClaimShortened(t *testing.T, s *Stack, claim string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ttl, err := s.Redis.PTTL(context.Background(), claim).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl > 0 && ttl <= idempotency.UsageClaimGrace {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the committed event's claim lives %v, want at most %v", ttl, idempotency.UsageClaimGrace)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitUsageSeeded waits until the seeder has marked every seen filter,
// the usage index's included.
func waitUsageSeeded(t *testing.T, s *Stack) {
	t.Helper()
	store := lua.NewStore(s.Redis, s.Prefix)
	deadline := time.Now().Add(20 * time.Second)
	for {
		marks, err := store.SeenSeeded(context.Background())
		ok := err == nil
		for _, m := range marks {
			ok = ok && !m.IsZero()
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the seen filters are not seeded after 20 s: %v %v", marks, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
