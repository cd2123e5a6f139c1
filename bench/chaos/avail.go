package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sort"
	"sync"
	"time"
)

// Sample is one answer the run got: a money attempt or a check, kept so
// that each fault's window can be cut out of the whole run afterwards.
type Sample struct {
	At       time.Time     // when the request was sent
	Took     time.Duration // until its answer (or the transport error)
	Check    bool          // a GET /v1/entitlements/check; else a money attempt
	Customer string        // external id
	Key      string        // a money attempt's Idempotency-Key
	Attempt  int           // a money attempt's number (1: its first)
	Status   int           // 0: no answer
	// Balancer: HAProxy answered itself (Proxy-Status), not creditd.
	Balancer   bool
	RetryAfter bool // a Retry-After header came with it
	Problem    bool // its body is application/problem+json
	InProgress bool // 409 "still in progress"
}

// sampleOf is the Sample of answer a to a request sent at at.
func sampleOf(at time.Time, check bool, customer, key string, a Answer) Sample {
	return Sample{At: at, Took: time.Since(at), Check: check, Customer: customer, Key: key, Status: a.Status, Balancer: a.Status != 0 && !a.FromCreditd,
		RetryAfter: a.RetryAfter, Problem: a.Problem, InProgress: a.Status == 409 && !outcome(a)}
}

// Samples is the run's answers, safe for concurrent use.
type Samples struct {
	mu sync.Mutex
	s  []Sample
}

func (s *Samples) add(x Sample) {
	s.mu.Lock()
	s.s = append(s.s, x)
	s.mu.Unlock()
}

