package persist

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// storedEventsSQL is every stored event as (tenant_id, customer_id,
// event_type, sequence): the rows and the carried ones (carried.go) not
// copied into rows yet.
const storedEventsSQL = `(SELECT tenant_id, customer_id, event_type, sequence FROM webhook_events
	UNION ALL
	SELECT l.tenant_id, l.customer_id, 'credit.consumed', l.event_sequence FROM ledger_entries l
	WHERE l.event_sequence IS NOT NULL
		AND l.event_sequence > COALESCE((SELECT through FROM event_carried_through m WHERE m.tenant_id = l.tenant_id), 0)
) AS stored_events`

// storedEvents is tenant's events as EventsAfter reads them, one line
// each, without their ids: a lean write's carried credit.consumed and the
// ON CONFLICT write's row of the same consume differ only in id.
func storedEvents(t *testing.T, b *bundle, tenant uuid.UUID) []string {
	t.Helper()
	evs, err := b.store.EventsAfter(b.ctx, tenant, nil, 0, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(evs))
	for i, e := range evs {
		var body map[string]any
		if err := json.Unmarshal(e.Payload, &body); err != nil {
			t.Fatal(err)
		}
		delete(body, "event_id")
		payload, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = fmt.Sprintf("%d %s %v %d %s %d %s %s", *e.Sequence, e.EventType, e.CustomerID, *e.Version, e.Status,
			e.Attempts, e.CreatedAt.Format(time.RFC3339Nano), payload)
	}
	return out
}

