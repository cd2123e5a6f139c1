// The fused door: on a single Redis, a money request's door (its tenant's
// stamps, its idempotency claim) runs inside the money script itself, so
// the request makes one Redis round trip, not two (issue 26).

package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"

	"github.com/google/uuid"
)

// DoorFuser is a store that can run a FusedDoor inside a money script
// (lua.Store on a single Redis with Functions). On a Cluster the stamps,
// the claim's record and the customer live in different slots, so it
// cannot, and the request opens its door the usual way (Tenants.Open).
type DoorFuser interface {
	FusesDoors() bool
}

// FusedOutcome is what a fused door did.
type FusedOutcome uint8

const (
	// FusedUnused: no money script ran under the door yet (the endpoint
	// refused the request first, or its script asked for state first).
	FusedUnused FusedOutcome = iota
	// FusedStale: the script found a stamp moved since this node read the
	// caches the request used, or a record under the key (a twin, a retry,
	// the key of another request): it ran nothing, and the request must go
	// the usual way.
	FusedStale
	// FusedMarked: the script ran, and the key's record now says "done,
	// replay by re-running" (what a claim and its rerun mark leave,
	// idempotency.Claims.Settle).
	FusedMarked
	// FusedClaimed: the script refused, and the key's record is this
	// request's in-progress claim (what Begin leaves): the caller settles it
	// as any claim.
	FusedClaimed
	// FusedRateRefused: the key's rate budget refused the request
	// (RateAnswer): nothing else ran.
	FusedRateRefused
	// FusedChecked: a read door's first Redis read found the tenant's
	// stamps where the request's caches were read under (FusedDoor.Read).
	FusedChecked
)

// ErrFusedStale is a money script's answer when its fused door found the
// request's caches stale or the key recorded (FusedStale): nothing ran.
var ErrFusedStale = errors.New("engine: the fused door found a stamp moved or the key recorded; nothing ran")

// FusedDoor is one request's door as its money script checks it: the
// tenant's stamps this node's caches were read under, and the claim.
type FusedDoor struct {
	Tenant uuid.UUID
	// Stamps are the tenant's stamps as seen when the request began
	// (Checked false: a node alone, no stamps to check).
	Stamps  TenantStamps
	Checked bool
	// Key and RequestHash are the claim's (the Idempotency-Key and the
	// request's fingerprint); LockTTL is an in-progress claim's life and
	// Window the rerun mark's (idempotency.ReplayWindow).
	Key, RequestHash string
	LockTTL, Window  time.Duration
	// Rate, when set, is a take from the key's rate budget the script makes
	// after the stamps (unfenced: the stamps check covers the limits);
	// once taken, RateTaken holds and RateAnswer is the budget's answer, and
	// the script run again (after NOSTATE) takes nothing more.
	Rate       *RateAsk
	RateTaken  bool
	RateAnswer RateDecision
	// ReservationNote, when set, asks the script to append the reservation notice of
	// this customer (NotingReservations) after an answer that is not a replay;
	// Noted says it did, so NotingReservations sends none of its own.
	ReservationNote *CustomerKey
	Noted           bool
	// Read marks a read route's door (Tenants.FuseRead): no claim, no rate
	// take and no money script; the first Redis read the request makes
	// under it carries the stamps check in its round trip (ReadOpen), so a
	// check costs one round trip, not two.
	Read    bool
	outcome FusedOutcome
}

// Took records the rate budget's answer to the door's take.
func (d *FusedDoor) Took(rd RateDecision) {
	d.Rate, d.RateTaken, d.RateAnswer = nil, true, rd
}

// Open reports whether the next money script may run under the door:
// none has settled it yet (never a read door's).
func (d *FusedDoor) Open() bool { return d != nil && !d.Read && d.outcome == FusedUnused }

// ReadOpen reports whether the next Redis read is a read door's first:
// it checks the stamps in its round trip and settles the door.
func (d *FusedDoor) ReadOpen() bool { return d != nil && d.Read && d.outcome == FusedUnused }

// Settle records what the script under the door did.
func (d *FusedDoor) Settle(o FusedOutcome) { d.outcome = o }

// Outcome is what the door's script did (FusedUnused before one ran).
func (d *FusedDoor) Outcome() FusedOutcome { return d.outcome }

// fusedDoorKey is the context key of a request's FusedDoor.
type fusedDoorKey struct{}

// WithFusedDoor is ctx with d as the door its money script runs under.
func WithFusedDoor(ctx context.Context, d *FusedDoor) context.Context {
	return context.WithValue(ctx, fusedDoorKey{}, d)
}

