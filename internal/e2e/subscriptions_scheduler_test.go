package e2e

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/internal/testenv"
	"github.com/creditd/creditd/persist"
)

// TestSchedulerTwoProcessesCatchUp: two creditd processes on the same Redis
// and Postgres, the clock jumped by 10 periods at once: every grant fires
// exactly once per period (a daily plan with a billing_period grant and an
// ISO-duration grant on its own clock), in order.
func TestSchedulerTwoProcessesCatchUp(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := newSettableClock(t0)
	s := NewStack(t, WithClock(clock), WithSchedulerInterval(20*time.Millisecond))
	pool, err := persist.Open(context.Background(), s.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	second := app.New(s.Redis, pool, app.Config{RedisPrefix: s.Prefix, Consumer: "e2e-2", Clock: clock,
		SweepInterval: 50 * time.Millisecond, SchedulerInterval: 20 * time.Millisecond,
		ReplicaAckTimeout: testenv.ReplicaAckTimeout}, zerolog.New(io.Discard))
	second.Start()
	t.Cleanup(func() { second.Stop(0) })

	tn := s.NewTenant(uniq("sched"))
	a := s.as(t, tn.Live)
	plan := str(t, a.newPlan(map[string]any{"name": "Daily"})["id"], "plan")
	vid := str(t, a.newVariant(plan, map[string]any{"billing_cycle": "daily", "billing_mode": "postpaid"})["id"], "variant")
	a.newGrant(plan, vid, map[string]any{"credits": 1000, "grant_interval": "billing_period", "grant_type": "recurring"})
	a.newGrant(plan, vid, map[string]any{"credits": 7, "grant_interval": "PT12H", "grant_type": "recurring"})

	const subs = 5
	custs := make([]string, subs)
	ids := make([]string, subs)
	for i := range custs {
		custs[i], _ = a.newCustomer()
		r := a.post("/v1/subscriptions", map[string]any{"customer_id": custs[i], "plan_variant_id": vid})
		wantStatus(t, r, 201, "create")
		ids[i] = str(t, r.Body["id"], "id")
	}
	for _, c := range custs {
		if b := a.balance(c); b != 1007 {
			t.Fatalf("balance at start %d, want 1007", b)
		}
	}

	// Ten periods later (plus a little): both processes race for the work.
	clock.Set(t0.AddDate(0, 0, 10).Add(time.Minute))
	for _, id := range ids {
		eventually(t, "ten renewals", func() bool {
			return mustTime(t, a.subscription(id)["current_period_start"]).Equal(t0.AddDate(0, 0, 10))
		})
	}
	// Let any straggling duplicate show itself before counting.
	time.Sleep(300 * time.Millisecond)
	for _, c := range custs {
		// 11 period grants (activation + 10 renewals), 21 twelve-hour grants (0h .. 240h).
		if b := a.balance(c); b != 11*1000+21*7 {
			t.Errorf("customer %s balance %d, want %d", c, b, 11*1000+21*7)
		}
		if n := len(a.subEvents("subscription.renewed", c)); n != 10 {
			t.Errorf("customer %s: %d subscription.renewed, want 10", c, n)
		}
	}
	s.Drain()
	for _, c := range custs {
		grants := a.history(c, "?type=plan_grant&limit=100")
		if len(grants) != 32 {
			t.Errorf("customer %s: %d plan_grant entries, want 32", c, len(grants))
		}
		seen := map[string]bool{}
		for _, g := range grants {
			id := str(t, obj(t, g, "entry")["id"], "entry id")
			if seen[id] {
				t.Errorf("duplicate entry %s", id)
			}
			seen[id] = true
		}
	}
}
