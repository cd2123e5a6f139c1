package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// RunResult is one chaos run: what happened and what the checks found.
type RunResult struct {
	Stamp     string       `json:"stamp"`
	Started   time.Time    `json:"started"`
	Finished  time.Time    `json:"finished"`
	Setting   string       `json:"setting"`
	Options   Options      `json:"options"`
	Timeline  []Event      `json:"timeline"`
	Failovers []Failover   `json:"failovers"`
	NodeKills []NodeKill   `json:"node_kills"`
	Counts    Counts       `json:"counts"`
	Flood     *FloodResult `json:"rate_limit_flood,omitempty"`
	// WriteRefusal and PostgresOutage are issue 25's faults.
	WriteRefusal   *WriteRefusal   `json:"redis_write_refusal,omitempty"`
	PostgresOutage *PostgresOutage `json:"postgres_outage,omitempty"`
	// RecordSlots says whether the harness's copies of creditd's key
	// names matched Redis (verifySlots).
	RecordSlots string `json:"idempotency_record_slots"`
	// ChecksSkipped are check ticks skipped with maxChecksInFlight checks
	// still waiting for answers.
	ChecksSkipped int      `json:"checks_skipped"`
	Drain         Drain    `json:"drain"`
	Checks        []Check  `json:"checks"`
	Problems      []string `json:"problems,omitempty"`
	// RetriedOps are the operations that needed more than one attempt,
	// with their final answers: where a failover's effects show first.
	RetriedOps []*Op  `json:"retried_operations,omitempty"`
	Error      string `json:"error,omitempty"`
	Kept       string `json:"kept,omitempty"`
}

// NodeKill is one creditd node kill and its restart.
type NodeKill struct {
	Node      int       `json:"node"`
	Pid       int       `json:"pid"`
	Killed    time.Time `json:"killed"`
	Restarted time.Time `json:"ready_again"`
	Ready     bool      `json:"ready"`
}

// Check is one verdict of the run; a check that does not gate is reported
// only.
type Check struct {
	Name   string `json:"name"`
	Pass   bool   `json:"pass"`
	Gating bool   `json:"gating"`
	Detail string `json:"detail"`
}

// Pass: the run finished and every gating check passed.
func (r *RunResult) Pass() bool {
	if r.Error != "" || len(r.Checks) == 0 {
		return false
	}
	for _, c := range r.Checks {
		if c.Gating && !c.Pass {
			return false
		}
	}
	return true
}

// Verdict is PASS or FAIL.
func (r *RunResult) Verdict() string {
	if r.Pass() {
		return "PASS"
	}
	return "FAIL"
}

func (r *RunResult) check(name string, pass, gating bool, format string, args ...any) {
	r.Checks = append(r.Checks, Check{Name: name, Pass: pass, Gating: gating, Detail: fmt.Sprintf(format, args...)})
}

