package lua

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

func TestConnectedReplicas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		info string
		want int64
	}{
		{"# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=x\r\n", 2},
		{"# Replication\r\nrole:master\r\nconnected_slaves:0\r\n", 0},
		{"", 0},
		{"connected_slaves:x\r\n", 0},
	} {
		if got := connectedReplicas(tc.info); got != tc.want {
			t.Errorf("connectedReplicas(%q) = %d, want %d", tc.info, got, tc.want)
		}
	}
}

// replicated is a private master with one online replica.
func replicated(t testing.TB) (*redis.Client, *testenv.RedisServer) {
	master := testenv.StartRedisServer(t)
	replica := testenv.StartRedisReplica(t, master)
	rdb := redis.NewClient(&redis.Options{Addr: master.Addr, PoolSize: 64})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb, replica
}

// TestReplicaAcks: a money operation whose WAIT falls short (2 replicas
// wanted, 1 exists) applies on the master but answers ErrNotReplicated,
// grants of a batch included; the retry of its key where the wait can
// succeed replays the same Mutation, acknowledged, and moves nothing again;
// auto mode waits for the one replica and off never waits.
func TestReplicaAcks(t *testing.T) {
	t.Parallel()
	rdb, replica := replicated(t)
	ctx := context.Background()
	prefix := "ra" + testenv.RandomSuffix()
	short := bundle{store: NewStore(rdb, prefix).WithReplicaAcks(2, 5*time.Millisecond), rdb: rdb, real: true}
	one := bundle{store: NewStore(rdb, prefix).WithReplicaAcks(1, time.Second), rdb: rdb, real: true}
	auto := NewStore(rdb, prefix).WithReplicaAcks(ReplicaAcksAuto, 0)

	c, _ := one.funded(t)
	cmd := consumeCmd(c, 3, perUnitTerms(10), engine.OveragePolicyBlock, t0)
	cmd.IdempotencyKey, cmd.RequestHash = "k1", "h1"
	if _, err := short.store.Consume(ctx, cmd); !errors.Is(err, engine.ErrNotReplicated) {
		t.Fatalf("consume short of replicas: %v, want ErrNotReplicated", err)
	}
	if a := one.snapshot(t, c, t0); a.Balance != 70 {
		t.Fatalf("balance %d after the unacknowledged consume, want 70 (applied on the master)", a.Balance)
	}
	res, err := one.store.Consume(ctx, cmd)
	if err != nil || !res.Replayed || res.Mutation.OpID != cmd.OpID {
		t.Fatalf("retry: %+v %v, want the replayed Mutation", res, err)
	}
	// A replay is acknowledged through a fresh write, not this
	// connection's old ones: with the replica stalled it is refused.
	replica.Pause()
	stalled := NewStore(rdb, prefix).WithReplicaAcks(1, 20*time.Millisecond)
	if _, err := stalled.Consume(ctx, cmd); !errors.Is(err, engine.ErrNotReplicated) {
		t.Fatalf("replay with the replica stalled: %v, want ErrNotReplicated", err)
	}
	replica.Resume()

	g := grantCmd(c, 5, t0)
	g.IdempotencyKey, g.RequestHash = "g1", "h2"
	if errs := short.store.GrantBatch(ctx, []engine.GrantCommand{g}); !errors.Is(errs[0], engine.ErrNotReplicated) {
		t.Fatalf("grant batch short of replicas: %v", errs)
	}
	if errs := one.store.GrantBatch(ctx, []engine.GrantCommand{g}); errs[0] != nil {
		t.Fatalf("grant batch retry: %v", errs)
	}

	cmd2 := consumeCmd(c, 1, perUnitTerms(10), engine.OveragePolicyBlock, t0)
	if res, err := auto.Consume(ctx, cmd2); err != nil || res.Mutation.OpID != cmd2.OpID {
		t.Fatalf("auto consume: %+v %v", res, err)
	}
	if n := auto.replicasOf(ctx, rdb); n != 1 {
		t.Fatalf("auto mode saw %d replicas, want 1", n)
	}
	if a := one.snapshot(t, c, t0); a.Balance != 65 {
		t.Fatalf("balance %d, want 65 (70 + 5 - 10)", a.Balance)
	}
}

