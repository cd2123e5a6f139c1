package persist

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// subscription builds a live record of customer c on variant v.
func subscription(s engine.Scope, c uuid.UUID, v engine.PlanVariant, at time.Time) engine.SubscriptionRecord {
	end := at.AddDate(0, 1, 0)
	return engine.SubscriptionRecord{
		Subscription: engine.Subscription{ID: uuid.Must(uuid.NewV7()), TenantID: s.TenantID, Environment: s.Environment,
			CustomerID: c, PlanID: v.PlanID, PlanVariantID: v.ID, Status: engine.SubscriptionActive,
			BillingMode: v.BillingMode, CurrentPeriodStart: at, CurrentPeriodEnd: &end, Metadata: engine.Metadata{},
			CreatedAt: at, UpdatedAt: at},
		ActivatedAt: &at,
		Grants:      []engine.GrantState{{PlanGrantID: uuid.New(), Anchor: at, Fired: 1, LastFiredAt: &at, BlockIDs: []uuid.UUID{uuid.New()}}},
	}
}

func TestSubscriptionStore(t *testing.T) {
	b := setup(t)
	live, sandbox := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	p := plan(live, "pro", false, now)
	if err := b.store.CreatePlan(b.ctx, p); err != nil {
		t.Fatal(err)
	}
	v := variant(live, p.ID, now)
	if err := b.store.CreateVariant(b.ctx, v); err != nil {
		t.Fatal(err)
	}
	c := newCustomer(live, "acct_sub", now)
	if err := b.store.CreateCustomer(b.ctx, c); err != nil {
		t.Fatal(err)
	}

	first := subscription(live, c.ID, v, now)
	if err := b.store.CreateSubscription(b.ctx, first); err != nil {
		t.Fatalf("CreateSubscription: %v", err)
	}
	second := subscription(live, c.ID, v, now.Add(time.Second))
	if err := b.store.CreateSubscription(b.ctx, second); !errors.Is(err, engine.ErrLiveSubscription) {
		t.Fatalf("second live subscription: %v, want ErrLiveSubscription", err)
	}

	got, err := b.store.GetRecord(b.ctx, live, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != engine.SubscriptionActive || len(got.Grants) != 1 || got.Grants[0].BlockIDs[0] != first.Grants[0].BlockIDs[0] ||
		!got.CurrentPeriodEnd.Equal(*first.CurrentPeriodEnd) || !got.ActivatedAt.Equal(now) {
		t.Fatalf("GetRecord = %+v", got)
	}
	if _, err := b.store.GetSubscription(b.ctx, sandbox, first.ID); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("other environment: %v, want ErrNotFound", err)
	}
	if sub, err := b.store.LiveSubscription(b.ctx, engine.CustomerKey{TenantID: live.TenantID, Environment: live.Environment, CustomerID: c.ID}); err != nil || sub.ID != first.ID {
		t.Fatalf("LiveSubscription = %v, %v", sub.ID, err)
	}

	// A change error writes nothing.
	boom := errors.New("boom")
	if _, err := b.store.UpdateSubscription(b.ctx, live, first.ID, func(r *engine.SubscriptionRecord) error {
		r.Status = engine.SubscriptionPaused
		return boom
	}); !errors.Is(err, boom) {
		t.Fatalf("UpdateSubscription error = %v", err)
	}
	// Cancel the first; the second may then be created.
	if _, err := b.store.UpdateSubscription(b.ctx, live, first.ID, func(r *engine.SubscriptionRecord) error {
		r.Status, r.CanceledAt, r.UpdatedAt = engine.SubscriptionCanceled, &now, now
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.LiveSubscription(b.ctx, engine.CustomerKey{TenantID: live.TenantID, Environment: live.Environment, CustomerID: c.ID}); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("LiveSubscription after cancel: %v", err)
	}
	if err := b.store.CreateSubscription(b.ctx, second); err != nil {
		t.Fatalf("create after cancel: %v", err)
	}

	page, err := b.store.ListSubscriptions(b.ctx, live, c.ID, "", 1)
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != second.ID || !page.HasMore {
		t.Fatalf("page 1 = %+v, %v", page, err)
	}
	page, err = b.store.ListSubscriptions(b.ctx, live, c.ID, page.NextCursor, 1)
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != first.ID || page.HasMore {
		t.Fatalf("page 2 = %+v, %v", page, err)
	}
}

// TestRunDueSkipsLocked: concurrent RunDue callers each run every due
// subscription exactly once.
func TestRunDueSkipsLocked(t *testing.T) {
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	p := plan(live, "pro", false, now)
	if err := b.store.CreatePlan(b.ctx, p); err != nil {
		t.Fatal(err)
	}
	v := variant(live, p.ID, now)
	if err := b.store.CreateVariant(b.ctx, v); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := 0; i < n; i++ {
		c := newCustomer(live, "acct_"+uuid.NewString(), now)
		if err := b.store.CreateCustomer(b.ctx, c); err != nil {
			t.Fatal(err)
		}
		r := subscription(live, c.ID, v, now)
		due := now.Add(-time.Minute)
		r.NextActionAt = &due
		if err := b.store.CreateSubscription(b.ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	runs := map[uuid.UUID]int{}
	var total atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := b.store.RunDue(b.ctx, now, 100, func(_ context.Context, r *engine.SubscriptionRecord) error {
				mu.Lock()
				runs[r.ID]++
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
				r.NextActionAt = nil
				return nil
			})
			if err != nil {
				t.Error(err)
			}
			total.Add(int64(k))
		}()
	}
	wg.Wait()
	if total.Load() != n || len(runs) != n {
		t.Fatalf("ran %d, distinct %d, want %d", total.Load(), len(runs), n)
	}
	for id, k := range runs {
		if k != 1 {
			t.Fatalf("subscription %s ran %d times", id, k)
		}
	}
	// A failing change is rolled back and not retried by the same call.
	c := newCustomer(live, "acct_fail", now)
	if err := b.store.CreateCustomer(b.ctx, c); err != nil {
		t.Fatal(err)
	}
	r := subscription(live, c.ID, v, now)
	r.NextActionAt = &now
	if err := b.store.CreateSubscription(b.ctx, r); err != nil {
		t.Fatal(err)
	}
	k, err := b.store.RunDue(b.ctx, now, 10, func(context.Context, *engine.SubscriptionRecord) error { return errors.New("no") })
	if err != nil || k != 1 {
		t.Fatalf("RunDue failing = %d, %v", k, err)
	}
	got, _ := b.store.GetRecord(b.ctx, live, r.ID)
	if got.NextActionAt == nil {
		t.Fatal("a failed change was written")
	}
}
