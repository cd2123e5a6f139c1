package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// TestFailAnswersUnavailableStores (issue 25): an error the store says is
// only "cannot answer now" (Config.Unavailable: Postgres down) is a 503
// problem with Retry-After; any other unknown error stays a 500, and an
// engine error keeps its own status.
func TestFailAnswersUnavailableStores(t *testing.T) {
	down := errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")
	unavailable := func(err error) bool { return errors.Is(err, down) }
	tests := []struct {
		name       string
		err        error
		classify   func(error) bool
		wantStatus int
		wantType   string
		wantRetry  bool
	}{
		{"postgres down", fmt.Errorf("persist: api key by hash: %w", down), unavailable, 503, "unavailable", true},
		{"no classifier", fmt.Errorf("persist: api key by hash: %w", down), nil, 500, "internal", false},
		{"another failure", errors.New("persist: scan: bad row"), unavailable, 500, "internal", false},
		{"engine error wins", engine.NotFound("customer not found"), unavailable, 404, "not-found", false},
	}
	for _, tt := range tests {
		s := New(Config{Unavailable: tt.classify})
		var ctx fasthttp.RequestCtx
		c := &call{ctx: &ctx, s: s, reqID: []byte("req-1")}
		c.fail(tt.err)
		if got := ctx.Response.StatusCode(); got != tt.wantStatus {
			t.Errorf("%s: status %d, want %d", tt.name, got, tt.wantStatus)
		}
		var p Problem
		if err := json.Unmarshal(ctx.Response.Body(), &p); err != nil || p.Type != tt.wantType || p.RequestID != "req-1" {
			t.Errorf("%s: problem %s (%v), want type %s", tt.name, ctx.Response.Body(), err, tt.wantType)
		}
		if got := string(ctx.Response.Header.Peek("Retry-After")) != ""; got != tt.wantRetry {
			t.Errorf("%s: Retry-After present %v, want %v", tt.name, got, tt.wantRetry)
		}
	}
}
