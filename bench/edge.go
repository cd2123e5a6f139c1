package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creditd/creditd/client"
	"github.com/creditd/creditd/client/edge"
)

// The edge scenario's bounds (issue 27's goal table; invariant 11: every
// bound named).
const (
	// edgeTimedChecks are the checks timed one by one for the p99.
	edgeTimedChecks = 1_000_000
	// edgeRateDuration is how long each throughput run lasts.
	edgeRateDuration = 2 * time.Second
	// edgeChanges are the changes made over HTTP whose propagation is
	// timed, half grants, half override updates.
	edgeChanges = 100
	// edgeChangeTimeout ends the wait for one change to be seen; a change
	// not seen by then counts as missed.
	edgeChangeTimeout = 5 * time.Second
	// edgeGapMax bounds the random pause between one change seen and the
	// next made, so changes do not fall in step with creditd's 200 ms
	// change-feed poll (engine.Events) and measure one phase of it only.
	edgeGapMax = 250 * time.Millisecond
	// edgeWatchEvery is how often the watcher process polls its evaluator:
	// the propagation figures are late by up to this much.
	edgeWatchEvery = time.Millisecond
	// edgeMaxAge is the evaluators' MaxAge: the default, so the answers
	// timed are the ones an integrator gets.
	edgeMaxAge = edge.DefaultMaxAge
)

// Issue 27's goals the scenario measures.
const (
	edgeCheckP99Goal       = 5 * time.Microsecond
	edgeChecksPerCoreGoal  = 1_000_000
	edgePropagationP99Goal = 250 * time.Millisecond
)

// EdgeResult is the edge scenario (issue 27): checks answered in-process by
// client/edge, and how soon changes made over HTTP reach an evaluator in
// another process.
type EdgeResult struct {
	// Metric is what the timed checks asked: a metered metric priced per
	// unit (the most work a check from memory does).
	Metric string `json:"metric"`
	// Checks are the timed checks; NotMemory those of them not answered
	// from memory (the run is void unless 0).
	Checks    int     `json:"checks_timed"`
	NotMemory int     `json:"checks_not_from_memory"`
	P50NS     int64   `json:"p50_ns"`
	P99NS     int64   `json:"p99_ns"`
	P999NS    int64   `json:"p999_ns"`
	MaxNS     int64   `json:"max_ns"`
	BoolP99NS int64   `json:"boolean_p99_ns"`
	TimerNS   float64 `json:"timer_overhead_ns"`
	// One goroutine checking for edgeRateDuration: checks per second of
	// wall time and per second of the process's CPU.
	OneWallPerSecond    float64 `json:"one_goroutine_checks_per_second"`
	OneCPUPerSecond     float64 `json:"one_goroutine_checks_per_cpu_second"`
	Goroutines          int     `json:"parallel_goroutines"`
	ParallelPerSecond   float64 `json:"parallel_checks_per_second"`
	ParallelCPUPerCheck float64 `json:"parallel_cpu_ns_per_check"`
	// Propagation of changes made over HTTP to the watcher process.
	Propagation []EdgePropagation `json:"propagation"`
	All         EdgePropagation   `json:"propagation_all"`
	// Escrow is local consumes against an allowance (issue 27 item 2).
	Escrow *EscrowBench `json:"escrow,omitempty"`
	Error  string       `json:"error,omitempty"`
}

// EdgePropagation is the time from a change's HTTP request sent to the
// watcher process's evaluator answering with it.
type EdgePropagation struct {
	Kind   string  `json:"kind"`
	N      int     `json:"changes"`
	Missed int     `json:"missed"`
	P50MS  float64 `json:"p50_ms"`
	P99MS  float64 `json:"p99_ms"`
	MaxMS  float64 `json:"max_ms"`
	HTTPMS float64 `json:"http_p50_ms"` // the change's own request
	// Stream*MS are from the request sent to the watcher's evaluator
	// moving its change-stream cursor (the change's message arrived): the
	// rest of the propagation is the evaluator fetching the snapshot again.
	StreamP50MS float64 `json:"stream_p50_ms"`
	StreamP99MS float64 `json:"stream_p99_ms"`
	ms          []float64
	httpMS      []float64
	streamMS    []float64
}

