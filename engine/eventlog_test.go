package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// fakeEventLog is an in-memory EventLog: events appended in sequence order.
type fakeEventLog struct {
	mu  sync.Mutex
	evs []Event
}

func (f *fakeEventLog) add(tenant, customer uuid.UUID) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	seq := int64(len(f.evs) + 1)
	c := customer
	f.evs = append(f.evs, Event{ID: uuid.New(), TenantID: tenant, CustomerID: &c, Sequence: &seq, EventType: EventCreditGranted})
	return seq
}

func (f *fakeEventLog) EventsAfter(_ context.Context, tenant uuid.UUID, customer *uuid.UUID, after int64, limit int) ([]Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Event
	for _, e := range f.evs {
		if e.TenantID == tenant && *e.Sequence > after && (customer == nil || *e.CustomerID == *customer) && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}

func (f *fakeEventLog) LastSequence(_ context.Context, tenant uuid.UUID) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var n int64
	for _, e := range f.evs {
		if e.TenantID == tenant {
			n = *e.Sequence
		}
	}
	return n, nil
}

// receive reads want sequences from st within a second each.
func receive(t *testing.T, st *Stream, want ...int64) {
	t.Helper()
	for _, w := range want {
		select {
		case e, ok := <-st.C:
			if !ok || *e.Sequence != w {
				t.Fatalf("got %v (open %v), want sequence %d", e.Sequence, ok, w)
			}
		case <-time.After(time.Second):
			t.Fatalf("no event %d", w)
		}
	}
}

// TestEventStreamsFanOutAndCap: a tenant's feed starts after the events
// already stored, hands each new event to its customer's streams only, a
// tenant past its cap is refused (another tenant is not), a closed stream
// frees its place, and a stream that falls a buffer behind is ended.
func TestEventStreamsFanOutAndCap(t *testing.T) {
	t.Parallel()
	log := &fakeEventLog{}
	tenant, other := uuid.New(), uuid.New()
	a, b := uuid.New(), uuid.New()
	log.add(tenant, a) // stored before any stream: not streamed
	s := NewEvents(log, 5*time.Millisecond, 2, zerolog.Nop())
	ctx := context.Background()
	sa, err := s.Open(ctx, Scope{TenantID: tenant}, a)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := s.Open(ctx, Scope{TenantID: tenant}, b)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open(ctx, Scope{TenantID: tenant}, a); !errors.Is(err, ErrTooManyStreams) {
		t.Fatalf("third stream: %v, want ErrTooManyStreams", err)
	}
	so, err := s.Open(ctx, Scope{TenantID: other}, a)
	if err != nil {
		t.Fatalf("another tenant's stream: %v", err)
	}
	log.add(tenant, a)
	log.add(tenant, b)
	log.add(tenant, a)
	receive(t, sa, 2, 4)
	receive(t, sb, 3)
	sb.Close()
	sb.Close() // twice is harmless
	sc, err := s.Open(ctx, Scope{TenantID: tenant}, b)
	if err != nil {
		t.Fatalf("after a close: %v", err)
	}
	for range streamBuffer + 10 {
		log.add(tenant, a)
	}
	// Read nothing until the feed has ended the stream: a reader draining
	// while the feed delivers could keep it from ever falling a buffer
	// behind (the test failed so on a loaded machine).
	deadline := time.Now().Add(5 * time.Second)
	for s.OpenStreams() > 2 { // sa, sc and so were open
		if time.Now().After(deadline) {
			t.Fatal("a stream a buffer behind was not ended")
		}
		time.Sleep(time.Millisecond)
	}
	for range sa.C { // ended: what it buffered, then closed
	}
	sa.Close()
	sc.Close()
	so.Close()
	if n := s.OpenStreams(); n != 0 {
		t.Errorf("%d streams open after closing all", n)
	}
}
