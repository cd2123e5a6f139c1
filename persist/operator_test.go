package persist

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestListTenantsAndKeys: tenants page in id order from a cursor; a
// tenant's keys list oldest first with the revoked one marked; a bad limit
// is refused.
func TestListTenantsAndKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ids []uuid.UUID
	for range 3 {
		live, _ := b.tenant(t)
		ids = append(ids, live.TenantID)
	}
	all, err := b.store.ListTenants(b.ctx, uuid.Nil, 10)
	if err != nil || len(all) != 3 {
		t.Fatalf("list all: %d, %v", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		if all[i-1].ID.String() >= all[i].ID.String() {
			t.Fatalf("not in id order: %v", all)
		}
	}
	page, err := b.store.ListTenants(b.ctx, all[0].ID, 1)
	if err != nil || len(page) != 1 || page[0].ID != all[1].ID {
		t.Fatalf("page after the first: %v, %v", page, err)
	}
	for _, limit := range []int{0, MaxTenantList + 1} {
		if _, err := b.store.ListTenants(b.ctx, uuid.Nil, limit); err == nil {
			t.Errorf("limit %d accepted", limit)
		}
	}

	tenant := ids[0]
	now := time.Now().UTC().Truncate(time.Millisecond)
	k1 := engine.APIKey{ID: uuid.New(), TenantID: tenant, Environment: engine.EnvironmentLive, CreatedAt: now}
	k2 := engine.APIKey{ID: uuid.New(), TenantID: tenant, Environment: engine.EnvironmentSandbox, CreatedAt: now.Add(time.Second)}
	for i, k := range []engine.APIKey{k1, k2} {
		if err := b.store.CreateAPIKey(b.ctx, k, []byte{byte(i), 1, 2, 3}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.store.RevokeAPIKey(b.ctx, tenant, k1.ID, now.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	keys, err := b.store.ListAPIKeys(b.ctx, tenant)
	if err != nil || len(keys) != 2 || keys[0].ID != k1.ID || keys[1].ID != k2.ID ||
		keys[0].RevokedAt == nil || keys[1].RevokedAt != nil || keys[1].Environment != engine.EnvironmentSandbox {
		t.Fatalf("keys: %+v, %v", keys, err)
	}
	if keys, err := b.store.ListAPIKeys(b.ctx, ids[1]); err != nil || len(keys) != 0 {
		t.Fatalf("other tenant's keys: %+v, %v", keys, err)
	}
}