func (p *EdgePropagation) finish() {
	p.N = len(p.ms) + p.Missed
	p.P50MS, p.P99MS, p.MaxMS = quantile(p.ms, 0.5), quantile(p.ms, 0.99), quantile(p.ms, 1)
	p.HTTPMS = quantile(p.httpMS, 0.5)
	p.StreamP50MS, p.StreamP99MS = quantile(p.streamMS, 0.5), quantile(p.streamMS, 0.99)
}

// quantile is the nearest-rank q-quantile of xs (sorted in place); 0 for
// none.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(q*float64(len(xs))+0.999999) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// edgeSetup is what the scenario creates in creditd: a customer with
// credits, a metered metric, and a boolean one under an override.
type edgeSetup struct {
	c            *client.Client
	base, key    string
	customer     string
	metered      string
	flag         string
	subscription string
}

// edge runs the edge scenario.
func (b *Bench) edge(ctx context.Context) {
	r := &EdgeResult{Metric: "edge_api"}
	b.res.Edge = r
	logf("edge: local checks and propagation (issue 27)")
	s, err := b.edgeSetup(ctx)
	if err != nil {
		r.Error = "setup: " + err.Error()
		logf("edge: %s", r.Error)
		return
	}
	if err := edgeLocal(ctx, s, r); err != nil {
		r.Error = "local checks: " + err.Error()
		logf("edge: %s", r.Error)
		return
	}
	logf("edge: check p99 %d ns (p50 %d, max %d) over %d; one goroutine %.0f checks/s per CPU-second; %d goroutines %.0f/s",
		r.P99NS, r.P50NS, r.MaxNS, r.Checks, r.OneCPUPerSecond, r.Goroutines, r.ParallelPerSecond)
	if err := b.edgePropagation(ctx, s, r); err != nil {
		r.Error = "propagation: " + err.Error()
		logf("edge: %s", r.Error)
	}
	logf("edge: propagation p99 %.1f ms (p50 %.1f, max %.1f) over %d changes, %d missed", r.All.P99MS, r.All.P50MS, r.All.MaxMS, r.All.N, r.All.Missed)
	if ctx.Err() == nil {
		b.edgeEscrow(ctx, s, r)
	}
}

func (b *Bench) edgeSetup(ctx context.Context) (*edgeSetup, error) {
	api, err := newTenant(b.addr, b.runID+"-edge")
	if err != nil {
		return nil, err
	}
	c := client.New(api.Base, api.Key)
	s := &edgeSetup{c: c, base: api.Base, key: api.Key, metered: "edge_api", flag: "edge_sso"}
	if _, err := c.CreateMeteringRule(ctx, client.RuleInput{BillableMetricKey: s.metered, CostType: "per_unit", UnitCost: client.Ptr(int64(1))}); err != nil {
		return nil, fmt.Errorf("metering rule: %w", err)
	}
	if _, err := c.CreateBillableMetric(ctx, client.MetricInput{Key: &s.flag, Type: client.Ptr("boolean"),
		DefaultValue: client.Value(map[string]any{"enabled": false})}); err != nil {
		return nil, fmt.Errorf("boolean metric: %w", err)
	}
	plan, err := c.CreatePlan(ctx, client.CreatePlanInput{Name: "edge"})
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	variant, err := c.CreatePlanVariant(ctx, plan.ID, client.CreatePlanVariantInput{BillingCycle: "monthly"})
	if err != nil {
		return nil, fmt.Errorf("variant: %w", err)
	}
	cust, err := c.CreateCustomer(ctx, client.CreateCustomerInput{ExternalID: "edge-0"})
	if err != nil {
		return nil, fmt.Errorf("customer: %w", err)
	}
	s.customer = cust.ID
	sub, err := c.CreateSubscription(ctx, client.CreateSubscriptionInput{CustomerID: cust.ID, PlanVariantID: variant.ID})
	if err != nil {
		return nil, fmt.Errorf("subscription: %w", err)
	}
	s.subscription = sub.ID
	if _, err := c.CreateOverride(ctx, sub.ID, client.CreateOverrideInput{BillableMetricKey: s.flag,
		Value: map[string]any{"enabled": false}, Reason: client.Ptr("edge bench")}); err != nil {
		return nil, fmt.Errorf("override: %w", err)
	}
	if _, err := c.GrantCredits(ctx, cust.ID, client.GrantInput{Credits: grantCredits, Source: "promotional", Reason: "edge bench"}); err != nil {
		return nil, fmt.Errorf("grant: %w", err)
	}
	return s, nil
}

