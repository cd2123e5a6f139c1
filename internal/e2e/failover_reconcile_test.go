package e2e

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/internal/testenv"
)

// TestFailoverLosesNothingAndReconciles protects invariants 3, 4 and 14
// across a real promotion (issue 11): with the replica stalled, adjusts
// apply on the master and answer 503 (not acknowledged) and the persister
// stores none of them; the master and the stalled replica are killed with
// -9, the replica restarts from its AOF and is promoted (REPLICAOF NO ONE,
// the clients redialled to it), so those adjusts are gone from Redis. Retried with their keys they apply once on
// the new master. After the drain every key has exactly one op in Postgres
// (none twice), nothing was refused as a fork (no dead letter: the
// persister never stored an op the promoted replica lacked), every balance
// equals its ledger, and a reconcile pass finds 0 differences.
func TestFailoverLosesNothingAndReconciles(t *testing.T) {
	t.Parallel()
	master := testenv.StartRedisServer(t)
	// The replica keeps an AOF so it can be killed and come back with what
	// it had applied: a stalled replica resumed would still read what the
	// master sent it before dying (the kernel holds it), a killed one not.
	replica := testenv.StartRedisReplica(t, master, "--appendonly", "yes", "--appendfsync", "always")
	var addr atomic.Value
	addr.Store(master.Addr)
	dial := func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr.Load().(string))
	}
	rdb := redis.NewClient(&redis.Options{Addr: master.Addr, Dialer: dial, PoolSize: StackRedisPoolSize})
	t.Cleanup(func() { _ = rdb.Close() })
	s := NewStack(t, WithRedis(rdb, "fo"+testenv.RandomSuffix()))
	tn := s.NewTenant(uniq("failover"))
	a := s.as(t, tn.Live)
	// untilOK retries call (same key) while it is not acknowledged: on a
	// loaded machine the replica may miss the 50 ms ack timeout.
	deadline := time.Now().Add(60 * time.Second)
	untilOK := func(what string, want int, call func() Response) {
		t.Helper()
		for {
			r := call()
			if r.Status == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d %s", what, r.Status, r.Raw)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	var customers []string
	for i := 0; i < 4; i++ {
		id, _ := a.newCustomer()
		key := idemKey()
		untilOK("grant", 201, func() Response {
			return a.do("POST", "/v1/customers/"+id+"/credits/grant", key,
				map[string]any{"credits": 10_000, "source": "promotional", "reason": "seed"})
		})
		customers = append(customers, id)
	}
	s.Drain()

	type op struct{ customer, key string }
	adjust := func(o op) Response {
		r, err := TryCall(s.HTTP, s.URL, "POST", "/v1/customers/"+o.customer+"/credits/adjust",
			map[string]any{"delta": -10, "source": "manual", "reason": o.key}, "X-API-Key", tn.Live, "Idempotency-Key", o.key)
		if err != nil {
			return Response{Status: -1, Raw: []byte(err.Error())}
		}
		return r
	}
	var all []op
	next := func() op {
		o := op{customers[len(all)%len(customers)], fmt.Sprintf("fo-%d-%s", len(all), testenv.RandomSuffix())}
		all = append(all, o)
		return o
	}
	for i := 0; i < 12; i++ {
		o := next()
		untilOK("adjust with the replica up", 200, func() Response { return adjust(o) })
	}

	replica.Pause()
	var unacked []op
	for i := 0; i < 8; i++ {
		o := next()
		if r := adjust(o); r.Status != 200 {
			unacked = append(unacked, o)
		}
	}
	if len(unacked) == 0 {
		t.Fatal("every adjust was acknowledged with the replica stalled")
	}
	time.Sleep(500 * time.Millisecond) // the persister reads them and must not store them

	master.Kill()
	replica.Kill()
	replica.Restart()
	promoted := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer promoted.Close()
	if err := promoted.SlaveOf(context.Background(), "NO", "ONE").Err(); err != nil {
		t.Fatalf("promote the replica: %v", err)
	}
	addr.Store(replica.Addr)

	for _, o := range unacked {
		untilOK("retry after the failover", 200, func() Response { return adjust(o) })
	}
	for i := 0; i < 8; i++ {
		o := next()
		untilOK("adjust after the failover", 200, func() Response { return adjust(o) })
	}
	s.Drain()

	ctx := context.Background()
	for _, o := range all {
		var ops int64
		if err := s.Pool.QueryRow(ctx, `SELECT count(DISTINCT op_id) FROM ledger_entries WHERE customer_id = $1 AND idempotency_key = $2`,
			o.customer, o.key).Scan(&ops); err != nil {
			t.Fatal(err)
		}
		if ops != 1 {
			t.Errorf("key %s: %d ops in postgres, want exactly 1", o.key, ops)
		}
	}
	// With the persister waiting for the replica, no op the failover took
	// from Redis was in Postgres: nothing forked, nothing dead-lettered.
	var letters int64
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_letters WHERE resolved_at IS NULL`).Scan(&letters); err != nil {
		t.Fatal(err)
	}
	if letters != 0 {
		t.Errorf("%d dead letters after the failover, want 0", letters)
	}
	for _, c := range customers {
		if got, sum := a.balance(c), ledgerSum(a, c); got != sum {
			t.Errorf("customer %s: balance %d, ledger sum %d", c, got, sum)
		}
	}
	if rep := reconcileOf(t, s, false); rep.Found != 0 || rep.Checked != int64(len(customers)) {
		t.Fatalf("reconcile after the failover: %+v %v", rep, rep.First)
	}
}
