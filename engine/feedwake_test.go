package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// fakeWakes is an in-process FeedWakes: a publish calls every follower.
type fakeWakes struct {
	mu        sync.Mutex
	followers map[int]func(FeedWake, uuid.UUID)
	next      int
	following atomic.Int32
	// published is every publish's tenants; gate, when set, holds each
	// publish until it receives.
	published [][]uuid.UUID
	gate      chan struct{}
}

func (w *fakeWakes) PublishWakes(_ context.Context, what FeedWake, tenants []uuid.UUID) error {
	if w.gate != nil {
		<-w.gate
	}
	w.mu.Lock()
	w.published = append(w.published, append([]uuid.UUID(nil), tenants...))
	fs := make([]func(FeedWake, uuid.UUID), 0, len(w.followers))
	for _, f := range w.followers {
		fs = append(fs, f)
	}
	w.mu.Unlock()
	for _, f := range fs {
		for _, t := range tenants {
			f(what, t)
		}
	}
	return nil
}

func (w *fakeWakes) FollowWakes(ctx context.Context, wake func(FeedWake, uuid.UUID), resumed func()) error {
	w.mu.Lock()
	id := w.next
	w.next++
	if w.followers == nil {
		w.followers = map[int]func(FeedWake, uuid.UUID){}
	}
	w.followers[id] = wake
	w.mu.Unlock()
	w.following.Add(1)
	defer w.following.Add(-1)
	resumed()
	<-ctx.Done()
	w.mu.Lock()
	delete(w.followers, id)
	w.mu.Unlock()
	return ctx.Err()
}

// countingLog counts the reads of the event log it wraps.
type countingLog struct {
	*fakeEventLog
	reads atomic.Int64
}

func (c *countingLog) EventsAfter(ctx context.Context, tenant uuid.UUID, customer *uuid.UUID, after int64, limit int) ([]Event, error) {
	c.reads.Add(1)
	return c.fakeEventLog.EventsAfter(ctx, tenant, customer, after, limit)
}

// countingFeed counts the reads of the change feed it wraps.
type countingFeed struct {
	*fakeChangeFeed
	reads atomic.Int64
}

func (c *countingFeed) ChangesAfter(ctx context.Context, tenant uuid.UUID, after ChangeID, limit int) ([]ConfigChange, bool, error) {
	c.reads.Add(1)
	return c.fakeChangeFeed.ChangesAfter(ctx, tenant, after, limit)
}

// nextItem reads one item of st within a second.
func nextItem(t *testing.T, st *ChangeStream) FeedItem {
	t.Helper()
	select {
	case it, ok := <-st.C:
		if !ok {
			t.Fatal("stream ended")
		}
		return it
	case <-time.After(time.Second):
		t.Fatal("nothing within a second of the wake (the poll is an hour)")
	}
	return FeedItem{}
}

// TestWakesReadAtOnce: with a poll far too slow to matter, a wake
// published for the tenant (on any node, here the fake's one channel)
// makes its feed read the source woken, and that source alone; a wake
// for a tenant without a feed here costs nothing; the process follows
// the wakes while a feed runs and stops with the last, and a fresh
// subscription reads every feed (the wakes before it may be lost).
func TestWakesReadAtOnce(t *testing.T) {
	t.Parallel()
	log := &countingLog{fakeEventLog: &fakeEventLog{}}
	changes := &countingFeed{fakeChangeFeed: &fakeChangeFeed{}}
	wakes := &fakeWakes{}
	s := NewEvents(log, time.Hour, 0, zerolog.Nop()).WithChangeFeed(changes, 0).WithWakes(wakes)
	s.WakeGap = time.Millisecond
	tenant, cust := uuid.New(), uuid.New()
	st, err := s.OpenChanges(context.Background(), Scope{TenantID: tenant, Environment: EnvironmentLive})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the process to follow wakes", func() bool { return wakes.following.Load() == 1 })
	// The subscription's first read: both sources, once.
	waitFor(t, "the read after subscribing", func() bool { return log.reads.Load() == 1 && changes.reads.Load() == 1 })

	seq := log.addIn(tenant, cust, EnvironmentLive)
	if err := wakes.PublishWakes(context.Background(), WakeEvents, []uuid.UUID{uuid.New(), tenant}); err != nil {
		t.Fatal(err)
	}
	if it := nextItem(t, st); it.Event == nil || *it.Event.Sequence != seq {
		t.Fatalf("got %+v, want event %d", it, seq)
	}
	if n := changes.reads.Load(); n != 1 {
		t.Errorf("an events wake read the change feed (%d reads)", n)
	}

	id := changes.add(StampPlans)
	s.Wake(WakeChanges, tenant)
	if it := nextItem(t, st); it.Change == nil || it.Change.ID != id {
		t.Fatalf("got %+v, want change %s", it, id)
	}
	if n := log.reads.Load(); n != 2 {
		t.Errorf("a changes wake read the event log (%d reads, want 2)", n)
	}

	st.Close()
	waitFor(t, "the process to stop following", func() bool { return wakes.following.Load() == 0 })
}

