package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// fakeIndex serves DueExpiries from a fixed list sorted by expiry, as
// Postgres would, and records every window asked.
type fakeIndex struct {
	due     []DueExpiry
	windows [][2]time.Time
}

func (f *fakeIndex) DueExpiries(_ context.Context, since, now time.Time, limit int) ([]DueExpiry, error) {
	f.windows = append(f.windows, [2]time.Time{since, now})
	var out []DueExpiry
	for _, d := range f.due {
		if d.ExpiresAt.After(since) && !d.ExpiresAt.After(now) && len(out) < limit {
			out = append(out, d)
		}
	}
	return out, nil
}

// expiringStore is a BlockStore whose Expire counts calls per customer.
type expiringStore struct {
	BlockStore
	mu    sync.Mutex
	calls map[uuid.UUID]int
}

func (s *expiringStore) Expire(_ context.Context, _ uuid.UUID, c CustomerKey, _ time.Time) (MutationResult, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[c.CustomerID]++
	return MutationResult{}, true, nil
}

// TestExpirySweepPages: one pass pages through every due customer (a page
// starts after the last one's expiry), expires each once even when a page
// lists it again, looks back Lookback, and every DeepEvery looks back
// DeepLookback instead.
func TestExpirySweepPages(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	idx := &fakeIndex{}
	for i := range 7 {
		c := CustomerKey{TenantID: uuid.New(), Environment: EnvironmentLive, CustomerID: uuid.New()}
		idx.due = append(idx.due, DueExpiry{Customer: c, ExpiresAt: now.Add(-time.Duration(7-i) * time.Minute)})
	}
	// A customer of the first page again on the last: Postgres persisted
	// the expiry of its soonest block meanwhile, and lists its next one.
	idx.due = append(idx.due, DueExpiry{Customer: idx.due[2].Customer, ExpiresAt: idx.due[6].ExpiresAt})
	store := &expiringStore{calls: map[uuid.UUID]int{}}
	clock := &fixedClock{t: now}
	s := &ExpirySweeper{Blocks: store, Index: idx, Clock: clock, Batch: 3, Lookback: 10 * time.Minute,
		DeepLookback: 24 * time.Hour, DeepEvery: time.Hour}

	if n := s.SweepOnce(context.Background()); n != 7 {
		t.Errorf("first pass expired %d customers, want 7", n)
	}
	for c, n := range store.calls {
		if n != 1 {
			t.Errorf("customer %v expired %d times in one pass", c, n)
		}
	}
	if got := idx.windows[0][0]; !got.Equal(now.Add(-24 * time.Hour)) {
		t.Errorf("first pass looked back to %v, want the deep lookback", got)
	}
	if len(idx.windows) < 3 {
		t.Errorf("7 customers in pages of 3 took %d pages", len(idx.windows))
	}
	idx.windows = nil
	s.SweepOnce(context.Background())
	if got := idx.windows[0][0]; !got.Equal(now.Add(-10 * time.Minute)) {
		t.Errorf("second pass looked back to %v, want Lookback", got)
	}
	clock.t = now.Add(time.Hour)
	idx.windows = nil
	s.SweepOnce(context.Background())
	if got := idx.windows[0][0]; !got.Equal(clock.t.Add(-24 * time.Hour)) {
		t.Errorf("a pass DeepEvery later looked back to %v, want the deep lookback", got)
	}
}
