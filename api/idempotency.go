package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/engine/idempotency"
)

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
// (docs/spec/interface.md Common rules 1): the first request claims the key and runs;
// its completed response (2xx or 4xx, see storable) is remembered for
// idempotency.ReplayWindow and replayed to every retry with the same fingerprint; a 5xx drops the
// claim so a retry runs afresh. A money route's 2xx is remembered without
// its body: the retry re-runs the endpoint, which replays the operation
// from Postgres or from its op key (replaysByRerun). A duplicate arriving while the first still runs
// waits for its answer, so racing twins produce one effect and one answer. A
// key reused with another fingerprint (another path, body or environment)
// is a 409. Requests refused before this point (auth, rate limit, a missing
// key) leave no record.
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
	c.idem = engine.Idempotency{Key: string(key), RequestHash: fingerprint(c.scope.Environment, ctx.Method(), ctx.URI().PathOriginal(), ctx.Request.Body())}
	tenant := c.scope.TenantID
	deadline := time.Now().Add(idempotency.Wait)
	for {
		claimedAt := time.Now()
		var rec idempotency.Record
		var claimed bool
		var err error
		if d := c.doorClaim(); d != nil {
			claimedAt, rec, claimed, err = d.claimedAt, d.claim, d.claimed, d.claimErr
		} else {
			rec, claimed, err = s.idem.Begin(c.reqContext(), tenant, c.idem.Key, c.idem.RequestHash, idempotency.LockTTL)
		}
		switch {
		case err != nil && replaysByRerun(rt) && errors.Is(err, engine.ErrUnavailable):
			s.runUnclaimed(rt, c)
			return
		case err != nil:
			c.fail(err)
			return
		case claimed:
			s.runClaimed(rt, c, claimedAt)
			return
		case rec.Mismatch:
			c.fail(engine.ErrIdempotencyMismatch)
			return
		case rec.Rerun:
			s.rerun(rt, c)
			return
		case rec.Done:
			ctx.SetStatusCode(rec.Status)
			ctx.Response.Header.SetContentType(rec.ContentType)
			ctx.SetBody(rec.Body)
			ctx.Response.Header.SetBytesKV(headerReplayed, valueTrue)
			return
		case time.Now().After(deadline):
			c.fail(errIdemBusy)
			return
		}
		select {
		case <-ctx.Done(): // server shutting down
			c.fail(errIdemBusy)
			return
		case <-time.After(idempotency.Poll):
		}
	}
}

// runUnclaimed runs a money route whose claim could not be taken because
// the record's Redis slot has no master for a moment (a failover of
// another shard than the customer's; the record is keyed by tenant and
// key, not by customer, so it lives on any shard). The route's script
// keeps the key per customer (op key, seen filter), so retries and racing
// twins for the same customer still have one effect and the first answer
// (invariant 4); what is lost meanwhile is only the refusal of the key
// reused for another customer or body, which the record alone detects
// (docs/decisions.md "Money calls outlive another shard's failover").
// Nothing is stored: a retry after the failover claims the key and
// re-runs into the op key, as after a lost rerun mark.
func (s *Server) runUnclaimed(rt *route, c *call) {
	s.log.Debug().Bytes("request_id", c.reqID).Msg("idempotency record unavailable; running on the customer's op key alone")
	if err := c.invoke(rt.ep); err != nil {
		c.fail(err)
	}
}

// runClaimed runs the endpoint under a claim taken at claimedAt and settles
// it: Finish stores a completed answer (for a money route's 2xx only the
// mark "done, replay by re-running", written after the answer, see
// markRerun), Abort forgets anything else.
func (s *Server) runClaimed(rt *route, c *call, claimedAt time.Time) {
	if err := c.invoke(rt.ep); err != nil {
		c.fail(err)
	}
	s.settleClaim(rt, c, claimedAt, false)
}

