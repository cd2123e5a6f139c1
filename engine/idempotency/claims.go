package idempotency

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// Claims runs the HTTP record's protocol (docs/spec/interface.md Common
// rules 1) over a Records port: a POST or PATCH runs at most once per
// tenant and key. The first request claims the key and runs; its completed
// response (2xx or 4xx, see storable) is remembered for ReplayWindow and
// replayed to every retry with the same fingerprint; a 5xx drops the claim
// so a retry runs afresh. A money route's 2xx is remembered without its
// body, as the rerun mark: the retry re-runs the route, which replays the
// operation from Postgres or from its op key. A duplicate arriving while the
// first still runs waits for its answer (Wait), so racing twins produce one
// effect and one answer. A key reused with another fingerprint (another
// path, body or environment) is a mismatch. The API reads the header,
// answers and runs the route (api/idempotency.go); Claims decides. Safe for
// concurrent use.
type Claims struct {
	records Records
	log     zerolog.Logger
	// unavailable is the error (errors.Is) Records reports while the
	// record's Redis slot has no master (engine.ErrUnavailable).
	unavailable error
	// wait is Wait; a test shortens it.
	wait  time.Duration
	marks *rerunMarks
	// abortSlots bounds the claims being released in the background
	// (abortLater) and the batches of marks retried (retryMarks): past it,
	// a claim lapses on its own.
	abortSlots chan struct{}
}

// NewClaims runs the protocol over records, logging to log; unavailable is
// the error records reports while a record cannot be reached for a moment
// (a failover), under which a rerun route runs unclaimed. Close stops its
// rerun-mark writer.
func NewClaims(records Records, log zerolog.Logger, unavailable error) *Claims {
	c := &Claims{records: records, log: log, unavailable: unavailable, wait: Wait,
		abortSlots: make(chan struct{}, MaxAbortsInFlight)}
	c.marks = newRerunMarks(c)
	return c
}

// Request is one request's claim: its tenant, Idempotency-Key and
// fingerprint (Fingerprint).
type Request struct {
	Tenant      uuid.UUID
	Key         string
	RequestHash string
	// Rerun: the route's 2xx is replayed by running it again, not stored
	// (the route declares optRerun in api/server.go): its whole effect is
	// one money script that remembers the operation under its op key
	// (lua/prelude/idempotency.lua replay) until Postgres holds it, and its
	// answer is built from that record alone.
	Rerun bool
	// ID is the request id, for the logs. Claims copies it when it keeps
	// it past the call (the caller's buffer is reused once it answered).
	ID []byte
}

// Taken is a claim the caller already made in another round trip (the
// request's door, engine.DoorAnswer): Begin's answer and when it was asked.
// Asked is false for none.
type Taken struct {
	Asked   bool
	At      time.Time
	Record  Record
	Claimed bool
	Err     error
}

// Outcome is what a request does after its claim (Claim).
type Outcome uint8

const (
	// OutcomeClaimed: the key is the request's; run the route, then Settle.
	OutcomeClaimed Outcome = iota
	// OutcomeReplay: answer Claim.Record's stored status, content type and
	// body, as a replay.
	OutcomeReplay
	// OutcomeRerun: the key is done with the rerun mark; run the route
	// again and answer what it answers (Reran).
	OutcomeRerun
	// OutcomeMismatch: the key was used for another fingerprint.
	OutcomeMismatch
	// OutcomeBusy: the request holding the key did not finish within the
	// wait (or the server is stopping): "still in progress".
	OutcomeBusy
	// OutcomeUnclaimed: the record could not be reached (a failover of
	// another shard than the customer's) and the route replays by
	// rerunning: run it without a claim and store nothing. Its script
	// keeps the key per customer (op key, seen filter), so retries and
	// racing twins still have one effect and the first answer (invariant
	// 4); what is lost meanwhile is only the refusal of the key reused for
	// another customer or body, which the record alone detects
	// (docs/decisions.md "Money calls outlive another shard's failover").
	// A retry after the failover claims the key and re-runs into the op
	// key, as after a lost rerun mark.
	OutcomeUnclaimed
	// OutcomeFailed: the claim failed with Claim.Err.
	OutcomeFailed
)