// startEvaluator starts an evaluator over s's tenant and waits for its
// stream and a first answer from memory.
func startEvaluator(ctx context.Context, base, key, customer, metric string) (*edge.Evaluator, error) {
	e := edge.New(client.New(base, key), edge.Config{MaxAge: edgeMaxAge})
	e.Start(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if e.StreamUp() {
			if a, err := e.Check(ctx, customer, metric, 1); err == nil && a.Source == edge.SourceMemory {
				return e, nil
			}
		}
		if time.Now().After(deadline) {
			e.Close()
			return nil, fmt.Errorf("no answer from memory within 10 s (stream up %v)", e.StreamUp())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// edgeLocal times checks answered from memory in this process.
func edgeLocal(ctx context.Context, s *edgeSetup, r *EdgeResult) error {
	e, err := startEvaluator(ctx, s.base, s.key, s.customer, s.metered)
	if err != nil {
		return err
	}
	defer e.Close()
	if _, err := e.Check(ctx, s.customer, s.flag, 1); err != nil {
		return err
	}
	// What two clock reads cost is in every timed check: reported, not
	// subtracted.
	const timerReads = 100_000
	t0 := time.Now()
	for range timerReads {
		_ = time.Since(t0)
	}
	r.TimerNS = float64(time.Since(t0).Nanoseconds()) / timerReads

	timed := func(metric string, n int) ([]int64, error) {
		ns := make([]int64, n)
		for i := range ns {
			t := time.Now()
			a, err := e.Check(ctx, s.customer, metric, 3)
			ns[i] = time.Since(t).Nanoseconds()
			if err != nil {
				return nil, err
			}
			if a.Source != edge.SourceMemory {
				r.NotMemory++
			}
		}
		slices.Sort(ns)
		return ns, nil
	}
	ns, err := timed(s.metered, edgeTimedChecks)
	if err != nil {
		return err
	}
	at := func(q float64) int64 { return ns[min(int(q*float64(len(ns))), len(ns)-1)] }
	r.Checks, r.P50NS, r.P99NS, r.P999NS, r.MaxNS = len(ns), at(0.5), at(0.99), at(0.999), ns[len(ns)-1]
	bools, err := timed(s.flag, edgeTimedChecks/10)
	if err != nil {
		return err
	}
	r.BoolP99NS = bools[min(int(0.99*float64(len(bools))), len(bools)-1)]

	// rate checks from g goroutines for edgeRateDuration: checks, wall
	// seconds and the process's CPU seconds (the evaluator's stream and
	// the runtime included: they are the cost of checking in-process).
	rate := func(g int) (int64, float64, float64) {
		var n atomic.Int64
		var stop atomic.Bool
		var wg sync.WaitGroup
		cpu0, wall0 := processCPU(), time.Now()
		for range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var k int64
				for !stop.Load() {
					for range 1000 {
						_, _ = e.Check(ctx, s.customer, s.metered, 3)
					}
					k += 1000
				}
				n.Add(k)
			}()
		}
		time.Sleep(edgeRateDuration)
		stop.Store(true)
		wg.Wait()
		return n.Load(), time.Since(wall0).Seconds(), (processCPU() - cpu0).Seconds()
	}
	n, wall, cpu := rate(1)
	r.OneWallPerSecond, r.OneCPUPerSecond = float64(n)/wall, float64(n)/cpu
	r.Goroutines = runtime.GOMAXPROCS(0)
	n, wall, cpu = rate(r.Goroutines)
	r.ParallelPerSecond, r.ParallelCPUPerCheck = float64(n)/wall, cpu*1e9/float64(n)
	return nil
}

// processCPU is this process's CPU time, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// edgePropagation makes changes over HTTP and times when the evaluator of
// a watcher process (this binary with -edge-watcher) answers with each.
func (b *Bench) edgePropagation(ctx context.Context, s *edgeSetup, r *EdgeResult) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(wctx, self, "-edge-watcher")
	cmd.Env = append(os.Environ(), "EDGE_URL="+s.base, "EDGE_KEY="+s.key, "EDGE_CUSTOMER="+s.customer,
		"EDGE_METERED="+s.metered, "EDGE_FLAG="+s.flag)
	cmd.Stderr = os.Stderr
	// A watcher outliving a killed bench would poll creditd for ever.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Wait() }()
	defer cancel()
	seen := make(chan edgeSeen, 64)
	go func() {
		defer close(seen)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if v, ok := parseEdgeSeen(sc.Text()); ok {
				seen <- v
			}
		}
	}()
	// The watcher says "ready" with its first figures.
	var balance int64
	var flag bool
	readyBy := time.After(30 * time.Second)
	for ready := false; !ready; {
		select {
		case v, open := <-seen:
			if !open {
				return fmt.Errorf("the watcher process ended before it was ready")
			}
			switch v.what {
			case "bal":
				balance = v.value
			case "flag":
				flag = v.value == 1
			case "ready":
				ready = true
			}
		case <-readyBy:
			return fmt.Errorf("the watcher process was not ready within 30 s")
		}
	}
	grants, overrides := &EdgePropagation{Kind: "grant"}, &EdgePropagation{Kind: "override"}
	for i := range edgeChanges {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(time.Duration(rand.Int64N(int64(edgeGapMax))))
		var (
			p    *EdgePropagation
			want func(edgeSeen) bool
		)
		sent := time.Now()
		if i%2 == 0 {
			p = grants
			_, err = s.c.GrantCredits(ctx, s.customer, client.GrantInput{Credits: 1, Source: "promotional", Reason: "edge bench"})
			balance++
			target := balance
			want = func(v edgeSeen) bool { return v.what == "bal" && v.value >= target }
		} else {
			p = overrides
			flag = !flag
			_, err = s.c.UpdateOverride(ctx, s.subscription, s.flag, client.UpdateOverrideInput{Value: map[string]any{"enabled": flag}})
			target := flag
			want = func(v edgeSeen) bool { return v.what == "flag" && (v.value == 1) == target }
		}
		if err != nil {
			return fmt.Errorf("change %d (%s): %w", i, p.Kind, err)
		}
		p.httpMS = append(p.httpMS, float64(time.Since(sent).Microseconds())/1000)
		timeout := time.After(edgeChangeTimeout)
		streamed := false
	wait:
		for {
			select {
			case v, open := <-seen:
				if !open {
					return fmt.Errorf("the watcher process ended")
				}
				if v.what == "cur" && !streamed && !v.at.Before(sent) {
					streamed = true
					p.streamMS = append(p.streamMS, float64(v.at.Sub(sent).Microseconds())/1000)
				}
				if want(v) {
					p.ms = append(p.ms, float64(v.at.Sub(sent).Microseconds())/1000)
					break wait
				}
			case <-timeout:
				p.Missed++
				break wait
			}
		}
	}
	all := &EdgePropagation{Kind: "all", Missed: grants.Missed + overrides.Missed,
		ms: append(slices.Clone(grants.ms), overrides.ms...), httpMS: append(slices.Clone(grants.httpMS), overrides.httpMS...),
		streamMS: append(slices.Clone(grants.streamMS), overrides.streamMS...)}
	for _, p := range []*EdgePropagation{grants, overrides, all} {
		p.finish()
	}
	r.Propagation = []EdgePropagation{*grants, *overrides}
	r.All = *all
	return nil
}