// customerRows stores the tenant and customer rows the Mutations of ms
// name, as the directory would have before any of them ran: a carried
// event reads the customer's external id from its row.
func customerRows(t *testing.T, b *bundle, ms []engine.Mutation) {
	t.Helper()
	for _, m := range ms {
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO tenants (id, name) VALUES ($1, 't') ON CONFLICT DO NOTHING`,
			m.TenantID); err != nil {
			t.Fatal(err)
		}
		if m.Context == nil {
			continue
		}
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO customers (id, tenant_id, environment, external_id)
			VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`, m.CustomerID, m.TenantID, string(m.Environment),
			m.Context.ExternalID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCarriedConsumedEvent states that a lean write keeps a consume's
// credit.consumed on its ledger entry (no row) and that every read gives
// back exactly the event EventsOf owes, under the carried id: the body
// byte for byte with that id and the sequence; that redeliver tells it
// from an unknown id; that pages of the events list merge rows and
// carried events by sequence; and that a tenant with a webhook URL has
// its carried events copied into rows before a claim, each read once.
func TestCarriedConsumedEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	c := &profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 1, balance: 2_000_000}
	grant := c.grant(live.TenantID)
	var consumes []engine.Mutation
	for range 5 {
		consumes = append(consumes, c.consume(live.TenantID, true))
	}
	customerRows(t, b, append([]engine.Mutation{grant}, consumes...))
	if err := b.store.Apply(b.ctx, []engine.Mutation{grant}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.insertApply(b.ctx, consumes, nil); err != nil {
		t.Fatal(err)
	}
	var rows, carried int
	if err := b.pool.QueryRow(b.ctx, `SELECT (SELECT count(*) FROM webhook_events WHERE tenant_id = $1
		AND event_type = 'credit.consumed'), (SELECT count(*) FROM ledger_entries WHERE tenant_id = $1
		AND event_sequence IS NOT NULL)`, live.TenantID).Scan(&rows, &carried); err != nil {
		t.Fatal(err)
	}
	if rows != 0 || carried != len(consumes) {
		t.Fatalf("%d credit.consumed rows and %d carried, want 0 and %d", rows, carried, len(consumes))
	}

	evs, err := b.store.EventsAfter(b.ctx, live.TenantID, nil, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var read []engine.Event
	for _, e := range evs {
		if e.EventType == engine.EventCreditConsumed {
			read = append(read, e)
		}
	}
	if len(read) != len(consumes) {
		t.Fatalf("read %d credit.consumed, want %d", len(read), len(consumes))
	}
	for i, m := range consumes {
		var owed engine.Event
		for _, e := range engine.EventsOf(m) {
			if e.EventType == engine.EventCreditConsumed {
				owed = e
			}
		}
		id := engine.CarriedEventID(engine.EntryID(m.OpID, 0))
		want := engine.CarriedConsumedEvent(m, 0, &m.Context.ExternalID)
		got := read[i]
		if got.ID != id || want.ID != id {
			t.Fatalf("consume %d: event id %s (built %s), want the carried id %s", i, got.ID, want.ID, id)
		}
		wantBody := sequencedPayload(*got.Sequence, string(want.Payload))
		if string(got.Payload) != wantBody {
			t.Errorf("consume %d: body\n%s\nwant\n%s", i, got.Payload, wantBody)
		}
		// The carried body is the one EventsOf built but for the id.
		var a, bb map[string]any
		_ = json.Unmarshal(owed.Payload, &a)
		_ = json.Unmarshal(want.Payload, &bb)
		delete(a, "event_id")
		delete(bb, "event_id")
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(bb)
		if string(ja) != string(jb) {
			t.Errorf("consume %d: carried body %s, EventsOf's %s", i, jb, ja)
		}
		if got.Status != engine.EventPending || got.Attempts != 0 || *got.Version != m.Account.Version {
			t.Errorf("consume %d: status %s, attempts %d, version %d", i, got.Status, got.Attempts, *got.Version)
		}
	}

	if _, err := b.store.Redeliver(b.ctx, live.TenantID, read[0].ID, time.Now()); !errors.Is(err, engine.ErrNotDeadLetter) {
		t.Errorf("redeliver of a carried event: %v, want ErrNotDeadLetter", err)
	}
	if _, err := b.store.Redeliver(b.ctx, live.TenantID, uuid.New(), time.Now()); !errors.Is(err, engine.ErrNotFound) {
		t.Errorf("redeliver of an unknown id: %v, want ErrNotFound", err)
	}

	// Pages of 2, newest first, walk every event once in sequence order.
	all := storedEvents(t, b, live.TenantID)
	var walked []int64
	cursor := ""
	for {
		page, err := b.store.ListEvents(b.ctx, live.TenantID, engine.EventQuery{Cursor: cursor, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Data {
			walked = append(walked, *e.Sequence)
		}
		if !page.HasMore {
			break
		}
		cursor = page.NextCursor
	}
	if len(walked) != len(all) {
		t.Fatalf("the list walked %v, want %d events", walked, len(all))
	}
	for i := range walked {
		if walked[i] != int64(len(all)-i) {
			t.Fatalf("the list walked %v, want %d down to 1", walked, len(all))
		}
	}
	page, err := b.store.ListEvents(b.ctx, live.TenantID, engine.EventQuery{EventType: string(engine.EventCreditGranted)})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Data {
		if e.EventType != engine.EventCreditGranted {
			t.Errorf("a credit.granted filter listed a %s", e.EventType)
		}
	}

	// With a webhook URL the carried events become rows, pending, under
	// the same ids, and a read sees each once.
	if _, err := b.pool.Exec(b.ctx, `UPDATE tenants SET webhook_url = 'http://127.0.0.1:9/', webhook_secret = 'whsec_x'
		WHERE id = $1`, live.TenantID); err != nil {
		t.Fatal(err)
	}
	claims, err := b.store.ClaimDue(b.ctx, time.Now().Add(time.Minute), time.Minute, 100, 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	claimed := map[uuid.UUID]bool{}
	for _, cl := range claims {
		claimed[cl.Event.ID] = true
	}
	for _, e := range read {
		if !claimed[e.ID] {
			t.Errorf("carried event %s was not claimed once copied", e.ID)
		}
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM webhook_events WHERE tenant_id = $1
		AND event_type = 'credit.consumed'`, live.TenantID).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != len(consumes) {
		t.Errorf("%d credit.consumed rows after the copy, want %d", rows, len(consumes))
	}
	after := storedEvents(t, b, live.TenantID)
	if len(after) != len(all) {
		t.Errorf("%d events read after the copy, want %d (each once)", len(after), len(all))
	}
	copied, err := b.store.EventsAfter(b.ctx, live.TenantID, nil, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range copied {
		for _, r := range read {
			if e.ID == r.ID && string(e.Payload) != string(r.Payload) {
				t.Errorf("event %s: row body\n%s\ncarried body\n%s", e.ID, e.Payload, r.Payload)
			}
		}
	}
}
