package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// metric is the metered metric the load consumes (per_unit, unitCost).
const (
	metric   = "chaos-calls"
	unitCost = 3
)

// Timeline is the run's events with their times, safe for concurrent use.
type Timeline struct {
	mu     sync.Mutex
	start  time.Time
	Events []Event
}

// Event is one timeline entry; At is seconds since the run started.
type Event struct {
	Time time.Time `json:"time"`
	At   float64   `json:"at_s"`
	What string    `json:"what"`
}

func (t *Timeline) add(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	e := Event{Time: now.UTC(), At: now.Sub(t.start).Seconds(), What: fmt.Sprintf(format, args...)}
	t.Events = append(t.Events, e)
	logf("  +%6.1fs %s", e.At, e.What)
}

// API calls creditd through the balancer.
type API struct {
	base string
	hc   *http.Client
}

func newAPI(base string) *API {
	return &API{base: base, hc: &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 256, MaxIdleConnsPerHost: 128, IdleConnTimeout: 30 * time.Second}}}
}

// Answer is one HTTP answer; Status 0 means no answer (transport error).
type Answer struct {
	Status   int
	Body     []byte
	Replayed bool
	// FromCreditd: creditd answered, not the balancer (whose own answers,
	// problem documents too, carry Proxy-Status: deploy/haproxy.cfg).
	FromCreditd bool
	RetryAfter  bool // a Retry-After header came with it
	Problem     bool // Content-Type application/problem+json
	Err         error
}

