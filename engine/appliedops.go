package engine

import (
	"time"
)

// Op keys (issue 10: Redis memory bounded by customers and the 24 h window,
// not by history). A money script remembers what an idempotency key did
// under the customer's op key; once the persister has committed the
// operation to Postgres it shortens that key's life to OpKeyGrace, and
// Postgres answers every later retry (AppliedOps). An op key absent from
// Redis therefore means "never applied" or "committed to Postgres".
const (
	// OpKeyRetention is the life an op key is written with: a safety net
	// for a persister that never shortens it (a lost write), so no key
	// outlives the HTTP replay window.
	OpKeyRetention = 24 * time.Hour
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
