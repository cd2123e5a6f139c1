package engine

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// Event log limits (issue 15 item 2; invariant 11).
const (
	// DefaultStreamPoll is how often a tenant's feed reads the events stored
	// after its cursor while it has streams open.
	DefaultStreamPoll = 200 * time.Millisecond
	// DefaultStreamsPerTenant caps a tenant's open streams in one process.
	DefaultStreamsPerTenant = 100
	// streamBuffer is how many events a stream may lag its feed before it is
	// ended (its client resumes with Last-Event-ID).
	streamBuffer = 256
	// feedReadLimit is the most events one read of a feed takes.
	feedReadLimit = 500
)

// ErrTooManyStreams: a tenant already has its cap of streams open here.
var ErrTooManyStreams = &Error{Kind: KindRateLimited,
	Detail: "too many balance streams open for this tenant; close one or retry after the Retry-After seconds"}

// Events serves the ordered event log: pages by sequence (GET /v1/events)
// and live per-customer streams. A stream costs no query of its own: one
// feed per tenant with streams open reads the tenant's new events every
// Poll and hands each to the streams of its customer.
type Events struct {
	log       EventLog
	poll      time.Duration
	perTenant int
	logger    zerolog.Logger
	// WrittenBehind, when set, makes a page wait for the events of the
	// writes acknowledged before it (on any node).
	WrittenBehind *WrittenBehind

	// changes, when set, feeds change streams the tenants' config changes
	// (WithChangeFeed); changesPerTenant caps their open change streams.
	changes          ChangeFeed
	changesPerTenant int

	// wakes, when set, wakes the feeds when their tenant has something
	// new (WithWakes); WakeGap spaces a feed's woken reads (0: the
	// default).
	wakes   FeedWakes
	WakeGap time.Duration

	mu    sync.Mutex
	feeds map[uuid.UUID]*tenantFeed
	// unfollow stops following wakes; nil while not following (no feed).
	unfollow context.CancelFunc
}

// NewEvents builds the event log service; poll and perTenant 0 mean the
// defaults.
func NewEvents(log EventLog, poll time.Duration, perTenant int, logger zerolog.Logger) *Events {
	if poll <= 0 {
		poll = DefaultStreamPoll
	}
	if perTenant <= 0 {
		perTenant = DefaultStreamsPerTenant
	}
	return &Events{log: log, poll: poll, perTenant: perTenant, changesPerTenant: DefaultChangeStreamsPerTenant,
		logger: logger, feeds: map[uuid.UUID]*tenantFeed{}}
}

// EventsPage is a checked GET /v1/events query.
type EventsPage struct {
	After int64 // the sequence to list after (0: from the start)
	Limit int   // <= 0: 20
}

// Page lists the tenant's events (both environments) after a sequence, in
// sequence order; NextCursor is the last sequence listed when more follow.
func (s *Events) Page(ctx context.Context, scope Scope, in EventsPage) (Page[Event], error) {
	after := in.After
	limit := in.Limit
	if limit <= 0 {
		limit = 20
	}
	s.WrittenBehind.All(ctx)
	evs, err := s.log.EventsAfter(ctx, scope.TenantID, nil, after, limit+1)
	if err != nil {
		return Page[Event]{}, err
	}
	page := Page[Event]{Data: evs}
	if len(evs) > limit {
		page.Data, page.HasMore = evs[:limit], true
		page.NextCursor = strconv.FormatInt(*evs[limit-1].Sequence, 10)
	}
	return page, nil
}

// ParseSequence reads a sequence parameter: "" is 0, else a non-negative
// integer. Errors: 400 naming field.
func ParseSequence(field, raw string) (int64, error) {
	if raw == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n < 0 {
		return 0, BadRequest(field, field+" must be a non-negative integer")
	}
	return n, nil
}

// CustomerEventsAfter lists up to limit of one customer's events after a
// sequence, in sequence order: a stream's catch-up on Last-Event-ID.
func (s *Events) CustomerEventsAfter(ctx context.Context, scope Scope, customer uuid.UUID, after int64, limit int) ([]Event, error) {
	return s.log.EventsAfter(ctx, scope.TenantID, &customer, after, limit)
}

// Stream is one open per-customer subscription to its tenant's feed.
type Stream struct {
	// C carries the customer's events stored after the stream opened, in
	// sequence order; it is closed when the stream fell too far behind or
	// the feed failed (the client resumes with Last-Event-ID).
	C        chan Event
	customer uuid.UUID
	feed     *tenantFeed
	events   *Events
	closed   bool // under feed's Events.mu
}