// edgeSeen is one line of the watcher: what its evaluator answered and
// when (Unix ns; the two processes share the machine's clock).
type edgeSeen struct {
	what  string // "bal", "flag", "cur" (the stream's cursor moved) or "ready"
	value int64
	at    time.Time
}

func parseEdgeSeen(line string) (edgeSeen, bool) {
	f := strings.Fields(line)
	if len(f) != 3 {
		return edgeSeen{}, false
	}
	v, err1 := strconv.ParseInt(f[1], 10, 64)
	ns, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return edgeSeen{}, false
	}
	return edgeSeen{what: f[0], value: v, at: time.Unix(0, ns)}, true
}

// edgeWatch is the watcher process: an evaluator of its own that polls the
// customer's metered balance and flag every edgeWatchEvery and prints each
// new value with the time it was first answered, until stdin's parent
// ends it.
func edgeWatch() error {
	ctx := context.Background()
	base, key, cust := os.Getenv("EDGE_URL"), os.Getenv("EDGE_KEY"), os.Getenv("EDGE_CUSTOMER")
	metered, flag := os.Getenv("EDGE_METERED"), os.Getenv("EDGE_FLAG")
	e, err := startEvaluator(ctx, base, key, cust, metered)
	if err != nil {
		return err
	}
	defer e.Close()
	w := bufio.NewWriter(os.Stdout)
	lastBal, lastFlag, lastCursor := int64(-1), int64(-1), e.Cursor()
	for ready := false; ; ready = true {
		now := time.Now().UnixNano()
		if c := e.Cursor(); c != lastCursor {
			lastCursor = c
			fmt.Fprintf(w, "cur 0 %d\n", now)
		}
		if a, err := e.Check(ctx, cust, metered, 1); err == nil && a.EffectiveBalance != nil && *a.EffectiveBalance != lastBal {
			lastBal = *a.EffectiveBalance
			fmt.Fprintf(w, "bal %d %d\n", lastBal, now)
		}
		if a, err := e.Check(ctx, cust, flag, 1); err == nil {
			v := int64(0)
			if a.Allowed {
				v = 1
			}
			if v != lastFlag {
				lastFlag = v
				fmt.Fprintf(w, "flag %d %d\n", v, now)
			}
		}
		if !ready {
			fmt.Fprintf(w, "ready 0 %d\n", now)
		}
		if w.Buffered() > 0 {
			if err := w.Flush(); err != nil {
				return nil // the parent is gone
			}
		}
		time.Sleep(edgeWatchEvery)
	}
}

