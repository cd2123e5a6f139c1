package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creditd/creditd/internal/app"
)

// TestEventSequencesHaveNoGapUnderConcurrentWriters (issue 15 item 2):
// goroutines consume, grant and debit for customers of one tenant in both
// environments at once, two per customer; once the persister has drained,
// GET /v1/events pages exactly sequences 1..N (N the tenant's stored
// events), each payload carrying its own sequence, and each customer's
// account versions never go back along the sequence, one operation per
// version.
func TestEventSequencesHaveNoGapUnderConcurrentWriters(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	tn := s.NewTenant(uniq("sequence"))
	raiseRateLimit(t, s.HTTP, s.URL, tn.ID)
	metric := uniq("calls")
	keys := []string{tn.Live, tn.Sandbox}
	var ids []string
	keyOf := map[string]string{}
	for _, key := range keys {
		a := s.as(t, key)
		wantStatus(t, a.post("/v1/metering-rules", map[string]any{
			"billable_metric_key": metric, "cost_type": "per_unit", "unit_cost": 3}), 201, "rule")
		for range 3 {
			c := a.createCustomer(map[string]any{"external_id": uniq("c"), "low_balance_threshold_mc": 400})
			id := c["id"].(string)
			a.grant(id, map[string]any{"credits": 600, "source": "promotional", "reason": "seed"})
			ids = append(ids, id)
			keyOf[id] = key
		}
	}

	client := loadClient()
	var wg sync.WaitGroup
	for w := range 2 * len(ids) {
		wg.Add(1)
		go func(cust string, seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 11))
			call := func(path string, body any) Response {
				return Call(t, client, s.URL, "POST", path, body, "X-API-Key", keyOf[cust], "Idempotency-Key", idemKey())
			}
			for range 15 {
				var r Response
				switch rng.IntN(3) {
				case 0:
					r = call("/v1/entitlements/consume", map[string]any{
						"customer_id": cust, "billable_metric_key": metric, "units": 1 + rng.IntN(20)})
				case 1:
					r = call("/v1/customers/"+cust+"/credits/grant", map[string]any{
						"credits": 1 + rng.IntN(50), "source": "promotional", "reason": "top"})
				default:
					r = call("/v1/customers/"+cust+"/credits/adjust", map[string]any{
						"delta": -1 - rng.IntN(30), "source": "manual", "reason": "debit"})
				}
				if r.Status >= 300 && r.Status != 409 {
					t.Errorf("write: %d %s", r.Status, r.Raw)
				}
			}
		}(ids[w%len(ids)], uint64(w))
	}
	wg.Wait()
	s.Drain()

	var stored int
	if err := s.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+storedEventsSQL+` WHERE tenant_id = $1`,
		tn.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	a := s.as(t, tn.Live)
	var events []map[string]any
	after := "0"
	for {
		r := a.get("/v1/events?limit=37&after_sequence=" + after)
		wantStatus(t, r, 200, "events page")
		data, more, next := page(t, r)
		for _, d := range data {
			events = append(events, obj(t, d, "event"))
		}
		if !more {
			break
		}
		after = str(t, next, "next_cursor")
	}
	if len(events) != stored || stored < 2*len(ids) {
		t.Fatalf("paged %d events, %d stored (want equal, at least %d)", len(events), stored, 2*len(ids))
	}
	lastVersion := map[string]int64{}
	keyOfVersion := map[string]string{}
	envs := map[string]bool{}
	for i, e := range events {
		if seq := Int(t, e["sequence"]); seq != int64(i+1) {
			t.Fatalf("event %d has sequence %d, want %d (no gap, no duplicate)", i, seq, i+1)
		}
		envs[e["environment"].(string)] = true
		cust, _ := e["customer_id"].(string)
		if e["version"] == nil {
			t.Fatalf("credit event without a version: %v", e)
		}
		v := Int(t, e["version"])
		if v < lastVersion[cust] {
			t.Errorf("customer %s: version %d after %d (sequence %d)", cust, v, lastVersion[cust], i+1)
		}
		opKey := fmt.Sprintf("%s/%d", cust, v)
		if k, ok := keyOfVersion[opKey]; ok && k != e["idempotency_key"] {
			t.Errorf("customer %s: version %d shared by operations %s and %v", cust, v, k, e["idempotency_key"])
		}
		keyOfVersion[opKey] = e["idempotency_key"].(string)
		lastVersion[cust] = v
	}
	if !envs["live"] || !envs["sandbox"] {
		t.Errorf("environments paged: %v, want both", envs)
	}
	// The webhook event resource carries the same numbers.
	r := a.get("/v1/webhooks/events?limit=5")
	wantStatus(t, r, 200, "webhook events")
	data, _, _ := page(t, r)
	for _, d := range data {
		e := obj(t, d, "webhook event")
		p := obj(t, e["payload"], "payload")
		if Int(t, e["sequence"]) != Int(t, p["sequence"]) || Int(t, e["version"]) != Int(t, p["version"]) {
			t.Errorf("webhook event %v: sequence/version differ from its payload's", e["id"])
		}
	}
	checkProblem(t, a.get("/v1/events?after_sequence=-1"), 400, "bad-request", "after_sequence", "negative after_sequence")
}