// settleClaim settles the claim taken at claimedAt by the answer c holds:
// Finish stores a completed answer (for a money route's 2xx only the rerun
// mark, markRerun, unless marked says the claim is that mark already: a
// fused door's script wrote it), Abort forgets anything else (a mark stays:
// the retry re-runs into the script's op key).
func (s *Server) settleClaim(rt *route, c *call, claimedAt time.Time, marked bool) {
	ctx := c.ctx
	tenant := c.scope.TenantID
	status := ctx.Response.StatusCode()
	if !storable(status) {
		if err := s.idem.Abort(c.reqContext(), tenant, c.idem.Key, c.idem.RequestHash); err != nil {
			s.abortLater(tenant, c.idem.Key, c.idem.RequestHash, c.reqID, err)
		}
		return
	}
	if status < 300 && replaysByRerun(rt) {
		if !marked {
			s.markRerun(c, claimedAt)
		}
		return
	}
	rec := idempotency.Record{
		Status:      status,
		ContentType: contentTypeOf(ctx.Response.Header.ContentType()),
		Body:        ctx.Response.Body(), // Finish copies it into its record
	}
	if err := s.idem.Finish(c.reqContext(), tenant, c.idem.Key, c.idem.RequestHash, rec, idempotency.ReplayWindow, held(claimedAt)); err != nil {
		// The effect happened and the client gets its answer; a retry finds
		// the customer-level key memory of the Lua scripts instead.
		s.log.Error().Bytes("request_id", c.reqID).Err(err).Msg("idempotency finish failed")
	}
}

// held reports whether a claim taken at claimedAt certainly still stands.
// Only expiry ends a claim that its holder neither finished nor aborted, so
// one taken less than half its lock TTL ago (a margin for the clocks and the
// round trip) is still ours: Finish may overwrite it with a plain SET
// instead of checking it first.
func held(claimedAt time.Time) bool { return time.Since(claimedAt) < idempotency.LockTTL/2 }

// markRerun finishes c's claim with the rerun mark (replaysByRerun) after
// the answer has gone out, in a batch with other requests' marks
// (rerunMarks), so a money request costs the client two Redis round trips
// (claim and script), not three, and the server a share of the third. Losing the mark (a crash, a
// failed write) is safe: the claim lapses and the retry runs the endpoint,
// whose script replays from its op key. A retry arriving before the mark
// lands finds the claim and waits for it, as for any running request.
func (s *Server) markRerun(c *call, claimedAt time.Time) {
	tenant, key, hash := c.scope.TenantID, c.idem.Key, c.idem.RequestHash
	m := pendingMark{mark: idempotency.RerunMark{Tenant: tenant, Key: key, RequestHash: hash}, claimedAt: claimedAt,
		reqID: append([]byte(nil), c.reqID...)} // c is reused once the answer is out
	if !s.marks.add(m) {
		s.finishRerun(c.reqContext(), tenant, key, hash, claimedAt, c.reqID)
	}
}

// abortLater keeps trying to drop a claim whose Abort failed, typically a
// 503 while the key's Redis slot had no master: the release then fails for
// the same reason, and a retry with the key would wait out idempotency.Wait and get
// 409 "still in progress" while the claim lives (idempotency.LockTTL). Tried again
// every idempotency.AbortRetry until it works or the claim has lapsed anyway, the
// retry of the operation can run once the slot has a master again.
func (s *Server) abortLater(tenant uuid.UUID, key, hash string, reqID []byte, first error) {
	select {
	case s.abortSlots <- struct{}{}:
	default:
		s.log.Error().Bytes("request_id", reqID).Err(first).Msg("idempotency abort failed; the key stays locked until its claim lapses")
		return
	}
	s.log.Warn().Bytes("request_id", reqID).Err(first).Msg("idempotency abort failed; trying again until the claim lapses")
	reqID = append([]byte(nil), reqID...) // the call is reused once the answer is out
	go func() {
		defer func() { <-s.abortSlots }()
		deadline := time.Now().Add(idempotency.LockTTL)
		for time.Now().Before(deadline) {
			time.Sleep(idempotency.AbortRetry)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := s.idem.Abort(ctx, tenant, key, hash)
			cancel()
			if err == nil {
				return
			}
		}
		s.log.Error().Bytes("request_id", reqID).Msg("idempotency abort kept failing; the claim lapsed on its own")
	}()
}

