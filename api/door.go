package api

import (
	"errors"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
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
	// rateLimits are the limits (per second, burst) the decision was made
	// under, the cached tenant's: rateLimit decides again when
	// authentication read others (a tenant changed on another node), so
	// the change governs this request (invariant 15).
	rateLimits [2]int
	// claimAsked: the door claimed claimKey for claimHash of tenant at
	// claimedAt; claim is its answer, claimUsed set once idempotent took it.
	claimAsked bool
	claimUsed  bool
	tenant     uuid.UUID
	claimKey   string
	claimHash  string
	claimedAt  time.Time
	claim      idempotency.Record
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
	var perSecond, burst int
	var keyID uuid.UUID
	ctx, ans, ok := s.tenants.Open(c.reqContext(), key, func(scope engine.Scope, t engine.Tenant) engine.DoorAsk {
		var ask engine.DoorAsk
		if s.budgets != nil && !d.rateDone {
			var now time.Time
			now, local = s.rateClocks()
			perSecond, burst = keyLimits(t.RateLimitPerSecond, t.RateLimitBurst)
			keyID = scope.KeyID
			p, err := planShared(c.reqContext(), s.refusals, s.leases, scope.KeyID, perSecond, burst, local, false)
			switch {
			case err != nil:
			case p.decided:
				d.rateDone, d.rate, d.rateLimits = true, p.d, [2]int{perSecond, burst}
			default:
				plan = p
				ask.Rate = &engine.RateAsk{Key: scope.KeyID, PerSecond: perSecond, Burst: burst, Requests: p.want, Now: now}
			}
		}
		if rt.opts&optIdem != 0 && !c.dry {
			if k := c.ctx.Request.Header.PeekBytes(headerIdempotencyKey); claimable(k) {
				d.claimAsked, d.tenant, d.claimKey, d.claimedAt = true, scope.TenantID, string(k), time.Now()
				d.claimHash = requestHash(scope.Environment, c.ctx)
				ask.Claim = &engine.ClaimAsk{Key: d.claimKey, RequestHash: d.claimHash, LockTTL: idempotency.LockTTL}
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
		d.rateDone, d.rateLimits = true, [2]int{perSecond, burst}
	}
	if d.claimAsked {
		d.claim, d.claimed, d.claimErr = ans.Claim, ans.Claimed, ans.ClaimErr
	}
}

// claimable reports whether an Idempotency-Key header value passes the
// checks idempotent makes before its claim, so the door claims only what
// idempotent would.
func claimable(k []byte) bool {
	if len(k) == 0 || (len(k) > idempotency.MaxKeyChars && utf8.RuneCount(k) > idempotency.MaxKeyChars) || !printableASCII(k) {
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
	s.claims.Release(c.reqContext(), idempotency.Request{Tenant: d.tenant, Key: d.claimKey, RequestHash: d.claimHash, ID: c.reqID})
}

// fuse runs a money route with its door fused into its money script
// (engine.FusedDoor) when this node can: the key cached and authenticated
// without a read (the script checks the tenant's stamps the caches were
// read under), the rate decided by this node's lease or taken by the
// script, and the Idempotency-Key claimed by the script itself. The
// request then costs one Redis round trip instead of two (issue 26). It
// reports whether it answered the request; false leaves the request as it
// found it but for a rate decision it made (c.door.rateDone, which the
// usual path applies instead of taking again), and the usual path serves
// it: a stamp moved or the key has a record (a twin, a retry, another
// request's key), or the endpoint answered before any money script ran (a
// 4xx of its own checks, a replay from Postgres), all of which the usual
// path answers under its own claim.
func (s *Server) fuse(rt *route, c *call) bool {
	ctx := c.ctx
	key := ctx.Request.Header.Peek("X-API-Key")
	idem := ctx.Request.Header.PeekBytes(headerIdempotencyKey)
	if len(key) == 0 || !claimable(idem) || s.budgets == nil {
		return false
	}
	before := c.tctx
	fctx, door, ok := s.tenants.Fuse(c.reqContext(), key)
	if !ok {
		return false
	}
	c.tctx = fctx
	scope, tenant, err := s.tenants.AuthenticateBytes(fctx, key)
	if err != nil {
		c.tctx = before
		return false
	}
	c.scope, c.tenant = scope, tenant
	rate, ok := s.fusedRate(c, door)
	if !ok {
		c.tctx, c.scope, c.tenant = before, engine.Scope{}, engine.Tenant{}
		return false
	}
	c.idem = engine.Idempotency{Key: string(idem), RequestHash: requestHash(scope.Environment, ctx)}
	door.Key, door.RequestHash, door.LockTTL, door.Window = c.idem.Key, c.idem.RequestHash, idempotency.LockTTL, idempotency.ReplayWindow
	claimedAt := time.Now()
	err = c.invoke(rt.ep)
	c.tctx = before
	s.settleFusedRate(c, scope.KeyID, rate, door)
	switch door.Outcome() {
	case engine.FusedRateRefused:
		c.answerRateRefused()
		return true
	case engine.FusedMarked, engine.FusedClaimed:
		// The script claimed the key (and marked it on an answer): the
		// rest is what runClaimed does after its endpoint.
		if c.door.rateDone {
			c.applyLimit(c.door.rate, errRateLimited)
		}
		if err != nil {
			c.fail(err)
		}
		s.claims.Settle(c.reqContext(), c.claimRequest(rt), claimedAt, (*answer)(&ctx.Response), door.Outcome() == engine.FusedMarked)
		return true
	}
	// Nothing was claimed: forget what the endpoint wrote and serve the
	// request the usual way (the RateLimit headers are set again then).
	c.scope, c.tenant, c.idem = engine.Scope{}, engine.Tenant{}, engine.Idempotency{}
	ctx.Response.Reset()
	ctx.Response.Header.SetBytesKV(headerRequestID, c.reqID)
	return false
}

// settleFusedRate settles the take a fused door planned (rate.want > 0):
// the door took the budget, or never did (then the lease is given back
// untaken and the usual path's door takes it). The decision is kept in
// c.door for what answers the request next.
func (s *Server) settleFusedRate(c *call, key uuid.UUID, rate fusedPlan, door *engine.FusedDoor) {
	if rate.want == 0 {
		return
	}
	rerr := errRateFenceMoved
	if door.RateTaken {
		rerr = nil
	}
	d, derr := finishShared(s.refusals, s.leases, key, rate.perSecond, rate.local, rate.ratePlan, door.RateAnswer, rerr)
	if derr == nil {
		c.door.rateDone, c.door.rate, c.door.rateLimits = true, d, [2]int{rate.perSecond, rate.burst}
	}
}

// answerRateRefused answers 429 in place of what a fused endpoint wrote:
// its door's budget refused it.
func (c *call) answerRateRefused() {
	c.ctx.Response.Reset()
	c.ctx.Response.Header.SetBytesKV(headerRequestID, c.reqID)
	c.applyLimit(c.door.rate, errRateLimited)
}

// fusedPlan is a fused request's rate plan: the take the script makes
// (want > 0) under these figures.
type fusedPlan struct {
	ratePlan
	perSecond, burst int
	local            time.Time
}

// fusedRate plans the rate of a fused request: decided on this node (a
// lease or a refusal window: nothing to send), or a take the script makes
// (door.Rate). false when the request goes the usual way: the plan failed,
// or the rate refused it (the decision kept in c.door for the usual path,
// which answers the 429 after its own authentication).
func (s *Server) fusedRate(c *call, door *engine.FusedDoor) (fusedPlan, bool) {
	now, local := s.rateClocks()
	perSecond, burst := keyLimits(c.tenant.RateLimitPerSecond, c.tenant.RateLimitBurst)
	p, err := planShared(c.reqContext(), s.refusals, s.leases, c.scope.KeyID, perSecond, burst, local, false)
	switch {
	case err != nil:
		return fusedPlan{}, false
	case p.decided:
		c.door.rateDone, c.door.rate, c.door.rateLimits = true, p.d, [2]int{perSecond, burst}
		if !p.d.allowed {
			return fusedPlan{}, false
		}
		c.applyLimit(p.d, errRateLimited)
		return fusedPlan{}, true
	}
	door.Rate = &engine.RateAsk{Key: c.scope.KeyID, PerSecond: perSecond, Burst: burst, Requests: p.want, Now: now}
	return fusedPlan{ratePlan: p, perSecond: perSecond, burst: burst, local: local}, true
}

// fuseRead runs a read route with its door checked by its first Redis
// read (engine.FusedDoor.Read): the key cached and authenticated without a
// read, and the tenant's stamps, with the rate take when this node's lease
// or refusal window does not decide it (fenced on the tenant's stamp), sent
// in the round trip of the endpoint's first read (lua.Store.doRead), or
// after it when the endpoint answered from caches alone
// (Tenants.CheckRead). A check then costs one Redis round trip instead of
// two. It reports whether it answered the request; false leaves the
// request as it found it but for a rate decision it made (c.door.rateDone,
// which the usual path applies instead of taking again): a stamp moved
// since the caches were read, and the usual path serves it.
func (s *Server) fuseRead(rt *route, c *call) bool {
	ctx := c.ctx
	key := ctx.Request.Header.Peek("X-API-Key")
	if len(key) == 0 || s.budgets == nil {
		return false
	}
	before := c.tctx
	fctx, door, ok := s.tenants.FuseRead(c.reqContext(), key)
	if !ok {
		return false
	}
	c.tctx = fctx
	back := func() bool {
		c.tctx, c.scope, c.tenant = before, engine.Scope{}, engine.Tenant{}
		ctx.Response.Reset()
		ctx.Response.Header.SetBytesKV(headerRequestID, c.reqID)
		return false
	}
	scope, tenant, err := s.tenants.AuthenticateBytes(fctx, key)
	if err != nil {
		return back()
	}
	c.scope, c.tenant = scope, tenant
	rate, ok := s.fusedRate(c, door)
	if !ok {
		return back()
	}
	if door.Rate != nil {
		// The take is made beside the read, not atomically with a stamps
		// check as in a money script: it holds only while the tenant's
		// stamp is the one its limits were read under.
		door.Rate.Fenced, door.Rate.Stamp = door.Checked, door.Stamps[engine.StampTenant]
	}
	err = c.invoke(rt.ep)
	if door.Outcome() == engine.FusedUnused && !errors.Is(err, engine.ErrFusedStale) {
		s.tenants.CheckRead(c.reqContext(), door)
	}
	s.settleFusedRate(c, scope.KeyID, rate, door)
	switch door.Outcome() {
	case engine.FusedRateRefused:
		c.answerRateRefused()
		c.tctx = before
		return true
	case engine.FusedChecked:
		c.tctx = before
		if c.door.rateDone {
			c.applyLimit(c.door.rate, errRateLimited)
		}
		if err != nil {
			c.fail(err)
		}
		return true
	}
	return back()
}
