package persist

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/sender"
)

// movableClock is a test clock that only moves when told to.
type movableClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *movableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *movableClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (b *bundle) events(t *testing.T, tenant uuid.UUID) []engine.Event {
	t.Helper()
	p, err := b.store.ListEvents(b.ctx, tenant, engine.EventQuery{Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	return p.Data
}

// TestApplyWritesEventsOnce: events derived from Mutations are written by
// Apply with the ledger entries, once however often the batch is replayed;
// a Mutation without a Context gets its external id and its low-balance
// threshold from the customer row.
func TestApplyWritesEventsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	cust := engine.Customer{ID: uuid.New(), TenantID: live.TenantID, Environment: live.Environment, ExternalID: "acme-1",
		LowBalanceThresholdMC: ptr(int64(300)), Metadata: engine.Metadata{}, CreatedAt: now, UpdatedAt: now}
	if err := b.store.CreateCustomer(b.ctx, cust); err != nil {
		t.Fatal(err)
	}
	src := engine.SourceManual
	base := engine.Mutation{TenantID: live.TenantID, CustomerID: cust.ID, Environment: live.Environment, AtMS: now.UnixMilli()}
	grant := base
	grant.OpID, grant.Kind, grant.IdempotencyKey = uuid.New(), engine.MutationGrant, "g1"
	grant.Account = engine.MutationAccount{ID: uuid.NewString(), Version: 1, Balance: 1000, LifetimeEarned: 1000}
	grant.Entries = []engine.MutationEntry{{Role: engine.RoleMain, Delta: 1000, Type: engine.EntryAdjustment, Source: &src}}
	debit := base
	debit.OpID, debit.Kind, debit.IdempotencyKey = uuid.New(), engine.MutationDebit, "d1"
	debit.Account = engine.MutationAccount{ID: grant.Account.ID, Version: 2, Balance: 200, LifetimeEarned: 1000}
	debit.Entries = []engine.MutationEntry{{Role: engine.RoleMain, Delta: -800, Type: engine.EntryAdjustment, Source: &src}}
	for i := 0; i < 2; i++ {
		if err := b.store.Apply(b.ctx, []engine.Mutation{grant, debit}); err != nil {
			t.Fatal(err)
		}
	}
	evs := b.events(t, live.TenantID)
	got := map[engine.EventType]engine.Event{}
	for _, e := range evs {
		got[e.EventType] = e
	}
	if len(evs) != 3 || len(got) != 3 {
		t.Fatalf("events = %d %v, want granted, consumed, low_balance once each", len(evs), got)
	}
	var low struct {
		External *string `json:"external_customer_id"`
		Data     struct {
			Balance   int64 `json:"balance_mc"`
			Threshold int64 `json:"threshold_mc"`
		} `json:"data"`
	}
	if err := json.Unmarshal(got[engine.EventCreditLowBalance].Payload, &low); err != nil {
		t.Fatal(err)
	}
	if low.External == nil || *low.External != "acme-1" || low.Data.Balance != 200 || low.Data.Threshold != 300 {
		t.Fatalf("low_balance payload = %s", got[engine.EventCreditLowBalance].Payload)
	}
	// Numbered in batch order once, the version of the Mutation behind
	// each, the sequence in the payload too.
	for typ, want := range map[engine.EventType][2]int64{engine.EventCreditGranted: {1, 1},
		engine.EventCreditConsumed: {2, 2}, engine.EventCreditLowBalance: {3, 2}} {
		e := got[typ]
		var body struct {
			Sequence int64 `json:"sequence"`
			Version  int64 `json:"version"`
		}
		if err := json.Unmarshal(e.Payload, &body); err != nil {
			t.Fatal(err)
		}
		if e.Sequence == nil || *e.Sequence != want[0] || e.Version == nil || *e.Version != want[1] ||
			body.Sequence != want[0] || body.Version != want[1] {
			t.Errorf("%s: sequence %v version %v, payload %s; want %d, %d", typ, e.Sequence, e.Version, e.Payload, want[0], want[1])
		}
	}
	checkSequences(t, b, live.TenantID)
	for _, e := range evs {
		if e.Status != engine.EventPending || e.NextRetryAt == nil || !e.NextRetryAt.Equal(now) || e.Attempts != 0 {
			t.Fatalf("event %s: status %s next %v attempts %d", e.EventType, e.Status, e.NextRetryAt, e.Attempts)
		}
	}
}

// receiver is an httptest endpoint whose answer the test sets.
type receiver struct {
	srv    *httptest.Server
	status atomic.Int32
	mu     sync.Mutex
	hits   []string // webhook-id of each request
}

func newReceiver(t *testing.T, status int) *receiver {
	r := &receiver{}
	r.status.Store(int32(status))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		_, _ = io.ReadAll(req.Body)
		r.mu.Lock()
		r.hits = append(r.hits, req.Header.Get("webhook-id"))
		r.mu.Unlock()
		w.WriteHeader(int(r.status.Load()))
		fmt.Fprint(w, "answer")
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.hits)
}