// Claim is a claim's outcome: when it was taken (OutcomeClaimed), the
// stored record (OutcomeReplay) or the error (OutcomeFailed).
type Claim struct {
	Outcome Outcome
	At      time.Time
	Record  Record
	Err     error
}

// Claim claims r's key, starting from door's answer when the door asked
// already, and waits while a twin holds it: it looks again every Poll
// until the twin's answer is there, the wait ends (OutcomeBusy) or stop is
// done (the server is stopping: OutcomeBusy; stop.Done is called only
// while waiting). ctx bounds each Begin.
func (c *Claims) Claim(ctx, stop context.Context, r Request, door Taken) Claim {
	deadline := time.Now().Add(c.wait)
	for {
		claimedAt := time.Now()
		var rec Record
		var claimed bool
		var err error
		if door.Asked {
			claimedAt, rec, claimed, err = door.At, door.Record, door.Claimed, door.Err
			door.Asked = false
		} else {
			rec, claimed, err = c.records.Begin(ctx, r.Tenant, r.Key, r.RequestHash, LockTTL)
		}
		switch {
		case err != nil && r.Rerun && c.unavailable != nil && errors.Is(err, c.unavailable):
			c.log.Debug().Bytes("request_id", r.ID).Msg("idempotency record unavailable; running on the customer's op key alone")
			return Claim{Outcome: OutcomeUnclaimed}
		case err != nil:
			return Claim{Outcome: OutcomeFailed, Err: err}
		case claimed:
			return Claim{Outcome: OutcomeClaimed, At: claimedAt}
		case rec.Mismatch:
			return Claim{Outcome: OutcomeMismatch}
		case rec.Rerun:
			return Claim{Outcome: OutcomeRerun}
		case rec.Done:
			return Claim{Outcome: OutcomeReplay, Record: rec}
		case time.Now().After(deadline):
			return Claim{Outcome: OutcomeBusy}
		}
		select {
		case <-stop.Done():
			return Claim{Outcome: OutcomeBusy}
		case <-time.After(Poll):
		}
	}
}

// Answer is the response a request under a claim wrote. ContentType and
// Body are read only when the answer is stored.
type Answer interface {
	StatusCode() int
	ContentType() []byte
	Body() []byte
}

// Settle settles r's claim, taken at claimedAt, by the answer a holds:
// Finish stores a completed answer (for a rerun route's 2xx only the rerun
// mark, written after the answer, see markRerun, unless marked says the
// claim is that mark already: a fused door's script wrote it); Release
// forgets anything else (a mark stays: the retry re-runs into the script's
// op key). Failures are logged: the effect happened and the client gets
// its answer.
func (c *Claims) Settle(ctx context.Context, r Request, claimedAt time.Time, a Answer, marked bool) {
	status := a.StatusCode()
	if !storable(status) {
		c.Release(ctx, r)
		return
	}
	if status < 300 && r.Rerun {
		if !marked {
			c.markRerun(ctx, r, claimedAt)
		}
		return
	}
	rec := Record{
		Status:      status,
		ContentType: contentTypeOf(a.ContentType()),
		Body:        a.Body(), // Finish copies it into its record
	}
	if err := c.records.Finish(ctx, r.Tenant, r.Key, r.RequestHash, rec, ReplayWindow, held(claimedAt)); err != nil {
		// A retry finds the customer-level key memory of the Lua scripts
		// instead.
		c.log.Error().Bytes("request_id", r.ID).Err(err).Msg("idempotency finish failed")
	}
}

// Release drops r's claim (Abort): the request changed nothing, or never
// ran, so the key is free again at once. A failed Abort is tried again in
// the background (abortLater).
func (c *Claims) Release(ctx context.Context, r Request) {
	if err := c.records.Abort(ctx, r.Tenant, r.Key, r.RequestHash); err != nil {
		c.abortLater(r.Tenant, r.Key, r.RequestHash, r.ID, err)
	}
}

