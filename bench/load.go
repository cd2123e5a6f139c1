package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// opFunc performs one operation (one or more HTTP calls) and returns the
// status that decides its outcome (the first non-2xx one), or an error for a
// transport failure. seq is unique within the run.
type opFunc func(w *worker, seq uint64) (status int, err error)

// worker is one load goroutine with its own request and response objects.
type worker struct {
	hc   *fasthttp.HostClient
	req  *fasthttp.Request
	resp *fasthttp.Response
	buf  []byte
	// extra counts scenario-specific acknowledgements (usage events charged).
	extra int64
}

// do sends w.req and leaves the answer in w.resp.
func (w *worker) do() (int, error) {
	if err := w.hc.DoTimeout(w.req, w.resp, requestTimeout); err != nil {
		return 0, err
	}
	return w.resp.StatusCode(), nil
}

const requestTimeout = 10 * time.Second

// RunResult is one fixed-rate run of one scenario.
type RunResult struct {
	Offered   float64          `json:"offered_rate"`
	Achieved  float64          `json:"achieved_rate"`
	Seconds   float64          `json:"seconds"`
	Sent      int64            `json:"sent"`
	OK        int64            `json:"ok"`
	Errors    map[string]int64 `json:"errors,omitempty"`
	Extra     int64            `json:"extra,omitempty"`
	Latency   Latency          `json:"latency"`
	ErrorRate float64          `json:"error_rate"`
	hist      *Histogram
}

// Latency is a latency summary in milliseconds.
type Latency struct {
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func summarize(h *Histogram) Latency {
	return Latency{P50: ms(h.Quantile(0.5)), P90: ms(h.Quantile(0.9)), P99: ms(h.Quantile(0.99)),
		P999: ms(h.Quantile(0.999)), Max: ms(h.Max()), Mean: ms(h.Mean())}
}

// ErrorSummary is the error counts as "status:count" text, sorted.
func (r RunResult) ErrorSummary() string {
	if len(r.Errors) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(r.Errors))
	for k := range r.Errors {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s := ""
	for i, k := range keys {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%s:%d", k, r.Errors[k])
	}
	return s
}

// Generator drives open-loop load at one host.
type Generator struct {
	Addr    string
	Workers int
	hc      *fasthttp.HostClient
}

// NewGenerator returns a generator with a pool of up to workers connections.
func NewGenerator(addr string, workers int) *Generator {
	return &Generator{Addr: addr, Workers: workers, hc: &fasthttp.HostClient{
		Addr: addr, MaxConns: workers, ReadTimeout: requestTimeout, WriteTimeout: requestTimeout,
		MaxIdleConnDuration: time.Minute, NoDefaultUserAgentHeader: true,
		// A bench must see every failure as it is, not retried.
		RetryIfErr: func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
	}}
}

// opSeq numbers every op of the process, so idempotency keys never repeat.
var opSeq atomic.Uint64

// job is one intended send.
type job struct {
	at  time.Time
	seq uint64
}

// maxDrain bounds how long a run waits for its queue after the last send is
// due; jobs still waiting then count as "late" errors.
const maxDrain = 5 * time.Second

// Run sends op at a fixed rate for dur, open loop: the schedule never waits
// for answers, and each latency is measured from the op's intended send
// time, so a stalled server shows as latency instead of fewer samples
// (coordinated omission). Workers bound the requests in flight; ops due while
// all are busy queue with their original intended time.
func (g *Generator) Run(ctx context.Context, rate float64, dur time.Duration, op opFunc) RunResult {
	n := int64(rate * dur.Seconds())
	if n < 1 {
		n = 1
	}
	jobs := make(chan job, 1<<16)
	type partial struct {
		h      Histogram
		ok     int64
		errs   map[string]int64
		extra  int64
		last   time.Time
		issued int64
	}
	parts := make([]*partial, g.Workers)
	start := time.Now().Add(5 * time.Millisecond)
	hardStop := start.Add(dur + maxDrain)
	var wg sync.WaitGroup
	for i := range parts {
		p := &partial{errs: map[string]int64{}}
		parts[i] = p
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := &worker{hc: g.hc, req: fasthttp.AcquireRequest(), resp: fasthttp.AcquireResponse()}
			defer fasthttp.ReleaseRequest(w.req)
			defer fasthttp.ReleaseResponse(w.resp)
			for j := range jobs {
				if time.Now().After(hardStop) || ctx.Err() != nil {
					p.errs["late"]++
					continue
				}
				p.issued++
				w.extra = 0
				status, err := op(w, j.seq)
				now := time.Now()
				p.h.Record(now.Sub(j.at))
				p.last = now
				switch {
				case err != nil:
					p.errs[errKind(err)]++
				case status >= 200 && status < 300:
					p.ok++
					p.extra += w.extra
				default:
					p.errs[strconv.Itoa(status)]++
				}
			}
		}()
	}
	interval := float64(time.Second) / rate
	var i int64
	for i < n && ctx.Err() == nil {
		now := time.Now()
		due := int64(float64(now.Sub(start))/interval) + 1
		if due > n {
			due = n
		}
		for ; i < due; i++ {
			jobs <- job{at: start.Add(time.Duration(float64(i) * interval)), seq: opSeq.Add(1)}
		}
		if i < n {
			next := start.Add(time.Duration(float64(i) * interval))
			if d := time.Until(next); d > 0 {
				time.Sleep(min(d, time.Millisecond))
			}
		}
	}
	close(jobs)
	wg.Wait()

	var h Histogram
	res := RunResult{Offered: rate, Errors: map[string]int64{}, hist: &h}
	last := start.Add(dur)
	for _, p := range parts {
		h.Merge(&p.h)
		res.OK += p.ok
		res.Extra += p.extra
		res.Sent += p.issued
		for k, v := range p.errs {
			res.Errors[k] += v
		}
		if p.last.After(last) {
			last = p.last
		}
	}
	res.Seconds = last.Sub(start).Seconds()
	res.Achieved = float64(res.OK) / res.Seconds
	var nerr int64
	for _, v := range res.Errors {
		nerr += v
	}
	if total := res.OK + nerr; total > 0 {
		res.ErrorRate = float64(nerr) / float64(total)
	}
	if len(res.Errors) == 0 {
		res.Errors = nil
	}
	res.Latency = summarize(&h)
	return res
}

