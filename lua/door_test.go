package lua

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestDoorTrip: a request's door answers each part as its own command
// would: the stamps StampsRead reads, the rate decision TakeRate takes (the
// same budget: a door's take spends it), and Begin's claim (claimed once,
// then the running record, a mismatch for another fingerprint); a part not
// asked is not touched, and a rate take whose script Redis lost loads it
// again (issue 26).
func TestDoorTrip(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		tenant, key := uuid.New(), uuid.New()
		moved, err := b.store.StampBump(ctx, tenant, engine.StampCatalog)
		if err != nil {
			t.Fatal(err)
		}
		now := t0
		ask := engine.DoorAsk{Tenant: tenant,
			Rate:  &engine.RateAsk{Key: key, PerSecond: 1, Burst: 2, Requests: 1, Now: now},
			Claim: &engine.ClaimAsk{Key: "k-1", RequestHash: "h-1", LockTTL: time.Minute}}
		a := b.store.DoorTrip(ctx, ask)
		if a.StampsErr != nil || a.RateErr != nil || a.ClaimErr != nil {
			t.Fatalf("errors: %v %v %v", a.StampsErr, a.RateErr, a.ClaimErr)
		}
		if a.Stamps[engine.StampCatalog] != moved || a.Stamps[engine.StampTenant] != 0 {
			t.Errorf("stamps %v, want catalog %d", a.Stamps, moved)
		}
		if !a.Rate.Allowed || a.Rate.Remaining != 1 || a.Rate.Limit != 2 {
			t.Errorf("first take %+v, want allowed with 1 left of 2", a.Rate)
		}
		if !a.Claimed {
			t.Errorf("first claim not claimed: %+v", a.Claim)
		}
		// The door spent the budget TakeRate keeps, and holds the claim
		// Begin sees.
		d, err := b.store.TakeRate(ctx, tenant, key, 1, 2, 1, now)
		if err != nil || !d.Allowed || d.Remaining != 0 {
			t.Errorf("take after the door: %+v %v, want the last one", d, err)
		}
		if _, claimed, err := b.store.Begin(ctx, tenant, "k-1", "h-1", time.Minute); err != nil || claimed {
			t.Errorf("Begin after the door's claim: claimed=%v err=%v", claimed, err)
		}
		ask.Claim = &engine.ClaimAsk{Key: "k-1", RequestHash: "h-2", LockTTL: time.Minute}
		if _, err := b.rdb.ScriptFlush(ctx).Result(); err != nil && b.real {
			t.Fatal(err)
		}
		a = b.store.DoorTrip(ctx, ask)
		if a.RateErr != nil || a.Rate.Allowed {
			t.Errorf("take of an empty budget (after a script flush): %+v %v, want refused", a.Rate, a.RateErr)
		}
		if a.ClaimErr != nil || a.Claimed || !a.Claim.Mismatch {
			t.Errorf("claim of another fingerprint: %+v claimed=%v err=%v, want a mismatch", a.Claim, a.Claimed, a.ClaimErr)
		}
		// Stamps alone: nothing else asked, nothing else touched.
		a = b.store.DoorTrip(ctx, engine.DoorAsk{Tenant: tenant})
		if a.StampsErr != nil || a.Stamps[engine.StampCatalog] != moved || a.Claimed || a.Rate != (engine.RateDecision{}) {
			t.Errorf("stamps-only door: %+v", a)
		}
		if _, claimed, err := b.store.Begin(ctx, tenant, "k-2", "h-1", time.Minute); err != nil || !claimed {
			t.Errorf("a key no door claimed: claimed=%v err=%v", claimed, err)
		}
	})
}

// TestDoorRateFence: a take fenced on the tenant's stamp takes only while
// the stamp is the one the limits were read under (0 for a stamp never
// moved); after a bump it takes nothing and says so, and a take fenced on
// the new value takes again (a limit changed on another node governs the
// next request here).
func TestDoorRateFence(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		tenant, key := uuid.New(), uuid.New()
		take := func(stamp uint64) engine.DoorAnswer {
			return b.store.DoorTrip(ctx, engine.DoorAsk{Tenant: tenant,
				Rate: &engine.RateAsk{Key: key, PerSecond: 1, Burst: 3, Requests: 1, Now: t0, Fenced: true, Stamp: stamp}})
		}
		if a := take(0); a.RateErr != nil || a.RateStale || !a.Rate.Allowed || a.Rate.Remaining != 2 {
			t.Fatalf("take under the unmoved stamp: %+v", a)
		}
		moved, err := b.store.StampBump(ctx, tenant, engine.StampTenant)
		if err != nil {
			t.Fatal(err)
		}
		if a := take(0); a.RateErr != nil || !a.RateStale || a.Rate.Allowed {
			t.Fatalf("take under the old stamp after a bump: %+v, want stale", a)
		}
		// The stale take spent nothing: one request went, two are left.
		if a := take(moved); a.RateErr != nil || a.RateStale || !a.Rate.Allowed || a.Rate.Remaining != 1 {
			t.Fatalf("take under the new stamp: %+v, want allowed with 1 left", a)
		}
		// Another kind's bump does not fence the rate take.
		if _, err := b.store.StampBump(ctx, tenant, engine.StampCatalog); err != nil {
			t.Fatal(err)
		}
		if _, err := b.rdb.ScriptFlush(ctx).Result(); err != nil && b.real {
			t.Fatal(err)
		}
		if a := take(moved); a.RateErr != nil || a.RateStale || !a.Rate.Allowed || a.Rate.Remaining != 0 {
			t.Fatalf("take after a catalog bump and a script flush: %+v, want the last one", a)
		}
	})
}