// runOnce is one run on a fresh fleet; its fleet is stopped on the way out
// (and its data kept when the run fails).
func runOnce(ctx context.Context, o Options) *RunResult {
	start := time.Now()
	stamp := start.UTC().Format("20060102T150405Z")
	r := &RunResult{Stamp: stamp, Started: start.UTC(), Options: o}
	r.Options.Root = ""
	tl := &Timeline{start: start}
	defer func() {
		r.Finished = time.Now().UTC()
		r.Timeline = tl.Events
	}()
	tl.add("starting the fleet (scripts/fleet.sh start, own CREDITD_DATA_DIR and FLEET_PORT)")
	f, err := startFleet(ctx, o.Root, strings.ToLower(stamp))
	if f != nil {
		defer f.stopFor(r, o.Keep)
	}
	if err != nil {
		r.Error = "fleet: " + err.Error()
		return r
	}
	tl.add("fleet up: HAProxy %s, nodes %s, redis %s", f.URL, strings.Join(f.Nodes, " "), strings.Join(f.Seeds, ","))
	r.Setting = fmt.Sprintf("scripts/fleet.sh: 3 creditd nodes behind HAProxy (round robin over /readyz), Redis Cluster 3 masters + 3 replicas "+
		"(AOF everysec, cluster-node-timeout 5000 ms), CREDITD_REPLICA_ACKS at its default; %d workers offering %.0f money operations/s "+
		"(25 %% grants, 25 %% adjusts, 50 %% consumes) over %d customers; %s", o.Workers, o.Rate, o.Customers, machine())
	r.Setting += fmt.Sprintf("; %.0f checks/s (GET /v1/entitlements/check) beside the money load; Postgres is the run's own private server", o.CheckRate)
	if o.WriteRefusal > 0 {
		r.Setting += fmt.Sprintf("; after the failovers one Redis master refuses writes for %s", o.WriteRefusal)
	}
	if o.PostgresOutage > 0 {
		r.Setting += fmt.Sprintf("; then Postgres is down for %s", o.PostgresOutage)
	}
	if o.ReplicaStall > 0 {
		r.Setting += fmt.Sprintf("; the last failover's replica stopped and cut off %s before its master's kill (-replica-stall %s)", o.ReplicaStall, o.ReplicaStall)
	}
	lr, err := startLoad(ctx, o, f, stamp, tl, r)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	if err := chaos(ctx, o, f, lr.api, lr.rlKey, lr.slotOf, tl, r); err != nil {
		r.Error = "chaos: " + err.Error()
		tl.add("chaos stopped: %v", err)
	}
	sleepCtx(ctx, o.Settle)
	lr.stopLoad(ctx, f, tl, r)
	verify(ctx, r, f, lr)
	tl.add("checks done: %s", r.Verdict())
	return r
}

// loadRun is a fleet under money load and checks: what a chaos run and an
// upgrade run (upgrade.go) share, so that both judge the books alike.
type loadRun struct {
	api    *API
	tenant string // the load's tenant id
	key    string // its sandbox key
	rlKey  string // the rate-limited tenant's key (the chaos flood's)
	l      *Load
	rec    *Samples
	// customers are the load's external ids; slotOf their slots, and
	// recordSlot an idempotency key's record slot (nil: not verified).
	customers  []string
	slotOf     map[string]int
	recordSlot func(string) int
	stop       chan struct{}
	loadDone   chan struct{}
	checksDone chan struct{}
}