// tenantFeed reads one tenant's new events for its streams.
type tenantFeed struct {
	tenant        uuid.UUID
	streams       map[*Stream]struct{}
	changeStreams map[*ChangeStream]struct{}
	stop          chan struct{}
	// pending is the FeedWake bits not read yet; woken signals them.
	pending atomic.Uint32
	woken   chan struct{}
	// currentAt (unix nanoseconds) is the latest moment up to which every
	// event and config change stored before it was handed to the streams.
	currentAt atomic.Int64
}

// Open subscribes to the customer's events stored from now on. Errors:
// 429 ErrTooManyStreams at the tenant's cap. The caller must Close it.
func (s *Events) Open(ctx context.Context, scope Scope, customer uuid.UUID) (*Stream, error) {
	f, err := s.feedFor(ctx, scope, func(f *tenantFeed) bool { return len(f.streams) < s.perTenant })
	if err != nil {
		if err == errFeedFull {
			return nil, ErrTooManyStreams
		}
		return nil, err
	}
	st := &Stream{C: make(chan Event, streamBuffer), customer: customer, feed: f, events: s}
	f.streams[st] = struct{}{}
	s.mu.Unlock()
	return st, nil
}

// errFeedFull: the tenant's feed has no room for one more stream of the
// kind asked for.
var errFeedFull = errors.New("engine: feed full")

// feedFor returns the tenant's feed, started when it has none, with s.mu
// held, once room says it takes one more stream; else errFeedFull (or the
// error reading where a new feed starts), with s.mu released.
func (s *Events) feedFor(ctx context.Context, scope Scope, room func(*tenantFeed) bool) (*tenantFeed, error) {
	s.mu.Lock()
	if f := s.feeds[scope.TenantID]; f != nil {
		if !room(f) {
			s.mu.Unlock()
			return nil, errFeedFull
		}
		return f, nil
	}
	s.mu.Unlock()
	// A new feed starts after the last sequence handed out and the last
	// config change: anything before them is stored, so a caller's
	// catch-up read after Open sees it.
	cursor, err := s.log.LastSequence(ctx, scope.TenantID)
	if err != nil {
		return nil, err
	}
	var change ChangeID
	if s.changes != nil {
		if change, err = s.changes.ChangesLast(ctx, scope.TenantID); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	f := s.feeds[scope.TenantID]
	if f == nil {
		f = &tenantFeed{tenant: scope.TenantID, streams: map[*Stream]struct{}{},
			changeStreams: map[*ChangeStream]struct{}{}, stop: make(chan struct{}), woken: make(chan struct{}, 1)}
		s.feeds[scope.TenantID] = f
		s.followWakesLocked()
		go s.run(f, cursor, change)
	} else if !room(f) {
		s.mu.Unlock()
		return nil, errFeedFull
	}
	return f, nil
}

// Close ends the stream; its feed stops with its last stream.
func (st *Stream) Close() {
	s := st.events
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endLocked(st)
}

func (s *Events) endLocked(st *Stream) {
	if st.closed {
		return
	}
	st.closed = true
	close(st.C)
	delete(st.feed.streams, st)
	s.stopIfIdleLocked(st.feed)
}

// stopIfIdleLocked stops f once it has no stream of either kind.
func (s *Events) stopIfIdleLocked(f *tenantFeed) {
	if len(f.streams) == 0 && len(f.changeStreams) == 0 && s.feeds[f.tenant] == f {
		delete(s.feeds, f.tenant)
		close(f.stop)
		s.unfollowWakesLocked()
	}
}

// OpenStreams is the number of streams open in this process, of both
// kinds.
func (s *Events) OpenStreams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.feeds {
		n += len(f.streams) + len(f.changeStreams)
	}
	return n
}

// run reads f's tenant's events after cursor, and its config changes after
// change, every poll and when woken, until f stops. Only the poll proves
// how current the feed is (CurrentAt): it keeps its pace however many
// wakes come, and a woken read costs the reads of its sources alone.
func (s *Events) run(f *tenantFeed, cursor int64, change ChangeID) {
	t := time.NewTicker(s.poll)
	defer t.Stop()
	gap := s.WakeGap
	if gap <= 0 {
		gap = DefaultWakeGap
	}
	var proof currentProof
	var lastWoken time.Time
	for {
		select {
		case <-f.stop:
			return
		case <-f.woken:
			if d := wakeWait(lastWoken, time.Now(), gap); d > 0 {
				// Wakes arriving meanwhile join this read.
				w := time.NewTimer(d)
				select {
				case <-f.stop:
					w.Stop()
					return
				case <-w.C:
				}
			}
			what := FeedWake(f.pending.Swap(0))
			if what == 0 {
				continue
			}
			lastWoken = time.Now()
			if what&WakeEvents != 0 {
				cursor, _ = s.readEvents(f, cursor)
			}
			if what&WakeChanges != 0 {
				change, _ = s.pollChanges(f, change)
			}
			continue
		case <-t.C:
		}
		// The poll reads both sources: wakes pending now are answered by it.
		f.pending.Store(0)
		// Only change streams show how current they are: a feed of balance
		// streams alone takes no outbox marks.
		s.mu.Lock()
		proving := len(f.changeStreams) > 0
		s.mu.Unlock()
		if proving {
			proof.begin(s.WrittenBehind)
		} else {
			proof.settled = false
		}
		var eventsRead, changesRead bool
		cursor, eventsRead = s.readEvents(f, cursor)
		change, changesRead = s.pollChanges(f, change)
		if at, ok := proof.end(eventsRead && changesRead); ok {
			f.currentAt.Store(at.UnixNano())
		}
	}
}