// TestReplicaAckCost measures consume on a private master + replica with
// the wait off and on (REPLICA_ACK_COST=yes for 16 workers, =n for n; it
// prints, it does not assert).
func TestReplicaAckCost(t *testing.T) {
	if os.Getenv("REPLICA_ACK_COST") == "" {
		t.Skip("set REPLICA_ACK_COST=1 to measure")
	}
	rdb, _ := replicated(t)
	const dur = 5 * time.Second
	workers := 16
	if n, err := strconv.Atoi(os.Getenv("REPLICA_ACK_COST")); err == nil && n > 0 {
		workers = n // REPLICA_ACK_COST=n: n workers
	}
	for _, mode := range []struct {
		name string
		acks int
	}{{"off", 0}, {"acks=1", 1}, {"off", 0}, {"acks=1", 1}} {
		prefix := "rc" + testenv.RandomSuffix()
		b := bundle{store: NewStore(rdb, prefix).WithReplicaAcks(mode.acks, 0), rdb: rdb, real: true}
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		end := time.Now().Add(dur)
		for w := 0; w < workers; w++ {
			c := newCustomer()
			b.known(t, c)
			g := grantCmd(c, 1<<40, t0.Add(-time.Minute))
			b.grant(t, g)
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []time.Duration
				for i := 0; time.Now().Before(end); i++ {
					cmd := consumeCmd(c, 1, perUnitTerms(1), engine.OveragePolicyBlock, t0)
					cmd.IdempotencyKey, cmd.RequestHash = fmt.Sprint("k", i), "h"
					start := time.Now()
					if _, err := b.store.Consume(context.Background(), cmd); err != nil {
						t.Error(err)
						return
					}
					mine = append(mine, time.Since(start))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			}()
		}
		wg.Wait()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		q := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))].Round(time.Microsecond) }
		t.Logf("%-7s %d workers: %6.0f consumes/s, p50 %v p99 %v max %v", mode.name, workers,
			float64(len(lat))/dur.Seconds(), q(0.5), q(0.99), lat[len(lat)-1].Round(time.Microsecond))
	}
}

// TestReplicaGoneStillWaited: auto mode, once it saw a master with a
// replica, keeps waiting for one when the replica stalls (its link silent)
// and when it is gone (the master counts 0 connected): a money operation
// then answers ErrNotReplicated, never an acknowledgement a failover of
// that master could take back. A retry once the replica is back replays.
func TestReplicaGoneStillWaited(t *testing.T) {
	t.Parallel()
	rdb, replica := replicated(t)
	ctx := context.Background()
	prefix := "rs" + testenv.RandomSuffix()
	// Funded with a patient wait (a loaded box can take 30 ms to ack);
	// measured with a short one.
	funding := bundle{store: NewStore(rdb, prefix).WithReplicaAcks(ReplicaAcksAuto, 2*time.Second), rdb: rdb, real: true}
	c, _ := funding.funded(t)
	auto := bundle{store: NewStore(rdb, prefix).WithReplicaAcks(ReplicaAcksAuto, 30*time.Millisecond), rdb: rdb, real: true}
	if n := auto.store.replicasOf(ctx, rdb); n != 1 {
		t.Fatalf("auto mode saw %d replicas, want 1", n)
	}
	replica.Pause()
	cmd := consumeCmd(c, 1, perUnitTerms(10), engine.OveragePolicyBlock, t0)
	cmd.IdempotencyKey, cmd.RequestHash = "stall-1", "h"
	if _, err := auto.store.Consume(ctx, cmd); !errors.Is(err, engine.ErrNotReplicated) {
		replica.Resume()
		t.Fatalf("consume with the replica stalled: %v, want ErrNotReplicated", err)
	}
	replica.Resume()
	var res engine.MutationResult
	var err error
	for i := 0; i < 50; i++ { // the replica catches up first
		if res, err = auto.store.Consume(ctx, cmd); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || !res.Replayed {
		t.Fatalf("retry after the replica came back: %+v %v, want the acknowledged replay", res, err)
	}
	// The replica gone (the master counts 0 connected, as a master just
	// promoted does): auto mode, having seen one, still waits for it.
	replica.Kill()
	for deadline := time.Now().Add(5 * time.Second); ; {
		info := rdb.Info(ctx, "replication").Val()
		if strings.Contains(info, "connected_slaves:0") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the master still counts the killed replica: %s", info)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(replicaCountTTL + 100*time.Millisecond)
	auto.store.replicasOf(ctx, rdb) // the background refresh of the count
	time.Sleep(100 * time.Millisecond)
	cmd2 := consumeCmd(c, 1, perUnitTerms(10), engine.OveragePolicyBlock, t0)
	cmd2.IdempotencyKey, cmd2.RequestHash = "gone-1", "h"
	if _, err := auto.store.Consume(ctx, cmd2); !errors.Is(err, engine.ErrNotReplicated) {
		t.Fatalf("consume with the replica gone (count %d): %v, want ErrNotReplicated", auto.store.replicasOf(ctx, rdb), err)
	}
}

// TestRefreshKeepsCountWithoutAnswer: a look at the replica count that gets
// no answer (a timeout, a dropped connection) changes nothing: a master
// seen with a replica keeps counting one, so money operations keep waiting
// for it and the persister keeps holding back what it lacks; a first look
// without an answer counts one and asks again on the next call. A server
// that answers INFO with an error (miniredis) counts none.
func TestRefreshKeepsCountWithoutAnswer(t *testing.T) {
	t.Parallel()
	rdb, _ := replicated(t)
	ctx := context.Background()
	auto := NewStore(rdb, "rk"+testenv.RandomSuffix()).WithReplicaAcks(ReplicaAcksAuto, 0)
	for deadline := time.Now().Add(10 * time.Second); auto.replicasOf(ctx, rdb) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("auto mode never saw the replica")
		}
		time.Sleep(replicaCountTTL)
	}
	v, _ := auto.acks.counts.Load(rdb)
	rc := v.(*replicaCount)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	rc.busy.Store(true)
	rc.refresh(gone, rdb)
	if n, had := rc.n.Load(), rc.had.Load(); n != 1 || !had {
		t.Fatalf("after a look without an answer: count %d, had %v; want 1, true", n, had)
	}

	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { _ = dead.Close() })
	first := NewStore(dead, "rk"+testenv.RandomSuffix()).WithReplicaAcks(ReplicaAcksAuto, 0)
	if n := first.replicasOf(ctx, dead); n != 1 {
		t.Fatalf("first look without an answer counted %d, want 1", n)
	}
	v, _ = first.acks.counts.Load(dead)
	if checked := v.(*replicaCount).checked.Load(); checked != 0 {
		t.Fatalf("first look without an answer marked the count checked (%d): the next call would not ask again", checked)
	}

	mini := miniredis.RunT(t)
	mrdb := redis.NewClient(&redis.Options{Addr: mini.Addr()})
	t.Cleanup(func() { _ = mrdb.Close() })
	if n := NewStore(mrdb, "rk").WithReplicaAcks(ReplicaAcksAuto, 0).replicasOf(ctx, mrdb); n != 0 {
		t.Fatalf("a server refusing INFO replication counted %d, want 0", n)
	}
}