// computeGoals27 fills Goals27: issue 27's goal table.
func (r *Results) computeGoals27() {
	var gs []Goal
	add := func(name, goal, now string, met *bool) {
		gs = append(gs, Goal{Name: name, Goal: goal, Now: now, Met: met})
	}
	e := r.Edge
	const checkName, checkGoal = "local check p99, in-process (metered per unit, from memory)", "<= 5 µs"
	const rateName, rateGoal = "local checks per core", ">= 1M checks/s"
	const propName, propGoal = "propagation: a grant or an override made over HTTP, visible to an evaluator in another process", "p99 <= 250 ms"
	switch {
	case e == nil:
		add(checkName, checkGoal, "not measured (edge scenario not run)", nil)
		add(rateName, rateGoal, "not measured (edge scenario not run)", nil)
		add(propName, propGoal, "not measured (edge scenario not run)", nil)
	case e.Checks == 0:
		add(checkName, checkGoal, "failed: "+e.Error, boolp(false))
		add(rateName, rateGoal, "failed: "+e.Error, boolp(false))
		add(propName, propGoal, "failed: "+e.Error, boolp(false))
	default:
		now := fmt.Sprintf("%.2f µs (p50 %.2f, p99.9 %.2f, max %.0f µs over %d checks, %d not from memory; boolean p99 %.2f µs; clock reads %.0f ns each, included)",
			float64(e.P99NS)/1e3, float64(e.P50NS)/1e3, float64(e.P999NS)/1e3, float64(e.MaxNS)/1e3, e.Checks, e.NotMemory, float64(e.BoolP99NS)/1e3, e.TimerNS)
		add(checkName, checkGoal, now, boolp(time.Duration(e.P99NS) <= edgeCheckP99Goal && e.NotMemory == 0))
		add(rateName, rateGoal, fmt.Sprintf("%.2fM per CPU-second, one goroutine (%.2fM/s wall); %d goroutines: %.2fM/s wall, %.0f ns CPU per check",
			e.OneCPUPerSecond/1e6, e.OneWallPerSecond/1e6, e.Goroutines, e.ParallelPerSecond/1e6, e.ParallelCPUPerCheck),
			boolp(e.OneCPUPerSecond >= edgeChecksPerCoreGoal))
		if a := e.All; a.N > 0 {
			now := fmt.Sprintf("%.1f ms (p50 %.1f, max %.1f) over %d changes, %d missed", a.P99MS, a.P50MS, a.MaxMS, a.N, a.Missed)
			for _, p := range e.Propagation {
				now += fmt.Sprintf("; %s: p99 %.1f ms, p50 %.1f ms (its request %.1f ms; its stream message p50 %.1f, p99 %.1f ms)",
					p.Kind, p.P99MS, p.P50MS, p.HTTPMS, p.StreamP50MS, p.StreamP99MS)
			}
			add(propName, propGoal, now, boolp(a.Missed == 0 && time.Duration(a.P99MS*float64(time.Millisecond)) <= edgePropagationP99Goal))
		} else {
			add(propName, propGoal, "failed: "+e.Error, boolp(false))
		}
	}
	escrowGoals27(e, add)
	r.Goals27 = gs
}

