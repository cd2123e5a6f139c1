package persist

import (
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestReconcileStatesAndSample: a scoped page holds exactly the accounts
// of the tenant (and environment), in customer id order, paged after an
// id, each with its live blocks; a sample holds at most n distinct
// accounts, all of them when the table is smaller than the sample.
func TestReconcileStatesAndSample(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().UnixMilli()
	tenantA, tenantB := uuid.New(), uuid.New()
	type acct struct {
		tenant uuid.UUID
		env    engine.Environment
	}
	accounts := map[uuid.UUID]acct{}
	for i, a := range []acct{{tenantA, engine.EnvironmentLive}, {tenantA, engine.EnvironmentLive}, {tenantA, engine.EnvironmentSandbox},
		{tenantB, engine.EnvironmentLive}, {tenantB, engine.EnvironmentSandbox}} {
		customer, block := uuid.New(), uuid.New()
		accounts[customer] = a
		credits := int64(100 + i)
		m := engine.Mutation{OpID: uuid.New(), Kind: engine.MutationGrant, TenantID: a.tenant, CustomerID: customer,
			Environment: a.env, AtMS: now,
			Account: engine.MutationAccount{ID: uuid.NewString(), Version: 1, Balance: credits, LifetimeEarned: credits},
			Blocks: []engine.MutationBlock{{ID: block, Original: credits, Remaining: credits, Source: engine.SourceManual,
				StartsMS: now, CreatedMS: now}},
			Entries: []engine.MutationEntry{{Role: engine.RoleMain, Delta: credits, Type: engine.EntryAdjustment, BlockID: &block}}}
		if err := b.store.Apply(b.ctx, []engine.Mutation{m}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		scope engine.ReconcileScope
		want  int
	}{
		{"every account", engine.ReconcileScope{}, 5},
		{"one tenant", engine.ReconcileScope{TenantID: tenantA}, 3},
		{"one tenant's live", engine.ReconcileScope{TenantID: tenantA, Environment: engine.EnvironmentLive}, 2},
		{"every sandbox", engine.ReconcileScope{Environment: engine.EnvironmentSandbox}, 2},
		{"no such tenant", engine.ReconcileScope{TenantID: uuid.New()}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []engine.AccountState
			after := uuid.Nil
			for {
				page, err := b.store.ReconcileStates(b.ctx, tc.scope, after, 2)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, page...)
				if len(page) < 2 {
					break
				}
				after = page[len(page)-1].CustomerID
			}
			if len(got) != tc.want {
				t.Fatalf("%d accounts, want %d", len(got), tc.want)
			}
			for i, st := range got {
				a := accounts[st.CustomerID]
				if (tc.scope.TenantID != uuid.Nil && a.tenant != tc.scope.TenantID) ||
					(tc.scope.Environment != "" && a.env != tc.scope.Environment) || st.TenantID != a.tenant {
					t.Fatalf("account %s (%+v) outside the scope %+v", st.CustomerID, a, tc.scope)
				}
				if len(st.Blocks) != 1 || st.Blocks[0].Remaining < 100 || st.Version != 1 {
					t.Fatalf("account %s: version %d, blocks %+v", st.CustomerID, st.Version, st.Blocks)
				}
				if i > 0 && st.CustomerID.String() <= got[i-1].CustomerID.String() {
					t.Fatal("accounts out of customer id order")
				}
			}
		})
	}
	for i, n := range []int{2, 100, 2, 100} {
		if i == 2 {
			// From here the planner's estimate sizes the sample, not a count.
			if _, err := b.pool.Exec(b.ctx, `ANALYZE credit_accounts`); err != nil {
				t.Fatal(err)
			}
		}
		sample, err := b.store.SampleStates(b.ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uuid.UUID]bool{}
		for _, st := range sample {
			if _, ok := accounts[st.CustomerID]; !ok || seen[st.CustomerID] || len(st.Blocks) != 1 {
				t.Fatalf("sample of %d: account %s unknown, repeated or without its block", n, st.CustomerID)
			}
			seen[st.CustomerID] = true
		}
		if want := min(n, 5); len(sample) != want {
			t.Fatalf("sample of %d: %d accounts, want %d", n, len(sample), want)
		}
	}
}