// startLoad makes the load's tenants and metering rule, seeds the
// customers, checks the harness's slot mapping against Redis and starts
// the money load and the checks.
func startLoad(ctx context.Context, o Options, f *Fleet, stamp string, tl *Timeline, r *RunResult) (*loadRun, error) {
	api := newAPI(f.URL)
	// Tenants: one for the load (limit raised out of the way), one for the
	// rate-limit flood.
	loadTenant, loadKey, err := createTenant(ctx, api, f.Token, "chaos-load", 1_000_000, 10_000_000)
	if err != nil {
		return nil, err
	}
	_, rlKey, err := createTenant(ctx, api, f.Token, "chaos-rate-limit", o.RateLimit, o.Burst)
	if err != nil {
		return nil, err
	}
	if a := api.call(ctx, "POST", "/v1/metering-rules", map[string]any{"billable_metric_key": metric, "cost_type": "per_unit", "unit_cost": unitCost},
		"X-API-Key", loadKey, "Idempotency-Key", "chaos-rule-"+stamp); a.Status != 201 {
		return nil, fmt.Errorf("metering rule: %d %v %s", a.Status, a.Err, trunc(a.Body))
	}
	// The tenants' limits reach every node within the auth cache's 2 s.
	time.Sleep(3 * time.Second)

	rec := &Samples{}
	l := newLoad(api, loadKey, "chaos-"+strings.ToLower(stamp), rec)
	l.reservePct = o.Reserve
	customers := make([]string, o.Customers)
	for i := range customers {
		customers[i] = fmt.Sprintf("chaos-%s-c%03d", strings.ToLower(stamp), i)
		path, body := "/v1/customers/"+customers[i]+"/credits/grant", map[string]any{"credits": 1_000_000, "source": "promotional", "reason": "chaos seed",
			// Spent last (lower is spent first): the load's grants and positive
			// adjusts are drained before it, so a customer's live blocks stay
			// far below the cap of 100 however long the grants keep landing
			// (they now land during a Postgres outage too).
			"priority": 255}
		if op := l.do(ctx, "grant", customers[i], l.prefix+"-seed-"+strconv.Itoa(i), path, body, time.Minute); op.Status != 201 {
			return nil, fmt.Errorf("seed %s: %d %s", customers[i], op.Status, op.Body)
		}
	}
	tl.add("seeded %d customers with 1,000,000 credits each; tenant %s", o.Customers, loadTenant)
	// Each customer's slot, from the id its seed grant named.
	slotOf := map[string]int{}
	ids := map[string]uuid.UUID{}
	var seedKeys []string
	for _, op := range l.ops {
		id, err := uuid.Parse(op.CustomerID)
		if err != nil {
			return nil, fmt.Errorf("seed %s: customer id %q: %v", op.Customer, op.CustomerID, err)
		}
		slotOf[op.Customer], ids[op.Customer] = customerSlot(id), id
		seedKeys = append(seedKeys, op.Key)
	}
	tenantID, err := uuid.Parse(loadTenant)
	if err != nil {
		return nil, fmt.Errorf("tenant id %q: %v", loadTenant, err)
	}
	customersOK, recordSlot := verifySlots(ctx, f, tenantID, ids, seedKeys)
	switch {
	case !customersOK && o.Upgrade:
		// The slots serve only the failovers' per-shard figures, which an
		// upgrade has none of; and the fleet runs the old release, whose
		// key layout the harness of the new one need not know.
		recordSlot = nil
		r.RecordSlots = "not verified: the old release's account keys are not where this harness computes them (no per-shard figures are needed in an upgrade)"
	case !customersOK:
		return nil, fmt.Errorf("a seeded customer's account hash is not under its partition's hash tag in Redis: the harness's slot mapping (customerSlot) no longer matches creditd's keys")
	case recordSlot != nil:
		r.RecordSlots = "verified: every seeded customer's account hash and the first seed grants' idempotency records are where the harness computes them"
	default:
		r.RecordSlots = "customers verified, records NOT: a seed grant's idempotency record is not where the harness computes it; money availability per shard counts customers' slots only"
	}
	tl.add("slot mapping: %s", r.RecordSlots)

	lr := &loadRun{api: api, tenant: loadTenant, key: loadKey, rlKey: rlKey, l: l, rec: rec, customers: customers, slotOf: slotOf, recordSlot: recordSlot,
		stop: make(chan struct{}), loadDone: make(chan struct{}), checksDone: make(chan struct{})}
	go func() {
		l.run(ctx, lr.stop, o.Workers, o.Rate, customers)
		close(lr.loadDone)
	}()
	if o.CheckRate > 0 {
		go func() {
			r.ChecksSkipped = checks(ctx, api, loadKey, o.CheckRate, customers, rec, lr.stop)
			close(lr.checksDone)
		}()
	} else {
		close(lr.checksDone)
	}
	tl.add("money load started: %d workers, %.0f ops/s offered (%s); checks: %.0f/s", o.Workers, o.Rate, l.mix(), o.CheckRate)
	return lr, nil
}

