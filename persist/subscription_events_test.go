package persist

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// subscriptionEvent is an event of r's as engine builds them; a bad one
// carries a NUL byte, which Postgres refuses in text, so its insert fails
// the transaction after the row was written.
func subscriptionEvent(r engine.SubscriptionRecord, tag string, bad bool) engine.Event {
	t := engine.EventSubscriptionRenewed
	if bad {
		t = "subscription.\x00"
	}
	customer := r.CustomerID
	return engine.NewEvent(uuid.NewSHA1(uuid.NameSpaceOID, []byte(r.ID.String()+tag)), t, r.TenantID, r.Environment,
		&customer, nil, r.UpdatedAt, "", engine.SubscriptionEventData{SubscriptionID: r.ID, Status: r.Status})
}

// TestSubscriptionEventsShareTheRowTransaction (issue 12 item 5): a
// subscription write and the events of its change commit together; a
// transaction that fails after the row was written leaves neither the row
// change nor any of the events, and a retried change inserts its events
// once, numbered with no gap.
func TestSubscriptionEventsShareTheRowTransaction(t *testing.T) {
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
	newSub := func(t *testing.T) engine.SubscriptionRecord {
		c := newCustomer(live, "acct_"+uuid.NewString(), now)
		if err := b.store.CreateCustomer(b.ctx, c); err != nil {
			t.Fatal(err)
		}
		r := subscription(live, c.ID, v, now)
		r.Events = []engine.Event{subscriptionEvent(r, "created", false)}
		if err := b.store.CreateSubscription(b.ctx, r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	// pause changes r to paused with one good event and, when bad, a
	// failing one after it.
	pause := func(bad bool) func(r *engine.SubscriptionRecord) {
		return func(r *engine.SubscriptionRecord) {
			r.Status, r.UpdatedAt, r.NextActionAt = engine.SubscriptionPaused, now.Add(time.Second), nil
			r.Events = append(r.Events, subscriptionEvent(*r, "paused", false))
			if bad {
				r.Events = append(r.Events, subscriptionEvent(*r, "bad", true))
			}
		}
	}
	cases := []struct {
		name string
		// write runs one transition of r through the store.
		write func(t *testing.T, r engine.SubscriptionRecord, bad bool) error
		// created is whether the row exists before write.
		created bool
	}{
		{"create", func(t *testing.T, r engine.SubscriptionRecord, bad bool) error {
			pause(bad)(&r)
			return b.store.CreateSubscription(b.ctx, r)
		}, false},
		{"update", func(t *testing.T, r engine.SubscriptionRecord, bad bool) error {
			_, err := b.store.UpdateSubscription(b.ctx, live, r.ID, func(rec *engine.SubscriptionRecord) error {
				pause(bad)(rec)
				return nil
			})
			return err
		}, true},
		{"run due", func(t *testing.T, r engine.SubscriptionRecord, bad bool) error {
			_, err := b.store.RunDue(b.ctx, now, 1, func(_ context.Context, rec *engine.SubscriptionRecord) error {
				pause(bad)(rec)
				return nil
			})
			return err
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r engine.SubscriptionRecord
			if tc.created {
				r = newSub(t)
				due := now.Add(-time.Minute)
				if _, err := b.store.UpdateSubscription(b.ctx, live, r.ID, func(rec *engine.SubscriptionRecord) error {
					rec.NextActionAt = &due
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			} else {
				c := newCustomer(live, "acct_"+uuid.NewString(), now)
				if err := b.store.CreateCustomer(b.ctx, c); err != nil {
					t.Fatal(err)
				}
				r = subscription(live, c.ID, v, now)
			}
			good := subscriptionEvent(r, "paused", false).ID
			if err := tc.write(t, r, true); err == nil {
				t.Fatal("the failing transaction reported no error")
			}
			got, err := b.store.GetRecord(b.ctx, live, r.ID)
			switch {
			case !tc.created && !errors.Is(err, engine.ErrNotFound):
				t.Fatalf("row after a failed create: %v, want none", err)
			case tc.created && (err != nil || got.Status != engine.SubscriptionActive):
				t.Fatalf("row after a failed change: %v, %v, want active", got.Status, err)
			}
			if n := countEvents(t, b, good); n != 0 {
				t.Fatalf("%d events of the failed transaction stored, want 0", n)
			}
			checkSequences(t, b, live.TenantID)

			// The retried transition stores row and event; a second retry
			// inserts the event no second time.
			for i := 0; i < 2; i++ {
				if err := tc.write(t, r, false); err != nil && !(i == 1 && !tc.created) {
					t.Fatalf("retry %d: %v", i, err)
				}
			}
			if got, err := b.store.GetRecord(b.ctx, live, r.ID); err != nil || got.Status != engine.SubscriptionPaused {
				t.Fatalf("row after the retry: %v, %v, want paused", got.Status, err)
			}
			if n := countEvents(t, b, good); n != 1 {
				t.Fatalf("%d events after the retries, want 1", n)
			}
			checkSequences(t, b, live.TenantID)
		})
	}
}

func countEvents(t *testing.T, b *bundle, id uuid.UUID) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM webhook_events WHERE id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
