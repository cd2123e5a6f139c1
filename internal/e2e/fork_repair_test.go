package e2e

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/persist"
)

// forkedOp is one acknowledged request a forked Redis runs: its tag is in
// the entry's reason (adjust, grant) or metadata (consume), which a repair
// carries over, so the ledger can be searched for it.
type forkedOp struct {
	kind  string // "adjust", "grant", "consume" or "commit"
	delta int64  // adjust and grant: the amount; consume: units
}

// TestPersisterRepairsForkedHistory protects invariants 1, 3 and 14 when a
// fork does happen (issue 25: "under faults a fork is repaired from the
// ledger, never silently dropped, and no acknowledged operation goes
// missing"). Op L is persisted, then Redis loses it (the account hash
// restored from a DUMP taken before L), and the forked Redis acknowledges
// one to three ops at versions Postgres holds from L. Postgres refuses
// them (SQLSTATE 23F01), the persister fences the fork, reloads Redis and
// applies each forked op again on the true state. Afterwards: no fork dead
// letter is left unresolved (each is resolved as repaired), each forked
// op's effect is in the ledger exactly once, balance = sum of ledger
// deltas = sum of blocks' remaining (Postgres and the API), a forked
// commit settles the reservation the true state still has, what the true state
// could not pay is overage (a consume's under its metric, a debit's
// under engine.ForkShortfallMetric), and running the repair again (the
// letters unresolved as after a crash before their resolution) changes
// nothing.
func TestPersisterRepairsForkedHistory(t *testing.T) {
	t.Parallel()
	s := NewStack(t, SingleNode()) // one persister: its fences and repairs
	tn := s.NewTenant("fork-repair")
	a := s.as(t, tn.Live)
	ctx := context.Background()
	metric := a.perUnit(100)
	for _, tc := range []struct {
		name        string
		reservation bool  // a reservation of 5 units persisted before L, for a forked "commit"
		lost        int64 // the adjust persisted, then lost from Redis
		forked      []forkedOp
		// want is the balance once the forked ops are repaired; overage
		// the overage by metric ("" for the consume's metric).
		want    int64
		overage map[string]int64
	}{
		{name: "one acknowledged consume", lost: -300, forked: []forkedOp{{"consume", 1}},
			want: 600, overage: map[string]int64{}},
		{name: "a consume and a grant", lost: -300, forked: []forkedOp{{"consume", 2}, {"grant", 500}},
			want: 1000, overage: map[string]int64{}},
		// The reservation was persisted before L, so the true state has it: the
		// forked commit settles it again.
		{name: "a commit of a reservation both histories have", reservation: true, lost: -300, forked: []forkedOp{{"commit", 3}},
			want: 400, overage: map[string]int64{}},
		// The first forked op runs on the forked state whatever the
		// persister does; the later ones may run on the reloaded state if
		// the fence comes first, and end the same way (allow).
		{name: "credit gone: shortfalls", lost: -980, forked: []forkedOp{{"adjust", -50}, {"consume", 5}, {"grant", 30}},
			want: 30, overage: map[string]int64{engine.ForkShortfallMetric: 30, "": 500}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := str(t, a.createCustomer(map[string]any{"external_id": uniq("fork"), "overage_policy": "allow"})["id"], "id")
			a.grant(c, map[string]any{"credits": 1000})
			var reservation string
			if tc.reservation {
				reservation = str(t, a.reserve(map[string]any{"customer_id": c, "billable_metric_key": metric, "estimated_units": 5})["id"], "reservation id")
			}
			s.Drain()
			key := accountKeyOf(s, c)
			dump, err := s.Redis.Dump(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			wantStatus(t, a.post("/v1/customers/"+c+"/credits/adjust", map[string]any{"delta": tc.lost, "source": "manual", "reason": "L"}),
				200, "adjust L")
			s.Drain()
			if err := s.Redis.RestoreReplace(ctx, key, 0, dump).Err(); err != nil {
				t.Fatal(err)
			}
			for i, op := range tc.forked {
				tag := fmt.Sprintf("forked %d", i)
				switch op.kind {
				case "adjust":
					wantStatus(t, a.post("/v1/customers/"+c+"/credits/adjust", map[string]any{"delta": op.delta, "source": "manual", "reason": tag}),
						200, tag)
				case "grant":
					a.grant(c, map[string]any{"credits": op.delta, "reason": tag})
				case "commit":
					wantStatus(t, a.post("/v1/reservations/"+reservation+"/commit", map[string]any{"actual_units": op.delta,
						"metadata": map[string]any{"tag": tag}}), 200, tag)
				case "consume":
					wantStatus(t, a.post("/v1/entitlements/consume", map[string]any{"customer_id": c, "billable_metric_key": metric,
						"units": op.delta, "metadata": map[string]any{"tag": tag}}), 200, tag)
				}
			}
			settleForks(t, s, c)

			books := forkBooks(t, s, a, c, tc.want)
			for i, op := range tc.forked {
				tag := fmt.Sprintf("forked %d", i)
				var ops int64
				q := `SELECT count(DISTINCT op_id) FROM ledger_entries
					WHERE customer_id = $1 AND (reason = $2 OR metadata->>'tag' = $2 OR metadata->>'fork_repair_reason' = $2)`
				args := []any{c, tag}
				if op.kind == "commit" {
					// A commit's metadata goes to its reservation; its entry names the reservation.
					q = `SELECT count(DISTINCT op_id) FROM ledger_entries
						WHERE customer_id = $1 AND type = 'consumption' AND reference_id = $2`
					args = []any{c, reservation}
				}
				if err := s.Pool.QueryRow(ctx, q, args...).Scan(&ops); err != nil {
					t.Fatal(err)
				}
				if ops != 1 {
					t.Errorf("%s: in the ledger %d times, want exactly once", tag, ops)
				}
			}
			var letters, repaired int64
			if err := s.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE resolution LIKE 'repaired: %')
				FROM outbox_dead_letters WHERE customer_id = $1`, c).Scan(&letters, &repaired); err != nil {
				t.Fatal(err)
			}
			if letters == 0 || repaired != letters {
				t.Fatalf("%d dead letters, %d resolved as repaired; want the fork refused and every letter repaired", letters, repaired)
			}
			// The forked op's own entries never reach the ledger: each is
			// there through its repair op only.
			// A letter can read as resolved before its repair op's entries
			// are in the ledger (a make test run counted fewer repairs than letters
			// between the two): wait for them, draining, up to 10 s.
			// A repair op can itself be refused as a fork (a second fence
			// reloaded Redis before it was persisted) and repaired in turn:
			// its letter's repair stands for both, so such a letter's own
			// repair is not in the ledger (chained).
			own, byRepair, chained := forkOpsInLedger(t, s, c)
			for wait := time.Now().Add(10 * time.Second); own == 0 && byRepair < letters-noopLetters(t, s, c)-chained && time.Now().Before(wait); {
				time.Sleep(100 * time.Millisecond)
				s.Drain()
				own, byRepair, chained = forkOpsInLedger(t, s, c)
			}
			if own != 0 || byRepair != letters-noopLetters(t, s, c)-chained {
				t.Errorf("ledger ops: %d of the forked ops themselves (want 0), %d repairs (want one per letter that moved money); letters:\n%s",
					own, byRepair, lettersOf(t, s, c))
			}

			var reserved int64
			if err := s.Pool.QueryRow(ctx, `SELECT reserved_balance FROM credit_accounts WHERE customer_id = $1`, c).Scan(&reserved); err != nil {
				t.Fatal(err)
			}
			if reserved != 0 {
				t.Errorf("reserved %d after the repair, want 0 (a forked commit settles the reservation the true state has)", reserved)
			}

			list, _, err := persist.NewStore(s.Pool).ListRepairedForks(ctx, persist.MaxDeadLetterList)
			if err != nil {
				t.Fatal(err)
			}
			listed := int64(0)
			for _, r := range list {
				if r.CustomerID != nil && r.CustomerID.String() == c && r.Resolution != nil {
					listed++
				}
			}
			if listed != letters {
				t.Errorf("deadletters list --repaired shows %d of the customer's %d repaired letters", listed, letters)
			}

			got := overageOf(t, a, c)
			want := map[string]int64{}
			for k, v := range tc.overage {
				if k == "" {
					k = metric
				}
				want[k] = v
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("overage %v, want %v", got, want)
			}

			// A crash after the scripts and before the resolution: the
			// letters come back unresolved and the next pass replays each
			// repair by its key instead of applying it again.
			if _, err := s.Pool.Exec(ctx, `UPDATE outbox_dead_letters SET resolved_at = NULL, resolution = NULL
				WHERE customer_id = $1`, c); err != nil {
				t.Fatal(err)
			}
			settleForks(t, s, c)
			if again := forkBooks(t, s, a, c, tc.want); again != books {
				t.Fatalf("a second repair changed the books: %+v, first %+v", again, books)
			}
			if got := overageOf(t, a, c); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("overage after the second repair %v, want %v", got, want)
			}
		})
	}
}

// settleForks waits (bounded) until customer c has no unresolved dead
// letter and the outbox is drained: repairs run in the persister, at the
// refusal and at each reservation refresh (1 s).
func settleForks(t *testing.T, s *Stack, c string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		s.Drain()
		var n int64
		if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_dead_letters
			WHERE customer_id = $1 AND resolved_at IS NULL`, c).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			s.Drain()
			return
		}
		if time.Now().After(deadline) {
			var why string
			_ = s.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(coalesce(retry_error, error), '; '), '')
				FROM outbox_dead_letters WHERE customer_id = $1 AND resolved_at IS NULL`, c).Scan(&why)
			t.Fatalf("%d dead letters of customer %s left unrepaired: %s", n, c, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ledgerBooks are one customer's books in Postgres.
type ledgerBooks struct {
	balance, ledger, remaining, entries int64
}

// forkBooks checks invariant 1 for c in Postgres and through the API and
// that the balance is want; it returns the books.
func forkBooks(t *testing.T, s *Stack, a api, c string, want int64) ledgerBooks {
	t.Helper()
	var b ledgerBooks
	if err := s.Pool.QueryRow(context.Background(), `SELECT
			(SELECT balance FROM credit_accounts WHERE customer_id = $1),
			(SELECT coalesce(sum(delta), 0) FROM ledger_entries WHERE customer_id = $1),
			(SELECT coalesce(sum(remaining_amount), 0) FROM credit_blocks WHERE customer_id = $1),
			(SELECT count(*) FROM ledger_entries WHERE customer_id = $1)`, c).Scan(&b.balance, &b.ledger, &b.remaining, &b.entries); err != nil {
		t.Fatal(err)
	}
	if b.balance != want || b.ledger != want || b.remaining != want {
		t.Fatalf("postgres: balance %d, ledger sum %d, blocks' remaining %d; want all %d", b.balance, b.ledger, b.remaining, want)
	}
	if got, sum := a.balance(c), ledgerSum(a, c); got != want || sum != want {
		t.Fatalf("API: balance %d, ledger sum %d; want %d", got, sum, want)
	}
	if rep := reconcileOf(t, s, false); rep.Found != 0 {
		t.Fatalf("reconcile after the repair: %v", rep.First)
	}
	return b
}

// forkOpsInLedger counts the ledger ops of c that are a dead-lettered op
// itself, those that are its repair (engine.ForkRepairOpID), and the
// letters whose repair op was dead-lettered in turn.
func forkOpsInLedger(t *testing.T, s *Stack, c string) (own, repairs, chained int64) {
	t.Helper()
	ctx := context.Background()
	rows, err := s.Pool.Query(ctx, `SELECT op_id FROM outbox_dead_letters WHERE customer_id = $1`, c)
	if err != nil {
		t.Fatal(err)
	}
	var forked, derived []uuid.UUID
	for rows.Next() {
		var id uuid.UUID
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		forked = append(forked, id)
		derived = append(derived, engine.ForkRepairOpID(id))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	lettered := map[uuid.UUID]bool{}
	for _, id := range forked {
		lettered[id] = true
	}
	for _, id := range derived {
		if lettered[id] {
			chained++
		}
	}
	if err := s.Pool.QueryRow(ctx, `SELECT count(DISTINCT op_id) FILTER (WHERE op_id = ANY($2)),
			count(DISTINCT op_id) FILTER (WHERE op_id = ANY($3))
		FROM ledger_entries WHERE customer_id = $1`, c, forked, derived).Scan(&own, &repairs); err != nil {
		t.Fatal(err)
	}
	return own, repairs, chained
}

// lettersOf lists c's dead letters, one per line, for a failure message.
func lettersOf(t *testing.T, s *Stack, c string) string {
	t.Helper()
	var out string
	if err := s.Pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('%s op %s %s v%s sqlstate %s held_by %s entry %s: %s',
			id, op_id, kind, account_version, sqlstate, held_by, entry_id, resolution), E'\n' ORDER BY id), '')
		FROM outbox_dead_letters WHERE customer_id = $1`, c).Scan(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// noopLetters counts c's dead letters whose repair moved no money.
func noopLetters(t *testing.T, s *Stack, c string) int64 {
	t.Helper()
	var n int64
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_dead_letters
		WHERE customer_id = $1 AND resolution LIKE 'repaired: nothing to re-apply%'`, c).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// overageOf is c's overage report by metric, over all time.
func overageOf(t *testing.T, a api, c string) map[string]int64 {
	t.Helper()
	now := time.Now().UTC()
	r := a.get("/v1/customers/" + c + "/overage?from=" + url.QueryEscape(now.Add(-time.Hour).Format(time.RFC3339)) +
		"&to=" + url.QueryEscape(now.Add(time.Hour).Format(time.RFC3339)))
	wantStatus(t, r, 200, "overage")
	out := map[string]int64{}
	for _, l := range arr(t, r.Body["data"], "overage lines") {
		line := obj(t, l, "overage line")
		out[str(t, line["billable_metric_key"], "metric")] = Int(t, line["overage_mc"])
	}
	return out
}
