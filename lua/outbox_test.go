package lua

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// portBundle is one Redis the outbox and idempotency tests run against.
type portBundle struct {
	rdb   redis.UniversalClient
	store *Store
	// elapse lets d pass for TTLs and idle times: miniredis moves its clock,
	// real Redis (whose clock tests cannot move) sleeps.
	elapse func(d time.Duration)
}

// portBackends runs fn once on miniredis and once on the suite's real Redis
// (a cluster when TEST_REDIS_CLUSTER is set).
func portBackends(t *testing.T, fn func(t *testing.T, b portBundle)) {
	t.Run("miniredis", func(t *testing.T) {
		t.Parallel()
		m := miniredis.RunT(t)
		now := time.Now()
		m.SetTime(now)
		var mu sync.Mutex
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		fn(t, portBundle{rdb: rdb, store: NewStore(rdb, "t"+testenv.RandomSuffix()), elapse: func(d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			now = now.Add(d)
			m.SetTime(now)
			m.FastForward(d)
		}})
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rdb, prefix := testenv.Redis(t)
		fn(t, portBundle{rdb: rdb, store: NewStore(rdb, prefix), elapse: time.Sleep})
	})
}

// outboxMutation is a small Mutation whose OpID tells test entries apart.
func outboxMutation(t *testing.T) engine.Mutation {
	t.Helper()
	src := engine.Source("manual")
	block := uuid.New()
	return engine.Mutation{
		OpID:       uuid.New(),
		Kind:       engine.MutationGrant,
		TenantID:   uuid.New(),
		CustomerID: uuid.New(),
		AtMS:       time.Now().UnixMilli(),
		Account:    engine.MutationAccount{ID: uuid.NewString(), Version: 3, Balance: 1500, LifetimeEarned: 1500},
		Entries:    []engine.MutationEntry{{Role: engine.RoleMain, Delta: 1500, Type: engine.EntryType("grant"), Source: &src, BlockID: &block}},
		Blocks:     []engine.MutationBlock{{ID: block, Original: 1500, Remaining: 1500, Source: src}},
	}
}

// xadd appends m to partition p the way the money scripts do (field `m`)
// and returns the entry id; id "" lets Redis pick one.
func xadd(t *testing.T, b portBundle, p int, id string, m engine.Mutation) string {
	t.Helper()
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return xaddRaw(t, b, p, id, map[string]any{"m": string(raw)})
}

func xaddRaw(t *testing.T, b portBundle, p int, id string, values map[string]any) string {
	t.Helper()
	if id == "" {
		id = "*"
	}
	got, err := b.rdb.XAdd(context.Background(), &redis.XAddArgs{Stream: b.store.outboxKey(p), ID: id, Values: values}).Result()
	if err != nil {
		t.Fatalf("xadd: %v", err)
	}
	return got
}

func opIDs(msgs []engine.OutboxMessage) []uuid.UUID {
	out := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		out[i] = m.Mutation.OpID
	}
	return out
}

func msgIDs(msgs []engine.OutboxMessage) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func wantOps(t *testing.T, got []engine.OutboxMessage, want ...engine.Mutation) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d messages %v, want %d", len(got), opIDs(got), len(want))
	}
	for i := range want {
		if got[i].Mutation.OpID != want[i].OpID {
			t.Fatalf("message %d is op %s, want %s", i, got[i].Mutation.OpID, want[i].OpID)
		}
	}
}

func pendingCount(t *testing.T, b portBundle, p int) int64 {
	t.Helper()
	res, err := b.rdb.XPending(context.Background(), b.store.outboxKey(p), OutboxGroup).Result()
	if err != nil {
		t.Fatalf("xpending: %v", err)
	}
	return res.Count
}

// TestOutboxGroup checks that the persister group is created on every
// partition, that creating it again is harmless, and that a first Read on a
// partition nobody wrote to creates it too.
func TestOutboxGroup(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		for i := 0; i < 2; i++ {
			if err := b.store.EnsureOutboxGroups(ctx); err != nil {
				t.Fatalf("EnsureOutboxGroups round %d: %v", i, err)
			}
		}
		for _, p := range []int{0, Partitions - 1} {
			groups, err := b.rdb.XInfoGroups(ctx, b.store.outboxKey(p)).Result()
			if err != nil || len(groups) != 1 || groups[0].Name != OutboxGroup {
				t.Fatalf("partition %d groups %+v, %v", p, groups, err)
			}
		}

		other := NewStore(b.rdb, b.store.prefix+"x")
		msgs, err := other.Read(ctx, 5, "c1", 10, 0)
		if err != nil || len(msgs) != 0 {
			t.Fatalf("Read on a fresh partition = %v, %v", msgs, err)
		}
		groups, err := b.rdb.XInfoGroups(ctx, other.outboxKey(5)).Result()
		if err != nil || len(groups) != 1 {
			t.Fatalf("fresh partition groups %+v, %v", groups, err)
		}
		t.Cleanup(func() { b.rdb.Del(context.Background(), other.outboxKey(5)) })
	})
}

