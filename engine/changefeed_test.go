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

// fakeChangeFeed is an in-memory ChangeFeed; ids are (n, 0).
type fakeChangeFeed struct {
	mu      sync.Mutex
	changes []ConfigChange
}

func (f *fakeChangeFeed) add(k StampKind) ChangeID {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := ChangeID{Ms: uint64(len(f.changes) + 1)}
	f.changes = append(f.changes, ConfigChange{ID: id, Kind: k, Stamp: uint64(time.Now().UnixMicro())})
	return id
}

func (f *fakeChangeFeed) ChangesAfter(_ context.Context, _ uuid.UUID, after ChangeID, limit int) ([]ConfigChange, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []ConfigChange
	for _, c := range f.changes {
		if after.Less(c.ID) && len(out) < limit {
			out = append(out, c)
		}
	}
	return out, false, nil
}

func (f *fakeChangeFeed) ChangesLast(context.Context, uuid.UUID) (ChangeID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.changes) == 0 {
		return ChangeID{}, nil
	}
	return f.changes[len(f.changes)-1].ID, nil
}

// addIn appends an event of customer in env.
func (f *fakeEventLog) addIn(tenant, customer uuid.UUID, env Environment) int64 {
	seq := f.add(tenant, customer)
	f.mu.Lock()
	f.evs[len(f.evs)-1].Environment = env
	f.mu.Unlock()
	return seq
}

