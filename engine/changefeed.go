// The tenant-wide change feed (issue 27): what a client that answers
// checks from memory must hear of to stay exact. Two sources, one cursor:
// the ordered event log (balances, subscriptions; the events webhooks
// deliver) and the tenant's config changes (ChangeFeed: plans, variant
// entitlements, overrides, metering rules, customers, tenant settings),
// which fire no webhook (docs/spec/interface.md Events) and so have a log of their
// own, appended beside the change stamps that the fleet's caches read.

package engine

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// Change feed limits (invariant 11).
const (
	// ChangeFeedCap is how many config changes a tenant's feed keeps in
	// Redis at least: it is trimmed back to the cap once it holds a tenth
	// more (lua/stamp.lua), so at most 1.1x. A client resuming from before
	// the oldest kept is told to start over (FeedReset), so the cap bounds
	// memory, not correctness.
	ChangeFeedCap = 1000
	// DefaultChangeStreamsPerTenant caps a tenant's open change streams in
	// one process, apart from its balance streams, so a page of dashboards
	// cannot lock a tenant's evaluators out (and the reverse).
	DefaultChangeStreamsPerTenant = 100
	// changeReadLimit is the most config changes one read takes.
	changeReadLimit = 500
)

// ErrTooManyChangeStreams: a tenant already has its cap of change streams
// open here.
var ErrTooManyChangeStreams = &Error{Kind: KindRateLimited,
	Detail: "too many change streams open for this tenant; close one or retry after the Retry-After seconds"}

// ChangeID is a config change's place in its tenant's feed: the Redis
// stream id, milliseconds and a sequence within them. The zero ID is
// before every change.
type ChangeID struct{ Ms, Seq uint64 }

// IsZero reports whether id is before every change.
func (id ChangeID) IsZero() bool { return id == ChangeID{} }

// Less reports whether id comes before o.
func (id ChangeID) Less(o ChangeID) bool {
	return id.Ms < o.Ms || (id.Ms == o.Ms && id.Seq < o.Seq)
}

// String is the stream id form, "ms-seq".
func (id ChangeID) String() string {
	return strconv.FormatUint(id.Ms, 10) + "-" + strconv.FormatUint(id.Seq, 10)
}

// ParseChangeID reads the "ms-seq" form.
func ParseChangeID(s string) (ChangeID, error) {
	ms, seq, ok := strings.Cut(s, "-")
	a, err1 := strconv.ParseUint(ms, 10, 64)
	b, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return ChangeID{}, BadRequest("Last-Event-ID", "Last-Event-ID must be an id this stream sent")
	}
	return ChangeID{a, b}, nil
}

// ConfigChange is one entry of a tenant's change feed: a bump of its
// change stamp of a Fed kind (the facts of that kind changed for some of
// the tenant's customers; which, the stamps do not say), or, with
// Customer set, a reservation notice: a reservation of that customer was
// created, committed or released (NotingReservations).
type ConfigChange struct {
	ID    ChangeID
	Kind  StampKind // of a stamp bump
	Stamp uint64    // the stamp's new value (or the notice's time), microseconds since the epoch
	// Customer and Environment are a reservation notice's.
	Customer    *uuid.UUID
	Environment Environment
}

// Name is the change's name on the feed (event type "change.<name>").
func (c ConfigChange) Name() string {
	if c.Customer != nil {
		return "holds"
	}
	return c.Kind.ChangeName()
}

// Fed reports whether a change of kind alters a check and so goes to the
// change feed: every kind but StampAlerts (alert settings change no check).
func (k StampKind) Fed() bool { return k < StampKinds && k != StampAlerts }

// changeNames are the Fed kinds as the feed names them (event type
// "change.<name>"), in the domain's words.
var changeNames = [StampKinds]string{
	StampTenant:        "tenant",
	StampCustomers:     "customers",
	StampCatalog:       "metering",
	StampPlans:         "plans",
	StampSubscriptions: "subscriptions",
}

// ChangeName is the kind's name on the feed ("plans", "metering", ...).
func (k StampKind) ChangeName() string {
	if k < StampKinds {
		return changeNames[k]
	}
	return ""
}

// StampKindOf is the kind whose field in the stamps hash is f.
func StampKindOf(f string) (StampKind, bool) {
	for k, name := range stampFields {
		if name == f {
			return StampKind(k), true
		}
	}
	return 0, false
}

