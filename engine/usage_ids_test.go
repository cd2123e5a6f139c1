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
