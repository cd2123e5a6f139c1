// The door: a request's first Redis round trip (issue 26), which carries
// everything the request asks of Redis before its endpoint runs.

package engine

import (
	"context"
	"crypto/sha256"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine/idempotency"
)

// DoorTrips sends a request's door in one round trip (lua.Store).
type DoorTrips interface {
	// DoorTrip reads ask.Tenant's change stamps and, when asked, takes from
	// a rate budget and claims an idempotency key, together; each part
	// answers (or fails) on its own.
	DoorTrip(ctx context.Context, ask DoorAsk) DoorAnswer
}

// DoorAsk is what a request asks at its door besides its tenant's stamps.
type DoorAsk struct {
	Tenant uuid.UUID
	// Rate, when set, is a take from an API key's budget
	// (RateBudgets.TakeRate).
	Rate *RateAsk
	// Claim, when set, is an idempotency claim
	// (idempotency.Records.Begin).
	Claim *ClaimAsk
}

// RateAsk is RateBudgets.TakeRate's arguments.
type RateAsk struct {
	Key                        uuid.UUID
	PerSecond, Burst, Requests int
	Now                        time.Time
	// Fenced, when set, makes the take conditional on the tenant's
	// StampTenant being Stamp: the limits come from this node's cached
	// tenant, and an operator may have changed them on another node since.
	// A take that finds the stamp moved takes nothing (DoorAnswer.RateStale).
	Fenced bool
	Stamp  uint64
}

// ClaimAsk is idempotency.Records.Begin's arguments.
type ClaimAsk struct {
	Key, RequestHash string
	LockTTL          time.Duration
}

// DoorAnswer is each part's answer.
type DoorAnswer struct {
	Stamps    TenantStamps
	StampsErr error
	Rate      RateDecision
	RateErr   error
	// RateStale: the fenced take found the tenant's stamp moved and took
	// nothing; the request takes again once it has the current limits.
	RateStale bool
	Claim     idempotency.Record
	Claimed   bool
	ClaimErr  error
}

// WithDoor lets s open doors (Open) through trips, the stamps read there
// kept in st (the Stamps its key cache checks).
func (s *Tenants) WithDoor(trips DoorTrips, st *Stamps) *Tenants {
	s.door, s.doorStamps = trips, st
	return s
}

// Open sends, for an API key this node holds in its cache, the request's
// door: the tenant's change stamps and what plan asks for given the cached
// scope and tenant (a rate take, an idempotency claim), in one round trip
// instead of one each. The context it returns carries the stamps read, so
// the request's authentication (AuthenticateBytes) checks its cached key
// against them without reading them again: a key revoked or a setting
// changed anywhere in the fleet is still seen by this request, after the
// door. What the door took on the strength of the cached key (a claim) is
// the caller's to give back when authentication then refuses. ok is false
// when the key is not cached or no door is set: the request goes the
// usual way, one round trip per step.
func (s *Tenants) Open(ctx context.Context, plain []byte, plan func(Scope, Tenant) DoorAsk) (context.Context, DoorAnswer, bool) {
	if s.door == nil {
		return ctx, DoorAnswer{}, false
	}
	peek, ok := s.keys.(interface {
		Peek(sum [32]byte) (Scope, Tenant, uint64, bool)
	})
	if !ok {
		return ctx, DoorAnswer{}, false
	}
	scope, t, stamp, ok := peek.Peek(sha256.Sum256(plain))
	if !ok {
		return ctx, DoorAnswer{}, false
	}
	ask := plan(scope, t)
	ask.Tenant = scope.TenantID
	if ask.Rate != nil && s.doorStamps != nil && s.doorStamps.store != nil {
		// The limits are the cached tenant's, good only while its stamp is
		// the one they were read under (a node alone has no other writer).
		ask.Rate.Fenced, ask.Rate.Stamp = true, stamp
	}
	ans := s.door.DoorTrip(ctx, ask)
	switch st := s.doorStamps; {
	case st == nil || st.store == nil:
		return ctx, ans, true // a node alone: no stamps to keep
	case ans.StampsErr != nil:
		st.readFailed(ans.StampsErr)
		return ctx, ans, true
	default:
		st.observe(scope.TenantID, ans.Stamps)
		return context.WithValue(ctx, stampsReadKey{}, scope.TenantID), ans, true
	}
}

// stampsReadKey is the context key under which Open notes the tenant whose
// stamps this request has read (Stamps.Refresh then reads them no more).
type stampsReadKey struct{}

// RateDecision is one take from an API key's rate budget (a lease of one or
// more requests) and the figures of the RateLimit headers (docs/spec/addendum.md §10).
type RateDecision struct {
	Allowed bool
	// Granted is the requests the take spent (0 when refused): the ones
	// asked for, or fewer when only those fitted.
	Granted int
	// Limit is the burst: the most requests the budget holds.
	Limit int
	// Remaining is the whole requests left in the budget after this take.
	Remaining int
	// Reset is the time until the budget is full again.
	Reset time.Duration
	// RetryAfter is the time until one request is allowed (refused only).
	RetryAfter time.Duration
}
