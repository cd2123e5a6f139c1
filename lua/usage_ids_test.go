package lua

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

// TestUsageClaims (issue 26): an event id of a tenant and environment is
// claimed for one customer at a time; the same customer's sends share the
// claim and it goes only when every one that took it has released it; a
// committed id (ForgetOps) keeps its claim for the grace only, and no
// release takes it back; other tenants and environments never see it.
func TestUsageClaims(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		tenant, a, c := uuid.New(), uuid.New(), uuid.New()
		live := engine.EnvironmentLive
		claim := func(tn uuid.UUID, env engine.Environment, cust uuid.UUID, id string) engine.UsageHold {
			t.Helper()
			holds, errs := b.store.UsageIDsClaim(ctx, tn, env, []engine.UsageClaim{{EventID: id, Customer: cust}})
			if errs[0] != nil {
				t.Fatalf("claim %s for %s: %v", id, cust, errs[0])
			}
			return holds[0]
		}
		release := func(cust uuid.UUID, id string) {
			t.Helper()
			if err := b.store.UsageIDsRelease(ctx, tenant, live, []engine.UsageClaim{{EventID: id, Customer: cust}}); err != nil {
				t.Fatal(err)
			}
		}
		if h := claim(tenant, live, a, "e1"); !h.Fresh || h.Other {
			t.Fatalf("first claim: %+v, want fresh", h)
		}
		if h := claim(tenant, live, c, "e1"); !h.Other || h.Holder != a {
			t.Fatalf("another customer's claim: %+v, want held by %s", h, a)
		}
		if h := claim(tenant, live, a, "e1"); h.Fresh || h.Other {
			t.Fatalf("the same customer again: %+v, want held by itself", h)
		}
		if h := claim(tenant, live, c, "e2"); !h.Fresh {
			t.Fatalf("another id: %+v, want fresh", h)
		}
		if h := claim(uuid.New(), live, c, "e1"); !h.Fresh {
			t.Errorf("another tenant: %+v, want fresh", h)
		}
		if h := claim(tenant, engine.EnvironmentSandbox, c, "e1"); !h.Fresh {
			t.Errorf("another environment: %+v, want fresh", h)
		}
		// Two sends of a hold it: the first release leaves it held.
		release(a, "e1")
		if h := claim(tenant, live, c, "e1"); !h.Other {
			t.Fatalf("after one of two releases: %+v, want still held by %s", h, a)
		}
		release(c, "e1") // not the holder: changes nothing
		release(a, "e1")
		if h := claim(tenant, live, c, "e1"); !h.Fresh {
			t.Fatalf("after both releases: %+v, want fresh for another customer", h)
		}
		key := b.store.UsageClaimKey(tenant, live, "e1")
		if ttl := b.rdb.PTTL(ctx, key).Val(); ttl < idempotency.UsageClaimRetention-time.Minute {
			t.Errorf("a fresh claim lives %v, want %v", ttl, idempotency.UsageClaimRetention)
		}

		// c's charge is committed: the claim is kept for the grace and no
		// release of c takes it back; a is still refused.
		m := engine.Mutation{TenantID: tenant, Environment: live, CustomerID: c, IdempotencyKey: "usage:e1"}
		if err := b.store.ForgetOps(ctx, Partition(c), []engine.Mutation{m}); err != nil {
			t.Fatal(err)
		}
		if ttl := b.rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > idempotency.UsageClaimGrace {
			t.Errorf("a committed claim lives %v, want at most %v", ttl, idempotency.UsageClaimGrace)
		}
		if h := claim(tenant, live, c, "e1"); h.Fresh || h.Other {
			t.Fatalf("the committed id for its customer: %+v", h)
		}
		release(c, "e1")
		if h := claim(tenant, live, a, "e1"); !h.Other || h.Holder != c {
			t.Fatalf("the committed id for another customer: %+v, want held by %s", h, c)
		}
	})
}

