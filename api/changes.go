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

const (
	// changeStreamHeartbeat is how often a change stream sends a comment
	// line. Shorter than a balance stream's: an evaluator reads a heartbeat
	// as "every change before now was sent" and measures its answers' age
	// from it, so the beat bounds the age a quiet tenant's answers show.
	changeStreamHeartbeat = time.Second
	// changeStreamCurrentWithin is how far behind now its feed may be
	// proven current (engine.ChangeStream.CurrentAt) for a heartbeat to be
	// sent; further behind (a stalled persister, an unreadable Redis or
	// Postgres) the stream sends ": behind" instead, and the evaluator's
	// answers age until they fall back.
	changeStreamCurrentWithin = 2 * time.Second
)

// streamChanges answers GET /v1/changes/stream (issue 27): a
// text/event-stream of everything that can change a check of any of the
// tenant's customers in the key's environment: the event log's events of
// customers (balances, subscriptions), reservation notices, and the config
// changes that fire no event (plans, variant entitlements, overrides,
// metering rules, customers, tenant settings). Each message's id is a
// cursor over both sources;
// Last-Event-ID resumes after it, and a cursor older than the config
// changes kept gets a "reset" message first (drop every cached answer).
// The body is written by the connection's goroutine, as streamCredits'.
func (s *Server) streamChanges(c *call) error {
	raw := string(c.ctx.Request.Header.Peek("Last-Event-ID"))
	from, err := engine.ParseFeedCursor(raw)
	if err != nil {
		return err
	}
	ctx := c.reqContext()
	st, err := s.events.OpenChanges(ctx, c.scope)
	if err != nil {
		if err == engine.ErrTooManyChangeStreams {
			c.ctx.Response.Header.SetBytesKV(headerRetryAfter, retryAfterOne)
		}
		return err
	}
	// A stream opened without a cursor starts now: its first id is the
	// place to resume from, so the client has one before any change. (A
	// zero cursor, "0.0-0", is one: a tenant's first stream sends it.)
	if raw == "" {
		if from, err = s.changesNow(ctx, c.scope); err != nil {
			st.Close()
			return err
		}
	}
	scope, conn := c.scope, c.ctx.Conn()
	c.ctx.SetStatusCode(fasthttp.StatusOK)
	c.ctx.Response.Header.SetContentType("text/event-stream")
	c.ctx.Response.Header.Set("Cache-Control", "no-cache")
	c.ctx.Response.Header.Set("X-Accel-Buffering", "no")
	c.ctx.SetConnectionClose()
	c.ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer st.Close()
		s.writeChanges(w, conn, scope, st, from)
	})
	return nil
}

// changesNow is the cursor of the newest event and config change.
func (s *Server) changesNow(ctx context.Context, scope engine.Scope) (engine.FeedCursor, error) {
	seq, err := s.events.LastSequence(ctx, scope)
	if err != nil {
		return engine.FeedCursor{}, err
	}
	ch, err := s.events.ChangesLast(ctx, scope)
	if err != nil {
		return engine.FeedCursor{}, err
	}
	return engine.FeedCursor{Sequence: seq, Change: ch}, nil
}