func errKind(err error) string {
	switch {
	case errors.Is(err, fasthttp.ErrTimeout):
		return "timeout"
	case errors.Is(err, fasthttp.ErrNoFreeConns):
		return "noconn"
	default:
		return "net"
	}
}

// Step is one rate of a ramp.
type Step struct {
	RunResult
	Blown bool `json:"blown"`
}

// RampConfig says how a ramp climbs.
type RampConfig struct {
	Start    float64
	Factor   float64
	Max      float64
	StepDur  time.Duration
	MaxP99   time.Duration
	MaxError float64
	Pause    time.Duration
}

// Ramp raises the rate step by step until the server cannot keep up (p99
// over the bound, errors over the bound, or achieved rate under 90 % of
// offered) and returns the steps and the highest achieved rate. A short
// warm-up opens the connections first, and a step that fails is tried once
// more before the ramp stops, so one burst of noise from a shared machine
// does not end it.
func (g *Generator) Ramp(ctx context.Context, rc RampConfig, op opFunc, logf func(string, ...any)) ([]Step, float64) {
	_ = g.Run(ctx, rc.Start/2, time.Second, op)
	time.Sleep(rc.Pause)
	var steps []Step
	best := 0.0
	retried := false
	for rate := rc.Start; rate <= rc.Max && ctx.Err() == nil; {
		r := g.Run(ctx, rate, rc.StepDur, op)
		blown := r.Latency.P99 > ms(rc.MaxP99) || r.ErrorRate > rc.MaxError || r.Achieved < 0.9*rate
		steps = append(steps, Step{RunResult: r, Blown: blown})
		note := ""
		switch {
		case blown && !retried:
			note = "  <- over the limit; once more"
		case blown:
			note = "  <- limit"
		}
		logf("  ramp %7.0f/s: achieved %7.0f/s p50 %.2fms p99 %.2fms errors %s%s", rate, r.Achieved,
			r.Latency.P50, r.Latency.P99, r.ErrorSummary(), note)
		if r.Achieved > best && r.ErrorRate <= rc.MaxError {
			best = r.Achieved
		}
		time.Sleep(rc.Pause)
		if blown {
			if retried {
				break
			}
			retried = true
			time.Sleep(rc.Pause)
			continue
		}
		retried = false
		rate *= rc.Factor
	}
	return steps, best
}
