// Package idempotency is the idempotency room (issue 29): every window and
// timer of it, declared once, the HTTP record's types and port (Records),
// the claim protocol the API runs over them (Claims) and the request
// fingerprint. It imports no creditd package, so engine, api, lua, persist
// and console all may import it. README.md is the map of the room and of
// its adapters outside it (the Lua scripts in lua/, the SQL in persist/,
// the HTTP glue in api/).
package idempotency

import "time"

// ReplayWindow is the HTTP idempotency replay window
// (docs/spec/interface.md Common rules 1): the same key and request replay
// the first answer for this long; a retry the customer's memory catches
// after it is a duplicate_replay. The API's records, its rerun marks, the
// fused door's claims and the console's forms live this long too.
const ReplayWindow = 24 * time.Hour

// Op keys (issue 10: Redis memory bounded by customers and ReplayWindow,
// not by history). A money script remembers what an idempotency key did
// under the customer's op key; once the persister has committed the
// operation to Postgres it shortens that key's life to OpKeyGrace, and
// Postgres answers every later retry (engine.AppliedOps). An op key absent
// from Redis therefore means "never applied" or "committed to Postgres".
const (
	// OpKeyRetention is the life an op key is written with: a safety net
	// for a persister that has not shortened it yet. It is the seen
	// filter's horizon, not the HTTP replay window: a key that lapsed
	// before the persister put it in the filter (seen filter, below) could
	// run again. Only keys of operations not yet committed keep it, so the
	// memory is bounded by the outbox's backlog, as the outbox itself is.
	OpKeyRetention = SeenHorizon
	// OpKeyGrace is how long an op key outlives the commit of its
	// operation. A money call looks its key up in Postgres first and must
	// reach its script within half of it (AppliedLookupFresh), so an
	// operation committed after a look-up missed it is still in Redis when
	// the script runs.
	OpKeyGrace = time.Minute
	// AppliedLookupFresh is how long a Postgres look-up that found nothing
	// stands for a script call: the call's deadline.
	AppliedLookupFresh = OpKeyGrace / 2
)

// LookupStands reports whether a Postgres look-up at checkedAt that found
// nothing still stands at now (it is younger than AppliedLookupFresh).
func LookupStands(checkedAt, now time.Time) bool {
	return !checkedAt.IsZero() && now.Sub(checkedAt) < AppliedLookupFresh
}

// The tenant index of usage event ids (issue 26; docs/decisions.md "A
// tenant index of usage event ids"). An event_id is a usage event's
// idempotency key per tenant and environment, forever, across customers,
// while the op key and the seen filter know keys per customer. So before a
// usage batch runs its events' consumes it claims each event id for the
// event's customer in Redis (lua/usage_ids.go): another customer's claim
// makes the event a reuse, charged to nobody. A claim lives as an op key
// does: UsageClaimRetention while its charge is not committed, shortened
// to UsageClaimGrace once the persister has committed it; a claim whose
// consume did not apply is released at once.
const (
	// UsageClaimRetention is the life of a claim taken afresh: the op
	// key's (OpKeyRetention), as it is written in the same instant by the
	// consume it guards and must not lapse before it. Taking it long
	// rather than short and lengthening it on success saves a round trip
	// per batch (a release is needed only for events that did not apply);
	// what a crash between the claim and its release leaves is a claim that
	// refuses the id to other customers until it lapses.
	UsageClaimRetention = OpKeyRetention
	// UsageClaimGrace is how long a claim outlives the commit of its
	// charge: the op key's grace, so a batch whose Postgres look-up missed
	// a commit (its claims are taken within AppliedLookupFresh of the
	// look-up) still finds the claim.
	UsageClaimGrace = OpKeyGrace
)

// The seen filter (issue 26: no Postgres before a money call). When the
// persister commits an operation it records the operation's idempotency key
// in a compact per-partition, per-period filter in Redis (lua/seen.go)
// before it shortens the op key, so a money call whose op key is absent runs
// at once when the filter certainly does not know the key, and asks Postgres
// (engine.AppliedOps) only when it may. A key is consulted for SeenPeriods
// periods from the period it was recorded in: at least SeenHorizon. Two
// periods as long as the horizon make a look-up read two hashes (six weeks
// once did: docs/decisions.md "The seen filter by period").
const (
	SeenPeriod  = 35 * 24 * time.Hour
	SeenPeriods = 2
	// SeenHorizon is how long after its commit a retried idempotency key
	// is still certainly recognised: a retry later than this may apply
	// again (docs/decisions.md).
	SeenHorizon = (SeenPeriods - 1) * SeenPeriod
)

// The claim's timers and limits (docs/spec/interface.md Common rules 1 and
// Limits). They are per request, not windows.
const (
	// MaxKeyChars is the longest Idempotency-Key accepted, in characters.
	MaxKeyChars = 256
	// LockTTL is how long a claim lives without Finish or Abort: a
	// crashed claimer's retry runs afresh after it.
	LockTTL = 30 * time.Second
	// Wait bounds how long a duplicate waits for the request that holds
	// the key; Poll is how often it looks.
	Wait = 10 * time.Second
	Poll = 10 * time.Millisecond
	// AbortRetry is how often a failed Abort (or a failed batch of rerun
	// marks) is tried again: a Redis failover takes a few seconds.
	AbortRetry = 250 * time.Millisecond
)

// Rerun marks are written in batches (marks.go): one Redis round trip
// finishes every money request answered within MarkLinger of the first,
// instead of one round trip (and one goroutine) per request. A consume's
// own cost is its claim and its script; the mark comes after the answer
// and costs the client nothing, so it may wait a little to travel with
// others.
const (
	// MarkLinger is how long the writer waits for more marks once it has
	// one. A retry arriving meanwhile finds the claim and waits for it
	// (Poll), as for any running request.
	MarkLinger = 2 * time.Millisecond
	// MaxMarkBatch ends the linger early and bounds one pipeline.
	MaxMarkBatch = 256
	// MaxMarksInFlight bounds the rerun marks of one server waiting to be
	// written after their answer went out; when all are taken the mark is
	// written before the answer, as a stored body is, so a slow Redis
	// slows requests instead of piling up marks.
	MaxMarksInFlight = 1024
	// MaxAbortsInFlight bounds the claims released in the background at
	// once (and the batches of marks retried): a failover fails every
	// write of its slot for a few seconds.
	MaxAbortsInFlight = 1024
)