// waitFor polls cond for up to 10 s of wall time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDeliveryScheduleDeadLetterRedeliver: a receiver that always fails sees
// exactly 7 attempts, each at exactly its delay on the injected clock (and
// not a millisecond before); the event ends dead_letter; redeliver starts a
// fresh schedule and the recovered receiver gets it exactly once more.
func TestDeliveryScheduleDeadLetterRedeliver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	rcv := newReceiver(t, 500)
	tn, err := b.store.GetTenant(b.ctx, live.TenantID)
	if err != nil {
		t.Fatal(err)
	}
	url, secret := rcv.srv.URL, "whsec_"+"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	tn.WebhookURL, tn.WebhookSecret = &url, &secret
	if err := b.store.UpdateTenant(b.ctx, tn); err != nil {
		t.Fatal(err)
	}
	clock := &movableClock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	wh := engine.NewWebhooks(b.store, b.store, sender.New(0, true), clock, zerolog.Nop())
	wh.Poll = 5 * time.Millisecond
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan struct{})
	go func() { wh.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	res, err := wh.Test(b.ctx, live, engine.Idempotency{Key: "ping-1"})
	if err != nil {
		t.Fatal(err)
	}
	event := func() engine.Event {
		for _, e := range b.events(t, live.TenantID) {
			if e.ID == res.EventID {
				return e
			}
		}
		t.Fatal("event gone")
		return engine.Event{}
	}
	start := clock.Now()
	elapsed := time.Duration(0)
	for attempt := 1; attempt <= engine.MaxDeliveryAttempts; attempt++ {
		if attempt > 1 {
			d := engine.RetryDelays[attempt-2]
			clock.Add(d - time.Millisecond)
			time.Sleep(50 * time.Millisecond)
			if n := rcv.count(); n != attempt-1 {
				t.Fatalf("attempt %d came %d early: receiver saw %d", attempt, time.Millisecond, n)
			}
			clock.Add(time.Millisecond)
			elapsed += d
		}
		waitFor(t, fmt.Sprintf("attempt %d recorded", attempt), func() bool { return event().Attempts == attempt })
		e := event()
		last := e.Deliveries[len(e.Deliveries)-1]
		if !last.CreatedAt.Equal(start.Add(elapsed)) || last.StatusCode == nil || *last.StatusCode != 500 || last.ResponseBody != "answer" {
			t.Fatalf("attempt %d: %+v at %v, want at %v", attempt, last, last.CreatedAt, start.Add(elapsed))
		}
		if e.LastError == nil || *e.LastError != "HTTP 500" {
			t.Fatalf("last_error = %v", e.LastError)
		}
		if attempt < engine.MaxDeliveryAttempts {
			if e.Status != engine.EventFailed || e.NextRetryAt == nil || !e.NextRetryAt.Equal(start.Add(elapsed+engine.RetryDelays[attempt-1])) {
				t.Fatalf("after attempt %d: %s next %v", attempt, e.Status, e.NextRetryAt)
			}
		}
	}
	e := event()
	if e.Status != engine.EventDeadLetter || e.NextRetryAt != nil || len(e.Deliveries) != 7 {
		t.Fatalf("after 7 failures: %s next %v deliveries %d", e.Status, e.NextRetryAt, len(e.Deliveries))
	}
	clock.Add(48 * time.Hour)
	time.Sleep(50 * time.Millisecond)
	if n := rcv.count(); n != 7 {
		t.Fatalf("receiver saw %d attempts, want exactly 7", n)
	}

	// Only a dead letter can be redelivered; ids are checked.
	if _, err := wh.Redeliver(b.ctx, live, "not-a-uuid"); !isKind(err, engine.KindValidation) {
		t.Fatalf("bad id: %v", err)
	}
	if _, err := wh.Redeliver(b.ctx, live, uuid.NewString()); !isKind(err, engine.KindNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	other, _ := b.tenant(t)
	if _, err := wh.Redeliver(b.ctx, other, res.EventID.String()); !isKind(err, engine.KindNotFound) {
		t.Fatalf("other tenant: %v", err)
	}
	rcv.status.Store(204)
	red, err := wh.Redeliver(b.ctx, live, res.EventID.String())
	if err != nil {
		t.Fatal(err)
	}
	if red.Status != engine.EventPending || red.Attempts != 0 || red.NextRetryAt == nil {
		t.Fatalf("redelivered: %+v", red)
	}
	waitFor(t, "redelivery", func() bool { return event().Status == engine.EventDelivered })
	time.Sleep(50 * time.Millisecond)
	clock.Add(48 * time.Hour)
	time.Sleep(50 * time.Millisecond)
	e = event()
	if rcv.count() != 8 || e.Attempts != 1 || e.LastError != nil || e.DeliveredAt == nil || e.NextRetryAt != nil || len(e.Deliveries) != 8 {
		t.Fatalf("after redelivery: hits %d, %+v", rcv.count(), e)
	}
	if _, err := wh.Redeliver(b.ctx, live, res.EventID.String()); !isKind(err, engine.KindConflict) {
		t.Fatalf("redeliver of a delivered event: %v", err)
	}
}

func isKind(err error, k engine.Kind) bool {
	e, ok := engine.AsError(err)
	return ok && e.Kind == k
}

// TestClaimFairAndLeased: a claim takes at most perTenant events of each
// tenant, skips the tenants asked, never hands out an event twice while its
// lease runs, and hands it out again once the lease lapses (a dead worker).
func TestClaimFairAndLeased(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, _ := b.tenant(t)
	c, _ := b.tenant(t)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := b.pool.Exec(b.ctx, `UPDATE tenants SET webhook_url = 'http://127.0.0.1:1/h', webhook_secret = 'whsec_c2VjcmV0'`); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		for _, s := range []engine.Scope{a, c} {
			e := engine.NewEvent(uuid.New(), engine.EventTestPing, s.TenantID, s.Environment, nil, nil, now, "k", engine.PingData{Message: "ping"})
			if err := b.store.InsertEvent(b.ctx, e); err != nil {
				t.Fatal(err)
			}
		}
	}
	claims, err := b.store.ClaimDue(b.ctx, now, time.Minute, 8, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	per := map[uuid.UUID]int{}
	for _, cl := range claims {
		per[cl.Event.TenantID]++
	}
	if len(claims) != 4 || per[a.TenantID] != 2 || per[c.TenantID] != 2 {
		t.Fatalf("claims per tenant = %v", per)
	}
	more, err := b.store.ClaimDue(b.ctx, now, time.Minute, 8, 100, []uuid.UUID{c.TenantID})
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range more {
		if cl.Event.TenantID == c.TenantID {
			t.Fatal("a skipped tenant was claimed")
		}
		for _, old := range claims {
			if old.Event.ID == cl.Event.ID {
				t.Fatal("an event under lease was claimed again")
			}
		}
	}
	if len(more) != 8 {
		t.Fatalf("second claim = %d, want the 8 unleased events of tenant a", len(more))
	}
	again, err := b.store.ClaimDue(b.ctx, now.Add(time.Minute), time.Minute, 100, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(again) != 20 {
		t.Fatalf("after the leases lapsed %d events were claimable, want 20", len(again))
	}
	// A stale lease cannot record over the new one.
	ok, err := b.store.RecordAttempt(b.ctx, claims[0], engine.Attempt{At: now, Status: engine.EventDelivered, Attempts: 1, DeliveredAt: &now})
	if err != nil || ok {
		t.Fatalf("stale lease recorded: %v %v", ok, err)
	}
}

// TestClaimWaitsForWebhookURL: events of a tenant without a webhook URL are
// not attempted (no attempts burnt); once a URL is set they are due.
func TestClaimWaitsForWebhookURL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a, _ := b.tenant(t)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	e := engine.NewEvent(uuid.New(), engine.EventTestPing, a.TenantID, a.Environment, nil, nil, now, "k", engine.PingData{Message: "ping"})
	if err := b.store.InsertEvent(b.ctx, e); err != nil {
		t.Fatal(err)
	}
	claims, err := b.store.ClaimDue(b.ctx, now, time.Minute, 8, 2, nil)
	if err != nil || len(claims) != 0 {
		t.Fatalf("claimed %d events of a tenant without a URL (%v)", len(claims), err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE tenants SET webhook_url = 'http://127.0.0.1:1/h', webhook_secret = 'whsec_c2VjcmV0' WHERE id = $1`, a.TenantID); err != nil {
		t.Fatal(err)
	}
	claims, err = b.store.ClaimDue(b.ctx, now, time.Minute, 8, 2, nil)
	if err != nil || len(claims) != 1 {
		t.Fatalf("after setting a URL: %d claims (%v)", len(claims), err)
	}
}