// TestFirstLooksWaitForTheCount: the first money calls a process makes to
// a master with a replica, all at once, each count the replica: none is
// answered from a count not yet read (which acknowledged alone).
func TestFirstLooksWaitForTheCount(t *testing.T) {
	t.Parallel()
	rdb, _ := replicated(t)
	ctx := context.Background()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(rdb.Info(ctx, "replication").Val(), "connected_slaves:1"); {
		if time.Now().After(deadline) {
			t.Fatal("the replica never connected")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for round := 0; round < 5; round++ {
		fresh := NewStore(rdb, "fl"+testenv.RandomSuffix()).WithReplicaAcks(ReplicaAcksAuto, 0)
		var wg sync.WaitGroup
		counts := make([]int, 32)
		for i := range counts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				counts[i] = fresh.replicasOf(ctx, rdb)
			}()
		}
		wg.Wait()
		for i, n := range counts {
			if n != 1 {
				t.Fatalf("round %d: first call %d counted %d replicas, want 1", round, i, n)
			}
		}
	}
}

// TestUsageClaimsWaitForReplicas: with replica acks on, a usage event id
// claim is held only once it reached the replicas (ackClaims), as a money
// script's answer is: short of replicas the claim fails with
// ErrNotReplicated (the event's retryable answer) and the retry, which
// finds the claim its own, goes on once they have it. A look, and a claim
// another customer holds, wrote nothing and wait for nothing.
func TestUsageClaimsWaitForReplicas(t *testing.T) {
	t.Parallel()
	rdb, replica := replicated(t)
	ctx := context.Background()
	prefix := "ru" + testenv.RandomSuffix()
	one := NewStore(rdb, prefix).WithReplicaAcks(1, 2*time.Second)
	short := NewStore(rdb, prefix).WithReplicaAcks(2, 5*time.Millisecond)
	tenant, a, b := uuid.New(), uuid.New(), uuid.New()
	live := engine.EnvironmentLive
	type want struct {
		err          error
		fresh, other bool
	}
	steps := []struct {
		name  string
		store *Store
		claim engine.UsageClaim
		pause bool // the replica stalled meanwhile
		want  want
	}{
		{"short of replicas", short, engine.UsageClaim{EventID: "e1", Customer: a}, false, want{err: engine.ErrNotReplicated}},
		{"the retry finds its own claim", one, engine.UsageClaim{EventID: "e1", Customer: a}, false, want{}},
		{"a fresh claim on the replica", one, engine.UsageClaim{EventID: "e2", Customer: a}, false, want{fresh: true}},
		{"another customer's claim waits for nothing", short, engine.UsageClaim{EventID: "e2", Customer: b}, false, want{other: true}},
		{"a look waits for nothing", short, engine.UsageClaim{EventID: "e3", LookOnly: true}, false, want{}},
		{"the replica stalled", one, engine.UsageClaim{EventID: "e4", Customer: b}, true, want{err: engine.ErrNotReplicated}},
	}
	for _, st := range steps {
		s := st.store
		if st.pause {
			replica.Pause()
			s = NewStore(rdb, prefix).WithReplicaAcks(1, 20*time.Millisecond)
		}
		holds, errs := s.UsageIDsClaim(ctx, tenant, live, []engine.UsageClaim{st.claim})
		if st.pause {
			replica.Resume()
		}
		if !errors.Is(errs[0], st.want.err) || (st.want.err == nil && errs[0] != nil) {
			t.Fatalf("%s: error %v, want %v", st.name, errs[0], st.want.err)
		}
		if st.want.err == nil && (holds[0].Fresh != st.want.fresh || holds[0].Other != st.want.other) {
			t.Errorf("%s: hold %+v, want fresh %v, other %v", st.name, holds[0], st.want.fresh, st.want.other)
		}
	}
}
