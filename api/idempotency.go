package api

import (
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

// The HTTP glue of the idempotency room (engine/idempotency/README.md):
// the header, the refusals of a bad key, the answers and their headers.
// What a claim does is idempotency.Claims'.

var (
	headerIdempotencyKey = []byte("Idempotency-Key")
	headerReplayed       = []byte("X-Idempotent-Replayed")
	valueTrue            = []byte("true")
)

var (
	errIdemKeyMissing = engine.Invalid("Idempotency-Key", "the Idempotency-Key header is required on this request")
	errIdemKeyLong    = engine.Invalid("Idempotency-Key", "the Idempotency-Key header is longer than 256 characters")
	errIdemBusy       = engine.Conflict("a request with this Idempotency-Key is still in progress; retry with the same key later")
)

// idempotent runs a POST or PATCH at most once per tenant and key
// (docs/spec/interface.md Common rules 1) under idempotency.Claims: it
// reads and checks the Idempotency-Key header, claims the key (starting
// from the door's claim when the door made the one this request needs),
// and runs the route, answers the stored response with
// X-Idempotent-Replayed, or refuses, by the claim's outcome. Requests
// refused before this point (auth, rate limit, a missing key) leave no
// record.
func (s *Server) idempotent(rt *route, c *call) {
	ctx := c.ctx
	key := ctx.Request.Header.PeekBytes(headerIdempotencyKey)
	switch {
	case len(key) == 0:
		c.fail(errIdemKeyMissing)
		return
	case len(key) > idempotency.MaxKeyChars && utf8.RuneCount(key) > idempotency.MaxKeyChars:
		c.fail(errIdemKeyLong)
		return
	case !printableASCII(key):
		// Checked before the claim: a key Postgres would refuse is never
		// remembered, so a retry with it gets the same 400, not a replay.
		if err := engine.CheckLine("Idempotency-Key", string(key)); err != nil {
			c.fail(err)
			return
		}
	}
	c.idem = engine.Idempotency{Key: string(key), RequestHash: requestHash(c.scope.Environment, ctx)}
	r := c.claimRequest(rt)
	var door idempotency.Taken
	if d := c.doorClaim(); d != nil {
		door = idempotency.Taken{Asked: true, At: d.claimedAt, Record: d.claim, Claimed: d.claimed, Err: d.claimErr}
	}
	claim := s.claims.Claim(c.reqContext(), ctx, r, door) // ctx is done when the server stops
	switch claim.Outcome {
	case idempotency.OutcomeUnclaimed:
		if err := c.invoke(rt.ep); err != nil {
			c.fail(err)
		}
	case idempotency.OutcomeFailed:
		c.fail(claim.Err)
	case idempotency.OutcomeClaimed:
		s.runClaimed(rt, c, r, claim.At)
	case idempotency.OutcomeMismatch:
		c.fail(engine.ErrIdempotencyMismatch)
	case idempotency.OutcomeRerun:
		s.rerun(rt, c, r)
	case idempotency.OutcomeReplay:
		ctx.SetStatusCode(claim.Record.Status)
		ctx.Response.Header.SetContentType(claim.Record.ContentType)
		ctx.SetBody(claim.Record.Body)
		ctx.Response.Header.SetBytesKV(headerReplayed, valueTrue)
	case idempotency.OutcomeBusy:
		c.fail(errIdemBusy)
	}
}

// runClaimed runs the endpoint under r's claim, taken at claimedAt, and
// settles it by the answer (idempotency.Claims.Settle).
func (s *Server) runClaimed(rt *route, c *call, r idempotency.Request, claimedAt time.Time) {
	if err := c.invoke(rt.ep); err != nil {
		c.fail(err)
	}
	s.claims.Settle(c.reqContext(), r, claimedAt, (*answer)(&c.ctx.Response), false)
}

// rerun answers a retry of a money request whose record says "done, replay
// by re-running": the endpoint runs again and its store call, finding the
// operation in Postgres (lua appliedFirst) or, before the persister
// committed it, under its op key, changes nothing and answers from the
// record of the first run, so status and body are the first ones.
func (s *Server) rerun(rt *route, c *call, r idempotency.Request) {
	if err := c.invoke(rt.ep); err != nil {
		c.fail(err)
	}
	if s.claims.Reran(r, c.ctx.Response.StatusCode()) {
		c.ctx.Response.Header.SetBytesKV(headerReplayed, valueTrue)
	}
}

// claimRequest is c's claim for idempotency.Claims (c.idem set).
func (c *call) claimRequest(rt *route) idempotency.Request {
	return idempotency.Request{Tenant: c.scope.TenantID, Key: c.idem.Key, RequestHash: c.idem.RequestHash,
		Rerun: replaysByRerun(rt), ID: c.reqID}
}

// replaysByRerun reports whether rt's 2xx answers are left unstored because
// a retry re-runs the endpoint and gets the same status and body: the route's
// whole effect is one money script that remembers the operation under its
// op key (lua/prelude/idempotency.lua replay) until Postgres holds it, where every money
// call looks its key up first (lua appliedFirst, forever), and its answer
// is built from that record alone. TestReplayByRerunIdentical
// (internal/e2e) checks each of these byte for byte. Gauge moves are here:
// their Mutation keeps the cap they were made under (engine.MutationGauge).
// Not here: usage batches (a replayed event answers "duplicate"), lease
// renewals and releases, top-ups and every route whose effect is in
// Postgres. A route says so where it is
// registered (optRerun).
func replaysByRerun(rt *route) bool { return rt.opts&optRerun != 0 }

// requestHash is the request's fingerprint (idempotency.Fingerprint) under
// env.
func requestHash(env engine.Environment, ctx *fasthttp.RequestCtx) string {
	return idempotency.Fingerprint(env == engine.EnvironmentSandbox, ctx.Method(), ctx.URI().PathOriginal(), ctx.Request.Body())
}

// answer is a response as idempotency.Answer: its content type and body
// are read only when the room stores them.
type answer fasthttp.Response

func (a *answer) StatusCode() int     { return (*fasthttp.Response)(a).StatusCode() }
func (a *answer) ContentType() []byte { return (*fasthttp.Response)(a).Header.ContentType() }
func (a *answer) Body() []byte        { return (*fasthttp.Response)(a).Body() }
