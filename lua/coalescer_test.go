package lua

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// pipelineSizes is a hook that records the largest pipeline its client
// sent.
type pipelineSizes struct{ largest atomic.Int64 }

func (h *pipelineSizes) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for n := int64(len(cmds)); ; {
			cur := h.largest.Load()
			if n <= cur || h.largest.CompareAndSwap(cur, n) {
				break
			}
		}
		return next(ctx, cmds)
	}
}

// TestCoalescerRoutesReplies: many goroutines send commands at once, so
// they share pipelines; each gets its own reply, and a command that fails
// (INCR of text) fails alone, on the suite's Redis (single or Cluster).
func TestCoalescerRoutesReplies(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	sizes := &pipelineSizes{}
	rdb.AddHook(sizes)
	co := &coalescer{rdb: rdb}
	const workers, rounds = 64, 40
	// Keys of their own slots: on a Cluster a pipeline splits by node.
	key := func(w, r int) string { return fmt.Sprintf("{%s:co:%d:%d}", prefix, w, r) }
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				k, v := key(w, r), fmt.Sprintf("v%d.%d", w, r)
				set := redis.NewStatusCmd(ctx, "set", k, v)
				if err := co.do(ctx, set); err != nil {
					errs <- fmt.Errorf("set %s: %w", k, err)
					continue
				}
				get := redis.NewStringCmd(ctx, "get", k)
				if err := co.do(ctx, get); err != nil || get.Val() != v {
					errs <- fmt.Errorf("get %s: %q %v, want %q", k, get.Val(), err, v)
				}
				if r%4 == 0 { // INCR of text: an error reply for this caller only
					incr := redis.NewIntCmd(ctx, "incr", k)
					if err := co.do(ctx, incr); err == nil || !strings.Contains(err.Error(), "not an integer") {
						errs <- fmt.Errorf("incr %s: %v, want an ERR reply", k, err)
					}
				}
				miss := redis.NewStringCmd(ctx, "get", k+":none")
				if err := co.do(ctx, miss); !errors.Is(err, redis.Nil) {
					errs <- fmt.Errorf("get of a missing key: %v, want redis.Nil", err)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if sizes.largest.Load() < 2 {
		t.Errorf("largest pipeline %d: %d concurrent callers never shared a round trip", sizes.largest.Load(), workers)
	}
	co.mu.Lock()
	defer co.mu.Unlock()
	if co.inFlight != 0 || len(co.queue) != 0 {
		t.Errorf("after the callers: %d round trips in flight, %d queued; want 0 and 0", co.inFlight, len(co.queue))
	}
}

// TestCoalescerNeverSendsAfterContext: a command whose context ended before
// its round trip was built is never written (its key stays unset), whether
// the context ended before the call or while the command queued; one whose
// round trip is under way when its context ends returns an outcome-unknown
// 503.
func TestCoalescerNeverSendsAfterContext(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	co := &coalescer{rdb: rdb}
	mustUnset := func(k string) {
		t.Helper()
		if n, err := rdb.Exists(ctx, k).Result(); err != nil || n != 0 {
			t.Errorf("%s: exists %d %v; the command was written after its context ended", k, n, err)
		}
	}

	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := co.do(done, redis.NewStatusCmd(done, "set", "before", "1")); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled context: %v, want context.Canceled", err)
	}
	mustUnset("before")

	// Every round trip slot held by a BLPOP of 1 s: what comes next queues.
	const reservation = time.Second
	var wg sync.WaitGroup
	for range maxTripsInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = co.do(ctx, redis.NewStringSliceCmd(ctx, "blpop", "nothing", reservation.Seconds()))
		}()
	}
	waitFor(t, func() bool { co.mu.Lock(); defer co.mu.Unlock(); return co.inFlight == maxTripsInFlight })
	queuedCtx, stop := context.WithTimeout(ctx, reservation/5)
	defer stop()
	if err := co.do(queuedCtx, redis.NewStatusCmd(queuedCtx, "set", "queued", "1")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a context ending in the queue: %v, want context.DeadlineExceeded", err)
	}
	// A deadline that passes while the command queues, its timer not read
	// (deadlineOnly never reports it): the round trip drops it too.
	passed := deadlineOnly{Context: ctx, at: time.Now().Add(reservation / 5)}
	lateDone := make(chan error, 1)
	go func() { lateDone <- co.do(passed, redis.NewStatusCmd(passed, "set", "late", "1")) }()
	// One queued behind the BLPOPs whose own round trip (another BLPOP)
	// outlives its context: taken at ~1 s, answered at ~2 s, context ends
	// at 1.5 s.
	inFlightCtx, stopInFlight := context.WithTimeout(ctx, reservation*3/2)
	defer stopInFlight()
	err := co.do(inFlightCtx, redis.NewStringSliceCmd(inFlightCtx, "blpop", "nothing", reservation.Seconds()))
	if !errors.Is(err, errLeftInFlight) || !errors.Is(err, engine.ErrUnavailable) {
		t.Errorf("a context ending in flight: %v, want errLeftInFlight as engine.ErrUnavailable", err)
	}
	if err := <-lateDone; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a deadline passed in the queue: %v, want context.DeadlineExceeded", err)
	}
	wg.Wait()
	waitFor(t, func() bool { co.mu.Lock(); defer co.mu.Unlock(); return co.inFlight == 0 })
	mustUnset("queued")
	mustUnset("late")
}

