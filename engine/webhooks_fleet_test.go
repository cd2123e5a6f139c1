package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// fleetEvents is an EventStore shared by several nodes: it leases due
// events as Postgres does (at most perTenant a call, none leased twice)
// and counts what was recorded.
type fleetEvents struct {
	mu        sync.Mutex
	pending   []Event
	leased    map[uuid.UUID]uuid.UUID // event -> lease
	delivered int
}

func (f *fleetEvents) InsertEvent(context.Context, Event) error { return nil }

func (f *fleetEvents) ClaimDue(_ context.Context, _ time.Time, _ time.Duration, limit, perTenant int, skip []uuid.UUID) ([]Claim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	skipped := map[uuid.UUID]bool{}
	for _, t := range skip {
		skipped[t] = true
	}
	per := map[uuid.UUID]int{}
	var out []Claim
	for _, e := range f.pending {
		if len(out) == limit {
			break
		}
		if _, held := f.leased[e.ID]; held || skipped[e.TenantID] || per[e.TenantID] == perTenant {
			continue
		}
		per[e.TenantID]++
		c := Claim{Event: e, Lease: uuid.New()}
		f.leased[e.ID] = c.Lease
		out = append(out, c)
	}
	return out, nil
}

func (f *fleetEvents) RecordAttempt(_ context.Context, c Claim, _ Attempt) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leased[c.Event.ID] != c.Lease {
		return false, nil
	}
	for i, e := range f.pending {
		if e.ID == c.Event.ID {
			f.pending = append(f.pending[:i], f.pending[i+1:]...)
			break
		}
	}
	f.delivered++
	return true, nil
}

func (f *fleetEvents) ListEvents(context.Context, uuid.UUID, EventQuery) (Page[Event], error) {
	return Page[Event]{}, nil
}

func (f *fleetEvents) Redeliver(context.Context, uuid.UUID, uuid.UUID, time.Time) (Event, error) {
	return Event{}, nil
}

// fleetTenant is the one tenant, with a URL and a secret.
type fleetTenant struct{ url, secret string }

func (f fleetTenant) GetTenant(_ context.Context, id uuid.UUID) (Tenant, error) {
	return Tenant{ID: id, WebhookURL: &f.url, WebhookSecret: &f.secret}, nil
}

// slowEndpoint answers 200 after a while and records the most attempts it
// saw at once.
type slowEndpoint struct {
	mu        sync.Mutex
	now, most int
}

func (s *slowEndpoint) Send(ctx context.Context, _ string, _ map[string]string, _ []byte) SendResult {
	s.mu.Lock()
	s.now++
	s.most = max(s.most, s.now)
	s.mu.Unlock()
	select {
	case <-time.After(40 * time.Millisecond):
	case <-ctx.Done():
	}
	s.mu.Lock()
	s.now--
	s.mu.Unlock()
	return SendResult{StatusCode: 200}
}

// memorySlots is DeliverySlots in memory (leases never lapse here).
type memorySlots struct {
	mu   sync.Mutex
	held map[uuid.UUID]map[uuid.UUID]bool
}

func (m *memorySlots) AcquireDeliverySlot(_ context.Context, tenant, holder uuid.UUID, limit int, _ time.Duration) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h := m.held[tenant]
	if h == nil {
		h = map[uuid.UUID]bool{}
		m.held[tenant] = h
	}
	if h[holder] || len(h) < limit {
		h[holder] = true
		return true, nil
	}
	return false, nil
}

func (m *memorySlots) ReleaseDeliverySlot(_ context.Context, tenant, holder uuid.UUID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.held[tenant], holder)
	return nil
}

// TestWebhooksFleetInFlight (issue 11): three nodes deliver one tenant's
// events to a slow endpoint. Each node caps the tenant at TenantInFlight
// (2) attempts; with shared Slots the cap holds for the fleet: never more
// than 2 attempts at once, where three nodes alone reach 6. Every event is
// delivered once either way.
func TestWebhooksFleetInFlight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		shared bool
		most   int // the most attempts at once: exact with slots, at least without
	}{
		{"per process", false, 3},
		{"fleet-wide slots", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tenant := uuid.New()
			store := &fleetEvents{leased: map[uuid.UUID]uuid.UUID{}}
			const events = 18
			for range events {
				store.pending = append(store.pending, NewEvent(uuid.New(), EventTestPing, tenant, EnvironmentLive, nil, nil,
					time.Now(), "", PingData{Message: "ping"}))
			}
			endpoint := &slowEndpoint{}
			slots := &memorySlots{held: map[uuid.UUID]map[uuid.UUID]bool{}}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for range 3 {
				w := NewWebhooks(store, fleetTenant{"https://example.com/hook", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"},
					endpoint, SystemClock{}, zerolog.Nop())
				w.Workers, w.TenantInFlight, w.Poll = 8, 2, 5*time.Millisecond
				if tc.shared {
					w.Slots = slots
				}
				wg.Add(1)
				go func() { defer wg.Done(); w.Run(ctx) }()
			}
			deadline := time.Now().Add(20 * time.Second)
			for {
				store.mu.Lock()
				done := store.delivered
				store.mu.Unlock()
				if done == events || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			wg.Wait()
			if store.delivered != events {
				t.Fatalf("%d of %d events delivered", store.delivered, events)
			}
			if tc.shared && endpoint.most != tc.most {
				t.Fatalf("at most %d attempts at once with fleet-wide slots, want exactly %d", endpoint.most, tc.most)
			}
			if !tc.shared && endpoint.most < tc.most {
				t.Fatalf("at most %d attempts at once on 3 nodes without slots; the test cannot tell the cap apart (want >= %d)", endpoint.most, tc.most)
			}
			t.Logf("%s: at most %d attempts at once", tc.name, endpoint.most)
		})
	}
}
