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

// TestUnavailableAbortRetried: a write that meets a failover answers 503,
// and the release of its claim fails too while the slot has no master. The
// claim is then released in the background once Redis answers, so the
// client's retry with the same key runs the write instead of waiting out
// the claim and getting 409 "still in progress".
func TestUnavailableAbortRetried(t *testing.T) {
	t.Parallel()
	h := setup(t)
	down := fmt.Errorf("lua: consume: %w", redisDown{io.EOF})
	runs := 0
	h.srv.handle("POST", "/test/abort", optTenant|optIdem, func(c *call) error {
		runs++
		if runs == 1 {
			return down
		}
		c.ctx.SetStatusCode(200)
		return nil
	})
	h.idem.mu.Lock()
	h.idem.abortFails = 3
	h.idem.mu.Unlock()
	wantProblem(t, h.do("POST", "/test/abort", `{}`, h.idemKey("k-abort")...), 503, "unavailable", "")
	r := h.do("POST", "/test/abort", `{}`, h.idemKey("k-abort")...)
	if r.status != 200 || runs != 2 {
		t.Fatalf("retry: status %d, %d runs; want 200 and the write run again", r.status, runs)
	}
	h.idem.mu.Lock()
	defer h.idem.mu.Unlock()
	if h.idem.aborts < 4 {
		t.Errorf("%d aborts, want the failed one tried again until it worked (4)", h.idem.aborts)
	}
}
