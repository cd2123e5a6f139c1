package e2e

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

// reconcileOf runs one reconcile pass over s's Redis and Postgres.
func reconcileOf(t *testing.T, s *Stack, fix bool) engine.ReconcileReport {
	t.Helper()
	rep, err := engine.Reconcile(context.Background(), persist.NewStore(s.Pool), lua.NewStore(s.Redis, s.Prefix),
		engine.ReconcileOptions{Fix: fix, PageSize: 3})
	if err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	return rep
}

// accountKeyOf is the customer's account hash in s's Redis (lua's layout,
// docs/design.md).
func accountKeyOf(s *Stack, customer string) string {
	return fmt.Sprintf("{%s:p%02d}:a:%s", s.Prefix, lua.Partition(uuid.MustParse(customer)), customer)
}

// TestReconcileFindsAndMendsRolledBackAccounts protects invariant 14 (a
// failover leaves no balance diverged from its ledger). Each case builds
// accounts through the API, lets the persister drain, then tampers with
// one account hash in Redis the way a failover would (the promoted replica
// lacks the master's last writes: an older DUMP restored; or holds other
// amounts at the same version). A pass without --fix reports exactly the
// tampered customer and changes nothing; a pass with --fix reloads it from
// Postgres; a third pass finds 0 differences, and the API balance equals
// the ledger sum. The clean case finds 0 differences in every pass.
func TestReconcileFindsAndMendsRolledBackAccounts(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	tn := s.NewTenant("reconcile")
	a := s.as(t, tn.Live)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// tamper changes the customer's hash after the drain; it may use
		// the DUMP taken after the first grant.
		tamper func(t *testing.T, key string, dump string)
		want   []engine.Divergence
	}{
		{name: "clean workload"},
		{name: "rolled back to an older version", want: []engine.Divergence{engine.DivergenceVersion, engine.DivergenceBlocks,
			engine.DivergenceEarned},
			tamper: func(t *testing.T, key, dump string) {
				if err := s.Redis.RestoreReplace(ctx, key, 0, dump).Err(); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "other amounts at the same version", want: []engine.Divergence{engine.DivergenceBlocks},
			tamper: func(t *testing.T, key, _ string) {
				fields, err := s.Redis.HGetAll(ctx, key).Result()
				if err != nil {
					t.Fatal(err)
				}
				for f, v := range fields {
					if len(f) > 2 && f[:2] == "b:" {
						// remaining|original|...: spend 1 more than Postgres knows.
						var rem int64
						var rest string
						if _, err := fmt.Sscanf(v, "%d|%s", &rem, &rest); err != nil {
							t.Fatal(err)
						}
						if err := s.Redis.HSet(ctx, key, f, fmt.Sprintf("%d|%s", rem-1, rest)).Err(); err != nil {
							t.Fatal(err)
						}
						return
					}
				}
				t.Fatal("no block in the hash")
			}},
		{name: "hash lost", // loaded on first use: no difference
			tamper: func(t *testing.T, key, _ string) {
				if err := s.Redis.Del(ctx, key).Err(); err != nil {
					t.Fatal(err)
				}
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Other customers' accounts stay clean around the tampered one.
			var custs []string
			for i := 0; i < 4; i++ {
				id, _ := a.newCustomer()
				custs = append(custs, id)
				a.grant(id, map[string]any{"credits": 1000 + i})
			}
			victim := custs[1]
			s.Drain()
			dump, err := s.Redis.Dump(ctx, accountKeyOf(s, victim)).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range custs {
				a.grant(c, map[string]any{"credits": 500})
				r := a.post("/v1/customers/"+c+"/credits/adjust", map[string]any{"delta": -300, "source": "manual", "reason": "use"})
				wantStatus(t, r, 200, "adjust")
			}
			s.Drain()
			if tc.tamper != nil {
				tc.tamper(t, accountKeyOf(s, victim), dump)
			}

			rep := reconcileOf(t, s, false)
			wantFound := int64(0)
			if len(tc.want) > 0 {
				wantFound = 1
			}
			if rep.Found != wantFound || rep.Fixed != 0 {
				t.Fatalf("pass without --fix: %+v; want %d found, 0 fixed", rep, wantFound)
			}
			if wantFound == 1 {
				d := rep.First[0]
				if d.Customer.CustomerID.String() != victim || fmt.Sprint(d.Kinds) != fmt.Sprint(tc.want) {
					t.Fatalf("difference %s; want customer %s with %v", d, victim, tc.want)
				}
			}
			again := reconcileOf(t, s, false)
			if again.Found != wantFound {
				t.Fatalf("a pass without --fix changed something: second pass %+v", again)
			}

			fixed := reconcileOf(t, s, true)
			if fixed.Found != wantFound || fixed.Fixed != wantFound || fixed.Remaining() != 0 {
				t.Fatalf("pass with --fix: %+v; want %d found and fixed", fixed, wantFound)
			}
			if after := reconcileOf(t, s, false); after.Found != 0 {
				t.Fatalf("pass after --fix: %+v; want 0 differences: %v", after, after.First)
			}
			for _, c := range custs {
				if bal, sum := a.balance(c), ledgerSum(a, c); bal != sum {
					t.Fatalf("customer %s: API balance %d, ledger sum %d", c, bal, sum)
				}
			}
			// The reloaded account takes writes again, and they persist.
			r := a.post("/v1/customers/"+victim+"/credits/adjust", map[string]any{"delta": -1, "source": "manual", "reason": "after"})
			wantStatus(t, r, 200, "adjust after reconcile")
			s.Drain()
			if after := reconcileOf(t, s, false); after.Found != 0 {
				t.Fatalf("pass after a write on the reloaded account: %v", after.First)
			}
		})
	}
}
