package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestWebhooksSurviveKill9: with events mid-retry (failed, waiting for their
// next attempt) and others just born (pending, some perhaps still in the
// Redis outbox or mid-attempt), creditd is killed with -9 and restarted on
// the same Redis and Postgres; once the receiver recovers every event is
// delivered at least once and none is lost. The binary runs on the wall
// clock, so the test stands in for the passing of time by making the retry
// times and leases due in Postgres.
func TestWebhooksSurviveKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test")
	}
	rig := newCrashRig(t)
	client := loadClient()
	base := rig.proc.URL
	rcv := newHookReceiver(t)
	rcv.setStatus(500)
	put := Call(t, client, base, "PUT", "/admin/v1/tenants/"+rig.tenant.ID+"/webhook", map[string]any{"url": rcv.srv.URL},
		"Authorization", "Bearer "+AdminToken)
	if put.Status != 200 {
		t.Fatalf("PUT webhook: %d %s", put.Status, put.Raw)
	}
	cust := createCustomer(t, client, base, rig.tenant.Live, uniq("kill"))
	grant := func(i int) {
		r := Call(t, client, base, "POST", "/v1/customers/"+cust+"/credits/grant",
			map[string]any{"credits": 10 + i, "source": "promotional", "reason": "r"},
			"X-API-Key", rig.tenant.Live, "Idempotency-Key", fmt.Sprintf("kill9-%s-%d", cust, i))
		if r.Status != 201 {
			t.Fatalf("grant %d: %d %s", i, r.Status, r.Raw)
		}
	}
	for i := 0; i < 20; i++ {
		grant(i)
	}
	ctx := context.Background()
	count := func(q string) int {
		var n int
		if err := rig.pool.QueryRow(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitCount := func(what, q string, want int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for count(q) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d, want %d\n%s", what, count(q), want, rig.proc.Logs())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitCount("events mid-retry", `SELECT count(*) FROM webhook_events WHERE status = 'failed' AND attempts >= 1`, 20)
	// Ten more, killed right after: pending, mid-attempt or still in the outbox.
	for i := 20; i < 30; i++ {
		grant(i)
	}
	rig.proc.Kill()
	rcv.setStatus(200)
	rig.proc.Restart()
	waitCount("events written after the restart", `SELECT count(*) FROM webhook_events`, 30)
	// Time passes: the retry delays and any lease of the dead process lapse.
	deadline := time.Now().Add(60 * time.Second)
	for count(`SELECT count(*) FROM webhook_events WHERE status = 'delivered'`) != 30 {
		if time.Now().After(deadline) {
			t.Fatalf("delivered %d of 30\n%s", count(`SELECT count(*) FROM webhook_events WHERE status = 'delivered'`), rig.proc.Logs())
		}
		if _, err := rig.pool.Exec(ctx, `UPDATE webhook_events SET next_retry_at = now(), locked_until = NULL
			WHERE status IN ('pending', 'failed') AND (next_retry_at > now() OR locked_until > now())`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	got := map[string]bool{}
	for _, h := range rcv.hooks() {
		got[h.Headers["webhook-id"]] = true
	}
	rows, err := rig.pool.Query(ctx, `SELECT id::text FROM webhook_events`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		if !got[id] {
			t.Errorf("event %s never reached the receiver", id)
		}
	}
}
