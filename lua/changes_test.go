package lua

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestChangeFeed: every bump of a kind that alters a check is appended to
// its tenant's change feed, in order, and no other (alert settings, the
// fleet's key stamp), and so is a reservation notice, with its customer;
// past engine.ChangeFeedCap and a tenth of it the oldest are trimmed back to
// the cap, and a reader resuming before them is told it lost changes
// instead of reading on as if current (issue 27).
func TestChangeFeed(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		tenant := uuid.New()
		bump := func(id uuid.UUID, k engine.StampKind) uint64 {
			t.Helper()
			n, err := b.store.StampBump(ctx, id, k)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		after := func(c engine.ChangeID) ([]engine.ConfigChange, bool) {
			t.Helper()
			cs, lost, err := b.store.ChangesAfter(ctx, tenant, c, 2000)
			if err != nil {
				t.Fatal(err)
			}
			return cs, lost
		}
		if last, err := b.store.ChangesLast(ctx, tenant); err != nil || !last.IsZero() {
			t.Fatalf("empty feed: last %v err %v, want zero", last, err)
		}
		if cs, lost := after(engine.ChangeID{}); len(cs) != 0 || lost {
			t.Fatalf("empty feed from zero: %v lost=%v", cs, lost)
		}
		if _, lost := after(engine.ChangeID{Ms: 1}); !lost {
			t.Error("a cursor into a feed that does not exist (a Redis restarted empty) was not reported lost")
		}
		plans := bump(tenant, engine.StampPlans)
		bump(tenant, engine.StampAlerts)
		bump(uuid.Nil, engine.StampTenant)
		subs := bump(tenant, engine.StampSubscriptions)
		cs, lost := after(engine.ChangeID{})
		if lost || len(cs) != 2 {
			t.Fatalf("feed %+v lost=%v, want the plans and subscriptions bumps only", cs, lost)
		}
		if cs[0].Kind != engine.StampPlans || cs[0].Stamp != plans || cs[1].Kind != engine.StampSubscriptions || cs[1].Stamp != subs {
			t.Errorf("feed %+v, want plans@%d then subscriptions@%d", cs, plans, subs)
		}
		if !cs[0].ID.Less(cs[1].ID) {
			t.Errorf("ids not in order: %v then %v", cs[0].ID, cs[1].ID)
		}
		if rest, _ := after(cs[0].ID); len(rest) != 1 || rest[0].ID != cs[1].ID {
			t.Errorf("after the first: %+v, want the second only", rest)
		}
		if last, _ := b.store.ChangesLast(ctx, tenant); last != cs[1].ID {
			t.Errorf("last %v, want %v", last, cs[1].ID)
		}
		reservation := engine.CustomerKey{TenantID: tenant, Environment: engine.EnvironmentSandbox, CustomerID: uuid.New()}
		sent := time.Now().UnixMicro()
		if err := b.store.ReservationNote(ctx, reservation); err != nil {
			t.Fatal(err)
		}
		answered := time.Now().UnixMicro()
		notes, _ := after(cs[1].ID)
		if len(notes) != 1 || notes[0].Customer == nil || *notes[0].Customer != reservation.CustomerID ||
			notes[0].Environment != engine.EnvironmentSandbox || notes[0].Name() != "holds" {
			t.Fatalf("after a reservation notice: %+v, want it with its customer and environment", notes)
		}
		// The notice is stamped by the caller's clock, in µs.
		if st := int64(notes[0].Stamp); st < sent || st > answered {
			t.Errorf("notice stamped %d, want within the call [%d, %d]", st, sent, answered)
		}
		// The feed keeps at least its cap and trims a tenth of it at a
		// time: at cap + cap/10 entries nothing is lost yet.
		slack := engine.ChangeFeedCap / 10
		for range engine.ChangeFeedCap + slack - 3 {
			bump(tenant, engine.StampCatalog)
		}
		full, lost := after(engine.ChangeID{})
		if lost || len(full) != engine.ChangeFeedCap+slack {
			t.Fatalf("at the cap and its slack: %d changes lost=%v, want all %d", len(full), lost, engine.ChangeFeedCap+slack)
		}
		bump(tenant, engine.StampCatalog)
		if _, lost := after(cs[0].ID); !lost {
			t.Error("a cursor before the trimmed entries was not reported lost")
		}
		if _, lost := after(engine.ChangeID{}); !lost {
			t.Error("a zero cursor (a stream opened before any change) was not reported lost once changes were trimmed")
		}
		if _, lost := after(notes[0].ID); !lost {
			t.Error("a cursor at the notice, trimmed with newer changes after it, was not reported lost")
		}
		// One append past the slack trims back to the cap: the two first
		// changes, the notice and the oldest bumps. A reader that saw the
		// newest trimmed missed nothing and reads every change kept; one
		// that saw only the change before it is told it lost one.
		newest := full[slack].ID
		all, lost := after(newest)
		if lost || len(all) != engine.ChangeFeedCap {
			t.Errorf("from the newest trimmed: %d changes lost=%v, want all %d kept", len(all), lost, engine.ChangeFeedCap)
		}
		if _, lost := after(full[slack-1].ID); !lost {
			t.Error("a cursor one change before the newest trimmed was not reported lost")
		}
	})
}

// TestReservationNotesTrimmed: reservation notices check the feed's length
// only one in feedTrimEvery, yet a feed fed by notices alone never holds
// more than its cap, its tenth and feedTrimEvery, and never fewer than
// the cap once past it.
func TestReservationNotesTrimmed(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := engine.CustomerKey{TenantID: uuid.New(), Environment: engine.EnvironmentLive, CustomerID: uuid.New()}
		most := engine.ChangeFeedCap + engine.ChangeFeedCap/10 + feedTrimEvery
		trimmed := false
		for i := range 2 * most {
			if err := b.store.ReservationNote(ctx, c); err != nil {
				t.Fatal(err)
			}
			n, err := b.rdb.XLen(ctx, b.store.changesKey(c.TenantID)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n > int64(most) || (i >= engine.ChangeFeedCap && n < engine.ChangeFeedCap) {
				t.Fatalf("after %d notices the feed holds %d, want between the cap %d and %d", i+1, n, engine.ChangeFeedCap, most)
			}
			trimmed = trimmed || n < int64(i+1)
		}
		if !trimmed {
			t.Errorf("%d notices never trimmed the feed", 2*most)
		}
	})
}