// deadlineOnly is a context with a deadline that never ends by itself.
type deadlineOnly struct {
	context.Context
	at time.Time
}

func (d deadlineOnly) Deadline() (time.Time, bool) { return d.at, true }

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not reached in 5 s")
		}
	}
}

// TestCoalescedCallsReloadTheLibrary: concurrent money calls and claims
// share pipelines on a Redis that lost the creditd library (FUNCTION
// DELETE); the FCALLs the node refused load it and run again, each once
// (every grant applied exactly once), and the claims in the same
// pipelines are not sent twice (each one claims).
func TestCoalescedCallsReloadTheLibrary(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	sizes := &pipelineSizes{}
	rdb.AddHook(sizes)
	s := NewStore(rdb, "co")
	const customers, grants = 16, 8
	cs := make([]engine.CustomerKey, customers)
	accounts := make([]uuid.UUID, customers)
	for i := range cs {
		cs[i], accounts[i] = newCustomer(), uuid.New()
		ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: cs[i].TenantID, CustomerID: cs[i].CustomerID, Environment: cs[i].Environment}, t0)
		if err != nil || !ok {
			t.Fatalf("load: %v %v", ok, err)
		}
	}
	if err := rdb.FunctionDelete(ctx, "creditd_"+library().version).Err(); err != nil {
		t.Fatalf("function delete: %v", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, customers*grants*2)
	for i, c := range cs {
		for g := range grants {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := "k" + strconv.Itoa(i) + "." + strconv.Itoa(g)
				if _, claimed, err := s.Begin(ctx, c.TenantID, key, "h", time.Minute); err != nil || !claimed {
					errs <- fmt.Errorf("claim %s: claimed %v, %v", key, claimed, err)
				}
				cmd := grantCmd(c, 100, t0)
				cmd.AccountID = accounts[i]
				if _, err := s.Grant(ctx, cmd); err != nil {
					errs <- fmt.Errorf("grant: %w", err)
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, c := range cs {
		b, err := s.Balances(ctx, c, t0.Add(time.Second))
		if err != nil || b.Balance != grants*100 {
			t.Errorf("balance %d %v, want %d: each grant applied once", b.Balance, err, grants*100)
		}
	}
	if sizes.largest.Load() < 2 {
		t.Errorf("largest pipeline %d: the calls never shared a round trip", sizes.largest.Load())
	}
	if s.noFunctions() {
		t.Error("the Store fell back to EVALSHA instead of loading the library")
	}
}
