package api

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// Stream limits (invariant 11).
const (
	// streamHeartbeat is how often an idle stream sends a comment line, so
	// proxies keep it open and a dead client is noticed by a failed write.
	streamHeartbeat = 15 * time.Second
	// streamCatchUpPage is how many events one catch-up read takes.
	streamCatchUpPage = 100
)

// listEvents answers GET /v1/events: the tenant's events in both
// environments after a sequence, in sequence order, each the exact body
// webhooks deliver.
func (s *Server) listEvents(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	after, err := engine.ParseSequence("after_sequence", c.query("after_sequence"))
	if err != nil {
		return err
	}
	page, err := s.events.Page(c.reqContext(), c.scope, engine.EventsPage{After: after, Limit: limit})
	if err != nil {
		return err
	}
	bodies := engine.Page[json.RawMessage]{HasMore: page.HasMore, NextCursor: page.NextCursor}
	for _, e := range page.Data {
		bodies.Data = append(bodies.Data, e.Payload)
	}
	return c.json(fasthttp.StatusOK, pageOf(bodies))
}

// streamCredits answers GET /v1/customers/{id}/credits/stream: a
// text/event-stream of the customer's events as the persister commits
// them, each with id: <sequence>; Last-Event-ID resumes after that
// sequence (the events missed are read first). The handler returns at
// once; the body is written by the connection's goroutine until the
// client leaves, the stream falls behind (the client resumes) or the
// server shuts down.
func (s *Server) streamCredits(c *call) error {
	ref, err := refParam(false)(c)
	if err != nil {
		return err
	}
	lastID, err := engine.ParseSequence("Last-Event-ID", string(c.ctx.Request.Header.Peek("Last-Event-ID")))
	if err != nil {
		return err
	}
	ctx := c.reqContext()
	cust, err := s.customers.Resolve(ctx, c.scope, ref, false)
	if err != nil {
		return err
	}
	st, err := s.events.Open(ctx, c.scope, cust.ID)
	if err != nil {
		if err == engine.ErrTooManyStreams {
			c.ctx.Response.Header.SetBytesKV(headerRetryAfter, retryAfterOne)
		}
		return err
	}
	scope, conn := c.scope, c.ctx.Conn()
	c.ctx.SetStatusCode(fasthttp.StatusOK)
	c.ctx.Response.Header.SetContentType("text/event-stream")
	c.ctx.Response.Header.Set("Cache-Control", "no-cache")
	c.ctx.Response.Header.Set("X-Accel-Buffering", "no")
	// The connection ends with the stream: writeStream reads it to notice a
	// client that left, so nothing may be read from it after.
	c.ctx.SetConnectionClose()
	c.ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer st.Close()
		s.writeStream(w, conn, scope, cust.ID, st, lastID)
	})
	return nil
}

// writeStream is the body of a stream: the catch-up after lastID (when
// given), then the feed, skipping what was already sent.
func (s *Server) writeStream(w *bufio.Writer, conn net.Conn, scope engine.Scope, customer uuid.UUID, st *engine.Stream, last int64) {
	flush := func() bool {
		// The server's write deadline was set once for the whole response;
		// each write of a stream gets its own.
		_ = conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		return w.Flush() == nil
	}
	send := func(e engine.Event) bool {
		if e.Sequence == nil || *e.Sequence <= last {
			return true
		}
		last = *e.Sequence
		writeStreamEvent(w, e)
		return flush()
	}
	gone := watchGone(conn)
	// A comment first, so the client sees the headers at once.
	_, _ = w.WriteString(": stream open\n\n")
	if !flush() {
		return
	}
	if last > 0 {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), readyCheckTimeout)
			evs, err := s.events.CustomerEventsAfter(ctx, scope, customer, last, streamCatchUpPage)
			cancel()
			if err != nil {
				// The client resumes from what it has.
				s.log.Warn().Err(err).Msg("stream catch-up failed")
				return
			}
			for _, e := range evs {
				if !send(e) {
					return
				}
			}
			if len(evs) < streamCatchUpPage {
				break
			}
		}
	}
	beat := time.NewTicker(streamHeartbeat)
	defer beat.Stop()
	for {
		select {
		case e, ok := <-st.C:
			if !ok || !send(e) {
				return
			}
		case <-beat.C:
			_, _ = w.WriteString(": heartbeat\n\n")
			if !flush() {
				return
			}
		case <-s.streamsDone:
			return
		case <-gone:
			return
		}
	}
}

// watchGone is closed when the client of a stream leaves. A client sends
// nothing on a stream: a read ends only when it leaves (or the connection
// closes), which frees the stream's place at once instead of at a failed
// write.
func watchGone(conn net.Conn) <-chan struct{} {
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		_ = conn.SetReadDeadline(time.Time{})
		var b [512]byte
		for {
			if _, err := conn.Read(b[:]); err != nil {
				return
			}
		}
	}()
	return gone
}

// writeStreamEvent writes one event in the text/event-stream format: its
// sequence as id, its type as event, its delivered body (one JSON line)
// as data.
func writeStreamEvent(w *bufio.Writer, e engine.Event) {
	_, _ = w.WriteString("id: ")
	_, _ = w.WriteString(strconv.FormatInt(*e.Sequence, 10))
	_, _ = w.WriteString("\nevent: ")
	_, _ = w.WriteString(string(e.EventType))
	_, _ = w.WriteString("\ndata: ")
	_, _ = w.Write(e.Payload)
	_, _ = w.WriteString("\n\n")
}

// registerEvents adds the event log routes (issue 15 item 2).
func (s *Server) registerEvents() {
	s.handle("GET", "/v1/events", optTenant, s.listEvents)
	s.handle("GET", "/v1/customers/{id}/credits/stream", optTenant, s.streamCredits)
	s.handle("GET", "/v1/changes/stream", optTenant, s.streamChanges)
}