// FeedCursor is a place in a tenant's change stream: the last event
// sequence and the last config change sent. Its text form, the SSE id, is
// "<sequence>.<change id>" ("42.1764382000000-0"); clients treat it as
// opaque.
type FeedCursor struct {
	Sequence int64
	Change   ChangeID
}

// String is the cursor's text form.
func (c FeedCursor) String() string {
	return strconv.FormatInt(c.Sequence, 10) + "." + c.Change.String()
}

// ParseFeedCursor reads a Last-Event-ID: "" is the zero cursor (start
// now, nothing replayed). Errors: 400 naming Last-Event-ID.
func ParseFeedCursor(raw string) (FeedCursor, error) {
	if raw == "" {
		return FeedCursor{}, nil
	}
	seq, change, ok := strings.Cut(raw, ".")
	if !ok {
		return FeedCursor{}, BadRequest("Last-Event-ID", "Last-Event-ID must be an id this stream sent (<sequence>.<change>)")
	}
	n, err := ParseSequence("Last-Event-ID", seq)
	if err != nil {
		return FeedCursor{}, err
	}
	id, err := ParseChangeID(change)
	if err != nil {
		return FeedCursor{}, err
	}
	return FeedCursor{Sequence: n, Change: id}, nil
}

// FeedItem is one message of a change stream: an event of the log, or a
// config change.
type FeedItem struct {
	Event  *Event
	Change *ConfigChange
}

// ChangeStream is one open subscription to a tenant's whole feed.
type ChangeStream struct {
	// C carries the tenant's events and config changes stored after the
	// stream opened, each source in its order; it is closed when the stream
	// fell too far behind or the feed failed (the client resumes).
	C chan FeedItem
	// env is the stream's environment: the events of the other one are
	// not its key's to see (invariant 8).
	env    Environment
	feed   *tenantFeed
	events *Events
	closed bool // under Events.mu
}

// WithChangeFeed makes s serve change streams from feed's config changes
// besides the event log; perTenant 0 means the default cap.
func (s *Events) WithChangeFeed(feed ChangeFeed, perTenant int) *Events {
	if perTenant <= 0 {
		perTenant = DefaultChangeStreamsPerTenant
	}
	s.changes, s.changesPerTenant = feed, perTenant
	return s
}

// OpenChanges subscribes to the tenant's whole feed from now on: the
// events of the scope's environment, and every config change. Errors:
// 429 ErrTooManyChangeStreams at the tenant's cap; 503 when the event log
// or the change feed cannot be read. The caller must Close it.
func (s *Events) OpenChanges(ctx context.Context, scope Scope) (*ChangeStream, error) {
	f, err := s.feedFor(ctx, scope, func(f *tenantFeed) bool { return len(f.changeStreams) < s.changesPerTenant })
	if err != nil {
		if err == errFeedFull {
			return nil, ErrTooManyChangeStreams
		}
		return nil, err
	}
	st := &ChangeStream{C: make(chan FeedItem, streamBuffer), env: scope.Environment, feed: f, events: s}
	f.changeStreams[st] = struct{}{}
	s.mu.Unlock()
	return st, nil
}

// CurrentAt is the latest moment up to which every event (its write
// persisted) and config change stored before it has been handed to the
// stream (zero before the feed's first proof): a stream is as current as
// its feed, its lag behind now is the persister's plus a poll or two.
func (st *ChangeStream) CurrentAt() time.Time {
	n := st.feed.currentAt.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Close ends the stream; its feed stops with its last stream.
func (st *ChangeStream) Close() {
	s := st.events
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endChangesLocked(st)
}

func (s *Events) endChangesLocked(st *ChangeStream) {
	if st.closed {
		return
	}
	st.closed = true
	close(st.C)
	delete(st.feed.changeStreams, st)
	s.stopIfIdleLocked(st.feed)
}

// ChangesAfter lists up to limit of the tenant's config changes after
// cursor, and whether some after it are gone (the client must start over).
func (s *Events) ChangesAfter(ctx context.Context, scope Scope, after ChangeID, limit int) ([]ConfigChange, bool, error) {
	if s.changes == nil {
		return nil, false, nil
	}
	return s.changes.ChangesAfter(ctx, scope.TenantID, after, limit)
}

// ChangesLast is the id of the tenant's newest config change.
func (s *Events) ChangesLast(ctx context.Context, scope Scope) (ChangeID, error) {
	if s.changes == nil {
		return ChangeID{}, nil
	}
	return s.changes.ChangesLast(ctx, scope.TenantID)
}

// LastSequence is the tenant's highest event sequence handed out.
func (s *Events) LastSequence(ctx context.Context, scope Scope) (int64, error) {
	return s.log.LastSequence(ctx, scope.TenantID)
}

// TenantEventsAfter lists up to limit of the tenant's events (both
// environments) after a sequence, in sequence order: a change stream's
// catch-up, which skips the other environment's.
func (s *Events) TenantEventsAfter(ctx context.Context, scope Scope, after int64, limit int) ([]Event, error) {
	return s.log.EventsAfter(ctx, scope.TenantID, nil, after, limit)
}

// deliverChanges hands config changes to the feed's change streams; a
// stream whose buffer is full is ended.
func (s *Events) deliverChanges(f *tenantFeed, cs []ConfigChange) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range cs {
		c := cs[i]
		for st := range f.changeStreams {
			select {
			case st.C <- FeedItem{Change: &c}:
			default:
				s.endChangesLocked(st)
			}
		}
	}
}

