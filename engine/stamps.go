// Stamps: this node's view of the fleet's change stamps (issue 25), which
// make every node's caches drop what another node's write changed before
// the next request uses it.

package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// StampKind names one family of cached facts of a tenant; a write moves
// the stamp of the kind it changes, and a cache checks the kinds it holds.
type StampKind uint8

const (
	// StampTenant covers the tenant's settings (overage policy, thresholds,
	// rate limits, webhook) and its API keys. Under uuid.Nil it is the
	// fleet's key creations, which the memory of unknown keys checks.
	StampTenant StampKind = iota
	// StampCustomers covers the tenant's customers.
	StampCustomers
	// StampCatalog covers billable metrics and metering rules.
	StampCatalog
	// StampPlans covers plans, variants, plan grants and variant
	// entitlements.
	StampPlans
	// StampSubscriptions covers subscriptions and their overrides.
	StampSubscriptions
	// StampAlerts, under uuid.Nil, covers every credit alert setting: the
	// persister's list of the scopes that have any checks it.
	StampAlerts
	// StampKinds is the number of kinds.
	StampKinds
)

// String is the kind's one-letter field in the tenant's stamps hash.
func (k StampKind) String() string {
	if k < StampKinds {
		return stampFields[k]
	}
	return "?"
}

// stampFields are the kinds' fields in Redis, in kind order.
var stampFields = [StampKinds]string{"t", "c", "m", "p", "s", "a"}

// StampFields is the kinds' fields in kind order (what lua.Store reads).
func StampFields() []string { return stampFields[:] }

// TenantStamps is one read of a tenant's stamps, indexed by StampKind.
type TenantStamps [StampKinds]uint64

// stampMask is a set of kinds a cache entry depends on.
type stampMask uint8

func maskOf(kinds ...StampKind) stampMask {
	var m stampMask
	for _, k := range kinds {
		m |= 1 << k
	}
	return m
}

// The kinds each cache checks. Plan facts hold a variant's entitlements and
// the plan's name besides the subscription and its overrides.
var (
	maskTenant    = maskOf(StampTenant)
	maskCustomers = maskOf(StampCustomers)
	maskCatalog   = maskOf(StampCatalog)
	maskPlans     = maskOf(StampPlans)
	maskPlanFacts = maskOf(StampPlans, StampSubscriptions)
	maskSnapshot  = maskOf(StampTenant, StampCustomers, StampCatalog, StampPlans, StampSubscriptions)
)

const (
	// stampReadTimeout bounds one read of a tenant's stamps; past it the
	// request goes on with what this node has (see stampRetryAfter).
	stampReadTimeout = 500 * time.Millisecond
	// stampRetryAfter is how long a node stops reading stamps after a read
	// failed: meanwhile its caches expire by their TTLs alone (2 s for keys,
	// tenants, metrics, rules and plans, 5 s for customers, each served
	// stale up to its stale limit while a background read refreshes it),
	// as before issue 25, and no request waits on an unreachable Redis.
	stampRetryAfter = time.Second
	// stampBumpTimeout bounds the bump after a committed write; it runs
	// even when the request's context has ended, so a client that hangs up
	// does not keep the change from the fleet.
	stampBumpTimeout = 2 * time.Second
	// stampWarnEvery spaces the warnings of failed reads and bumps.
	stampWarnEvery = 10 * time.Second
	// maxStampTenants bounds the tenants whose stamps a node remembers; a
	// full table starts over (every entry then reloads once).
	maxStampTenants = 100_000
)