// stopLoad stops the load (each worker finishes the operation it holds),
// waits for the persisters to drain and analyses the answers.
func (lr *loadRun) stopLoad(ctx context.Context, f *Fleet, tl *Timeline, r *RunResult) {
	close(lr.stop)
	tl.add("load stopping: workers finish the operations they hold")
	<-lr.loadDone
	<-lr.checksDone
	r.Counts = lr.l.counts
	for _, op := range lr.l.ops {
		if op.Attempts > 1 {
			r.RetriedOps = append(r.RetriedOps, op)
		}
	}
	tl.add("load stopped: %d operations, %d acknowledged", r.Counts.Sent, r.Counts.Acknowledged)

	r.Drain = drain(ctx, f, 3*time.Minute)
	tl.add("drain: %s", r.Drain.Detail)
	analyse(r, lr.rec.all(), lr.slotOf, lr.recordSlot)
}

// chaos is the run's fault schedule: o.Failovers cycles, each killing -9
// one creditd node and one Redis master and starting both again; the
// second cycle floods the rate-limited key while its node is down and
// coming back.
//
// Then, issue 25, one at a time with o.Settle of load between: one Redis
// master refuses writes for o.WriteRefusal, and Postgres is down for
// o.PostgresOutage (either 0: left out).
func chaos(ctx context.Context, o Options, f *Fleet, api *API, rlKey string, slotOf map[string]int, tl *Timeline, r *RunResult) error {
	floodCycle := min(1, o.Failovers-1)
	for c := 0; c < o.Failovers; c++ {
		if !sleepCtx(ctx, o.Settle) {
			return ctx.Err()
		}
		n := c%3 + 1
		nk := NodeKill{Node: n}
		pid, err := f.killNode(n)
		nk.Pid, nk.Killed = pid, time.Now()
		if err != nil {
			return err
		}
		tl.add("kill -9 creditd node %d (pid %d)", n, pid)
		restart := func() error {
			if d := o.NodeDown - time.Since(nk.Killed); d > 0 {
				sleepCtx(ctx, d)
			}
			tl.add("starting creditd node %d again (scripts/fleet.sh start-node %d)", n, n)
			err := f.startNode(ctx, n)
			nk.Restarted, nk.Ready = time.Now(), err == nil
			r.NodeKills = append(r.NodeKills, nk)
			if err != nil {
				return err
			}
			tl.add("creditd node %d ready again (%.1f s after the kill)", n, nk.Restarted.Sub(nk.Killed).Seconds())
			return nil
		}
		if c == floodCycle {
			done := make(chan FloodResult, 1)
			tl.add("rate-limit flood starts: key limited to %d/s (burst %d), 8 clients at 4x that together through HAProxy for %s", o.RateLimit, o.Burst, o.Flood)
			go func() { done <- flood(ctx, api, rlKey, o.RateLimit, o.Burst, o.Flood) }()
			if err := restart(); err != nil {
				return err
			}
			fr := <-done
			r.Flood = &fr
			tl.add("rate-limit flood done: %d 2xx (want %.0f +-10 %%), %d 429, %d other", fr.OK, fr.Want, fr.Limited, fr.Other)
		} else if !sleepCtx(ctx, time.Second) {
			return ctx.Err()
		}
		var stall time.Duration
		if c == o.Failovers-1 {
			stall = o.ReplicaStall
		}
		// The node killed this cycle is still down during the failover,
		// except in the flood cycle, which started it again already.
		down := n
		if c == floodCycle {
			down = 0
		}
		poll := pollReady(ctx, f, down)
		fo, err := f.failMaster(ctx, c, stall, tl)
		fo.Readiness = poll.stop()
		r.Failovers = append(r.Failovers, fo)
		if err != nil {
			return err
		}
		if c != floodCycle {
			if err := restart(); err != nil {
				return err
			}
		}
	}
	if o.WriteRefusal > 0 {
		if !sleepCtx(ctx, o.Settle) {
			return ctx.Err()
		}
		wr, err := refuseWrites(ctx, f, slotOf, o.WriteRefusal, tl)
		r.WriteRefusal = wr
		if err != nil {
			return err
		}
	}
	if o.PostgresOutage > 0 {
		if !sleepCtx(ctx, o.Settle) {
			return ctx.Err()
		}
		po, err := postgresOutage(ctx, f, o.PostgresOutage, tl)
		r.PostgresOutage = po
		if err != nil {
			return err
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// createTenant makes a tenant through the admin API and sets its rate
// limit; it returns the tenant id and its sandbox key.
func createTenant(ctx context.Context, api *API, token, name string, perSecond, burst int) (string, string, error) {
	auth := []string{"Authorization", "Bearer " + token}
	a := api.call(ctx, "POST", "/admin/v1/tenants", map[string]any{"name": name}, auth...)
	if a.Status != 201 {
		return "", "", fmt.Errorf("create tenant %s: %d %v %s", name, a.Status, a.Err, trunc(a.Body))
	}
	var t struct {
		Tenant struct {
			ID string `json:"id"`
		} `json:"tenant"`
		APIKeys struct {
			Sandbox string `json:"sandbox"`
		} `json:"api_keys"`
	}
	if err := json.Unmarshal(a.Body, &t); err != nil {
		return "", "", err
	}
	a = api.call(ctx, "PATCH", "/admin/v1/tenants/"+t.Tenant.ID, map[string]any{"rate_limit_per_second": perSecond, "rate_limit_burst": burst}, auth...)
	if a.Status != 200 {
		return "", "", fmt.Errorf("rate limit of %s: %d %v %s", name, a.Status, a.Err, trunc(a.Body))
	}
	return t.Tenant.ID, t.APIKeys.Sandbox, nil
}

// Drain is the wait for the persister after the load.
type Drain struct {
	OK          bool    `json:"ok"`
	Seconds     float64 `json:"seconds"`
	Backlog     float64 `json:"backlog"`
	DeadLetters float64 `json:"dead_letters_unresolved"`
	Detail      string  `json:"detail"`
}

// drain waits until every node reports an empty outbox backlog and no
// unresolved dead letter, twice in a row a second apart.
func drain(ctx context.Context, f *Fleet, limit time.Duration) Drain {
	start := time.Now()
	var d Drain
	calm := 0
	for time.Since(start) < limit && ctx.Err() == nil {
		ok := true
		d.Backlog, d.DeadLetters = 0, 0
		for _, n := range f.Nodes {
			m, err := metrics("http://" + n + "/metrics")
			b, ok1 := m["creditd_persister_backlog"]
			dl := m["creditd_dead_letters_unresolved"]
			if err != nil || !ok1 {
				ok = false
				continue
			}
			d.Backlog += b
			d.DeadLetters += dl
			if b != 0 || dl != 0 {
				ok = false
			}
		}
		if ok {
			calm++
			if calm >= 2 {
				d.OK = true
				break
			}
		} else {
			calm = 0
		}
		time.Sleep(time.Second)
	}
	d.Seconds = time.Since(start).Seconds()
	if d.OK {
		d.Detail = fmt.Sprintf("outbox backlog 0 and 0 dead letters on all 3 nodes after %.1f s", d.Seconds)
	} else {
		d.Detail = fmt.Sprintf("NOT drained after %.0f s: backlog %.0f, dead letters %.0f (summed over the nodes)", d.Seconds, d.Backlog, d.DeadLetters)
	}
	return d
}

// metrics reads a Prometheus text page's unlabelled samples.
func metrics(url string) (map[string]float64, error) {
	hc := &http.Client{Timeout: 5 * time.Second}
	res, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := res.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	out := map[string]float64{}
	for _, line := range strings.Split(b.String(), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 || strings.ContainsRune(fields[0], '{') {
			continue
		}
		if v, err := strconv.ParseFloat(fields[1], 64); err == nil {
			out[fields[0]] = v
		}
	}
	return out, nil
}

// machine is a line about the machine.
func machine() string {
	cpus := 0
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		cpus = strings.Count(string(b), "processor\t:")
	}
	load := ""
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return fmt.Sprintf("%d CPUs shared with other work (load average %s at the start)", cpus, load)
}