// goals27Markdown renders issue 27's goal table and how it was measured.
func (r *Results) goals27Markdown(w func(string, ...any)) {
	if r.Edge == nil {
		return
	}
	w("## Goals (issue 27: entitlements at the edge)\n\n")
	w("`go run ./bench -scenario edge`. Local checks: an `edge.Evaluator` in the bench process, following creditd's change stream, asked `Check(customer, %s, 3)` "+
		"%d times one after another, each timed with two clock reads; then one goroutine, and GOMAXPROCS goroutines, checking for %s each, counted against the process's CPU time (getrusage: the evaluator's stream and the runtime included). "+
		"Propagation: a second process (this binary with `-edge-watcher`) runs its own evaluator and polls it every %s; the bench makes %d changes over HTTP one at a time, alternately a grant of 1 credit and an override update flipping a boolean entitlement, each after a random pause of up to %s, "+
		"and times each from its request sent to the watcher's first answer with it (the two processes share the machine's clock).\n\n",
		r.Edge.Metric, edgeTimedChecks, edgeRateDuration, edgeWatchEvery, edgeChanges, edgeGapMax)
	escrowMarkdown(w)
	if r.Edge.Error != "" {
		w("**Failed:** %s\n\n", r.Edge.Error)
	}
	if x := r.Edge.Escrow; x != nil && x.Error != "" {
		w("**Local consumes failed:** %s\n\n", x.Error)
	}
	w("| figure | goal | measured | met |\n|---|---|---|---|\n")
	for _, g := range r.Goals27 {
		met := "not measured"
		if g.Met != nil {
			met = map[bool]string{true: "**met**", false: "**missed**"}[*g.Met]
		}
		w("| %s | %s | %s | %s |\n", g.Name, g.Goal, strings.ReplaceAll(g.Now, "|", "\\|"), met)
	}
	w("\n")
}