// Stamps is this node's view of the fleet's change stamps: the newest
// value it has read of each tenant's stamp of each kind. Requests read
// their tenant's stamps first (Refresh, in CachedKeys); caches store with
// each entry the sum of the stamps it depends on as seen before the entry
// was read (Seen), and an entry whose sum differs from the current one is a
// miss. Stamps only grow (the store bumps past its own clock), so the sum
// changes exactly when one of them moved. A nil *Stamps is a node alone:
// Seen is always 0 and Bump does nothing. Safe for concurrent use.
type Stamps struct {
	store ChangeStamps
	log   zerolog.Logger
	// seen maps a tenant id to its *seenStamps; n counts them.
	seen sync.Map
	n    atomic.Int64
	// downUntil (unix nanoseconds) skips reads after a failed one.
	downUntil atomic.Int64
	// warned (unix nanoseconds) is when a failure was last logged.
	warned atomic.Int64
	// raised counts the times a seen stamp rose, of any tenant: a reader
	// that finds it unchanged across a read knows no stamp it could have
	// used moved meanwhile.
	raised atomic.Uint64
}

type seenStamps [StampKinds]atomic.Uint64

// NewStamps is the view of store's stamps; a nil store is a node alone.
func NewStamps(store ChangeStamps, log zerolog.Logger) *Stamps {
	return &Stamps{store: store, log: log}
}

func (s *Stamps) of(tenant uuid.UUID) *seenStamps {
	if x, ok := s.seen.Load(tenant); ok {
		return x.(*seenStamps)
	}
	if s.n.Load() >= maxStampTenants {
		s.seen.Clear()
		s.n.Store(0)
		s.raised.Add(1) // what was seen is gone: a reader across this reads again
	}
	x, loaded := s.seen.LoadOrStore(tenant, new(seenStamps))
	if !loaded {
		s.n.Add(1)
	}
	return x.(*seenStamps)
}

// Seen is the sum of tenant's stamps of the kinds in m as this node last
// read them (0 before any read). Take it before reading what it stamps.
func (s *Stamps) Seen(tenant uuid.UUID, m stampMask) uint64 {
	if s == nil || s.store == nil {
		return 0
	}
	x, ok := s.seen.Load(tenant)
	if !ok {
		return 0
	}
	st := x.(*seenStamps)
	var sum uint64
	for k := StampKind(0); k < StampKinds; k++ {
		if m&(1<<k) != 0 {
			sum += st[k].Load()
		}
	}
	return sum
}

// observe raises the stamps this node has seen of tenant to v's.
func (s *Stamps) observe(tenant uuid.UUID, v TenantStamps) {
	st := s.of(tenant)
	for k, x := range v {
		s.raise(&st[k], x)
	}
}

// raise sets a to v unless it holds more already.
func (s *Stamps) raise(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if v <= old {
			return
		}
		if a.CompareAndSwap(old, v) {
			s.raised.Add(1)
			return
		}
	}
}

// rises is a count that changes whenever any seen stamp rises (0 for a
// node alone).
func (s *Stamps) rises() uint64 {
	if s == nil {
		return 0
	}
	return s.raised.Load()
}

// Refresh reads tenant's stamps from the fleet so that what this node
// cached under older ones is a miss from now on. It is the request's first
// step, before any cache is read. An error (the store unreachable, or
// skipped for stampRetryAfter after a failure) leaves the caches to their
// TTLs; the caller goes on.
func (s *Stamps) Refresh(ctx context.Context, tenant uuid.UUID) error {
	if s == nil || s.store == nil {
		return nil
	}
	if read, ok := ctx.Value(stampsReadKey{}).(uuid.UUID); ok && read == tenant {
		return nil // this request's door read them (Tenants.Open)
	}
	if d := FusedDoorOf(ctx); d != nil && d.Checked && d.Tenant == tenant {
		return nil // the money script checks them (Tenants.Fuse)
	}
	now := time.Now().UnixNano()
	if now < s.downUntil.Load() {
		return errStampsDown
	}
	ctx, cancel := context.WithTimeout(ctx, stampReadTimeout)
	v, err := s.store.StampsRead(ctx, tenant)
	cancel()
	if err != nil {
		s.readFailed(err)
		return err
	}
	s.observe(tenant, v)
	return nil
}

// readFailed notes a failed read of the stamps: none is tried for
// stampRetryAfter, the caches meanwhile keep their short TTLs.
func (s *Stamps) readFailed(err error) {
	if s == nil || s.store == nil {
		return
	}
	s.downUntil.Store(time.Now().Add(stampRetryAfter).UnixNano())
	s.warn(err, "change stamps unreadable: caches fall back to their TTLs")
}