// all is every sample in the order sent.
func (s *Samples) all() []Sample {
	s.mu.Lock()
	out := append([]Sample(nil), s.s...)
	s.mu.Unlock()
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Avail is the availability of one group of answers (a shard's checks
// during a promotion, every money attempt during an outage, ...).
type Avail struct {
	N  int `json:"answers"`
	OK int `json:"ok_2xx"`
	// Unavailable are creditd's 503s with Retry-After and a problem
	// document: the answer invariants 14 and 16 allow.
	Unavailable int `json:"503_retry_after"`
	// Bad503 are 503s without Retry-After or without a problem document.
	Bad503 int `json:"503_without_retry_after_or_problem"`
	// Other5xx are creditd's 5xx other than 503: never allowed.
	Other5xx int `json:"5xx_other_than_503"`
	// Balancer are HAProxy's own answers (no node took the request).
	Balancer int `json:"balancer"`
	// Retryable are the 4xx the load retries with the same key (409 still
	// in progress, 429, 408).
	Retryable int `json:"retryable_4xx"`
	// Unexpected are every other 4xx, and 1xx/3xx: the load sends none
	// that should get one.
	Unexpected int `json:"unexpected"`
	Transport  int `json:"no_answer"`
	// Longest503 is the longest run of consecutive 503s (in the order
	// sent) and how long it lasted from its first request to its last.
	Longest503  int     `json:"longest_503_run"`
	Longest503S float64 `json:"longest_503_run_s"`
	// Latency of the 2xx answers, milliseconds: a shard that keeps
	// answering but slowly is not unaffected.
	OKP50Ms float64 `json:"ok_p50_ms"`
	OKP99Ms float64 `json:"ok_p99_ms"`
	OKMaxMs float64 `json:"ok_max_ms"`
}

// tally counts samples (in the order sent).
func tally(samples []Sample) Avail {
	var a Avail
	run := 0
	var runStart time.Time
	var took []time.Duration
	for _, s := range samples {
		a.N++
		is503 := false
		switch {
		case s.Status == 0:
			a.Transport++
		case s.Status >= 200 && s.Status < 300:
			a.OK++
			took = append(took, s.Took)
		case s.Balancer:
			a.Balancer++
			is503 = s.Status == 503
		case s.Status == 503:
			is503 = true
			if s.RetryAfter && s.Problem {
				a.Unavailable++
			} else {
				a.Bad503++
			}
		case s.Status >= 500:
			a.Other5xx++
		case s.InProgress || s.Status == 429 || s.Status == 408:
			a.Retryable++
		default:
			a.Unexpected++
		}
		if is503 {
			if run == 0 {
				runStart = s.At
			}
			run++
			if run > a.Longest503 {
				a.Longest503, a.Longest503S = run, s.At.Sub(runStart).Seconds()
			}
		} else {
			run = 0
		}
	}
	if len(took) > 0 {
		sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
		ms := func(q float64) float64 {
			return float64(took[min(len(took)-1, int(q*float64(len(took))))].Microseconds()) / 1000
		}
		a.OKP50Ms, a.OKP99Ms, a.OKMaxMs = ms(0.5), ms(0.99), float64(took[len(took)-1].Microseconds())/1000
	}
	return a
}

// Share is the share of 2xx answers in percent (100 with no answers).
func (a Avail) Share() float64 {
	if a.N == 0 {
		return 100
	}
	return 100 * float64(a.OK) / float64(a.N)
}

// Clean: nothing but 2xx, 503 with Retry-After and a problem document, and
// the 4xx the load retries.
func (a Avail) Clean() bool {
	return a.Bad503 == 0 && a.Other5xx == 0 && a.Balancer == 0 && a.Unexpected == 0 && a.Transport == 0
}

// String is the figures in one line.
func (a Avail) String() string {
	s := fmt.Sprintf("%d answers, %.1f %% 2xx, %d 503+Retry-After", a.N, a.Share(), a.Unavailable)
	for _, x := range []struct {
		n    int
		what string
	}{{a.Bad503, "503 without Retry-After/problem"}, {a.Other5xx, "other creditd 5xx"}, {a.Balancer, "HAProxy answers"},
		{a.Retryable, "retried 4xx"}, {a.Unexpected, "unexpected"}, {a.Transport, "no answer"}} {
		if x.n > 0 {
			s += fmt.Sprintf(", %d %s", x.n, x.what)
		}
	}
	if a.Longest503 > 0 {
		s += fmt.Sprintf("; longest 503 run %d (%.1f s)", a.Longest503, a.Longest503S)
	}
	if a.OK > 0 {
		s += fmt.Sprintf("; 2xx in p50 %.0f ms, p99 %.0f ms, max %.0f ms", a.OKP50Ms, a.OKP99Ms, a.OKMaxMs)
	}
	return s
}

// window is the samples sent in [from, to).
func window(samples []Sample, from, to time.Time) []Sample {
	var out []Sample
	for _, s := range samples {
		if !s.At.Before(from) && s.At.Before(to) {
			out = append(out, s)
		}
	}
	return out
}

// filter is the samples keep accepts.
func filter(samples []Sample, keep func(Sample) bool) []Sample {
	var out []Sample
	for _, s := range samples {
		if keep(s) {
			out = append(out, s)
		}
	}
	return out
}

// maxChecksInFlight bounds the checks waiting for an answer at once.
const maxChecksInFlight = 64

// checks sends GET /v1/entitlements/check through the balancer at rate per
// second over random customers until stop is closed, recording every
// answer: the read path's availability during the faults. Open loop: each
// check goes out on its tick whatever the earlier ones are doing (at most
// maxChecksInFlight at once), so checks that hang on a failed shard do not
// thin out the samples of the others. It returns the ticks skipped because
// that many were in flight.
func checks(ctx context.Context, api *API, key string, rate float64, customers []string, rec *Samples, stop <-chan struct{}) int {
	interval := time.Duration(float64(time.Second) / rate)
	rng := rand.New(rand.NewPCG(101, uint64(time.Now().UnixNano())))
	slots := make(chan struct{}, maxChecksInFlight)
	var wg sync.WaitGroup
	skipped := 0
	next := time.Now()
	for {
		select {
		case <-stop:
			wg.Wait()
			return skipped
		case <-ctx.Done():
			wg.Wait()
			return skipped
		case <-time.After(time.Until(next)):
		}
		next = next.Add(interval)
		if time.Until(next) < -time.Second {
			next = time.Now()
		}
		select {
		case slots <- struct{}{}:
		default:
			skipped++
			continue
		}
		cust := customers[rng.IntN(len(customers))]
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			at := time.Now()
			a := api.call(ctx, "GET", "/v1/entitlements/check?customer_id="+url.QueryEscape(cust)+"&billable_metric_key="+metric+"&units=1",
				nil, "X-API-Key", key)
			rec.add(sampleOf(at, true, cust, "", a))
		}()
	}
}