func (a *API) call(ctx context.Context, method, path string, body any, headers ...string) Answer {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return Answer{Err: err}
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, rd)
	if err != nil {
		return Answer{Err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := a.hc.Do(req)
	if err != nil {
		return Answer{Err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return Answer{Status: 0, Err: err}
	}
	return Answer{Status: res.StatusCode, Body: b, Replayed: res.Header.Get("X-Idempotent-Replayed") == "true",
		FromCreditd: strings.Contains(res.Header.Get("Content-Type"), "json") && res.Header.Get("Proxy-Status") == "",
		RetryAfter:  res.Header.Get("Retry-After") != "", Problem: strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json")}
}

// outcome classifies an answer to a money request: definitive (2xx, or a
// 4xx other than 408, 429 and the 409 "still in progress") or unknown
// (no answer, 5xx, 408, 429, 409 in progress), which the client retries with
// the same Idempotency-Key.
func outcome(a Answer) (definitive bool) {
	switch {
	case a.Status == 0:
		return false
	case a.Status >= 200 && a.Status < 300:
		return true
	case a.Status == 408 || a.Status == 429 || a.Status >= 500:
		return false
	case a.Status == 409 && bytes.Contains(a.Body, []byte("still in progress")):
		return false
	}
	return true
}

// Op is one money operation the load sent and how it ended.
type Op struct {
	Key      string `json:"key"`
	Kind     string `json:"kind"`
	Customer string `json:"customer"` // external id
	Attempts int    `json:"attempts"`
	Status   int    `json:"status"` // final status; 0 when unresolved
	// Delta is the balance change the acknowledgement reports
	// (millicredits): a grant's or adjust's entries, minus a consume's
	// charge.
	Delta    int64 `json:"delta"`
	Replayed bool  `json:"replayed"`
	// CustomerID is the UUID the acknowledgement names.
	CustomerID string `json:"customer_id,omitempty"`
	Body       string `json:"body,omitempty"` // a refusal's body
	// Reservation is the reservation id a reserve's acknowledgement names.
	Reservation string `json:"hold,omitempty"`
}

// Counts are the load's request figures.
type Counts struct {
	Sent         int64            `json:"operations"`
	Acknowledged int64            `json:"acknowledged"`
	Refused      int64            `json:"refused_4xx"`
	Unresolved   int64            `json:"unresolved"`
	Requests     int64            `json:"requests"`
	Retried      int64            `json:"retried_operations"`
	Retries      int64            `json:"retries"`
	Replayed     int64            `json:"acknowledged_as_replay"`
	Transport    int64            `json:"transport_errors"`
	ByStatus     map[string]int64 `json:"by_status"`
	Other5xx     int64            `json:"5xx_other_than_503"`
	// Balancer5xx are HAProxy's own 5xx other than 503 (a 502 for a
	// request in flight on a node killed -9): not creditd's answers.
	Balancer5xx int64 `json:"balancer_5xx_other_than_503"`
	Got503      int64 `json:"503"`
	InProgress  int64 `json:"409_in_progress"`
	// Answers are the distinct non-2xx answers and how many of each.
	Answers map[string]int64 `json:"non_2xx_answers"`
}

// Load is the money load's state.
type Load struct {
	api    *API
	key    string
	prefix string
	mu     sync.Mutex
	ops    []*Op
	counts Counts
	status map[int]int64
	// samples counts the distinct answers that were not 2xx (status and
	// the start of the body, or the transport error).
	samples map[string]int64
	// rec keeps every attempt's answer for the fault windows.
	rec *Samples
	// reservePct is the share of ticks (percent) that reserve and then
	// commit a reservation, two operations with keys of their own; the rest
	// split 25 % grants, 25 % adjusts, 50 % consumes.
	reservePct int
}

// mix says what the load sends.
func (l *Load) mix() string {
	if l.reservePct <= 0 {
		return "25 % grants, 25 % adjusts, 50 % consumes"
	}
	rest := float64(100-l.reservePct) / 100
	return fmt.Sprintf("%d %% reserve then commit, %.0f %% grants, %.0f %% adjusts, %.0f %% consumes", l.reservePct, 25*rest, 25*rest, 50*rest)
}

func newLoad(api *API, key, prefix string, rec *Samples) *Load {
	return &Load{api: api, key: key, prefix: prefix, status: map[int]int64{}, samples: map[string]int64{}, rec: rec}
}

// opBody is the path and body of one money operation.
func opBody(kind, customer string, rng *rand.Rand) (path string, body map[string]any) {
	switch kind {
	case "grant":
		// Small enough that the load spends more than it grants (per op about
		// 2.6 granted and 3.2 by positive adjusts, against 4.5 consumed and
		// 3.2 by negative adjusts): its blocks are drained as they come, so a
		// customer's live blocks stay far below the cap of 100 however long
		// the run (a 60 s Postgres outage included); the seed grant pays the
		// difference.
		return "/v1/customers/" + customer + "/credits/grant",
			map[string]any{"credits": 1 + rng.IntN(20), "source": "promotional", "reason": "chaos"}
	case "adjust":
		d := 1 + rng.IntN(50)
		if rng.IntN(2) == 0 {
			d = -d
		}
		return "/v1/customers/" + customer + "/credits/adjust",
			map[string]any{"delta": d, "source": "manual", "reason": "chaos"}
	default:
		return "/v1/entitlements/consume",
			map[string]any{"customer_id": customer, "billable_metric_key": metric, "units": 1 + rng.IntN(5)}
	}
}

// do sends one operation with key until it has a definitive answer (or
// giveUp passes) and records it.
func (l *Load) do(ctx context.Context, kind, customer, key string, path string, body map[string]any, giveUp time.Duration) *Op {
	op := &Op{Key: key, Kind: kind, Customer: customer}
	deadline := time.Now().Add(giveUp)
	var last Answer
	for {
		op.Attempts++
		at := time.Now()
		a := l.api.call(context.Background(), "POST", path, body, "X-API-Key", l.key, "Idempotency-Key", key)
		last = a
		smp := sampleOf(at, false, customer, key, a)
		smp.Attempt = op.Attempts
		l.rec.add(smp)
		l.mu.Lock()
		l.counts.Requests++
		if a.Status == 0 {
			l.counts.Transport++
		} else {
			l.status[a.Status]++
		}
		if a.Status == 409 && !outcome(a) {
			l.counts.InProgress++
		}
		if a.Status < 200 || a.Status >= 300 {
			l.sample(a)
		}
		if a.Status >= 500 && a.Status != 503 {
			if a.FromCreditd {
				l.counts.Other5xx++
			} else {
				l.counts.Balancer5xx++
			}
		}
		l.mu.Unlock()
		if outcome(a) {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			op.Status = 0
			op.Body = fmt.Sprintf("unresolved after %d attempts; last %d %v %s", op.Attempts, a.Status, a.Err, trunc(a.Body))
			l.record(op)
			return op
		}
		pause := 200 * time.Millisecond
		if a.Status == 503 || a.Status == 429 {
			pause = 500 * time.Millisecond
		}
		time.Sleep(pause)
	}
	op.Status, op.Replayed = last.Status, last.Replayed
	if last.Status >= 200 && last.Status < 300 {
		d, cid, err := ackDelta(kind, last.Body)
		if err != nil {
			op.Body = "acknowledged, but: " + err.Error() + ": " + trunc(last.Body)
		}
		op.Delta, op.CustomerID = d, cid
		if kind == "reserve" {
			var h struct {
				ID string `json:"id"`
			}
			_ = json.Unmarshal(last.Body, &h)
			op.Reservation = h.ID
		}
	} else {
		op.Body = trunc(last.Body)
	}
	l.record(op)
	return op
}

// sample counts a non-2xx answer by its status and body (ids, times and
// numbers blanked so that one kind of answer counts once); l.mu is held.
func (l *Load) sample(a Answer) {
	var s string
	if a.Status == 0 {
		s = fmt.Sprintf("no answer: %v", a.Err)
	} else {
		var p struct {
			Title  string `json:"title"`
			Detail string `json:"detail"`
		}
		_ = json.Unmarshal(a.Body, &p)
		s = fmt.Sprintf("%d %s: %s", a.Status, p.Title, p.Detail)
		if p.Title == "" && p.Detail == "" {
			s = fmt.Sprintf("%d %s", a.Status, trunc(a.Body))
		}
	}
	s = blankDigits(s)
	if len(s) > 240 {
		s = s[:240] + "..."
	}
	if _, ok := l.samples[s]; ok || len(l.samples) < 40 {
		l.samples[s]++
	}
}

// blankDigits replaces runs of digits and hex ids with "N", so that
// answers differing only in ids or ports count as one.
func blankDigits(s string) string {
	var b strings.Builder
	in := false
	for _, r := range s {
		if r >= '0' && r <= '9' {
			if !in {
				b.WriteByte('N')
			}
			in = true
			continue
		}
		in = false
		b.WriteRune(r)
	}
	return b.String()
}

func (l *Load) record(op *Op) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ops = append(l.ops, op)
	l.counts.Sent++
	if op.Attempts > 1 {
		l.counts.Retried++
		l.counts.Retries += int64(op.Attempts - 1)
	}
	switch {
	case op.Status == 0:
		l.counts.Unresolved++
	case op.Status < 300:
		l.counts.Acknowledged++
		if op.Replayed {
			l.counts.Replayed++
		}
	default:
		l.counts.Refused++
	}
}

// ackDelta is the balance change and customer id an acknowledgement
// reports.
func ackDelta(kind string, body []byte) (int64, string, error) {
	type entry struct {
		Delta      int64  `json:"delta"`
		CustomerID string `json:"customer_id"`
	}
	switch kind {
	case "grant":
		var r struct {
			Transaction entry `json:"transaction"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return 0, "", err
		}
		return r.Transaction.Delta, r.Transaction.CustomerID, nil
	case "reserve":
		// A reservation changes the balance by nothing (it lowers the effective
		// balance only), so its operation's ledger entries sum to 0.
		var r struct {
			CustomerID string `json:"customer_id"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return 0, "", err
		}
		return 0, r.CustomerID, nil
	case "commit":
		var r struct {
			Transaction entry `json:"transaction"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return 0, "", err
		}
		return r.Transaction.Delta, r.Transaction.CustomerID, nil
	case "adjust":
		var r struct {
			Transactions []entry `json:"transactions"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return 0, "", err
		}
		var d int64
		cid := ""
		for _, e := range r.Transactions {
			d += e.Delta
			cid = e.CustomerID
		}
		return d, cid, nil
	default:
		var r struct {
			CustomerID string `json:"customer_id"`
			Charged    int64  `json:"charged"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			return 0, "", err
		}
		return -r.Charged, r.CustomerID, nil
	}
}

func trunc(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// run drives the mixed load from workers until stop is closed: each worker
// paces its first attempts at rate/workers per second; a worker finishes
// the operation it holds (retries included) before it returns.
func (l *Load) run(ctx context.Context, stop <-chan struct{}, workers int, rate float64, customers []string) {
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) * float64(workers) / rate)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w)+1, uint64(time.Now().UnixNano())))
			next := time.Now().Add(time.Duration(rng.Int64N(int64(interval))))
			for n := 0; ; n++ {
				// Stop first: a worker behind its pace has its tick due at
				// once, and select would pick between the two at random,
				// starting new operations after the stop.
				select {
				case <-stop:
					return
				default:
				}
				select {
				case <-stop:
					return
				case <-ctx.Done():
					return
				case <-time.After(time.Until(next)):
				}
				next = next.Add(interval)
				if time.Until(next) < -time.Second {
					next = time.Now() // behind after a stall: no burst to catch up
				}
				key := l.prefix + "-w" + strconv.Itoa(w) + "-" + strconv.Itoa(n)
				if l.reservePct > 0 && rng.IntN(100) < l.reservePct {
					l.reserveCommit(ctx, customers[rng.IntN(len(customers))], key, rng)
					continue
				}
				kind := "consume"
				switch k := rng.IntN(100); {
				case k < 25:
					kind = "grant"
				case k < 50:
					kind = "adjust"
				}
				c := customers[rng.IntN(len(customers))]
				path, body := opBody(kind, c, rng)
				l.do(ctx, kind, c, key, path, body, 3*time.Minute)
			}
		}(w)
	}
	wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.counts.ByStatus = map[string]int64{}
	for s, n := range l.status {
		l.counts.ByStatus[strconv.Itoa(s)] = n
		if s == 503 {
			l.counts.Got503 += n
		}
	}
	l.counts.Answers = l.samples
}

// reserveCommit reserves a reservation for customer and commits it with at most
// its estimated units: two operations, keys key-r and key-c. In a rolling
// upgrade the two often land on nodes of different versions, so one
// version's reservation is committed by the other's. An unresolved or refused
// reserve has no commit.
func (l *Load) reserveCommit(ctx context.Context, customer, key string, rng *rand.Rand) {
	est := 1 + rng.IntN(5)
	res := l.do(ctx, "reserve", customer, key+"-r", "/v1/reservations",
		map[string]any{"customer_id": customer, "billable_metric_key": metric, "estimated_units": est}, 3*time.Minute)
	if res.Status != 201 || res.Reservation == "" {
		return
	}
	l.do(ctx, "commit", customer, key+"-c", "/v1/reservations/"+res.Reservation+"/commit",
		map[string]any{"actual_units": 1 + rng.IntN(est)}, 3*time.Minute)
}

// FloodResult is the rate-limit flood's outcome.
type FloodResult struct {
	PerSecond int     `json:"rate_limit_per_second"`
	Burst     int     `json:"burst"`
	Seconds   float64 `json:"seconds"`
	Offered   int64   `json:"requests"`
	OK        int64   `json:"ok_2xx"`
	Limited   int64   `json:"limited_429"`
	Other     int64   `json:"other"`
	Want      float64 `json:"want_2xx"`
	// RatePerS is the 2xx count less the burst over the flood's length.
	RatePerS float64 `json:"ok_rate_per_s"`
}

// flood sends GET /v1/customers?limit=1 with the rate-limited key through
// the balancer from clients paced at 4R together, for d: the 2xx count
// should be burst + R x d (+-10 %), whichever node answers. Eight clients
// share the 4R so that one held up (a request to the node being killed,
// a starved core) leaves the others enough to keep the budget in use.
func flood(ctx context.Context, api *API, key string, perSecond, burst int, d time.Duration) FloodResult {
	const clients = 8
	r := FloodResult{PerSecond: perSecond, Burst: burst}
	var ok, limited, other, offered atomic.Int64
	interval := time.Duration(float64(time.Second) * clients / float64(4*perSecond))
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := time.Now()
			for time.Now().Before(end) && ctx.Err() == nil {
				time.Sleep(time.Until(next))
				next = next.Add(interval)
				offered.Add(1)
				a := api.call(ctx, "GET", "/v1/customers?limit=1", nil, "X-API-Key", key)
				switch {
				case a.Status >= 200 && a.Status < 300:
					ok.Add(1)
				case a.Status == 429:
					limited.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	r.Seconds = min(elapsed, d).Seconds()
	r.Offered, r.OK, r.Limited, r.Other = offered.Load(), ok.Load(), limited.Load(), other.Load()
	r.Want = float64(burst) + float64(perSecond)*r.Seconds
	r.RatePerS = (float64(r.OK) - float64(burst)) / r.Seconds
	return r
}

// Held: the 2xx count is within 10 % of burst + R x length, and the flood
// was limited at all (else it proves nothing).
func (r FloodResult) Held() bool {
	return r.Limited > 0 && float64(r.OK) >= 0.9*r.Want && float64(r.OK) <= 1.1*r.Want
}
