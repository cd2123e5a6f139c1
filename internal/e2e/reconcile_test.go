package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

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

// wantReconciled lets s's persister drain, then fails t when reconcile
// finds Redis and Postgres apart; when names the moment ("after the race").
func wantReconciled(t *testing.T, s *Stack, when string) {
	t.Helper()
	s.Drain()
	if rep := reconcileOf(t, s, false); rep.Found != 0 {
		t.Errorf("reconcile %s: %d differences: %+v", when, rep.Found, rep.First)
	}
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
						if err := s.Redis.HSet(ctx, key, f, withRemaining(t, v, rem-1)).Err(); err != nil {
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

// TestPersisterRefusesForkedHistory protects invariants 1 and 14 on the
// write path. An op L is persisted, then Redis loses it (the account hash
// restored from a DUMP taken before L, as a promoted replica that never got
// L), and the forked Redis runs ops at versions Postgres already holds from
// L. The persister must not take them as they are: Postgres keeps L's
// history, each forked op becomes a dead letter with SQLSTATE 23F01, the
// account is reloaded from Postgres and each forked op, acknowledged, is
// applied again on it (issue 25) and its dead letter resolved as repaired;
// the next op applies on Postgres' state and persists. A reconcile pass
// then finds 0 differences and the API balance equals the ledger sum.
// TestPersisterRepairsForkedHistory covers the repair itself.
func TestPersisterRefusesForkedHistory(t *testing.T) {
	t.Parallel()
	s := NewStack(t, SingleNode()) // one persister's counters, fences and repairs
	tn := s.NewTenant("fork")
	a := s.as(t, tn.Live)
	ctx := context.Background()
	adjust := func(c string, delta int64, reason string) {
		t.Helper()
		r := a.post("/v1/customers/"+c+"/credits/adjust", map[string]any{"delta": delta, "source": "manual", "reason": reason})
		wantStatus(t, r, 200, "adjust "+reason)
	}
	for _, tc := range []struct {
		name   string
		lost   []int64 // deltas of the ops persisted, then lost from Redis
		forked []int64 // deltas of the ops the forked Redis runs
	}{
		{"one op lost, one forked op", []int64{-300}, []int64{-100}},
		{"one op lost, three forked ops", []int64{-300}, []int64{-100, -10, 5}},
		// The first forked op is below Postgres' version: told from a late
		// delivery by its outbox entry, appended after the stored op's.
		{"two ops lost, one forked op", []int64{-200, -100}, []int64{-100}},
		{"three ops lost, two forked ops", []int64{-100, -100, -100}, []int64{-100, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := a.newCustomer()
			a.grant(c, map[string]any{"credits": 1000})
			s.Drain()
			key := accountKeyOf(s, c)
			dump, err := s.Redis.Dump(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			for i, d := range tc.lost {
				adjust(c, d, fmt.Sprintf("L%d", i))
			}
			s.Drain()
			if err := s.Redis.RestoreReplace(ctx, key, 0, dump).Err(); err != nil {
				t.Fatal(err)
			}
			forked := int64(0)
			for i, d := range tc.forked {
				adjust(c, d, fmt.Sprintf("forked %d", i))
				forked += d
			}
			settleForks(t, s, c)

			// Postgres kept L's history and took each forked op once, as
			// its repair on that history: state and ledger agree.
			var balance int64
			if err := s.Pool.QueryRow(ctx, `SELECT balance FROM credit_accounts WHERE customer_id = $1`, c).Scan(&balance); err != nil {
				t.Fatal(err)
			}
			var forkedOps, letters, repaired int64
			if err := s.Pool.QueryRow(ctx, `SELECT count(DISTINCT op_id) FROM ledger_entries WHERE customer_id = $1 AND reason LIKE 'forked%'`,
				c).Scan(&forkedOps); err != nil {
				t.Fatal(err)
			}
			if err := s.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE sqlstate = '23F01'),
					count(*) FILTER (WHERE resolution LIKE 'repaired: %')
				FROM outbox_dead_letters WHERE customer_id = $1`, c).Scan(&letters, &repaired); err != nil {
				t.Fatal(err)
			}
			want := 700 + forked
			if forkedOps != int64(len(tc.forked)) || balance != want {
				t.Fatalf("postgres: balance %d (want %d), %d forked ops in the ledger (want %d, each once)", balance, want,
					forkedOps, len(tc.forked))
			}
			if letters < 1 || repaired < letters {
				t.Fatalf("%d fork dead letters, %d repaired; want at least 1, all repaired", letters, repaired)
			}
			if got := a.balance(c); got != want {
				t.Fatalf("API balance %d after the fork was repaired, want %d", got, want)
			}

			// The reloaded account takes writes, and they persist.
			adjust(c, -50, "after")
			s.Drain()
			if got, sum := a.balance(c), ledgerSum(a, c); got != want-50 || sum != want-50 {
				t.Fatalf("after the fence: API balance %d, ledger sum %d; want %d", got, sum, want-50)
			}
			if rep := reconcileOf(t, s, false); rep.Found != 0 {
				t.Fatalf("reconcile after the fence: %v", rep.First)
			}
		})
	}
}

// TestReconcileCleanAfterMixedWorkload: after grants (one expiring, one
// starting later), consumes, negative adjusts, reservations committed,
// released and left active, and a consume refused for want of credit, the
// persister's drain leaves Redis and Postgres equal for every customer
// (invariant 1 in both stores): a reconcile pass finds 0 differences.
func TestReconcileCleanAfterMixedWorkload(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	tn := s.NewTenant("reconcile-mixed")
	a := s.as(t, tn.Live)
	metric := a.perUnit(7)
	now := time.Now().UTC()
	for i := 0; i < 5; i++ {
		c, _ := a.newCustomer()
		a.grant(c, map[string]any{"credits": 1000 + i, "priority": 5})
		a.grant(c, map[string]any{"credits": 300, "expires_at": now.Add(time.Hour).Format(time.RFC3339Nano)})
		a.grant(c, map[string]any{"credits": 200, "starts_at": now.Add(time.Hour).Format(time.RFC3339Nano)})
		for j := 0; j < 3; j++ {
			r := a.post("/v1/entitlements/consume", map[string]any{"customer_id": c, "billable_metric_key": metric, "units": 10 + j})
			wantStatus(t, r, 200, "consume")
		}
		wantStatus(t, a.post("/v1/customers/"+c+"/credits/adjust", map[string]any{"delta": -40, "source": "manual", "reason": "fee"}),
			200, "adjust")
		for j, end := range []string{"commit", "release", ""} {
			h := a.reserve(map[string]any{"customer_id": c, "billable_metric_key": metric, "estimated_units": 5 + j})
			hid := h["id"].(string)
			switch end {
			case "commit":
				wantStatus(t, a.post("/v1/reservations/"+hid+"/commit", map[string]any{"actual_units": 4}), 200, "commit")
			case "release":
				wantStatus(t, a.post("/v1/reservations/"+hid+"/release", nil), 200, "release")
			}
		}
		r := a.post("/v1/entitlements/consume", map[string]any{"customer_id": c, "billable_metric_key": metric, "units": 1_000_000})
		checkProblem(t, r, 409, "insufficient-credits", "", "refused consume")
	}
	s.Drain()
	rep := reconcileOf(t, s, false)
	if rep.Checked != 5 || rep.Found != 0 || rep.NotLoaded != 0 {
		t.Fatalf("reconcile after a mixed workload: %+v %v", rep, rep.First)
	}
}
