package persist

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// bundle is what most tests need: a migrated fresh database and a Store.
type bundle struct {
	ctx   context.Context
	pool  *pgxpool.Pool
	store *Store
}

func setup(t *testing.T) *bundle { return setupAt(t, 0) }

// setupAt is setup with the schema of an older release: the expand
// migrations up to version (0: all, and the contract steps, as Migrate
// does on a fresh database).
func setupAt(t *testing.T, version int) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	pool, err := Open(ctx, testenv.Database(t))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(pool.Close)
	plan := migratePlan{upTo: version, contract: contractNever}
	if version == 0 {
		plan.contract = contractIfFresh
	}
	if err := migrate(ctx, pool, plan); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	return &bundle{ctx: ctx, pool: pool, store: NewStore(pool)}
}

// tenant creates a tenant and returns its two scopes.
func (b *bundle) tenant(t *testing.T) (live, sandbox engine.Scope) {
	t.Helper()
	now := time.Now().UTC().Truncate(time.Millisecond)
	id := uuid.New()
	err := b.store.CreateTenant(b.ctx, engine.Tenant{ID: id, Name: "acme", DefaultOveragePolicy: engine.OveragePolicyBlock,
		RateLimitPerSecond: 1000, RateLimitBurst: 2000, CreatedAt: now, UpdatedAt: now})
	if err != nil {
		t.Fatalf("CreateTenant: %v", err)
	}
	return engine.Scope{TenantID: id, Environment: engine.EnvironmentLive},
		engine.Scope{TenantID: id, Environment: engine.EnvironmentSandbox}
}

func ptr[T any](v T) *T { return &v }

func contextCanceled(b *bundle) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(b.ctx)
	cancel()
	return ctx, cancel
}