// FusedDoorOf is the door ctx's money script runs under, or nil.
func FusedDoorOf(ctx context.Context) *FusedDoor {
	d, _ := ctx.Value(fusedDoorKey{}).(*FusedDoor)
	return d
}

// Fuse starts a fused door for a request whose API key this node holds in
// its cache, when the store can run one: the context it returns carries
// the door, under which the request's authentication reads no stamps (the
// money script checks them instead, against the ones taken here, before
// anything else: an entry cached under older stamps is already a miss, and
// a stamp moved since is the script's FusedStale). ok is false when the
// request must open its door the usual way: no fusing store, the key not
// cached, or the tenant's stamps not read by this node yet.
func (s *Tenants) Fuse(ctx context.Context, plain []byte) (context.Context, *FusedDoor, bool) {
	f, ok := s.door.(DoorFuser)
	if !ok || !f.FusesDoors() {
		return ctx, nil, false
	}
	return s.startDoor(ctx, plain, false)
}

// ReadFuser is a store whose reads can carry a read door's stamps check
// in their own round trip (lua.Store: a pipeline of two commands, on one
// Redis or on a Cluster's two nodes at once).
type ReadFuser interface {
	FusesReads() bool
}

// FuseRead starts a read door for a request whose API key this node holds
// in its cache: as Fuse, but the door (Read) is checked by the request's
// first Redis read instead of a money script. ok is false when the request
// must open its door the usual way.
func (s *Tenants) FuseRead(ctx context.Context, plain []byte) (context.Context, *FusedDoor, bool) {
	f, ok := s.door.(ReadFuser)
	if !ok || !f.FusesReads() {
		return ctx, nil, false
	}
	return s.startDoor(ctx, plain, true)
}

// startDoor is Fuse's and FuseRead's door (read: a read door) for the
// cached API key plain, carrying the tenant's stamps as this node has
// seen them; ok is false when the key is not cached or the stamps were
// never read here.
func (s *Tenants) startDoor(ctx context.Context, plain []byte, read bool) (context.Context, *FusedDoor, bool) {
	scope, ok := s.peekScope(plain)
	if !ok {
		return ctx, nil, false
	}
	d := &FusedDoor{Tenant: scope.TenantID, Read: read}
	if st := s.doorStamps; st != nil && st.store != nil {
		if d.Stamps, ok = st.snapshot(scope.TenantID); !ok {
			return ctx, nil, false
		}
		d.Checked = true
	}
	return WithFusedDoor(ctx, d), d, true
}

// CheckRead settles read door d when no read checked it (the endpoint
// answered from caches alone): the door's trip (DoorTrip: the stamps, and
// the rate take the door asks). false when a stamp moved since the caches
// were read, the stamps could not be read, the take was not made, or the
// budget refused it (FusedRateRefused): the request then goes the usual
// way, which reads them again, or answers 429.
func (s *Tenants) CheckRead(ctx context.Context, d *FusedDoor) bool {
	st := s.doorStamps
	checked := d.Checked && st != nil && st.store != nil
	if !checked && d.Rate == nil {
		d.Settle(FusedChecked)
		return true
	}
	ans := s.door.DoorTrip(ctx, DoorAsk{Tenant: d.Tenant, Rate: d.Rate})
	if d.Rate != nil {
		if ans.RateStale || ans.RateErr != nil {
			d.Settle(FusedStale)
			return false
		}
		d.Took(ans.Rate)
		if !ans.Rate.Allowed {
			d.Settle(FusedRateRefused)
			return false
		}
	}
	if checked && (ans.StampsErr != nil || ans.Stamps != d.Stamps) {
		d.Settle(FusedStale)
		return false
	}
	d.Settle(FusedChecked)
	return true
}

// peekScope is the scope of the cached API key plain; false when this
// node does not hold it.
func (s *Tenants) peekScope(plain []byte) (Scope, bool) {
	peek, ok := s.keys.(interface {
		Peek(sum [32]byte) (Scope, Tenant, uint64, bool)
	})
	if !ok {
		return Scope{}, false
	}
	scope, _, _, ok := peek.Peek(sha256.Sum256(plain))
	return scope, ok
}

// snapshot is tenant's stamps as this node has seen them; false before it
// read any.
func (s *Stamps) snapshot(tenant uuid.UUID) (TenantStamps, bool) {
	x, ok := s.seen.Load(tenant)
	if !ok {
		return TenantStamps{}, false
	}
	st := x.(*seenStamps)
	var out TenantStamps
	for k := range out {
		out[k] = st[k].Load()
	}
	return out, true
}
