package api

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/creditd/creditd/engine"
)

// redisDown is a transient store failure as lua wraps it: the Redis error
// and engine.ErrUnavailable in one chain, under a store's own wrapping.
type redisDown struct{ err error }

func (e redisDown) Error() string   { return e.err.Error() }
func (e redisDown) Unwrap() []error { return []error{engine.ErrUnavailable, e.err} }

// TestUnavailableIs503: a read and a write that meet a Redis failover
// (engine.ErrUnavailable anywhere in the error chain) answer 503 with
// Retry-After and the "unavailable" problem, never a 500; a write's key is
// not stored, so its retry runs again.
func TestUnavailableIs503(t *testing.T) {
	t.Parallel()
	h := setup(t)
	down := fmt.Errorf("lua: snapshot: %w", redisDown{io.EOF})
	runs := 0
	h.srv.handle("GET", "/test/unavailable", optTenant, func(c *call) error { return down })
	h.srv.handle("POST", "/test/unavailable", optTenant|optIdem, func(c *call) error {
		runs++
		return down
	})
	for i, r := range []response{
		h.do("GET", "/test/unavailable", "", h.key()...),
		h.do("POST", "/test/unavailable", `{}`, h.idemKey("k-down")...),
		h.do("POST", "/test/unavailable", `{}`, h.idemKey("k-down")...),
	} {
		p := wantProblem(t, r, 503, "unavailable", "")
		if r.get("Retry-After") != "1" || p["detail"] != engine.ErrUnavailable.Detail {
			t.Errorf("answer %d: Retry-After %q, problem %v", i, r.get("Retry-After"), p)
		}
	}
	if runs != 2 {
		t.Errorf("the write ran %d times, want 2 (a 503 is not stored under its key)", runs)
	}
	if !errors.Is(down, engine.ErrUnavailable) || !errors.Is(down, io.EOF) {
		t.Error("the chain lost a member")
	}
}
