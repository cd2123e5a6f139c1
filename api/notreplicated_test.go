package api

import (
	"strings"
	"testing"

	"github.com/creditd/creditd/engine"
)

// TestNotReplicatedIsRetryable503: an operation whose write missed the
// replicas answers 503 with Retry-After and an "unavailable" problem, the
// Idempotency-Key is released (a 5xx is not stored), so the retry runs the
// endpoint again and its 2xx is what later retries replay.
func TestNotReplicatedIsRetryable503(t *testing.T) {
	t.Parallel()
	if got := statusOf(engine.KindUnavailable); got != 503 {
		t.Fatalf("statusOf(unavailable) = %d, want 503", got)
	}
	h := setup(t)
	runs := 0
	h.srv.handle("POST", "/test/replicated", optTenant|optIdem, func(c *call) error {
		runs++
		if runs == 1 {
			return engine.ErrNotReplicated
		}
		return c.json(201, map[string]int{"run": runs})
	})
	for i, want := range []struct {
		status int
		runs   int
	}{{503, 1}, {201, 2}, {201, 2}} {
		r := h.do("POST", "/test/replicated", `{}`, h.idemKey("k-replica")...)
		if r.status != want.status || runs != want.runs {
			t.Fatalf("request %d: status %d after %d runs, want %d after %d: %s", i, r.status, runs, want.status, want.runs, r.body)
		}
		if r.status == 503 {
			p := wantProblem(t, r, 503, "unavailable", "")
			if r.get("Retry-After") != "1" || p["detail"] != engine.ErrNotReplicated.Detail {
				t.Fatalf("503 without Retry-After 1 or detail: %q %v", r.get("Retry-After"), p)
			}
		} else if strings.TrimSpace(string(r.body)) != `{"run":2}` || r.get("Retry-After") != "" {
			t.Fatalf("request %d: body %s, Retry-After %q", i, r.body, r.get("Retry-After"))
		}
	}
}
