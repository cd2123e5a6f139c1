package lua

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

type wakeSeen struct {
	what   engine.FeedWake
	tenant uuid.UUID
}

// TestFeedWakes: a follower of the wake channel hears, once subscribed,
// the persister's wakes (several tenants in one message) and every bump
// and reservation notice that joins a change feed, from the feed scripts
// themselves; a bump the feed does not take (alert settings) wakes no one.
func TestFeedWakes(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		seen := make(chan wakeSeen, 100)
		resumed := make(chan struct{}, 10)
		done := make(chan error, 1)
		go func() {
			done <- b.store.FollowWakes(ctx, func(w engine.FeedWake, t uuid.UUID) { seen <- wakeSeen{w, t} },
				func() { resumed <- struct{}{} })
		}()
		select {
		case <-resumed:
		case <-time.After(5 * time.Second):
			t.Fatal("no subscription within 5 s")
		}
		want := func(what engine.FeedWake, tenant uuid.UUID) {
			t.Helper()
			select {
			case got := <-seen:
				if got.what != what || got.tenant != tenant {
					t.Fatalf("woken %+v, want %v of %s", got, what, tenant)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("no wake %v of %s within 5 s", what, tenant)
			}
		}
		a, c := uuid.New(), uuid.New()
		if err := b.store.PublishWakes(ctx, engine.WakeEvents, []uuid.UUID{a, c}); err != nil {
			t.Fatal(err)
		}
		want(engine.WakeEvents, a)
		want(engine.WakeEvents, c)

		if _, err := b.store.StampBump(ctx, a, engine.StampAlerts); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.StampBump(ctx, a, engine.StampPlans); err != nil {
			t.Fatal(err)
		}
		want(engine.WakeChanges, a) // the alerts bump, published first, would come first
		cust := engine.CustomerKey{TenantID: c, CustomerID: uuid.New(), Environment: engine.EnvironmentLive}
		if err := b.store.ReservationNote(ctx, cust); err != nil {
			t.Fatal(err)
		}
		want(engine.WakeChanges, c)

		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("FollowWakes ended with %v, want context.Canceled", err)
		}
	})
}

// TestParseWake: a message lists its tenants in order; what a node cannot
// read (another source's letter, a bad id) it skips, keeping the rest.
func TestParseWake(t *testing.T) {
	a, c := uuid.New(), uuid.New()
	cases := []struct {
		payload string
		want    []wakeSeen
	}{
		{"e:" + a.String() + "," + c.String(), []wakeSeen{{engine.WakeEvents, a}, {engine.WakeEvents, c}}},
		{wakeChangesMessage(a), []wakeSeen{{engine.WakeChanges, a}}},
		{"e:nope," + c.String(), []wakeSeen{{engine.WakeEvents, c}}},
		{"x:" + a.String(), nil},
		{a.String(), nil},
		{"e:", nil},
	}
	for _, tc := range cases {
		var got []wakeSeen
		parseWake(tc.payload, func(w engine.FeedWake, t uuid.UUID) { got = append(got, wakeSeen{w, t}) })
		if len(got) != len(tc.want) {
			t.Errorf("%q: got %v, want %v", tc.payload, got, tc.want)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%q: got %v, want %v", tc.payload, got, tc.want)
			}
		}
	}
}

// TestFeedWakesOnCluster: on a Redis Cluster one subscription hears the
// wakes of every tenant, whatever the master its feed's slot is on: the
// scripts' PUBLISH, run on the tenant's master, reaches a subscriber on
// another node through the cluster bus. Each client is a node of its own.
func TestFeedWakesOnCluster(t *testing.T) {
	t.Parallel()
	masters := testenv.StartRedisCluster(t, 3)
	seeds := make([]string, len(masters))
	for i, m := range masters {
		seeds[i] = m.Addr
	}
	prefix := "w" + testenv.RandomSuffix()
	node := func() *Store {
		rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds, DialTimeout: time.Second})
		t.Cleanup(func() { _ = rdb.Close() })
		return NewStore(rdb, prefix)
	}
	follower, writer := node(), node()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := make(chan wakeSeen, 100)
	resumed := make(chan struct{}, 10)
	go func() {
		_ = follower.FollowWakes(ctx, func(w engine.FeedWake, t uuid.UUID) { seen <- wakeSeen{w, t} },
			func() { resumed <- struct{}{} })
	}()
	select {
	case <-resumed:
	case <-time.After(10 * time.Second):
		t.Fatal("no subscription within 10 s")
	}
	// Enough tenants that their feeds' slots span every master.
	want := map[uuid.UUID]bool{}
	for range 12 {
		tenant := uuid.New()
		want[tenant] = true
		if _, err := writer.StampBump(ctx, tenant, engine.StampPlans); err != nil {
			t.Fatal(err)
		}
	}
	// A cluster just started may not have every bus link up yet, and a
	// wake is best effort (the feed's poll is the fallback): the tenants
	// not heard of are bumped again each second, and each must be heard
	// within 20 s.
	bumped := map[uuid.UUID]bool{}
	for tenant := range want {
		bumped[tenant] = true
	}
	deadline := time.After(20 * time.Second)
	for len(want) > 0 {
		select {
		case got := <-seen:
			if got.what != engine.WakeChanges || !bumped[got.tenant] {
				t.Fatalf("woken %+v, not one of the bumps", got)
			}
			delete(want, got.tenant)
		case <-time.After(time.Second):
			for tenant := range want {
				if _, err := writer.StampBump(ctx, tenant, engine.StampPlans); err != nil {
					t.Fatal(err)
				}
			}
		case <-deadline:
			t.Fatalf("%d tenants' bumps woke no one within 20 s", len(want))
		}
	}
	tenant := uuid.New()
	if err := writer.PublishWakes(ctx, engine.WakeEvents, []uuid.UUID{tenant}); err != nil {
		t.Fatal(err)
	}
	for heard := false; !heard; {
		select {
		case got := <-seen:
			switch {
			case got == (wakeSeen{engine.WakeEvents, tenant}):
				heard = true
			case got.what == engine.WakeChanges && bumped[got.tenant]:
				// a late wake of a bump sent twice above
			default:
				t.Fatalf("woken %+v, want the events of %s", got, tenant)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the persister's wake reached no one within 5 s")
		}
	}
}