// TestUsageFilter (issue 26): once the usage filters are seeded, an id
// neither claimed nor committed is certainly new (no Postgres); an id
// committed (ForgetOps) or seeded from Postgres (SeedSeen) whose claim has
// lapsed may have been seen, so Postgres is asked; a look changes nothing
// and names any holder.
func TestUsageFilter(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		tenant, a, c := uuid.New(), uuid.New(), uuid.New()
		live := engine.EnvironmentLive
		claim := func(cust uuid.UUID, id string, look bool) engine.UsageHold {
			t.Helper()
			holds, errs := b.store.UsageIDsClaim(ctx, tenant, live, []engine.UsageClaim{{EventID: id, Customer: cust, LookOnly: look}})
			if errs[0] != nil {
				t.Fatalf("claim %s: %v", id, errs[0])
			}
			return holds[0]
		}
		if h := claim(a, "before-seed", false); !h.Fresh || !h.Seen {
			t.Fatalf("a filter not seeded: %+v, want fresh and maybe seen", h)
		}
		marks, err := b.store.SeenSeeded(ctx)
		if err != nil || len(marks) != Partitions+UsageSlots {
			t.Fatalf("marks: %d, %v; want %d", len(marks), err, Partitions+UsageSlots)
		}
		all := make([]int, Partitions+UsageSlots)
		for p := range all {
			all[p] = p
		}
		// Seeding: one usage event Postgres holds, then every filter marked.
		seeded := engine.OpRef{Customer: engine.CustomerKey{TenantID: tenant, Environment: live, CustomerID: c}, Key: "usage:old"}
		if err := b.store.SeedSeen(ctx, []engine.OpRef{seeded}, nil, t0, false); err != nil {
			t.Fatal(err)
		}
		if err := b.store.SeedSeen(ctx, nil, all, t0, true); err != nil {
			t.Fatal(err)
		}
		if marks, _ := b.store.SeenSeeded(ctx); marks[Partitions+UsageSlots-1].IsZero() {
			t.Fatalf("usage slots not marked seeded: %v", marks)
		}
		if h := claim(a, "new", true); h.Other || h.Seen {
			t.Errorf("a look at a new id: %+v, want neither held nor seen", h)
		}
		if h := claim(a, "new", false); !h.Fresh || h.Seen {
			t.Errorf("a new id: %+v, want fresh and certainly unseen", h)
		}
		if h := claim(c, "new", true); !h.Other || h.Holder != a {
			t.Errorf("a look at a held id: %+v, want held by %s", h, a)
		}
		if h := claim(a, "old", false); !h.Fresh || !h.Seen {
			t.Errorf("an id seeded from Postgres: %+v, want fresh and maybe seen", h)
		}
		// Committed, then its claim lapsed: maybe seen.
		m := engine.Mutation{TenantID: tenant, Environment: live, CustomerID: a, IdempotencyKey: "usage:new"}
		if err := b.store.ForgetOps(ctx, Partition(a), []engine.Mutation{m}); err != nil {
			t.Fatal(err)
		}
		b.rdb.Del(ctx, b.store.UsageClaimKey(tenant, live, "new"))
		if h := claim(c, "new", false); !h.Fresh || !h.Seen {
			t.Errorf("a committed id whose claim lapsed: %+v, want fresh and maybe seen", h)
		}
		if h := claim(a, "other-env", false); !h.Fresh || h.Seen {
			t.Errorf("another new id: %+v", h)
		}
	})
}