// reservationNoteTimeout bounds a reservation notice after the reservation's own script
// answered; it runs even when the request's context ended.
const reservationNoteTimeout = 2 * time.Second

// NotingReservations decorates hot so that every reservation create, extend,
// commit and release (the sweep's expiry too) that changed something
// appends a reservation
// notice of its customer to the tenant's change feed before it answers:
// a reservation moves reserved_balance and effective_balance, and only some of
// its outcomes fire an event (credit.consumed on a commit with units),
// so a client answering checks from memory would not hear of the rest.
// It adds one Redis round trip to those calls, none to a consume, and
// nothing to their Lua scripts; under a fused door (a single Redis) the
// money script appends the notice itself, in its own round trip. A failed notice is logged, not returned:
// the reservation stands. Replays and dry runs (ReserveDry passes through) note
// nothing: nothing changed.
func NotingReservations(hot MeteringStore, notes ReservationNotes, log zerolog.Logger) MeteringStore {
	return &notingReservations{MeteringStore: hot, notes: notes, log: log}
}

type notingReservations struct {
	MeteringStore
	notes ReservationNotes
	log   zerolog.Logger
}

func (h *notingReservations) Reserve(ctx context.Context, cmd ReserveCommand) (MutationResult, error) {
	d := fuseNote(ctx, cmd.Customer)
	res, err := h.MeteringStore.Reserve(ctx, cmd)
	h.note(ctx, d, cmd.Customer, res, err)
	return res, err
}

func (h *notingReservations) Commit(ctx context.Context, cmd CommitCommand) (MutationResult, error) {
	d := fuseNote(ctx, cmd.Customer)
	res, err := h.MeteringStore.Commit(ctx, cmd)
	h.note(ctx, d, cmd.Customer, res, err)
	return res, err
}

func (h *notingReservations) Extend(ctx context.Context, cmd ExtendCommand) (MutationResult, error) {
	d := fuseNote(ctx, cmd.Customer)
	res, err := h.MeteringStore.Extend(ctx, cmd)
	h.note(ctx, d, cmd.Customer, res, err)
	return res, err
}

func (h *notingReservations) Release(ctx context.Context, cmd ReleaseCommand) (MutationResult, error) {
	d := fuseNote(ctx, cmd.Customer)
	res, err := h.MeteringStore.Release(ctx, cmd)
	h.note(ctx, d, cmd.Customer, res, err)
	return res, err
}

// fuseNote asks ctx's open fused door, if any, to append c's reservation notice
// in its money script (the reservation's one round trip); the door it returns is
// the one asked.
func fuseNote(ctx context.Context, c CustomerKey) *FusedDoor {
	d := FusedDoorOf(ctx)
	if !d.Open() {
		return nil
	}
	d.ReservationNote = &c
	return d
}

func (h *notingReservations) note(ctx context.Context, d *FusedDoor, c CustomerKey, res MutationResult, err error) {
	if d != nil {
		d.ReservationNote = nil // asked for this call only
	}
	if err != nil || res.Replayed || (d != nil && d.Noted) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reservationNoteTimeout)
	defer cancel()
	if err := h.notes.ReservationNote(ctx, c); err != nil {
		h.log.Warn().Err(err).Str("customer", c.CustomerID.String()).Msg("reservation notice not written: change streams miss this reservation")
	}
}
