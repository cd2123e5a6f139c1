package idempotency

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Records stores HTTP idempotency records, scoped by tenant and key value
// alone (docs/spec/interface.md Common rules 1). lua.Store implements it on
// Redis (lua/idempotency.go).
type Records interface {
	// Begin claims key for a request whose fingerprint is requestHash. When
	// no record exists it writes an in-progress one that lapses after lockTTL
	// (so a crashed claimer's retry can run again) and returns claimed=true.
	// Otherwise it returns the existing record and claimed=false.
	Begin(ctx context.Context, tenant uuid.UUID, key, requestHash string, lockTTL time.Duration) (rec Record, claimed bool, err error)
	// Finish stores rec as requestHash's final answer for ttl (ReplayWindow). It
	// never replaces a record of another request hash nor a finished one;
	// held tells it the caller's claim certainly still stands (taken well
	// within its lock TTL), so no other record can be there to protect.
	Finish(ctx context.Context, tenant uuid.UUID, key, requestHash string, rec Record, ttl time.Duration, held bool) error
	// MarkRerun finishes many claims with the rerun mark (Record.Rerun)
	// for ttl in one round trip where it can; each mark as Finish would. It
	// returns the first error; the other marks are still written.
	MarkRerun(ctx context.Context, marks []RerunMark, ttl time.Duration) error
	// Abort drops an in-progress record of requestHash (the request changed
	// nothing, so a retry must run afresh).
	Abort(ctx context.Context, tenant uuid.UUID, key, requestHash string) error
}

// Record is the HTTP idempotency record of one key, as Begin finds it and
// Finish stores it.
type Record struct {
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
