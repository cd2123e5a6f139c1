package persist

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestListTenantsPages checks newest-first order and that the cursor walks
// every tenant exactly once.
func TestListTenantsPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 5
	for range n {
		b.tenant(t)
		time.Sleep(2 * time.Millisecond) // distinct created_at (millisecond precision)
	}
	seen := map[uuid.UUID]bool{}
	var last time.Time
	cursor := ""
	for pages := 0; ; pages++ {
		page, err := b.store.TenantsNewestFirst(b.ctx, cursor, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range page.Data {
			if seen[tn.ID] {
				t.Fatalf("tenant %s listed twice", tn.ID)
			}
			if !last.IsZero() && tn.CreatedAt.After(last) {
				t.Fatalf("not newest first: %v after %v", tn.CreatedAt, last)
			}
			seen[tn.ID], last = true, tn.CreatedAt
			if tn.Name != "acme" || tn.DefaultOveragePolicy != engine.OveragePolicyBlock {
				t.Fatalf("tenant = %+v", tn)
			}
		}
		if !page.HasMore {
			break
		}
		cursor = page.NextCursor
		if pages > n {
			t.Fatal("paging does not end")
		}
	}
	// The database is the test's own: exactly its tenants.
	if len(seen) != n {
		t.Fatalf("listed %d tenants, want %d", len(seen), n)
	}
	if _, err := b.store.TenantsNewestFirst(b.ctx, "not-a-cursor", 2); err == nil {
		t.Error("a bad cursor was accepted")
	}
}

// TestPendingWebhookEvents counts pending and failed events, never past limit.
func TestPendingWebhookEvents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	for i := range 3 {
		e := engine.NewEvent(uuid.New(), engine.EventTestPing, live.TenantID, live.Environment, nil, nil, now.Add(time.Duration(i)*time.Millisecond), "k", engine.PingData{Message: "ping"})
		if err := b.store.InsertEvent(b.ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ limit, want int }{{10, 3}, {2, 2}} {
		n, err := b.store.PendingWebhookEvents(b.ctx, tc.limit)
		if err != nil || n != tc.want {
			t.Errorf("PendingWebhookEvents(%d) = %d, %v; want %d", tc.limit, n, err, tc.want)
		}
	}
}