// readEvents reads f's tenant's events after cursor and hands them to its
// streams; it returns the new cursor, and whether the reads succeeded.
func (s *Events) readEvents(f *tenantFeed, cursor int64) (int64, bool) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		evs, err := s.log.EventsAfter(ctx, f.tenant, nil, cursor, feedReadLimit)
		cancel()
		if err != nil {
			s.logger.Warn().Err(err).Str("tenant", f.tenant.String()).Msg("event feed read failed")
			return cursor, false
		}
		if len(evs) > 0 {
			cursor = *evs[len(evs)-1].Sequence
			s.deliver(f, evs)
		}
		if len(evs) < feedReadLimit {
			return cursor, true
		}
	}
}

// currentProof finds the moments up to which a feed has handed out every
// change (ChangeStream.CurrentAt): a mark of the outbox taken at a moment
// covers every write acknowledged before it; once the persister has moved
// all of it into Postgres, the event log read after holds their events,
// and the config changes read after hold every one stored before it. The
// mark waits across polls until it is persisted, so a busy persister
// (always a few entries behind) still lets the moment advance, one poll
// and its lag late.
type currentProof struct {
	mark    *OutboxMark
	at      time.Time
	settled bool // the mark is persisted: this poll's reads prove it
}

// begin takes a mark when none is pending, and checks the pending one.
func (p *currentProof) begin(w *WrittenBehind) {
	p.settled = false
	if w == nil || w.marks == nil {
		p.mark, p.at, p.settled = &OutboxMark{}, time.Now(), true
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if p.mark == nil {
		m, err := w.marks.OutboxMark(ctx, nil)
		if err != nil {
			return
		}
		p.mark, p.at = &m, time.Now()
	}
	if len(p.mark.Partitions) == 0 {
		p.settled = true
		return
	}
	done, err := w.marks.OutboxPersisted(ctx, *p.mark)
	p.settled = err == nil && done
}

// end reports the moment this poll proved current, when its reads all
// succeeded after a settled mark.
func (p *currentProof) end(readsOK bool) (time.Time, bool) {
	if !p.settled || !readsOK {
		return time.Time{}, false
	}
	at := p.at
	p.mark = nil
	return at, true
}

// pollChanges reads f's tenant's config changes after change and hands
// them to its change streams; it returns the new cursor, and whether the
// reads succeeded. Changes trimmed
// before they were read end every change stream (each resumes and is
// told to start over).
func (s *Events) pollChanges(f *tenantFeed, change ChangeID) (ChangeID, bool) {
	if s.changes == nil {
		return change, true
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cs, lost, err := s.changes.ChangesAfter(ctx, f.tenant, change, changeReadLimit)
		cancel()
		if err != nil {
			s.logger.Warn().Err(err).Str("tenant", f.tenant.String()).Msg("change feed read failed")
			return change, false
		}
		if lost {
			s.mu.Lock()
			for st := range f.changeStreams {
				s.endChangesLocked(st)
			}
			s.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			last, err := s.changes.ChangesLast(ctx, f.tenant)
			cancel()
			if err != nil {
				return change, false
			}
			return last, true
		}
		if len(cs) > 0 {
			change = cs[len(cs)-1].ID
			s.deliverChanges(f, cs)
		}
		if len(cs) < changeReadLimit {
			return change, true
		}
	}
}

// deliver hands each event to its customer's streams; a stream whose
// buffer is full is ended rather than let it hold the feed.
func (s *Events) deliver(f *tenantFeed, evs []Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range evs {
		e := evs[i]
		if e.CustomerID == nil {
			continue
		}
		for st := range f.changeStreams {
			if e.Environment != st.env {
				continue
			}
			select {
			case st.C <- FeedItem{Event: &evs[i]}:
			default:
				s.endChangesLocked(st)
			}
		}
		for st := range f.streams {
			if st.customer != *e.CustomerID {
				continue
			}
			select {
			case st.C <- e:
			default:
				s.endLocked(st)
			}
		}
	}
}