// TestOutboxReadAck checks that messages come back decoded and in order, and
// that Ack both acknowledges and deletes them so the stream does not grow.
func TestOutboxReadAck(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 3
		ms := []engine.Mutation{outboxMutation(t), outboxMutation(t), outboxMutation(t)}
		for _, m := range ms {
			xadd(t, b, p, "", m)
		}
		got, err := b.store.Read(ctx, p, "c1", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, got, ms...)
		if g := got[1].Mutation; g.Account != ms[1].Account || len(g.Entries) != 1 || g.Entries[0].Delta != 1500 || *g.Entries[0].BlockID != *ms[1].Entries[0].BlockID {
			t.Fatalf("mutation decoded as %+v", g)
		}
		if n := pendingCount(t, b, p); n != 3 {
			t.Fatalf("pending %d, want 3", n)
		}
		if err := b.store.Ack(ctx, p, msgIDs(got)); err != nil {
			t.Fatal(err)
		}
		if n := pendingCount(t, b, p); n != 0 {
			t.Fatalf("pending after ack %d, want 0", n)
		}
		if n := b.rdb.XLen(ctx, b.store.outboxKey(p)).Val(); n != 0 {
			t.Fatalf("stream length after ack %d, want 0", n)
		}
		if err := b.store.Ack(ctx, p, nil); err != nil {
			t.Fatalf("Ack of nothing: %v", err)
		}
		got, err = b.store.Read(ctx, p, "c1", 10, 0)
		if err != nil || len(got) != 0 {
			t.Fatalf("Read after ack = %v, %v", opIDs(got), err)
		}
	})
}

// TestOutboxReadCount checks that Read returns at most count messages and
// the rest on the next calls.
func TestOutboxReadCount(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 4
		ms := []engine.Mutation{outboxMutation(t), outboxMutation(t), outboxMutation(t)}
		for _, m := range ms {
			xadd(t, b, p, "", m)
		}
		first, err := b.store.Read(ctx, p, "c1", 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, first, ms[:2]...)
		if err := b.store.Ack(ctx, p, msgIDs(first)); err != nil {
			t.Fatal(err)
		}
		rest, err := b.store.Read(ctx, p, "c1", 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, rest, ms[2])
	})
}

// TestOutboxResumeAfterCrash checks that a consumer that read messages and
// died before acknowledging them gets exactly those back first when it
// starts again under the same name, before any new message.
func TestOutboxResumeAfterCrash(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 7
		ms := []engine.Mutation{outboxMutation(t), outboxMutation(t), outboxMutation(t)}
		for _, m := range ms {
			xadd(t, b, p, "", m)
		}
		read, err := b.store.Read(ctx, p, "creditd-1", 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, read, ms[:2]...)

		// The process dies here; a new one (a new Store) takes the same name.
		restarted := NewStore(b.rdb, b.store.prefix)
		again, err := restarted.Read(ctx, p, "creditd-1", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, again, ms[:2]...)
		if fmt.Sprint(msgIDs(again)) != fmt.Sprint(msgIDs(read)) {
			t.Fatalf("resumed ids %v, want %v", msgIDs(again), msgIDs(read))
		}
		if err := restarted.Ack(ctx, p, msgIDs(again)); err != nil {
			t.Fatal(err)
		}
		next, err := restarted.Read(ctx, p, "creditd-1", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, next, ms[2])
	})
}

// TestOutboxReadNew: ReadNew skips the consumer's pending entries (the
// persister calls it only when it acknowledged everything it was given),
// which Read still returns first.
func TestOutboxReadNew(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 9
		ms := []engine.Mutation{outboxMutation(t), outboxMutation(t), outboxMutation(t)}
		for _, m := range ms {
			xadd(t, b, p, "", m)
		}
		first, err := b.store.Read(ctx, p, "c1", 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, first, ms[0])
		fresh, err := b.store.ReadNew(ctx, p, "c1", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, fresh, ms[1:]...)
		none, err := b.store.ReadNew(ctx, p, "c1", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, none)
		pending, err := b.store.Read(ctx, p, "c1", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, pending, ms...)
		if _, err := b.store.ReadNew(ctx, p, "c1", 0, 0); err == nil {
			t.Fatal("ReadNew of 0 messages: no error")
		}
	})
}