// TestWakeStormCoalesces: however many wakes come, a feed reads a source
// at most once per wake gap (plus the read in flight), and a wake that
// came during a read is not lost: the last event is delivered.
func TestWakeStormCoalesces(t *testing.T) {
	t.Parallel()
	log := &countingLog{fakeEventLog: &fakeEventLog{}}
	s := NewEvents(log, time.Hour, 0, zerolog.Nop())
	s.WakeGap = 20 * time.Millisecond
	tenant, cust := uuid.New(), uuid.New()
	st, err := s.OpenChanges(context.Background(), Scope{TenantID: tenant, Environment: EnvironmentLive})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	start := time.Now()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < 200*time.Millisecond {
				s.Wake(WakeEvents, tenant)
				time.Sleep(10 * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	seq := log.addIn(tenant, cust, EnvironmentLive)
	s.Wake(WakeEvents, tenant)
	if it := nextItem(t, st); it.Event == nil || *it.Event.Sequence != seq {
		t.Fatalf("got %+v, want event %d", it, seq)
	}
	if n, most := log.reads.Load(), int64(elapsed/s.WakeGap)+3; n > most {
		t.Errorf("%d reads in %v of wakes, want at most %d (one per %v gap)", n, elapsed, most, s.WakeGap)
	}
}

// TestWakeSenderCoalesces: the persister's commits never wait on a
// publish; the tenants of the batches committed while one is in flight
// go out together, each once, in the next.
func TestWakeSenderCoalesces(t *testing.T) {
	t.Parallel()
	wakes := &fakeWakes{gate: make(chan struct{})}
	w := NewWakeSender(wakes, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	a, b, c := uuid.New(), uuid.New(), uuid.New()
	w.Stored([]Mutation{{TenantID: a}})
	// The first publish is held: what follows must not block on it.
	time.Sleep(10 * time.Millisecond)
	returned := make(chan struct{})
	go func() {
		for range 100 {
			w.Stored([]Mutation{{TenantID: b}, {TenantID: c}, {TenantID: b}})
		}
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(time.Second):
		t.Fatal("Stored blocked on a publish in flight")
	}
	wakes.gate <- struct{}{}
	wakes.gate <- struct{}{}
	waitFor(t, "two publishes", func() bool {
		wakes.mu.Lock()
		defer wakes.mu.Unlock()
		return len(wakes.published) == 2
	})
	wakes.mu.Lock()
	got := wakes.published
	wakes.mu.Unlock()
	if len(got[0]) != 1 || got[0][0] != a {
		t.Errorf("first publish %v, want [%s]", got[0], a)
	}
	if len(got[1]) != 2 || !(got[1][0] == b && got[1][1] == c || got[1][0] == c && got[1][1] == b) {
		t.Errorf("second publish %v, want %s and %s once each", got[1], b, c)
	}
	cancel()
	close(wakes.gate)
	<-done
}

// waitFor fails unless ok holds within two seconds.
func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 2 s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