// Reran reports whether a rerun (OutcomeRerun) that answered status
// replayed the first answer, which was a 2xx. Anything else is not the
// first answer: what the route checks before its script changed since
// (the customer was deleted, the metric lost its rule), or a 5xx; the
// client gets it as it is, and it is logged.
func (c *Claims) Reran(r Request, status int) bool {
	if status >= 300 {
		c.log.Warn().Bytes("request_id", r.ID).Int("status", status).Msg("an idempotent replay by re-running did not answer 2xx")
		return false
	}
	return true
}

// Close stops the rerun-mark writer after it wrote what was queued,
// waiting at most until ctx ends.
func (c *Claims) Close(ctx context.Context) { c.marks.close(ctx) }

// held reports whether a claim taken at claimedAt certainly still stands.
// Only expiry ends a claim that its holder neither finished nor aborted, so
// one taken less than half its lock TTL ago (a margin for the clocks and the
// round trip) is still ours: Finish may overwrite it with a plain SET
// instead of checking it first.
func held(claimedAt time.Time) bool { return time.Since(claimedAt) < LockTTL/2 }

// markRerun finishes r's claim with the rerun mark after the answer has
// gone out, in a batch with other requests' marks (rerunMarks), so a money
// request costs the client two Redis round trips (claim and script), not
// three, and the server a share of the third. When the writer's queue is
// full the mark is written now, before the answer. Losing the mark (a
// crash, a failed write) is safe: the claim lapses and the retry runs the
// route, whose script replays from its op key. A retry arriving before the
// mark lands finds the claim and waits for it, as for any running request.
func (c *Claims) markRerun(ctx context.Context, r Request, claimedAt time.Time) {
	m := pendingMark{mark: RerunMark{Tenant: r.Tenant, Key: r.Key, RequestHash: r.RequestHash}, claimedAt: claimedAt,
		reqID: append([]byte(nil), r.ID...)} // the caller reuses r.ID once the answer is out
	if !c.marks.add(m) {
		c.finishRerun(ctx, r.Tenant, r.Key, r.RequestHash, claimedAt, r.ID)
	}
}

// finishRerun writes the rerun mark of key for hash.
func (c *Claims) finishRerun(ctx context.Context, tenant uuid.UUID, key, hash string, claimedAt time.Time, reqID []byte) {
	if err := c.records.Finish(ctx, tenant, key, hash, Record{Rerun: true}, ReplayWindow, held(claimedAt)); err != nil {
		c.log.Error().Bytes("request_id", reqID).Err(err).Msg("idempotency finish failed; the claim lapses and a retry re-runs into the op key")
	}
}

// abortLater keeps trying to drop a claim whose Abort failed, typically a
// 503 while the key's Redis slot had no master: the release then fails for
// the same reason, and a retry with the key would wait out Wait and get
// 409 "still in progress" while the claim lives (LockTTL). Tried again
// every AbortRetry until it works or the claim has lapsed anyway, the
// retry of the operation can run once the slot has a master again.
func (c *Claims) abortLater(tenant uuid.UUID, key, hash string, reqID []byte, first error) {
	select {
	case c.abortSlots <- struct{}{}:
	default:
		c.log.Error().Bytes("request_id", reqID).Err(first).Msg("idempotency abort failed; the key stays locked until its claim lapses")
		return
	}
	c.log.Warn().Bytes("request_id", reqID).Err(first).Msg("idempotency abort failed; trying again until the claim lapses")
	reqID = append([]byte(nil), reqID...) // the caller's buffer is reused once the answer is out
	go func() {
		defer func() { <-c.abortSlots }()
		deadline := time.Now().Add(LockTTL)
		for time.Now().Before(deadline) {
			time.Sleep(AbortRetry)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := c.records.Abort(ctx, tenant, key, hash)
			cancel()
			if err == nil {
				return
			}
		}
		c.log.Error().Bytes("request_id", reqID).Msg("idempotency abort kept failing; the claim lapsed on its own")
	}()
}