// TestOutboxClaim checks that messages a dead consumer read are taken over by
// another only once they have been idle for minIdle.
func TestOutboxClaim(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 9
		const minIdle = 50 * time.Millisecond
		ms := []engine.Mutation{outboxMutation(t), outboxMutation(t), outboxMutation(t)}
		for _, m := range ms {
			xadd(t, b, p, "", m)
		}
		if _, err := b.store.Read(ctx, p, "dead", 3, 0); err != nil {
			t.Fatal(err)
		}
		got, err := b.store.Claim(ctx, p, "live", time.Hour, 10)
		if err != nil || len(got) != 0 {
			t.Fatalf("Claim of young messages = %v, %v", opIDs(got), err)
		}
		b.elapse(minIdle + 30*time.Millisecond)

		got, err = b.store.Claim(ctx, p, "live", minIdle, 2)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, got, ms[:2]...)
		got2, err := b.store.Claim(ctx, p, "live", minIdle, 10)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, got2, ms[2])

		res, err := b.rdb.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: b.store.outboxKey(p), Group: OutboxGroup, Start: "-", End: "+", Count: 10}).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res {
			if e.Consumer != "live" {
				t.Fatalf("entry %s still pending in %s", e.ID, e.Consumer)
			}
		}
		// The claimed messages are now live's own: a restart of live resumes them.
		mine, err := b.store.Read(ctx, p, "live", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, mine, ms...)
		if err := b.store.Ack(ctx, p, msgIDs(mine)); err != nil {
			t.Fatal(err)
		}
		got, err = b.store.Claim(ctx, p, "other", 0, 10)
		if err != nil || len(got) != 0 {
			t.Fatalf("Claim after ack = %v, %v", opIDs(got), err)
		}
	})
}

// TestOutboxNoGroupRecovery checks that Read, Claim and Ack recover when the
// stream and its group vanished (Redis flushed or restarted empty): the group
// is recreated and entries appended since are delivered.
func TestOutboxNoGroupRecovery(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 11
		old := xadd(t, b, p, "", outboxMutation(t))
		if _, err := b.store.Read(ctx, p, "c1", 10, 0); err != nil {
			t.Fatal(err)
		}
		if err := b.rdb.Del(ctx, b.store.outboxKey(p)).Err(); err != nil {
			t.Fatal(err)
		}
		if err := b.store.Ack(ctx, p, []string{old}); err != nil {
			t.Fatalf("Ack after wipe: %v", err)
		}
		b.rdb.Del(ctx, b.store.outboxKey(p))
		if got, err := b.store.Claim(ctx, p, "c1", 0, 10); err != nil || len(got) != 0 {
			t.Fatalf("Claim after wipe = %v, %v", opIDs(got), err)
		}
		b.rdb.Del(ctx, b.store.outboxKey(p))

		// A script appends to the stream again before the persister reads:
		// the stream exists without the group.
		m := outboxMutation(t)
		xadd(t, b, p, "", m)
		got, err := b.store.Read(ctx, p, "c1", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, got, m)
	})
}

// TestOutboxBacklog checks that the backlog counts read-but-unacknowledged
// and unread messages alike, and dates itself by the oldest of them.
func TestOutboxBacklog(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 13
		n, oldest, err := b.store.Backlog(ctx, p)
		if err != nil || n != 0 || oldest != 0 {
			t.Fatalf("empty backlog = %d, %d, %v", n, oldest, err)
		}
		xadd(t, b, p, "1700000000001-0", outboxMutation(t))
		xadd(t, b, p, "1700000000002-5", outboxMutation(t))
		xadd(t, b, p, "1700000000003-0", outboxMutation(t))

		check := func(wantN, wantOldest int64) {
			t.Helper()
			n, oldest, err := b.store.Backlog(ctx, p)
			if err != nil || n != wantN || oldest != wantOldest {
				t.Fatalf("backlog = %d, %d, %v; want %d, %d", n, oldest, err, wantN, wantOldest)
			}
		}
		check(3, 1700000000001)
		got, err := b.store.Read(ctx, p, "c1", 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		check(3, 1700000000001) // read but not acknowledged still counts
		if err := b.store.Ack(ctx, p, msgIDs(got[:1])); err != nil {
			t.Fatal(err)
		}
		check(2, 1700000000002)
		if err := b.store.Ack(ctx, p, []string{got[1].ID, "1700000000003-0"}); err != nil {
			t.Fatal(err)
		}
		check(0, 0)
	})
}

