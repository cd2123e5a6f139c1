package api

import (
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// doorState is what a request's door (openDoor) did: the idempotency
// claim it made, for idempotent to use instead of a round trip of its own.
type doorState struct {
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

// openDoor sends, when this node holds the request's API key in its cache,
// the request's door (engine.Tenants.Open): the tenant's change stamps
// and, on a route with an Idempotency-Key, the claim, in one Redis round
// trip instead of two (issue 26). authenticate and idempotent then use
// what it answered. The rate take stays after authentication (rateLimit):
// taken at the door it would use the cached tenant's limits, and a limit
// an operator changed on another node must govern this very request.
// Without a cached key nothing is sent and each step makes its own round
// trip as before.
func (s *Server) openDoor(rt *route, c *call) {
	key := c.ctx.Request.Header.Peek("X-API-Key")
	if len(key) == 0 {
		return
	}
	d := &c.door
	ctx, ans, ok := s.tenants.Open(c.reqContext(), key, func(scope engine.Scope, _ engine.Tenant) engine.DoorAsk {
		var ask engine.DoorAsk
		if rt.opts&optIdem != 0 {
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