// TestChangeStreams: a change stream gets every customer's events of its
// key's environment and the tenant's config changes made after it opened,
// in order; its cap is its
// own (balance streams do not use it up, nor it theirs); the tenant's feed
// keeps running while either kind is open and stops with the last.
func TestChangeStreams(t *testing.T) {
	t.Parallel()
	log, feed := &fakeEventLog{}, &fakeChangeFeed{}
	ev := NewEvents(log, 5*time.Millisecond, 1, zerolog.Nop()).WithChangeFeed(feed, 1)
	tenant := uuid.New()
	scope := Scope{TenantID: tenant, Environment: EnvironmentLive}
	ctx := context.Background()
	log.add(tenant, uuid.New())
	feed.add(StampPlans) // before the stream: not sent

	cs, err := ev.OpenChanges(ctx, scope)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ev.OpenChanges(ctx, scope); err != ErrTooManyChangeStreams {
		t.Fatalf("second change stream: %v, want ErrTooManyChangeStreams", err)
	}
	bal, err := ev.Open(ctx, scope, uuid.New())
	if err != nil {
		t.Fatalf("a balance stream beside the change stream: %v", err)
	}
	a, b := uuid.New(), uuid.New()
	s1 := log.addIn(tenant, a, EnvironmentLive)
	log.addIn(tenant, uuid.New(), EnvironmentSandbox) // not the key's environment
	c1 := feed.add(StampSubscriptions)
	s2 := log.addIn(tenant, b, EnvironmentLive)
	log.addIn(uuid.New(), a, EnvironmentLive) // another tenant's
	var seqs []int64
	var changes []ChangeID
	for len(seqs) < 2 || len(changes) < 1 {
		select {
		case it, ok := <-cs.C:
			if !ok {
				t.Fatal("change stream closed")
			}
			if it.Event != nil {
				seqs = append(seqs, *it.Event.Sequence)
			}
			if it.Change != nil {
				changes = append(changes, it.Change.ID)
				if it.Change.Kind != StampSubscriptions {
					t.Errorf("change kind %v", it.Change.Kind)
				}
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("got events %v changes %v, want %d %d and %v", seqs, changes, s1, s2, c1)
		}
	}
	if seqs[0] != s1 || seqs[1] != s2 || len(changes) != 1 || changes[0] != c1 {
		t.Errorf("events %v changes %v, want [%d %d] [%v]", seqs, changes, s1, s2, c1)
	}
	bal.Close()
	if ev.OpenStreams() != 1 {
		t.Errorf("open streams %d, want 1", ev.OpenStreams())
	}
	feed.add(StampCatalog)
	select {
	case it := <-cs.C:
		if it.Change == nil || it.Change.Kind != StampCatalog {
			t.Errorf("after the balance stream closed: %+v", it)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the feed stopped with the balance stream although a change stream is open")
	}
	cs.Close()
	if ev.OpenStreams() != 0 {
		t.Errorf("open streams %d after closing both, want 0", ev.OpenStreams())
	}
	ev.mu.Lock()
	n := len(ev.feeds)
	ev.mu.Unlock()
	if n != 0 {
		t.Errorf("%d feeds left running", n)
	}
}

// TestFeedCursor: a cursor reads back as written; anything else is a 400
// naming Last-Event-ID.
func TestFeedCursor(t *testing.T) {
	t.Parallel()
	for _, c := range []FeedCursor{{}, {Sequence: 42, Change: ChangeID{1764381600000, 3}}} {
		got, err := ParseFeedCursor(c.String())
		if err != nil || got != c {
			t.Errorf("%q read back as %v, %v", c.String(), got, err)
		}
	}
	for _, bad := range []string{"x", "12", "1.2", "-1.0-0", "1.0-x", "1.-0", "1.0-0-0"} {
		_, err := ParseFeedCursor(bad)
		if e, ok := err.(*Error); !ok || e.Kind != KindBadRequest || e.Field != "Last-Event-ID" {
			t.Errorf("%q: %v, want a 400 naming Last-Event-ID", bad, err)
		}
	}
}

// heldOutbox is an outbox whose marks are persisted only when told.
type heldOutbox struct{ persisted atomic.Bool }

func (f *heldOutbox) OutboxMark(context.Context, *uuid.UUID) (OutboxMark, error) {
	return OutboxMark{Partitions: []int{0}, Entries: []string{"1-0"}}, nil
}

func (f *heldOutbox) OutboxPersisted(context.Context, OutboxMark) (bool, error) {
	return f.persisted.Load(), nil
}

// TestChangeStreamCurrentAt: a change stream is proven current only up to
// a moment whose acknowledged writes the persister has moved to Postgres
// before the feed read the log: while the outbox is behind, CurrentAt
// stays put (the stream sends no heartbeat); once it is persisted,
// CurrentAt moves to when the mark was taken.
func TestChangeStreamCurrentAt(t *testing.T) {
	t.Parallel()
	marks := &heldOutbox{}
	ev := NewEvents(&fakeEventLog{}, 50*time.Millisecond, 1, zerolog.Nop()).WithChangeFeed(&fakeChangeFeed{}, 1)
	ev.WrittenBehind = NewWrittenBehind(marks, nil)
	cs, err := ev.OpenChanges(context.Background(), Scope{TenantID: uuid.New()})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	time.Sleep(200 * time.Millisecond)
	if at := cs.CurrentAt(); !at.IsZero() {
		t.Fatalf("current at %v while the outbox is behind, want never", at)
	}
	before := time.Now()
	marks.persisted.Store(true)
	deadline := time.Now().Add(2 * time.Second)
	var at time.Time
	for at = cs.CurrentAt(); at.IsZero(); at = cs.CurrentAt() {
		if time.Now().After(deadline) {
			t.Fatal("CurrentAt did not move once the outbox was persisted")
		}
		time.Sleep(time.Millisecond)
	}
	// The first proof is the mark taken while the outbox was behind (the
	// next poll is 50 ms away).
	if !at.Before(before) {
		t.Errorf("current at %v, want the pending mark's moment, before %v", at, before)
	}
	time.Sleep(300 * time.Millisecond)
	if at := cs.CurrentAt(); time.Since(at) > 200*time.Millisecond {
		t.Errorf("current at %v: new marks are not proven as they persist", at)
	}
}

// reservationsStore answers reservations with a set result; other methods are not used.
type reservationsStore struct {
	MeteringStore
	res MutationResult
	err error
}

func (h *reservationsStore) Reserve(context.Context, ReserveCommand) (MutationResult, error) {
	return h.res, h.err
}
func (h *reservationsStore) Commit(context.Context, CommitCommand) (MutationResult, error) {
	return h.res, h.err
}
func (h *reservationsStore) Release(context.Context, ReleaseCommand) (MutationResult, error) {
	return h.res, h.err
}
func (h *reservationsStore) Extend(context.Context, ExtendCommand) (MutationResult, error) {
	return h.res, h.err
}
func (h *reservationsStore) ReserveDry(context.Context, ReserveCommand) (MutationResult, error) {
	return h.res, h.err
}

// notesTaken records reservation notices.
type notesTaken struct {
	mu    sync.Mutex
	notes []CustomerKey
}

func (n *notesTaken) ReservationNote(_ context.Context, c CustomerKey) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.notes = append(n.notes, c)
	return nil
}

// TestNotingReservations: a reservation create, extend, commit or release that
// changed something writes a notice of its customer; a refused one, a
// replay or a dry run writes none, and the reservation's answer passes through
// unchanged.
func TestNotingReservations(t *testing.T) {
	t.Parallel()
	c := CustomerKey{TenantID: uuid.New(), Environment: EnvironmentLive, CustomerID: uuid.New()}
	hdr := CommandHeader{Customer: c}
	ctx := context.Background()
	cases := []struct {
		name  string
		res   MutationResult
		err   error
		notes int
	}{
		{"applied", MutationResult{}, nil, 1},
		{"replayed", MutationResult{Replayed: true}, nil, 0},
		{"refused", MutationResult{}, ErrInsufficientCredits, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			taken := &notesTaken{}
			hot := NotingReservations(&reservationsStore{res: tc.res, err: tc.err}, taken, zerolog.Nop())
			calls := []func() (MutationResult, error){
				func() (MutationResult, error) { return hot.Reserve(ctx, ReserveCommand{CommandHeader: hdr}) },
				func() (MutationResult, error) { return hot.Commit(ctx, CommitCommand{CommandHeader: hdr}) },
				func() (MutationResult, error) { return hot.Release(ctx, ReleaseCommand{CommandHeader: hdr}) },
				func() (MutationResult, error) { return hot.Extend(ctx, ExtendCommand{CommandHeader: hdr}) },
			}
			for _, call := range calls {
				res, err := call()
				if err != tc.err || res.Replayed != tc.res.Replayed {
					t.Errorf("answer %+v, %v changed by the decorator", res, err)
				}
			}
			if _, err := hot.ReserveDry(ctx, ReserveCommand{CommandHeader: hdr}); err != tc.err {
				t.Errorf("dry run answer %v changed by the decorator", err)
			}
			if len(taken.notes) != len(calls)*tc.notes {
				t.Fatalf("%d notices for %d calls and a dry run, want %d", len(taken.notes), len(calls), len(calls)*tc.notes)
			}
			for _, n := range taken.notes {
				if n != c {
					t.Errorf("notice of %v, want %v", n, c)
				}
			}
		})
	}
}
