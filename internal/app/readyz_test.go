package app_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/internal/e2e"
)

// TestReadyzShowsEachRunner: a started node's /readyz has one entry per
// background loop, under the loop's Name, next to the checks that were
// there before, all "ok"; after Stop every loop reports stopped.
func TestReadyzShowsEachRunner(t *testing.T) {
	// The reconcile sampler is on, so every loop runs.
	n := startNode(t, nil, func(c *app.Config) { c.ReconcileSample = 5 })
	r := e2e.Call(t, http.DefaultClient, n.URL, "GET", "/readyz", nil)
	var body struct {
		Status string            `json:"status"`
		Checks map[string]string `json:"checks"`
	}
	if err := json.Unmarshal(r.Raw, &body); err != nil || r.Status != 200 || body.Status != "ready" {
		t.Fatalf("/readyz = %d %s", r.Status, r.Raw)
	}
	want := []string{"redis", "postgres", "persister", "dead_letters"}
	for _, run := range n.App.Runners() {
		want = append(want, run.Name())
	}
	if len(want) != 4+7 {
		t.Errorf("%d runners, want 7: %v", len(want)-4, want[4:])
	}
	for _, name := range want {
		if got := body.Checks[name]; got != "ok" {
			t.Errorf("/readyz checks[%q] = %q, want ok", name, got)
		}
	}
	if len(body.Checks) != len(want) {
		t.Errorf("/readyz checks %v, want exactly %v", body.Checks, want)
	}
	n.App.Stop(0)
	for _, run := range n.App.Runners() {
		if err := run.Health(); err == nil || err.Error() != "stopped" {
			t.Errorf("%s after Stop: %v, want stopped", run.Name(), err)
		}
	}
}
