package persist

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestWebhookBacklog: the backlog counts the undelivered events of tenants
// with a webhook URL, and the due ones among them; events of a tenant
// without a URL wait outside it.
func TestWebhookBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, _ := b.tenant(t)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for range 2 {
		e := engine.NewEvent(uuid.New(), engine.EventTestPing, a.TenantID, a.Environment, nil, nil, now, "k", engine.PingData{Message: "ping"})
		if err := b.store.InsertEvent(b.ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	check := func(at time.Time, waiting, due int64) {
		t.Helper()
		w, d, err := b.store.WebhookBacklog(b.ctx, at)
		if err != nil || w != waiting || d != due {
			t.Fatalf("backlog at %s = %d waiting, %d due (%v); want %d, %d", at, w, d, err, waiting, due)
		}
	}
	check(now, 0, 0)
	if _, err := b.pool.Exec(b.ctx, `UPDATE tenants SET webhook_url = 'http://127.0.0.1:1/h', webhook_secret = 'whsec_c2VjcmV0' WHERE id = $1`, a.TenantID); err != nil {
		t.Fatal(err)
	}
	check(now, 2, 2)
	check(now.Add(-time.Hour), 2, 0)
	if _, err := b.pool.Exec(b.ctx, `UPDATE webhook_events SET status = 'delivered' WHERE id = (SELECT id FROM webhook_events LIMIT 1)`); err != nil {
		t.Fatal(err)
	}
	check(now, 1, 1)
	if n, err := b.store.DueSubscriptions(b.ctx, now); err != nil || n != 0 {
		t.Fatalf("due subscriptions on a fresh database: %d %v", n, err)
	}
}
