package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/internal/testenv"
)

// TestPersisterWaitsForTheReplica protects invariant 14 at its root (issue
// 11): Postgres never holds an op a failover can take from Redis. With the
// replica stalled, an adjust applies on the master (and answers 503); the
// persister reads its outbox entry but stores nothing while no replica has
// it, so a promotion of that replica could not fork the account. Once the
// replica is back the entry persists, and the books agree.
func TestPersisterWaitsForTheReplica(t *testing.T) {
	t.Parallel()
	master := testenv.StartRedisServer(t)
	replica := testenv.StartRedisReplica(t, master)
	rdb := redis.NewClient(&redis.Options{Addr: master.Addr, PoolSize: StackRedisPoolSize})
	t.Cleanup(func() { _ = rdb.Close() })
	s := NewStack(t, SingleNode(), WithRedis(rdb, "rp"+testenv.RandomSuffix()))
	tn := s.NewTenant(uniq("replicated"))
	a := s.as(t, tn.Live)
	id, _ := a.newCustomer()
	a.grant(id, map[string]any{"credits": 1_000})
	s.Drain()
	ctx := context.Background()
	entries := func() int64 {
		t.Helper()
		var n int64
		if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE customer_id = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := entries()

	replica.Pause()
	r := a.do("POST", "/v1/customers/"+id+"/credits/adjust", idemKey(), map[string]any{"delta": -300, "source": "manual", "reason": "unreplicated"})
	checkProblem(t, r, 503, "unavailable", "", "adjust with the replica stalled")
	// The persister reads a batch within its 200 ms block and would commit
	// it within its 100 ms linger: a second is ample.
	time.Sleep(time.Second)
	if n := entries(); n != before {
		t.Fatalf("%d ledger entries in postgres with the replica stalled, want %d: the unreplicated op was persisted", n, before)
	}
	if st := s.App.Persister.Stats(); st.NotReplicated == 0 {
		t.Fatalf("no batch put back for want of a replica: %+v", st)
	}

	replica.Resume()
	s.Drain()
	if n := entries(); n != before+1 {
		t.Fatalf("%d ledger entries once the replica is back, want %d", n, before+1)
	}
	if got, sum := a.balance(id), ledgerSum(a, id); got != 700 || sum != 700 {
		t.Fatalf("balance %d, ledger sum %d; want 700", got, sum)
	}
}
