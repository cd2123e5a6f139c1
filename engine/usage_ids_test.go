package engine

import (
	"errors"
	"fmt"
	"testing"
)

// TestUsageMayHaveCharged: a usage event's claim is given back only when
// its consume certainly charged nothing (a refusal, a reuse, a duplicate,
// a look-up that ran nothing); an unknown outcome keeps it, so an id is
// never freed for another customer while its charge may stand
// (invariant 4).
func TestUsageMayHaveCharged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		res  MutationResult
		err  error
		want bool
	}{
		{"charged", MutationResult{}, nil, true},
		{"duplicate", MutationResult{Replayed: true}, nil, false},
		{"refused for credit", MutationResult{}, ErrInsufficientCredits, false},
		{"refused by a budget", MutationResult{}, ErrBudgetExceeded, false},
		{"another request under the id", MutationResult{}, ErrIdempotencyMismatch, false},
		{"invalid", MutationResult{}, Invalid("units", "units must be >= 1"), false},
		{"Postgres could not say, nothing ran", MutationResult{}, fmt.Errorf("lua: %w", ErrAppliedUnknown), false},
		{"Redis unavailable", MutationResult{}, fmt.Errorf("lua: %w", ErrUnavailable), true},
		{"not replicated", MutationResult{}, ErrNotReplicated, true},
		{"unexpected", MutationResult{}, errors.New("boom"), true},
	} {
		if got := usageMayHaveCharged(tc.res, tc.err); got != tc.want {
			t.Errorf("%s: usageMayHaveCharged = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestUsageRecordDown: an event stopped only because Postgres could not
// answer (its customer's facts not cached during an outage) fails with the
// retryable text, not as internal; any other unexpected error stays
// internal, and without a way to tell (no AppliedDown) nothing changes.
func TestUsageRecordDown(t *testing.T) {
	t.Parallel()
	refused := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	down := SourceDown(func(err error) bool { return errors.Is(err, refused) })
	ev := UsageEvent{EventID: "e1"}
	for _, tc := range []struct {
		name     string
		down     SourceDown
		err      error
		wantText string
		wantLog  bool
	}{
		{"Postgres down", down, fmt.Errorf("persist: live subscription: %w", refused), ErrRecordUnavailable.Detail, false},
		{"another failure", down, errors.New("persist: scan: bad column"), UsageInternalError, true},
		{"no way to tell", nil, fmt.Errorf("persist: live subscription: %w", refused), UsageInternalError, true},
		{"a domain error stays", down, ErrInsufficientCredits, ErrInsufficientCredits.Detail, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Entitlements{appliedDown: tc.down}
			r := usageFailure(ev, s.recordDown(tc.err))
			if r.Error == nil || *r.Error != tc.wantText || (r.Cause != nil) != tc.wantLog {
				t.Errorf("result %+v (error %v), want error %q, cause logged %v", r, r.Error, tc.wantText, tc.wantLog)
			}
		})
	}
}
