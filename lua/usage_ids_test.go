package lua

import (
	"context"
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
