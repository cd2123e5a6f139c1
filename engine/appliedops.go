package engine

import (
	"time"

	"github.com/google/uuid"
)

// ReplayWindow is the HTTP idempotency replay window
// (docs/spec/interface.md Common rules 1): the same key and request replay
// the first answer for this long; a retry the customer's memory catches
// after it is a duplicate_replay. The one declaration, beside the op keys'
// and the seen filter's horizons: the API's records, its rerun marks, the
// fused door's claims and the console's forms live this long too.
const ReplayWindow = 24 * time.Hour

// Op keys (issue 10: Redis memory bounded by customers and ReplayWindow,
// not by history). A money script remembers what an idempotency key did
// under the customer's op key; once the persister has committed the
// operation to Postgres it shortens that key's life to OpKeyGrace, and
// Postgres answers every later retry (AppliedOps). An op key absent from
// Redis therefore means "never applied" or "committed to Postgres".
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

// OpRef names one idempotency key of one customer.
type OpRef struct {
	Customer CustomerKey
	Key      string
}

// AppliedChecked reports whether a Postgres look-up at checkedAt that found
// nothing still stands at now (it is younger than AppliedLookupFresh).
func AppliedChecked(checkedAt, now time.Time) bool {
	return !checkedAt.IsZero() && now.Sub(checkedAt) < AppliedLookupFresh
}

// The seen filter (issue 26: no Postgres before a money call). When the
// persister commits an operation it records the operation's idempotency key
// in a compact per-partition, per-week filter in Redis (lua/seen.go) before
// it shortens the op key, so a money call whose op key is absent runs at
// once when the filter certainly does not know the key, and asks Postgres
// (AppliedOps) only when it may. A key is consulted for SeenWeeks weeks
// from the week it was recorded in: at least SeenHorizon.
const (
	SeenWeek  = 7 * 24 * time.Hour
	SeenWeeks = 6
	// SeenHorizon is how long after its commit a retried idempotency key
	// is still certainly recognised: a retry later than this may apply
	// again (docs/decisions.md).
	SeenHorizon = (SeenWeeks - 1) * SeenWeek
)

// IdemRecord is the HTTP idempotency record of one key, as Begin finds it
// and Finish stores it.
type IdemRecord struct {
	// Mismatch: the record was written for another request hash (a key
	// reused with another method, path, body or environment). Set by Begin.
	Mismatch bool
	// Done: the request ran to its final answer; false while it runs.
	Done bool
	// Rerun: done, and no response is stored because running the endpoint
	// again answers byte for byte the same: the money scripts remember the
	// operation under its own op key and replay it.
	Rerun bool
	// Status, ContentType and Body are the stored response (Done, not Rerun).
	Status      int
	ContentType string
	Body        []byte
}

// RerunMark is one claim to finish with the rerun mark (MarkRerun).
type RerunMark struct {
	Tenant      uuid.UUID
	Key         string
	RequestHash string
	// Held: the claim certainly still stands (Finish's held).
	Held bool
}
