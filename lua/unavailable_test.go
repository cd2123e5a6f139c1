package lua

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// replyError is a Redis error reply as go-redis hands it over.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// TestUnavailable: the failures of a cluster in failover and of a broken
// connection are transient (a 503); a missing key, a script's refusal and
// a cancelled request are not.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"redis nil", redis.Nil, false},
		{"cancelled", context.Canceled, false},
		{"script refusal", replyError("NOSTATE no credit state"), false},
		{"noscript", replyError("NOSCRIPT No matching script"), false},
		{"wrong type", replyError("WRONGTYPE Operation against a key"), false},
		{"plain error", errors.New("lua: consume: unexpected reply"), false},
		{"connection refused", refused, true},
		{"wrapped refused", fmt.Errorf("lua: consume: %w", refused), true},
		{"eof", io.EOF, true},
		{"unexpected eof", io.ErrUnexpectedEOF, true},
		{"closed conn", net.ErrClosed, true},
		{"deadline", context.DeadlineExceeded, true},
		{"pool timeout", redis.ErrPoolTimeout, true},
		{"client closed", redis.ErrClosed, true},
		{"clusterdown", replyError("CLUSTERDOWN The cluster is down"), true},
		{"clusterdown hash slot", replyError("CLUSTERDOWN Hash slot not served"), true},
		{"tryagain", replyError("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{"loading", replyError("LOADING Redis is loading the dataset in memory"), true},
		{"readonly", replyError("READONLY You can't write against a read only replica."), true},
		{"masterdown", replyError("MASTERDOWN Link with MASTER is down"), true},
		{"moved", replyError("MOVED 3999 127.0.0.1:6381"), true},
		{"ask", replyError("ASK 3999 127.0.0.1:6381"), true},
		{"already wrapped", &UnavailableError{Err: io.EOF}, true},
		{"out of memory", replyError("OOM command not allowed when used memory > 'maxmemory'."), true},
	} {
		if got := Unavailable(tc.err); got != tc.want {
			t.Errorf("%s: Unavailable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
	h := unavailableHook{reload: func() {}}
	if err := h.classify(refused); !errors.Is(err, engine.ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) || err.Error() != refused.Error() {
		t.Errorf("classify(refused) = %v: want engine.ErrUnavailable wrapping the dial error, same text", err)
	}
	if err := h.classify(redis.Nil); err != redis.Nil {
		t.Errorf("classify(redis.Nil) = %v, want redis.Nil itself", err)
	}
}

// TestStoreUnavailable: with its Redis dead, a Store's reads and money
// scripts (plain and replica-acknowledged) fail with engine.ErrUnavailable,
// never an error the API would answer with a 500; the hook goes on only
// once however many Stores share the client.
func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: 1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	prefix := "un" + testenv.RandomSuffix()
	plain := NewStore(rdb, prefix)
	acked := NewStore(rdb, prefix).WithReplicaAcks(1, 10*time.Millisecond)
	ctx := context.Background()
	c := newCustomer()
	now := t0
	b := bundle{store: plain, rdb: rdb, real: true}
	b.known(t, c)
	b.grant(t, grantCmd(c, 1000, now))
	srv.Kill()
	for name, err := range map[string]error{
		"snapshot":     func() error { _, err := plain.Snapshot(ctx, c, now); return err }(),
		"debit":        func() error { _, err := plain.Debit(ctx, debitCmd(c, 10, now)); return err }(),
		"debit (acks)": func() error { _, err := acked.Debit(ctx, debitCmd(c, 10, now)); return err }(),
		"grant batch":  plain.GrantBatch(ctx, []engine.GrantCommand{grantCmd(c, 5, now)})[0],
	} {
		if !errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("%s with Redis dead: %v, want engine.ErrUnavailable", name, err)
		}
	}
	n := 0
	hooked.Range(func(k, _ any) bool {
		if k == redis.UniversalClient(rdb) {
			n++
		}
		return true
	})
	if n != 1 {
		t.Errorf("client registered %d times, want 1", n)
	}
}

// TestStoreRefusedWrites (issue 25): a Redis at maxmemory under noeviction
// refuses money scripts with OOM; the Store answers engine.ErrUnavailable
// (the API's 503 with Retry-After), and nothing was applied: the balance,
// the version and the outbox are as they were, and the same debit applies
// once memory is free again.
func TestStoreRefusedWrites(t *testing.T) {
	t.Parallel()
	srv := testenv.StartRedisServer(t, "--maxmemory-policy", "noeviction")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	store := NewStore(rdb, "oom"+testenv.RandomSuffix())
	ctx := context.Background()
	c := newCustomer()
	now := t0
	b := bundle{store: store, rdb: rdb, real: true}
	b.known(t, c)
	b.grant(t, grantCmd(c, 1000, now))
	before, err := store.Snapshot(ctx, c, now)
	if err != nil {
		t.Fatal(err)
	}
	outbox := rdb.XLen(ctx, store.outboxKey(Partition(c.CustomerID))).Val()
	info := rdb.InfoMap(ctx, "memory").Item("Memory", "used_memory")
	limit, _ := strconv.ParseInt(info, 10, 64)
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(limit+64<<10, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	// Fill up to the limit: the first refused SET means writes are refused.
	for i := 0; ; i++ {
		err := rdb.Set(ctx, "filler:"+strconv.Itoa(i), strings.Repeat("x", 8<<10), 0).Err()
		if err != nil && strings.HasPrefix(err.Error(), "OOM") {
			break
		}
		if err != nil || i > 1000 {
			t.Fatalf("filling to maxmemory: %v after %d values", err, i)
		}
	}
	if _, err := store.Debit(ctx, debitCmd(c, 10, now)); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("debit at maxmemory: %v, want engine.ErrUnavailable", err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	after, err := store.Snapshot(ctx, c, now)
	if err != nil {
		t.Fatal(err)
	}
	if after.Balance != before.Balance || after.Version != before.Version {
		t.Errorf("refused debit changed the account: balance %d -> %d, version %d -> %d",
			before.Balance, after.Balance, before.Version, after.Version)
	}
	if n := rdb.XLen(ctx, store.outboxKey(Partition(c.CustomerID))).Val(); n != outbox {
		t.Errorf("outbox %d entries after the refusal, want %d", n, outbox)
	}
	if _, err := store.Debit(ctx, debitCmd(c, 10, now)); err != nil {
		t.Fatalf("debit once memory is free: %v", err)
	}
}
