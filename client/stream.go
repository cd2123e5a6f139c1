package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"
)

// StreamEvent is one message of a customer's balance stream.
type StreamEvent struct {
	// ID is the event's sequence: pass the last one seen to StreamCredits
	// to resume.
	ID int64
	// Type is the event type (credit.granted, credit.consumed, ...).
	Type string
	// Data is the event's delivered body (WebhookEnvelope), as sent.
	Data json.RawMessage
}

// CreditStream is an open GET /v1/customers/{id}/credits/stream. It is not
// safe for concurrent use; Close it when done.
type CreditStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// maxStreamLine bounds one line of a stream (an event's body).
const maxStreamLine = 1 << 20

// StreamCredits opens the customer's balance stream (streamCredits): the
// customer's events as creditd commits them, after lastEventID when it is
// not nil (the sequence of the last event received). It is sent once,
// never retried; a refusal is a *Problem (429 past the tenant's open
// streams). The stream ends with ctx or Close.
func (c *Client) StreamCredits(ctx context.Context, id string, lastEventID *int64) (*CreditStream, error) {
	r := &request{method: "GET", path: "/v1/customers/" + url.PathEscape(id) + "/credits/stream"}
	if lastEventID != nil {
		r.header("Last-Event-ID", *lastEventID)
	}
	body, sc, err := c.openStream(ctx, r)
	if err != nil {
		return nil, err
	}
	return &CreditStream{body: body, sc: sc}, nil
}

// openStream sends r, once, and returns its text/event-stream body with a
// line scanner over it; a refusal is a *Problem.
func (c *Client) openStream(ctx context.Context, r *request) (io.ReadCloser, *bufio.Scanner, error) {
	resp, err := c.send(ctx, r, c.base+r.path, nil, "", nil)
	if err != nil {
		return nil, nil, fmt.Errorf("creditd: GET %s: %w", r.path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, nil, readProblem(resp)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxStreamLine)
	return resp.Body, sc, nil
}

// Next waits for the next event; comments (heartbeats) are skipped. It
// returns io.EOF when the server ended the stream (resume with the last
// ID).
func (s *CreditStream) Next() (StreamEvent, error) {
	id, typ, data, err := nextMessage(s.sc, nil)
	if err != nil {
		return StreamEvent{}, err
	}
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		return StreamEvent{}, fmt.Errorf("creditd: stream id %q: %w", id, err)
	}
	return StreamEvent{ID: n, Type: typ, Data: data}, nil
}

// nextMessage reads one text/event-stream message (one with an id) from
// sc, handing every comment line to comment when set. It returns io.EOF
// when the server ended the stream.
func nextMessage(sc *bufio.Scanner, comment func(string)) (id, typ string, data json.RawMessage, err error) {
	seen := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if seen {
				return id, typ, data, nil
			}
		case strings.HasPrefix(line, ":"):
			if comment != nil {
				comment(line)
			}
		case strings.HasPrefix(line, "id: "):
			id, seen = strings.TrimPrefix(line, "id: "), true
		case strings.HasPrefix(line, "event: "):
			typ = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = json.RawMessage(strings.TrimPrefix(line, "data: "))
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", nil, fmt.Errorf("creditd: read stream: %w", err)
	}
	return "", "", nil, io.EOF
}

// Close ends the stream.
func (s *CreditStream) Close() error { return s.body.Close() }