// finishRerun writes the rerun mark of key for hash.
func (s *Server) finishRerun(ctx context.Context, tenant uuid.UUID, key, hash string, claimedAt time.Time, reqID []byte) {
	if err := s.idem.Finish(ctx, tenant, key, hash, idempotency.Record{Rerun: true}, idempotency.ReplayWindow, held(claimedAt)); err != nil {
		s.log.Error().Bytes("request_id", reqID).Err(err).Msg("idempotency finish failed; the claim lapses and a retry re-runs into the op key")
	}
}

// rerun answers a retry of a money request whose record says "done, replay
// by re-running": the endpoint runs again and its store call, finding the
// operation in Postgres (lua appliedFirst) or, before the persister
// committed it, under its op key, changes nothing and answers from the
// record of the first run, so status and body are the first ones.
func (s *Server) rerun(rt *route, c *call) {
	if err := c.invoke(rt.ep); err != nil {
		c.fail(err)
	}
	if status := c.ctx.Response.StatusCode(); status >= 300 {
		// Not the first answer (that was a 2xx): what the endpoint checks
		// before its script changed since (the customer was deleted, the
		// metric lost its rule), or a 5xx. The client gets it as it is.
		s.log.Warn().Bytes("request_id", c.reqID).Int("status", status).Msg("an idempotent replay by re-running did not answer 2xx")
		return
	}
	c.ctx.Response.Header.SetBytesKV(headerReplayed, valueTrue)
}

// replaysByRerun reports whether rt's 2xx answers are left unstored because
// a retry re-runs the endpoint and gets the same status and body: the route's
// whole effect is one money script that remembers the operation under its
// op key (lua/prelude/idempotency.lua replay) until Postgres holds it, where every money
// call looks its key up first (lua appliedFirst, forever), and its answer
// is built from that record alone. TestReplayByRerunIdentical
// (internal/e2e) checks each of these byte for byte. Not here: usage
// batches (a replayed event answers "duplicate"), gauges, top-ups and every
// route whose effect is in Postgres. A route says so where it is
// registered (optRerun).
func replaysByRerun(rt *route) bool { return rt.opts&optRerun != 0 }

// storable reports whether a response under a claimed key is the request's
// final answer: 2xx and 4xx are (a 409 insufficient-credits stays the answer
// to that key even after a top-up: a new attempt takes a new key); 429 and
// 5xx are not (the request did not run to its end, so a retry must run). A
// 409 "still in progress" never gets here: it is answered before a claim.
func storable(status int) bool {
	return status >= 200 && status < 500 && status != fasthttp.StatusTooManyRequests && (status < 300 || status >= 400)
}

// fingerprint is the request hash: sha256 hex of environment, method, raw
// path and body, so a reused key on another path, with another body, or with
// the other environment's API key is told apart (the record itself is keyed
// by tenant and key alone, docs/spec/addendum.md §12).
func fingerprint(env engine.Environment, method, path, body []byte) string {
	h := sha256.New()
	h.Write(envTag(env))
	h.Write(method)
	h.Write([]byte{' '})
	h.Write(path)
	h.Write([]byte{'\n'})
	h.Write(body)
	var sum [sha256.Size]byte
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], h.Sum(sum[:0]))
	return string(out[:])
}

var (
	tagLive    = []byte("live ")
	tagSandbox = []byte("sandbox ")
)

// envTag is env as the fingerprint's first words, without an allocation.
func envTag(env engine.Environment) []byte {
	if env == engine.EnvironmentSandbox {
		return tagSandbox
	}
	return tagLive
}

// contentTypeOf is ct as a string, without an allocation for the two types
// the API answers with.
func contentTypeOf(ct []byte) string {
	switch {
	case bytes.Equal(ct, contentJSON):
		return "application/json"
	case bytes.Equal(ct, contentProblem):
		return "application/problem+json"
	}
	return string(ct)
}
