package api

import (
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestLeaseRenewPayload: an absent lease_seconds keeps the lease's own
// length (0); one out of range is a 422 naming it.
func TestLeaseRenewPayload(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	for _, tc := range []struct {
		in   leaseRenewPayload
		secs int64
		ok   bool
	}{{leaseRenewPayload{}, 0, true}, {leaseRenewPayload{LeaseSeconds: i64(60)}, 60, true}, {leaseRenewPayload{LeaseSeconds: i64(0)}, 0, false}, {leaseRenewPayload{LeaseSeconds: i64(86401)}, 0, false}} {
		got, err := tc.in.toCommand()
		e, isErr := engine.AsError(err)
		switch {
		case tc.ok && (err != nil || got.Seconds != tc.secs):
			t.Errorf("%+v: got %+v %v", tc.in, got, err)
		case !tc.ok && (!isErr || e.Field != "lease_seconds"):
			t.Errorf("%+v: got %v, want a 422 naming lease_seconds", tc.in, err)
		}
	}
}