// writeChanges is the body of a change stream: an "open" message with the
// cursor, the catch-up after it, then the feed, skipping what was sent.
func (s *Server) writeChanges(w *bufio.Writer, conn net.Conn, scope engine.Scope, st *engine.ChangeStream, cur engine.FeedCursor) {
	flush := func() bool {
		_ = conn.SetWriteDeadline(time.Now().Add(writeTimeout))
		return w.Flush() == nil
	}
	send := func(it engine.FeedItem) bool {
		switch {
		case it.Event != nil:
			if it.Event.Sequence == nil || *it.Event.Sequence <= cur.Sequence {
				return true
			}
			cur.Sequence = *it.Event.Sequence
			writeFeedMessage(w, cur, string(it.Event.EventType), it.Event.Payload)
		case it.Change != nil:
			if !cur.Change.Less(it.Change.ID) {
				return true
			}
			cur.Change = it.Change.ID
			if it.Change.Customer != nil && it.Change.Environment != scope.Environment {
				return true // the other environment's customer (invariant 8)
			}
			writeFeedMessage(w, cur, "change."+it.Change.Name(), changeBody(scope, *it.Change))
		}
		return flush()
	}
	gone := watchGone(conn)
	ctx, cancel := context.WithTimeout(context.Background(), readyCheckTimeout)
	changes, lost, err := s.events.ChangesAfter(ctx, scope, cur.Change, streamCatchUpPage)
	cancel()
	if err != nil {
		s.log.Warn().Err(err).Msg("change stream catch-up failed")
		return
	}
	if lost {
		// What changed since the cursor is gone: the client drops what it
		// cached and goes on from the newest change.
		ctx, cancel := context.WithTimeout(context.Background(), readyCheckTimeout)
		cur.Change, err = s.events.ChangesLast(ctx, scope)
		cancel()
		if err != nil {
			return
		}
		changes = nil
		writeFeedMessage(w, cur, "reset", []byte(`{"reason":"changes after the cursor are no longer kept; drop every cached answer"}`))
	} else {
		writeFeedMessage(w, cur, "open", []byte(`{}`))
	}
	if !flush() {
		return
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), readyCheckTimeout)
		evs, err := s.events.TenantEventsAfter(ctx, scope, cur.Sequence, streamCatchUpPage)
		cancel()
		if err != nil {
			s.log.Warn().Err(err).Msg("change stream catch-up failed")
			return
		}
		for i := range evs {
			if evs[i].CustomerID != nil && evs[i].Environment == scope.Environment && !send(engine.FeedItem{Event: &evs[i]}) {
				return
			}
			// An event the stream does not carry moves the cursor all the same.
			if evs[i].Sequence != nil && *evs[i].Sequence > cur.Sequence {
				cur.Sequence = *evs[i].Sequence
			}
		}
		if len(evs) < streamCatchUpPage {
			break
		}
	}
	for len(changes) > 0 {
		for i := range changes {
			if !send(engine.FeedItem{Change: &changes[i]}) {
				return
			}
		}
		if len(changes) < streamCatchUpPage {
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), readyCheckTimeout)
		changes, lost, err = s.events.ChangesAfter(ctx, scope, cur.Change, streamCatchUpPage)
		cancel()
		if err != nil || lost {
			return // the client resumes from what it has
		}
	}
	beat := time.NewTicker(changeStreamHeartbeat)
	defer beat.Stop()
	for {
		select {
		case it, ok := <-st.C:
			if !ok || !send(it) {
				return
			}
		case <-beat.C:
			// The heartbeat says how far behind now the stream is proven
			// current, in milliseconds: a duration, so the client needs no
			// clock of ours to date its figures.
			if lag := time.Since(st.CurrentAt()); lag <= changeStreamCurrentWithin {
				_, _ = w.WriteString(": heartbeat ")
				_, _ = w.WriteString(strconv.FormatInt(lag.Milliseconds(), 10))
				_, _ = w.WriteString("\n\n")
			} else {
				_, _ = w.WriteString(": behind\n\n")
			}
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

// changeBody is a change's data line: what kind of facts changed and when
// (the stamp, microseconds since the epoch); a reservation notice adds whose.
func changeBody(scope engine.Scope, c engine.ConfigChange) []byte {
	body := struct {
		Change      string     `json:"change"`
		TenantID    string     `json:"tenant_id"`
		CustomerID  *uuid.UUID `json:"customer_id,omitempty"`
		Environment string     `json:"environment,omitempty"`
		ChangedAt   time.Time  `json:"changed_at"`
	}{Change: c.Name(), TenantID: scope.TenantID.String(), CustomerID: c.Customer,
		Environment: string(c.Environment), ChangedAt: time.UnixMicro(int64(c.Stamp)).UTC()}
	b, _ := json.Marshal(body)
	return b
}

// writeFeedMessage writes one message: cursor as id, type as event, body
// (one JSON line) as data.
func writeFeedMessage(w *bufio.Writer, cur engine.FeedCursor, event string, body []byte) {
	_, _ = w.WriteString("id: ")
	_, _ = w.WriteString(strconv.FormatInt(cur.Sequence, 10))
	_ = w.WriteByte('.')
	_, _ = w.WriteString(cur.Change.String())
	_, _ = w.WriteString("\nevent: ")
	_, _ = w.WriteString(event)
	_, _ = w.WriteString("\ndata: ")
	_, _ = w.Write(body)
	_, _ = w.WriteString("\n\n")
}
