package persist

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
)

// refusingWriter commits every batch without a mutation of refused, and
// remembers the tenants committed.
type refusingWriter struct {
	refused   uuid.UUID
	mu        sync.Mutex
	committed map[uuid.UUID]bool
}

func (w *refusingWriter) Apply(_ context.Context, ms []engine.Mutation) error {
	for _, m := range ms {
		if m.TenantID == w.refused {
			return errors.New("refused")
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range ms {
		w.committed[m.TenantID] = true
	}
	return nil
}

// wakesSeen records the published wakes, checking each against what the
// writer had committed when it was published.
type wakesSeen struct {
	w         *refusingWriter
	mu        sync.Mutex
	published []uuid.UUID
	early     []uuid.UUID
}

func (s *wakesSeen) PublishWakes(_ context.Context, what engine.FeedWake, tenants []uuid.UUID) error {
	s.w.mu.Lock()
	defer s.w.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range tenants {
		if what != engine.WakeEvents || !s.w.committed[t] {
			s.early = append(s.early, t)
		}
		s.published = append(s.published, t)
	}
	return nil
}

func (s *wakesSeen) FollowWakes(ctx context.Context, _ func(engine.FeedWake, uuid.UUID), _ func()) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestPersisterWakesAfterCommit: the persister wakes the feeds of the
// tenants of a batch once it committed, never before, and never for a
// batch that did not commit (a group refused, re-applied batch by batch).
func TestPersisterWakesAfterCommit(t *testing.T) {
	t.Parallel()
	okTenant, refused := uuid.New(), uuid.New()
	w := &refusingWriter{refused: refused, committed: map[uuid.UUID]bool{}}
	seen := &wakesSeen{w: w}
	p := NewPersister(nil, w, PersisterConfig{Wakes: seen}, zerolog.Nop())
	p.linger = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.wakes.Run(ctx)
	commits := make(chan commitRequest)
	go p.commitGroups(ctx, commits)
	done := make(chan error, 2)
	commits <- commitRequest{ms: []engine.Mutation{{TenantID: okTenant}, {TenantID: okTenant}}, done: done}
	commits <- commitRequest{ms: []engine.Mutation{{TenantID: refused}}, done: done}
	p.Hurry()
	errs := 0
	for range 2 {
		if err := <-done; err != nil {
			errs++
		}
	}
	if errs != 1 {
		t.Fatalf("%d batches failed, want the refused one", errs)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		seen.mu.Lock()
		pub, early := append([]uuid.UUID(nil), seen.published...), seen.early
		seen.mu.Unlock()
		if len(early) > 0 {
			t.Fatalf("woken before (or without) a commit: %v", early)
		}
		if len(pub) == 1 && pub[0] == okTenant {
			break
		}
		if len(pub) > 1 || time.Now().After(deadline) {
			t.Fatalf("published %v, want %s once", pub, okTenant)
		}
		time.Sleep(time.Millisecond)
	}
	// Nothing more comes of the refused batch.
	time.Sleep(20 * time.Millisecond)
	seen.mu.Lock()
	defer seen.mu.Unlock()
	if len(seen.published) != 1 {
		t.Errorf("published %v, want %s alone", seen.published, okTenant)
	}
}
