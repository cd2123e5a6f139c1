package engine

import (
	"errors"
	"fmt"
)

// Kind classifies an error the way the API reports it (docs/spec/addendum.md §3 types).
type Kind string

// Error kinds; the API maps each to one HTTP status.
const (
	KindBadRequest          Kind = "bad-request"          // 400
	KindNotFound            Kind = "not-found"            // 404
	KindConflict            Kind = "conflict"             // 409
	KindInsufficientCredits Kind = "insufficient-credits" // 409
	KindReservationExpired  Kind = "reservation-expired"  // 409
	KindBudgetExceeded      Kind = "budget-exceeded"      // 409
	KindValidation          Kind = "validation-error"     // 422
	KindInternal            Kind = "internal"             // 500
	KindUnauthorized        Kind = "unauthorized"         // 401
	KindRateLimited         Kind = "rate-limited"         // 429
	KindUnavailable         Kind = "unavailable"          // 503, retry after a second
)

// Error is a domain error that names its kind and, for input errors, the field.
type Error struct {
	Kind   Kind
	Field  string
	Detail string
	// Extra carries kind-specific members of the problem body (the gauge
	// 409's current, cap, shortfall).
	Extra map[string]any
	// Documented marks an internal error the spec documents as a 500 (a reservation
	// without a rule, an unknown status filter): its detail is ours and safe
	// to show, unlike an unexpected failure's.
	Documented bool
}

// DocumentedInternal is a 500 the spec lists, with a detail clients may read.
func DocumentedInternal(detail string) *Error {
	return &Error{Kind: KindInternal, Detail: detail, Documented: true}
}

// Error implements error.
func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", e.Kind, e.Field, e.Detail)
	}
	return fmt.Sprintf("%s: %s", e.Kind, e.Detail)
}

// Is makes errors.Is match on kind and detail-free sentinels.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Kind == e.Kind && (t.Detail == "" || t.Detail == e.Detail) && (t.Field == "" || t.Field == e.Field)
}

// Invalid is a 422 naming field.
func Invalid(field, detail string) *Error {
	return &Error{Kind: KindValidation, Field: field, Detail: detail}
}

// BadRequest is a 400, naming field when there is one.
func BadRequest(field, detail string) *Error {
	return &Error{Kind: KindBadRequest, Field: field, Detail: detail}
}

// NotFound is a 404.
func NotFound(detail string) *Error { return &Error{Kind: KindNotFound, Detail: detail} }

// Conflict is a generic 409.
func Conflict(detail string) *Error { return &Error{Kind: KindConflict, Detail: detail} }

// Sentinel errors returned by stores; compare with errors.Is.
var (
	// ErrNotFound: no such row in scope.
	ErrNotFound = errors.New("not found")
	// ErrExternalIDTaken: a live customer already has that external id.
	ErrExternalIDTaken = errors.New("external_id taken")
	// ErrPoolTooDeep: joining the parent would make a pool two levels deep
	// (the parent has a parent, or the customer has children): what the
	// engine checked before the write was changed meanwhile by another
	// request, which the directory's write sees.
	ErrPoolTooDeep = &Error{Kind: KindValidation, Field: "parent_id",
		Detail: "pools are one level deep: the parent has a parent itself, or the customer is a parent"}
	// ErrStateMissing: the block store holds nothing for the customer; load it.
	ErrStateMissing = errors.New("credit state missing from the block store")
	// ErrInsufficientCredits: the effective balance cannot cover the debit.
	ErrInsufficientCredits = &Error{Kind: KindInsufficientCredits, Detail: "the effective balance is smaller than the amount"}
	// ErrNoAccount: a debit on a customer that never had an account.
	ErrNoAccount = &Error{Kind: KindNotFound, Detail: "the customer has no credit account"}
	// ErrOverflow: the result would not fit in int64.
	ErrOverflow = &Error{Kind: KindValidation, Detail: "the amount would overflow a 64-bit balance"}
	// ErrStackNoMatch: stack_after with fallback reject found no block.
	ErrStackNoMatch = &Error{Kind: KindConflict, Field: "stack_after", Detail: "no block matches stack_after.metadata_match and fallback is reject"}
	// ErrIdempotencyMismatch: the key was applied with another request body.
	ErrIdempotencyMismatch = &Error{Kind: KindConflict, Detail: "the Idempotency-Key was already used with a different request"}
	// ErrUnavailable: the hot store could not answer for a moment (a Redis
	// master died and its replica is not promoted yet, a connection broke,
	// a timeout). Nothing is known about the operation, so nothing is
	// answered from elsewhere: the client retries with the same
	// Idempotency-Key, which applies it once (issue 11.5).
	ErrUnavailable = &Error{Kind: KindUnavailable, Detail: "the credit store is unavailable for a moment (a failover or a broken connection); retry with the same Idempotency-Key (or event_id) after the Retry-After seconds"}
	// ErrNotReplicated: the operation applied on the Redis master but its
	// write did not reach a replica in time, so it is not acknowledged (a
	// failover could still lose it); a retry with the same Idempotency-Key
	// applies it once and waits again.
	ErrNotReplicated = &Error{Kind: KindUnavailable, Detail: "the operation reached the Redis master but no replica yet, so it is not acknowledged; retry it with the same Idempotency-Key (or event_id) after the Retry-After seconds"}
	// ErrAppliedUnknown: Postgres could not say whether the idempotency key
	// was applied before (AppliedOps failed), so nothing ran; a retry with
	// the same key is safe.
	ErrAppliedUnknown = &Error{Kind: KindUnavailable, Detail: "could not check whether this Idempotency-Key (or event_id) was applied before, so nothing changed; retry it with the same key after the Retry-After seconds"}
	// ErrRecordUnavailable: the system of record (Postgres) could not answer
	// for a moment (down, restarting, out of connections); what the request
	// needed from it is unknown, so nothing changed (issue 25).
	ErrRecordUnavailable = &Error{Kind: KindUnavailable, Detail: "the system of record is unavailable for a moment, so nothing changed; retry (with the same Idempotency-Key for a write) after the Retry-After seconds"}
)

// AsError returns err as a domain *Error when it is one.
func AsError(err error) (*Error, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e, true
	}
	return nil, false
}

// ItemErrorText is the one-line text of a per-item error inside a 200 body
// (a usage event, an import row): "field: detail" for a domain error. For
// anything else (a store failure, an undocumented internal error) it is
// false and the caller shows a generic text and logs err: its Go text may
// name hosts, SQL or SQLSTATEs.
func ItemErrorText(err error) (string, bool) {
	e, ok := AsError(err)
	if !ok || (e.Kind == KindInternal && !e.Documented) {
		return "", false
	}
	if e.Field != "" {
		return e.Field + ": " + e.Detail, true
	}
	return e.Detail, true
}