// sseEvent is one message of a text/event-stream.
type sseEvent struct {
	id, typ string
	data    map[string]any
}

// openStream opens a customer's balance stream (lastID "" for none) and
// returns its messages; the stream ends with the test or close.
func openStream(t *testing.T, s *Stack, key, cust, lastID string) (<-chan sseEvent, func()) {
	t.Helper()
	return openSSE(t, s, key, "/v1/customers/"+cust+"/credits/stream", lastID)
}

// openSSE opens the stream at path (lastID "" for none) and returns its
// messages; the stream ends with the test or close.
func openSSE(t *testing.T, s *Stack, key, path, lastID string) (<-chan sseEvent, func()) {
	t.Helper()
	status, out, cancel := dialSSE(t, s, key, path, lastID)
	if status != 200 {
		t.Fatalf("stream: status %d", status)
	}
	return out, cancel
}

// dialSSE opens the stream at path and returns the status and, on a 200
// text/event-stream, its messages (else a nil channel).
func dialSSE(t *testing.T, s *Stack, key, path, lastID string) (int, <-chan sseEvent, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", s.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	client := &http.Client{Transport: s.HTTP.Transport}
	res, err := client.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		res.Body.Close()
		cancel()
		return res.StatusCode, nil, func() {}
	}
	out := make(chan sseEvent, 64)
	go func() {
		defer close(out)
		defer res.Body.Close()
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var cur sseEvent
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if cur.id != "" {
					out <- cur
				}
				cur = sseEvent{}
			case strings.HasPrefix(line, "id: "):
				cur.id = strings.TrimPrefix(line, "id: ")
			case strings.HasPrefix(line, "event: "):
				cur.typ = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				d := json.NewDecoder(strings.NewReader(strings.TrimPrefix(line, "data: ")))
				d.UseNumber()
				if err := d.Decode(&cur.data); err != nil {
					t.Errorf("stream data: %v", err)
				}
			}
		}
	}()
	return 200, out, cancel
}

// next is the stream's next message, failing after a timeout.
func next(t *testing.T, c <-chan sseEvent) sseEvent {
	t.Helper()
	select {
	case e, ok := <-c:
		if !ok {
			t.Fatal("stream ended")
		}
		return e
	case <-time.After(15 * time.Second):
		t.Fatal("no stream message in 15 s")
	}
	return sseEvent{}
}

// quiet fails when the stream sends a message within d.
func quiet(t *testing.T, c <-chan sseEvent, d time.Duration) {
	t.Helper()
	select {
	case e, ok := <-c:
		if ok {
			t.Errorf("unexpected stream message %s %s", e.id, e.typ)
		}
	case <-time.After(d):
	}
}

