package client

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"time"
)

// Change stream event types besides the event log's (credit.granted, ...,
// subscription.*): the config changes that fire no webhook, and the
// stream's own messages.
const (
	// ChangeEventOpen is the first message of a stream; its ID is where it
	// starts (the cursor sent, or now).
	ChangeEventOpen = "open"
	// ChangeEventReset says changes after the cursor sent are no longer kept:
	// drop every cached answer, then go on from its ID.
	ChangeEventReset = "reset"
	// ChangeEventPrefix starts the type of a config change:
	// change.tenant, change.customers, change.metering, change.plans,
	// change.subscriptions (of some customers: drop every cached answer),
	// and change.holds.
	ChangeEventPrefix = "change."
	// ChangeEventReservations says a reservation of the customer its data names
	// (customer_id) was created, committed or released: its effective
	// balance moved, which no event of the log reports.
	ChangeEventReservations = "change.holds"
	// ChangeEventHolds is ChangeEventReservations' name before v0.4.
	//
	// Deprecated: use ChangeEventReservations (the wire value is the same).
	ChangeEventHolds = ChangeEventReservations
)

// ChangeEvent is one message of the tenant's change stream.
type ChangeEvent struct {
	// ID is the cursor after this message, opaque: pass the last one seen
	// to StreamChanges to resume.
	ID string
	// Type is an event type of the log, a change.* type, open or reset.
	Type string
	// Data is the event's delivered body (WebhookEnvelope) for events of
	// the log; {change, tenant_id, changed_at} for change.* types, plus
	// customer_id and environment for change.holds.
	Data json.RawMessage
}

// ChangeStream is an open GET /v1/changes/stream. It is not safe for
// concurrent use; Close it when done.
type ChangeStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
	// OnHeartbeat, when set, is called from Next on each heartbeat (about
	// one a second) with its lag: every change made up to lag before the
	// heartbeat was sent has been sent (the server's persister lag and
	// poll; at most 2 s, past it the server sends ": behind" comments
	// instead, which do not count).
	OnHeartbeat func(lag time.Duration)
}

// StreamChanges opens the tenant's change stream: every event of its
// customers and every config change that can alter a check, after
// lastEventID when it is not empty. It is sent once, never retried; a
// refusal is a *Problem (429 past the tenant's open change streams). The
// stream ends with ctx or Close.
func (c *Client) StreamChanges(ctx context.Context, lastEventID string) (*ChangeStream, error) {
	r := &request{method: "GET", path: "/v1/changes/stream"}
	if lastEventID != "" {
		r.header("Last-Event-ID", lastEventID)
	}
	body, sc, err := c.openStream(ctx, r)
	if err != nil {
		return nil, err
	}
	return &ChangeStream{body: body, sc: sc}, nil
}

// Next waits for the next message. It returns io.EOF when the server
// ended the stream (resume with the last ID).
func (s *ChangeStream) Next() (ChangeEvent, error) {
	id, typ, data, err := nextMessage(s.sc, func(line string) {
		if s.OnHeartbeat != nil && strings.HasPrefix(line, ": heartbeat") {
			ms, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, ": heartbeat")), 10, 64)
			s.OnHeartbeat(time.Duration(max(ms, 0)) * time.Millisecond)
		}
	})
	if err != nil {
		return ChangeEvent{}, err
	}
	return ChangeEvent{ID: id, Type: typ, Data: data}, nil
}

// Close ends the stream.
func (s *ChangeStream) Close() error { return s.body.Close() }