// stampedTTL is how long the caches keep an entry read while this node
// reads the stamps (Live): every request reads its tenant's stamps first
// and a cache entry read under other stamps is a miss, so a change made
// anywhere in the fleet is seen by the next request whatever the TTL; the
// TTL then only spaces the refreshes that change nothing (issue 26: a
// money call makes no Postgres round trip), and bounds what a change whose
// stamp bump failed (logged) leaves behind. While the stamps cannot be
// read, entries are kept for their own short TTLs (stampRetryAfter).
const stampedTTL = 30 * time.Second

// TTL is how long a cache keeps an entry read now: stampedTTL while this
// node reads the stamps, short otherwise (a node alone, whose stamps are
// no store, or stamps unreadable a moment ago).
func (s *Stamps) TTL(short time.Duration) time.Duration {
	if s == nil || s.store == nil || time.Now().UnixNano() < s.downUntil.Load() {
		return short
	}
	return max(short, stampedTTL)
}

// Current reads tenant's stamps (Refresh) and returns the one of kind, for
// a reader outside the request path (the persister's alert scopes) that
// keeps one cached list per kind. An error is Refresh's: the caller then
// keeps its list to its TTL.
func (s *Stamps) Current(ctx context.Context, tenant uuid.UUID, kind StampKind) (uint64, error) {
	if err := s.Refresh(ctx, tenant); err != nil {
		return 0, err
	}
	if s == nil || s.store == nil {
		return 0, nil
	}
	return s.of(tenant)[kind].Load(), nil
}

// ForgettingAlerts decorates store so that every alert setting it writes
// moves the fleet's alert stamp (StampAlerts of uuid.Nil) before the write
// answers: every node's persister then reads its list of the scopes with
// settings again before its next batch.
func (s *Stamps) ForgettingAlerts(store AlertStore) AlertStore {
	return &stampingAlerts{AlertStore: store, stamps: s}
}

// stampingAlerts is an AlertStore whose writes move the alert stamp.
type stampingAlerts struct {
	AlertStore
	stamps *Stamps
}

func (a *stampingAlerts) AlertSettingsPut(ctx context.Context, sc Scope, customer *uuid.UUID, settings AlertSettings, now time.Time) error {
	err := a.AlertStore.AlertSettingsPut(ctx, sc, customer, settings, now)
	if err == nil {
		a.stamps.Bump(ctx, uuid.Nil, StampAlerts)
	}
	return err
}

func (a *stampingAlerts) AlertSettingsDelete(ctx context.Context, sc Scope, customer uuid.UUID) (bool, error) {
	ok, err := a.AlertStore.AlertSettingsDelete(ctx, sc, customer)
	if err == nil && ok {
		a.stamps.Bump(ctx, uuid.Nil, StampAlerts)
	}
	return ok, err
}

// errStampsDown: a read failed less than stampRetryAfter ago.
var errStampsDown = errors.New("engine: change stamps unreadable a moment ago; not read again yet")

// Bump moves tenant's stamp of kind, after a write of that kind committed
// and before it answers, so that every node's next request drops what it
// cached of it. A failure is logged, not returned: the write stands, and
// the other nodes see it within their caches' TTLs.
func (s *Stamps) Bump(ctx context.Context, tenant uuid.UUID, kind StampKind) {
	if s == nil || s.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stampBumpTimeout)
	defer cancel()
	v, err := s.store.StampBump(ctx, tenant, kind)
	if err != nil {
		s.warn(err, "change stamp not moved: other nodes see this change within their caches' TTLs")
		return
	}
	s.raise(&s.of(tenant)[kind], v)
}

// warn logs err at most once per stampWarnEvery.
func (s *Stamps) warn(err error, msg string) {
	now := time.Now().UnixNano()
	last := s.warned.Load()
	if now-last < int64(stampWarnEvery) || !s.warned.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn().Err(err).Msg(msg)
}