// TestCreditStreamPushesAndResumes (issue 15 item 2): a customer's stream
// receives a grant's balance change with id = its sequence; reopened with
// Last-Event-ID it sends exactly the customer's events missed meanwhile,
// in order (not another customer's, not the one already seen), then the
// next live one and nothing else.
func TestCreditStreamPushesAndResumes(t *testing.T) {
	t.Parallel()
	s := NewStack(t)
	tn := s.NewTenant(uniq("stream"))
	a := s.as(t, tn.Live)
	cust, _ := a.newCustomer()
	other, _ := a.newCustomer()

	msgs, stop := openStream(t, s, tn.Live, cust, "")
	a.grant(cust, map[string]any{"credits": 1000, "source": "promotional", "reason": "first"})
	first := next(t, msgs)
	if first.typ != "credit.granted" || Int(t, first.data["sequence"]) == 0 ||
		strconv.FormatInt(Int(t, first.data["sequence"]), 10) != first.id {
		t.Fatalf("first message: %+v", first)
	}
	if d := obj(t, first.data["data"], "data"); Int(t, d["balance_after"]) != 1000 {
		t.Errorf("balance_after = %v, want 1000", d["balance_after"])
	}
	stop()

	a.grant(cust, map[string]any{"credits": 200, "source": "promotional", "reason": "missed 1"})
	a.grant(other, map[string]any{"credits": 5, "source": "promotional", "reason": "someone else"})
	wantStatus(t, a.post("/v1/customers/"+cust+"/credits/adjust", map[string]any{
		"delta": -50, "source": "manual", "reason": "missed 2"}), 200, "debit")
	s.Drain()

	msgs, stop = openStream(t, s, tn.Live, cust, first.id)
	defer stop()
	m1, m2 := next(t, msgs), next(t, msgs)
	if m1.typ != "credit.granted" || m2.typ != "credit.consumed" {
		t.Fatalf("resumed with %s, %s; want credit.granted, credit.consumed", m1.typ, m2.typ)
	}
	if Int(t, obj(t, m2.data["data"], "data")["balance_after"]) != 1150 {
		t.Errorf("after the debit balance_after = %v, want 1150", m2.data["data"])
	}
	id0, _ := strconv.ParseInt(first.id, 10, 64)
	id1, _ := strconv.ParseInt(m1.id, 10, 64)
	id2, _ := strconv.ParseInt(m2.id, 10, 64)
	if !(id0 < id1 && id1 < id2) {
		t.Errorf("ids %d, %d, %d not increasing", id0, id1, id2)
	}
	a.grant(cust, map[string]any{"credits": 7, "source": "promotional", "reason": "live"})
	m3 := next(t, msgs)
	if id3, _ := strconv.ParseInt(m3.id, 10, 64); id3 <= id2 || m3.typ != "credit.granted" {
		t.Errorf("live after resume: %s %s", m3.id, m3.typ)
	}
	quiet(t, msgs, 600*time.Millisecond)

	r := a.get("/v1/customers/" + uniq("nobody") + "/credits/stream")
	checkProblem(t, r, 404, "not-found", "", "stream of an unknown customer")
	checkProblem(t, a.do("GET", "/v1/customers/"+cust+"/credits/stream", "", nil, "Last-Event-ID", "x"),
		400, "bad-request", "Last-Event-ID", "bad Last-Event-ID")
}

// TestCreditStreamsCappedPerTenant: past its cap of open streams a tenant
// gets a 429 rate-limited problem with Retry-After; a stream whose client
// left frees its place at once.
func TestCreditStreamsCappedPerTenant(t *testing.T) {
	t.Parallel()
	s := NewStack(t, SingleNode(), WithConfig(func(c *app.Config) { c.StreamsPerTenant = 1 }))
	tn := s.NewTenant(uniq("cap"))
	a := s.as(t, tn.Live)
	cust, _ := a.newCustomer()
	_, stop := openStream(t, s, tn.Live, cust, "")
	r := a.get("/v1/customers/" + cust + "/credits/stream")
	checkProblem(t, r, 429, "rate-limited", "", "a second stream past the cap of 1")
	if r.Header.Get("Retry-After") == "" {
		t.Error("429 without Retry-After")
	}
	stop()
	deadline := time.Now().Add(5 * time.Second)
	for {
		msgs, stop2 := tryStream(t, s, tn.Live, cust)
		if msgs {
			stop2()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the cap was not freed after the stream closed")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// tryStream opens a stream and reports whether it was accepted.
func tryStream(t *testing.T, s *Stack, key, cust string) (bool, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", s.URL+"/v1/customers/"+cust+"/credits/stream", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	res, err := (&http.Client{Transport: s.HTTP.Transport}).Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if res.StatusCode != 200 {
		_ = res.Body.Close()
		cancel()
		return false, nil
	}
	return true, func() { cancel(); _ = res.Body.Close() }
}

// storedEventsSQL is every stored event as (id, tenant_id, event_type,
// sequence): the webhook_events rows and the credit.consumed a lean
// consume's ledger entry carries instead (persist/carried.go), those not
// copied into rows yet. (A carried event's id is the entry's, masked:
// engine.CarriedEventID; here the entry id stands in.)
const storedEventsSQL = `(SELECT id, tenant_id, event_type, sequence, status FROM webhook_events
	UNION ALL
	SELECT l.id, l.tenant_id, 'credit.consumed', l.event_sequence, 'pending' FROM ledger_entries l
	WHERE l.event_sequence IS NOT NULL
		AND l.event_sequence > COALESCE((SELECT through FROM event_carried_through m WHERE m.tenant_id = l.tenant_id), 0)
) AS stored_events`