// TestOutboxMalformedEntry checks that an undecodable entry is reported with
// its id and stays pending until acknowledged, and that it does not wedge the
// partition: once the caller acks it the other messages come through.
func TestOutboxMalformedEntry(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 15
		m1, m2 := outboxMutation(t), outboxMutation(t)
		xadd(t, b, p, "", m1)
		bad := xaddRaw(t, b, p, "", map[string]any{"m": "{not json"})
		noField := xaddRaw(t, b, p, "", map[string]any{"x": "1"})
		xadd(t, b, p, "", m2)

		for _, id := range []string{bad, noField} {
			for round := 0; round < 2; round++ {
				_, err := b.store.Read(ctx, p, "c1", 10, 0)
				var me *MalformedEntryError
				if !errors.As(err, &me) || me.ID != id || me.Partition != p {
					t.Fatalf("round %d: Read error %v, want MalformedEntryError for %s", round, err, id)
				}
				if id == bad && string(me.Raw) != "{not json" {
					t.Fatalf("Raw = %q", me.Raw)
				}
				// How persist, which does not import lua, finds the entry.
				var dead interface {
					OutboxEntryID() string
					RawEntry() []byte
				}
				if !errors.As(err, &dead) || dead.OutboxEntryID() != id {
					t.Fatalf("error %v does not expose its entry id", err)
				}
			}
			if err := b.store.Ack(ctx, p, []string{id}); err != nil {
				t.Fatal(err)
			}
		}
		got, err := b.store.Read(ctx, p, "c1", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, got, m1, m2)
	})
}

// TestOutboxReadBlocks checks that Read waits for a message appended while
// it blocks, and returns empty after block when none comes.
func TestOutboxReadBlocks(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 17
		got, err := b.store.Read(ctx, p, "c1", 10, 20*time.Millisecond)
		if err != nil || len(got) != 0 {
			t.Fatalf("Read of an empty partition = %v, %v", opIDs(got), err)
		}
		m := outboxMutation(t)
		done := make(chan struct{})
		go func() {
			defer close(done)
			time.Sleep(30 * time.Millisecond)
			raw, _ := json.Marshal(m)
			b.rdb.XAdd(ctx, &redis.XAddArgs{Stream: b.store.outboxKey(p), Values: map[string]any{"m": string(raw)}})
		}()
		got, err = b.store.Read(ctx, p, "c1", 10, 5*time.Second)
		<-done
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, got, m)
	})
}

// TestOutboxBadArguments checks that out-of-range partitions and counts are
// refused before Redis is asked.
func TestOutboxBadArguments(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	s := NewStore(rdb, "x")
	ctx := context.Background()
	for name, err := range map[string]error{
		"read partition":  func() error { _, err := s.Read(ctx, Partitions, "c", 1, 0); return err }(),
		"read count":      func() error { _, err := s.Read(ctx, 0, "c", 0, 0); return err }(),
		"claim partition": func() error { _, err := s.Claim(ctx, -1, "c", 0, 1); return err }(),
		"claim count":     func() error { _, err := s.Claim(ctx, 0, "c", 0, 0); return err }(),
		"ack partition":   s.Ack(ctx, Partitions, []string{"1-0"}),
		"backlog":         func() error { _, _, err := s.Backlog(ctx, -1); return err }(),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestStreamIDMillis checks the ms part of stream ids.
func TestStreamIDMillis(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id   string
		want int64
		bad  bool
	}{
		{id: "1700000000001-0", want: 1700000000001},
		{id: "5-12", want: 5},
		{id: "x-1", bad: true},
	} {
		got, err := streamIDMillis(tc.id)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("streamIDMillis(%q) = %d, %v", tc.id, got, err)
		}
	}
}

// TestOutboxDeletedWhilePending checks that an entry deleted from the stream
// while still pending (a trim, a manual XDEL) is acknowledged and skipped
// instead of coming back forever as an empty Mutation.
func TestOutboxDeletedWhilePending(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 19
		m1, m2 := outboxMutation(t), outboxMutation(t)
		gone := xadd(t, b, p, "", m1)
		xadd(t, b, p, "", m2)
		if _, err := b.store.Read(ctx, p, "c1", 10, 0); err != nil {
			t.Fatal(err)
		}
		if err := b.rdb.XDel(ctx, b.store.outboxKey(p), gone).Err(); err != nil {
			t.Fatal(err)
		}
		got, err := b.store.Read(ctx, p, "c1", 10, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantOps(t, got, m2)
		if n := pendingCount(t, b, p); n != 1 {
			t.Fatalf("pending %d, want 1 (the deleted entry acknowledged)", n)
		}
	})
}