// TestForgetUsageBatch: one ForgetOps of many committed usage events
// (more than a call takes, over many slots) records every id in the usage
// filter and shortens to the grace each claim its customer holds, and
// only those: a claim another customer holds keeps its retention.
func TestForgetUsageBatch(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		tenant, a, c := uuid.New(), uuid.New(), uuid.New()
		live := engine.EnvironmentLive
		all := make([]int, Partitions+UsageSlots)
		for p := range all {
			all[p] = p
		}
		if err := b.store.SeedSeen(ctx, nil, all, t0, true); err != nil {
			t.Fatal(err)
		}
		claim := func(cust uuid.UUID, id string) engine.UsageHold {
			t.Helper()
			holds, errs := b.store.UsageIDsClaim(ctx, tenant, live, []engine.UsageClaim{{EventID: id, Customer: cust}})
			if errs[0] != nil {
				t.Fatalf("claim %s: %v", id, errs[0])
			}
			return holds[0]
		}
		const n = 3*maxSeenPerCall + 5
		var ms []engine.Mutation
		for i := 0; i < n; i++ {
			id := fmt.Sprintf("ev-%d", i)
			if h := claim(a, id); !h.Fresh || h.Seen {
				t.Fatalf("claim of new id %s: %+v, want fresh and unseen", id, h)
			}
			ms = append(ms, engine.Mutation{TenantID: tenant, Environment: live, CustomerID: a, IdempotencyKey: "usage:" + id})
		}
		claim(c, "held-by-c")
		ms = append(ms,
			engine.Mutation{TenantID: tenant, Environment: live, CustomerID: a, IdempotencyKey: "usage:held-by-c"},
			engine.Mutation{TenantID: tenant, Environment: live, CustomerID: a, IdempotencyKey: "usage:never-claimed"},
			engine.Mutation{TenantID: tenant, Environment: live, CustomerID: a, IdempotencyKey: "not-usage"})
		if err := b.store.ForgetOps(ctx, Partition(a), ms); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			key := b.store.UsageClaimKey(tenant, live, fmt.Sprintf("ev-%d", i))
			if ttl := b.rdb.PTTL(ctx, key).Val(); ttl <= 0 || ttl > idempotency.UsageClaimGrace {
				t.Fatalf("committed id %d: claim lives %v, want at most %v", i, ttl, idempotency.UsageClaimGrace)
			}
			b.rdb.Del(ctx, key) // lapsed: the filter alone knows it now
			if h := claim(c, fmt.Sprintf("ev-%d", i)); !h.Fresh || !h.Seen {
				t.Fatalf("committed id %d after its claim lapsed: %+v, want maybe seen", i, h)
			}
		}
		if ttl := b.rdb.PTTL(ctx, b.store.UsageClaimKey(tenant, live, "held-by-c")).Val(); ttl <= idempotency.UsageClaimGrace {
			t.Errorf("another customer's claim lives %v after the forget, want its retention", ttl)
		}
		if n := b.rdb.Exists(ctx, b.store.UsageClaimKey(tenant, live, "never-claimed")).Val(); n != 0 {
			t.Errorf("forget made a claim for an id never claimed")
		}
		if h := claim(c, "never-claimed"); !h.Fresh || !h.Seen {
			t.Errorf("a committed id never claimed: %+v, want maybe seen", h)
		}
		if h := claim(c, "not-forgotten"); !h.Fresh || h.Seen {
			t.Errorf("control, an id never committed: %+v, want certainly unseen", h)
		}
	})
}

// TestUsageClaimsInOneCall: claims and looks sent together (more than one
// call takes, over many slots) answer as they would one at a time, in
// order: a repeated id sees the claim taken before it in the same batch.
func TestUsageClaimsInOneCall(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		tenant, a, c := uuid.New(), uuid.New(), uuid.New()
		live := engine.EnvironmentLive
		var claims []engine.UsageClaim
		var want []engine.UsageHold
		add := func(cl engine.UsageClaim, h engine.UsageHold) {
			claims, want = append(claims, cl), append(want, h)
		}
		for i := 0; i < 2*maxSeenPerCall+3; i++ {
			add(engine.UsageClaim{EventID: fmt.Sprintf("ev-%d", i), Customer: a}, engine.UsageHold{Fresh: true, Seen: true})
		}
		add(engine.UsageClaim{EventID: "ev-1", Customer: a}, engine.UsageHold{})                       // a again: held by a
		add(engine.UsageClaim{EventID: "ev-2", Customer: c}, engine.UsageHold{Other: true, Holder: a}) // c: a reuse
		add(engine.UsageClaim{EventID: "ev-3", LookOnly: true}, engine.UsageHold{Other: true, Holder: a})
		add(engine.UsageClaim{EventID: "unclaimed", LookOnly: true}, engine.UsageHold{Seen: true})
		holds, errs := b.store.UsageIDsClaim(ctx, tenant, live, claims)
		for i := range claims {
			if errs[i] != nil {
				t.Fatalf("claim %d (%s): %v", i, claims[i].EventID, errs[i])
			}
			if holds[i] != want[i] {
				t.Errorf("claim %d (%s, look %v): %+v, want %+v", i, claims[i].EventID, claims[i].LookOnly, holds[i], want[i])
			}
		}
		if n := b.rdb.Exists(ctx, b.store.UsageClaimKey(tenant, live, "unclaimed")).Val(); n != 0 {
			t.Errorf("a look took a claim")
		}
		// ev-1 is held twice by a: one release leaves it held.
		if err := b.store.UsageIDsRelease(ctx, tenant, live, []engine.UsageClaim{{EventID: "ev-1", Customer: a}}); err != nil {
			t.Fatal(err)
		}
		h, errs := b.store.UsageIDsClaim(ctx, tenant, live, []engine.UsageClaim{{EventID: "ev-1", Customer: c}})
		if errs[0] != nil || !h[0].Other {
			t.Errorf("ev-1 after one of a's two releases: %+v, %v; want still held by a", h[0], errs[0])
		}
	})
}
