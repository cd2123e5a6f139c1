package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// FeedWake says which of a tenant's sources has something new.
type FeedWake uint8

const (
	// WakeEvents: events of the tenant were committed to the event log.
	WakeEvents FeedWake = 1 << iota
	// WakeChanges: a config change or reservation notice joined the tenant's
	// change feed.
	WakeChanges
	// wakeAll is both sources.
	wakeAll = WakeEvents | WakeChanges
)

// DefaultWakeGap is the least time between two reads of a tenant's feed
// that wakes start: a storm of wakes (a reservation notice per reservation, a
// persister batch per node every linger) then costs a feed at most one
// read per source per gap, and a lone wake waits for none.
const DefaultWakeGap = 5 * time.Millisecond

// wakeRetry is the pause before a failed wake subscription is tried again;
// the feeds poll meanwhile.
const wakeRetry = time.Second

// WithWakes makes s's feeds read as soon as w says their tenant has
// something new, besides every poll: while a feed runs, s follows w (one
// subscription per process, whatever the number of feeds).
func (s *Events) WithWakes(w FeedWakes) *Events {
	s.wakes = w
	return s
}

// Wake makes the tenant's feed, when this process runs one, read what of
// its sources at once (within the wake gap of its last woken read); it
// never blocks.
func (s *Events) Wake(what FeedWake, tenant uuid.UUID) {
	s.mu.Lock()
	f := s.feeds[tenant]
	s.mu.Unlock()
	if f != nil {
		f.wake(what)
	}
}

// wakeAllFeeds wakes every feed on both sources: after a (re)subscription
// the wakes sent while none was held may be lost, and a read costs less
// than waiting for the poll.
func (s *Events) wakeAllFeeds() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.feeds {
		f.wake(wakeAll)
	}
}

// wake records what as pending and signals the feed's loop; wakes that
// arrive before the loop reads coalesce into one read.
func (f *tenantFeed) wake(what FeedWake) {
	f.pending.Or(uint32(what))
	select {
	case f.woken <- struct{}{}:
	default:
	}
}

// followWakesLocked starts following s.wakes when the first feed starts;
// s.mu held.
func (s *Events) followWakesLocked() {
	if s.wakes == nil || s.unfollow != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.unfollow = cancel
	go followWakes(ctx, s.wakes, s.Wake, s.wakeAllFeeds, s.logger)
}

// unfollowWakesLocked stops following once no feed runs; s.mu held.
func (s *Events) unfollowWakesLocked() {
	if s.unfollow != nil && len(s.feeds) == 0 {
		s.unfollow()
		s.unfollow = nil
	}
}

// followWakes follows w until ctx ends, subscribing again after a failure.
func followWakes(ctx context.Context, w FeedWakes, wake func(FeedWake, uuid.UUID), resumed func(), log zerolog.Logger) {
	for {
		err := w.FollowWakes(ctx, wake, resumed)
		if ctx.Err() != nil {
			return
		}
		log.Warn().Err(err).Msg("change feed wakes lost; feeds poll until they resume")
		t := time.NewTimer(wakeRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// wakeWait is how long a feed whose last woken read began at last waits
// before the next one, now.
func wakeWait(last, now time.Time, gap time.Duration) time.Duration {
	if last.IsZero() {
		return 0
	}
	return max(0, gap-now.Sub(last))
}

// WakeSender publishes wakes of the tenants whose events were committed
// (the persister, after each commit) without making the committer wait on
// Redis: tenants gathered while a publish is in flight go out together in
// the next, so a busy persister sends at most one message per publish
// round trip. A failed publish is logged and dropped: the feeds' polls
// find those events.
type WakeSender struct {
	wakes FeedWakes
	log   zerolog.Logger

	mu      sync.Mutex
	pending map[uuid.UUID]struct{}
	signal  chan struct{}
	// failed is set while publishing fails, so an outage logs once.
	failed atomic.Bool
}

// wakeSendTimeout bounds one publish: a wake later than a poll is
// worthless.
const wakeSendTimeout = time.Second

// NewWakeSender returns a sender publishing through w; nil w sends
// nothing.
func NewWakeSender(w FeedWakes, log zerolog.Logger) *WakeSender {
	return &WakeSender{wakes: w, log: log, pending: map[uuid.UUID]struct{}{}, signal: make(chan struct{}, 1)}
}

// Stored queues wakes of the tenants of ms, whose events (if any) were
// committed; it never blocks.
func (w *WakeSender) Stored(ms []Mutation) {
	if w == nil || w.wakes == nil || len(ms) == 0 {
		return
	}
	w.mu.Lock()
	for i := range ms {
		w.pending[ms[i].TenantID] = struct{}{}
	}
	w.mu.Unlock()
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// Run publishes the queued wakes until ctx ends.
func (w *WakeSender) Run(ctx context.Context) {
	if w == nil || w.wakes == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.signal:
		}
		w.mu.Lock()
		tenants := make([]uuid.UUID, 0, len(w.pending))
		for t := range w.pending {
			tenants = append(tenants, t)
		}
		clear(w.pending)
		w.mu.Unlock()
		if len(tenants) == 0 {
			continue
		}
		pctx, cancel := context.WithTimeout(ctx, wakeSendTimeout)
		err := w.wakes.PublishWakes(pctx, WakeEvents, tenants)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil && !w.failed.Swap(true):
			w.log.Warn().Err(err).Msg("change feed wakes not published; feeds poll until they are")
		case err == nil && w.failed.Swap(false):
			w.log.Info().Msg("change feed wakes published again")
		}
	}
}
