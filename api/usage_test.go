package api

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
)

// pgFailingDirectory fails the look-up of one external id the way Postgres
// refused a NUL byte (issue 9): an error no engine type describes.
type pgFailingDirectory struct{ *fakeDirectory }

const pgRefusal = `persist: customer by external id: ERROR: invalid byte sequence for encoding "UTF8": 0x00 (SQLSTATE 22021)`

func (d pgFailingDirectory) CustomerByExternalID(ctx context.Context, s engine.Scope, ext string) (engine.Customer, error) {
	if ext == "boom" {
		return engine.Customer{}, errors.New(pgRefusal)
	}
	return d.fakeDirectory.CustomerByExternalID(ctx, s, ext)
}

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestUsageEventInternalError: an event that fails for an unexpected reason
// answers `internal` with the request id and none of the cause's text, which
// goes to the log under that request id; known engine errors keep their
// message and the other events of the batch are charged.
func TestUsageEventInternalError(t *testing.T) {
	t.Parallel()
	logs := &lockedBuffer{}
	h := setup(t, func(cfg *Config) {
		clock := engine.SystemClock{}
		ledger := &fakeLedger{}
		cfg.Customers = engine.NewCustomers(pgFailingDirectory{newFakeDirectory()}, clock)
		cfg.Credits = engine.NewCredits(cfg.Customers, &fakeBlocks{accounts: map[uuid.UUID]*fakeAccount{}, ledger: ledger}, ledger, clock, nil)
		catalog := engine.NewCachedCatalog(newFakeCatalog())
		cfg.Metering = engine.NewMetering(catalog, catalog, clock)
		cfg.Entitlements = engine.NewEntitlements(engine.EntitlementsDeps{Customers: cfg.Customers, Metering: cfg.Metering, Credits: cfg.Credits, Hot: fakeHot{}, Clock: clock})
		cfg.Log = zerolog.New(logs)
	})
	if r := h.do("POST", "/v1/metering-rules", `{"billable_metric_key":"tok","cost_type":"per_unit","unit_cost":3}`, h.idemKey("r1")...); r.status != 201 {
		t.Fatalf("rule: %d %s", r.status, r.body)
	}
	body := `{"events":[
		{"event_id":"e1","customer_id":"c1","billable_metric_key":"tok","units":2},
		{"event_id":"e2","customer_id":"boom","billable_metric_key":"tok","units":1},
		{"event_id":"e3","customer_id":"c1","billable_metric_key":"tok","units":0}]}`
	const reqID = "req-usage-internal-1"
	r := h.do("POST", "/v1/usage", body, h.key("Idempotency-Key", "u1", "X-Request-Id", reqID)...)
	if r.status != 200 || r.get("X-Request-Id") != reqID {
		t.Fatalf("usage: %d (request id %q) %s", r.status, r.get("X-Request-Id"), r.body)
	}
	for _, leak := range []string{"SQLSTATE", "persist", "22021", "UTF8", "invalid byte"} {
		if bytes.Contains(r.body, []byte(leak)) {
			t.Fatalf("usage body leaks %q: %s", leak, r.body)
		}
	}
	results, _ := r.json()["results"].([]any)
	if len(results) != 3 {
		t.Fatalf("results: %s", r.body)
	}
	get := func(i int) map[string]any { return results[i].(map[string]any) }
	if e := get(0); e["status"] != "charged" || e["error"] != nil {
		t.Fatalf("event e1: %v", e)
	}
	e2 := get(1)
	msg, _ := e2["error"].(string)
	if e2["status"] != "failed" || e2["transaction_id"] != nil || !strings.HasPrefix(msg, "internal: ") || !strings.Contains(msg, reqID) {
		t.Fatalf("event e2: %v, want failed with an internal error naming %s", e2, reqID)
	}
	if e := get(2); e["status"] != "failed" || e["error"] != "units: units must be >= 1" {
		t.Fatalf("event e3 (a known error keeps its message): %v", e)
	}
	out := logs.String()
	if !strings.Contains(out, "SQLSTATE 22021") || !strings.Contains(out, reqID) || !strings.Contains(out, `"event_id":"e2"`) {
		t.Fatalf("the cause is not logged under the request id: %s", out)
	}
}
