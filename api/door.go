package api

import (
	"errors"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// doorState is what a request's door (openDoor) did: the rate decision it
// took and the idempotency claim it made, for rateLimit and idempotent to
// use instead of a round trip each.
type doorState struct {
	// rateDone: the door decided the rate limit (rate, or rateErr when the
	// budgets failed).
	rateDone bool
	rate     decision
	rateErr  error
	// claimAsked: the door claimed claimKey for claimHash of tenant at
	// claimedAt; claim is its answer, claimUsed set once idempotent took it.
	claimAsked bool
	claimUsed  bool
	tenant     uuid.UUID
	claimKey   string
	claimHash  string
	claimedAt  time.Time
	claim      engine.IdemRecord
	claimed    bool
	claimErr   error
}

// errRateFenceMoved settles the lease of a take the door's fence refused.
var errRateFenceMoved = errors.New("api: the tenant's stamp moved since its limits were cached")

// openDoor sends, when this node holds the request's API key in its cache,
// the request's door (engine.Tenants.Open): the tenant's change stamps, a
// take of the key's rate budget unless this node's lease or a refusal
// window decides it, and, on a route with an Idempotency-Key, the claim,
// in one Redis round trip instead of three (issue 26). authenticate,
// rateLimit and idempotent then use what it answered. Without a cached key
// nothing is sent and each step makes its own round trip as before.
//
// The take uses the cached tenant's limits, so it is fenced on the stamp
// they were read under: when an operator changed the tenant anywhere in
// the fleet, Redis takes nothing and rateLimit takes again under the new
// limits (a limit changed on one node governs the next request on all).
func (s *Server) openDoor(rt *route, c *call) {
	key := c.ctx.Request.Header.Peek("X-API-Key")
	if len(key) == 0 {
		return
	}
	d := &c.door
	var plan ratePlan
	var local time.Time
	var perSecond int
	var keyID uuid.UUID
	ctx, ans, ok := s.tenants.Open(c.reqContext(), key, func(scope engine.Scope, t engine.Tenant) engine.DoorAsk {
		var ask engine.DoorAsk
		if s.budgets != nil {
			var now time.Time // zero: the budget store's clock
			local = time.Now()
			if s.budgetClock != nil {
				now = s.budgetClock()
				local = now
			}
			var burst int
			perSecond, burst = keyLimits(t.RateLimitPerSecond, t.RateLimitBurst)
			keyID = scope.KeyID
			p, err := planShared(c.reqContext(), s.refusals, s.leases, scope.KeyID, perSecond, burst, local, false)
			switch {
			case err != nil:
			case p.decided:
				d.rateDone, d.rate = true, p.d
			default:
				plan = p
				ask.Rate = &engine.RateAsk{Key: scope.KeyID, PerSecond: perSecond, Burst: burst, Requests: p.want, Now: now}
			}
		}
		if rt.opts&optIdem != 0 && !c.dry {
			if k := c.ctx.Request.Header.PeekBytes(headerIdempotencyKey); claimable(k) {
				d.claimAsked, d.tenant, d.claimKey, d.claimedAt = true, scope.TenantID, string(k), time.Now()
				d.claimHash = fingerprint(scope.Environment, c.ctx.Method(), c.ctx.URI().PathOriginal(), c.ctx.Request.Body())
				ask.Claim = &engine.ClaimAsk{Key: d.claimKey, RequestHash: d.claimHash, LockTTL: idemLockTTL}
			}
		}
		return ask
	})
	if !ok {
		return
	}
	c.tctx = ctx
	switch {
	case plan.want == 0:
	case ans.RateStale:
		// The tenant's settings moved since this node cached its limits:
		// nothing was taken, and rateLimit takes under the limits that
		// authentication now reads. An owner's lease is settled as empty.
		if plan.owner {
			s.leases.settle(keyID, local, perSecond, plan.want, engine.RateDecision{}, errRateFenceMoved)
		}
	default:
		// Settled whatever comes next (an owner's lease must be).
		d.rate, d.rateErr = finishShared(s.refusals, s.leases, keyID, perSecond, local, plan, ans.Rate, ans.RateErr)
		d.rateDone = true
	}
	if d.claimAsked {
		d.claim, d.claimed, d.claimErr = ans.Claim, ans.Claimed, ans.ClaimErr
	}
}

// claimable reports whether an Idempotency-Key header value passes the
// checks idempotent makes before its claim, so the door claims only what
// idempotent would.
func claimable(k []byte) bool {
	if len(k) == 0 || (len(k) > maxIdempotencyKeyChars && utf8.RuneCount(k) > maxIdempotencyKeyChars) || !printableASCII(k) {
		return false
	}
	return true
}

// doorClaim hands idempotent the door's claim once, when it is the one
// idempotent would make now (same tenant, key and fingerprint); nil
// otherwise (any claim the door made is then given back by closeDoor).
func (c *call) doorClaim() *doorState {
	d := &c.door
	if !d.claimAsked || d.claimUsed || d.tenant != c.scope.TenantID || d.claimKey != c.idem.Key || d.claimHash != c.idem.RequestHash {
		return nil
	}
	d.claimUsed = true
	return d
}

// closeDoor gives back a claim the door made that no endpoint ran under
// (authentication or the rate limit refused the request, or idempotent
// wanted another): the key is free again at once, as if never claimed.
func (s *Server) closeDoor(c *call) {
	d := &c.door
	if !d.claimAsked || d.claimUsed || !d.claimed {
		return
	}
	d.claimUsed = true
	if err := s.idem.Abort(c.reqContext(), d.tenant, d.claimKey, d.claimHash); err != nil {
		s.abortLater(d.tenant, d.claimKey, d.claimHash, c.reqID, err)
	}
}
