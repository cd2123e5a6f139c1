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

// fakeUsageIDs is a tenant index of event ids in memory: ids in held are
// claimed by that customer, ids in seen are maybe seen by the filter, the
// others certainly new; it records the releases.
type fakeUsageIDs struct {
	mu       sync.Mutex
	held     map[string]uuid.UUID
	seen     map[string]bool
	released []string
}

func (f *fakeUsageIDs) UsageIDsClaim(_ context.Context, _ uuid.UUID, _ engine.Environment, claims []engine.UsageClaim) ([]engine.UsageHold, []error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	holds := make([]engine.UsageHold, len(claims))
	for i, c := range claims {
		h, ok := f.held[c.EventID]
		switch {
		case ok && (c.LookOnly || h != c.Customer):
			holds[i] = engine.UsageHold{Other: true, Holder: h}
		case ok:
		case c.LookOnly:
			holds[i] = engine.UsageHold{Seen: f.seen[c.EventID]}
		default:
			f.held[c.EventID] = c.Customer
			holds[i] = engine.UsageHold{Fresh: true, Seen: f.seen[c.EventID]}
		}
	}
	return holds, make([]error, len(claims))
}

func (f *fakeUsageIDs) UsageIDsRelease(_ context.Context, _ uuid.UUID, _ engine.Environment, claims []engine.UsageClaim) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range claims {
		delete(f.held, c.EventID)
		f.released = append(f.released, c.EventID)
	}
	return nil
}

// askedApplied is Postgres's look-up of applied usage: it records the
// keys asked and answers err (or nothing found).
type askedApplied struct {
	mu    sync.Mutex
	asked []string
	err   error
}

func (a *askedApplied) AppliedMutations(_ context.Context, _ uuid.UUID, keys []string) (map[string]engine.Mutation, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked = append(a.asked, keys...)
	return nil, a.err
}

// TestUsageAsksPostgresOnlyForMaybeIDs (issue 26: a money call touches
// Redis only): a usage batch asks Postgres only about the ids the tenant
// index cannot clear (a fresh claim the filter may know); an id another
// customer holds fails as a reuse, charged to nobody; with Postgres down
// only the ids it had to ask about fail, retryable, and their claims and
// the reuse's are not kept by this batch.
func TestUsageAsksPostgresOnlyForMaybeIDs(t *testing.T) {
	t.Parallel()
	other := uuid.New()
	for _, down := range []bool{false, true} {
		ids := &fakeUsageIDs{held: map[string]uuid.UUID{"held": other}, seen: map[string]bool{"maybe": true}}
		applied := &askedApplied{}
		if down {
			applied.err = engine.ErrRecordUnavailable
		}
		h := setup(t, func(cfg *Config) {
			clock := engine.SystemClock{}
			ledger := &fakeLedger{}
			cfg.Customers = engine.NewCustomers(newFakeDirectory(), clock)
			cfg.Credits = engine.NewCredits(cfg.Customers, &fakeBlocks{accounts: map[uuid.UUID]*fakeAccount{}, ledger: ledger}, ledger, clock, nil)
			catalog := engine.NewCachedCatalog(newFakeCatalog())
			cfg.Metering = engine.NewMetering(catalog, catalog, clock)
			cfg.Entitlements = engine.NewEntitlements(engine.EntitlementsDeps{Customers: cfg.Customers, Metering: cfg.Metering,
				Credits: cfg.Credits, Hot: fakeHot{}, Clock: clock, Applied: applied, UsageIDs: ids})
		})
		if r := h.do("POST", "/v1/metering-rules", `{"billable_metric_key":"tok","cost_type":"per_unit","unit_cost":3}`, h.idemKey("r1")...); r.status != 201 {
			t.Fatalf("rule: %d %s", r.status, r.body)
		}
		body := `{"events":[
			{"event_id":"new","customer_id":"c1","billable_metric_key":"tok","units":2},
			{"event_id":"maybe","customer_id":"c1","billable_metric_key":"tok","units":2},
			{"event_id":"held","customer_id":"c1","billable_metric_key":"tok","units":2}]}`
		r := h.do("POST", "/v1/usage", body, h.idemKey("u1")...)
		if r.status != 200 {
			t.Fatalf("usage (Postgres down %v): %d %s", down, r.status, r.body)
		}
		results, _ := r.json()["results"].([]any)
		get := func(i int) map[string]any { return results[i].(map[string]any) }
		if e := get(0); e["status"] != "charged" {
			t.Errorf("Postgres down %v: a new id: %v, want charged", down, e)
		}
		maybe := get(1)
		if msg, _ := maybe["error"].(string); down && (maybe["status"] != "failed" || !strings.Contains(msg, "retry")) {
			t.Errorf("Postgres down: a maybe-seen id: %v, want failed, retryable", maybe)
		} else if !down && maybe["status"] != "charged" {
			t.Errorf("a maybe-seen id Postgres does not hold: %v, want charged", maybe)
		}
		if e := get(2); e["status"] != "failed" || e["error"] != "event_id was already used for a different event" {
			t.Errorf("Postgres down %v: an id another customer holds: %v, want failed as a reuse", down, e)
		}
		if len(applied.asked) != 1 || applied.asked[0] != "usage:maybe" {
			t.Errorf("Postgres down %v: asked %v, want only usage:maybe", down, applied.asked)
		}
		if want := map[bool]int{false: 0, true: 1}[down]; len(ids.released) != want || ids.held["held"] != other {
			t.Errorf("Postgres down %v: released %v (held %v), want %d release and the reuse's holder kept", down, ids.released, ids.held, want)
		}
	}
}
