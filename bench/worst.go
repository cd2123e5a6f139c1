package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// The "worst allowed input" scenario (issue 9, invariant 13): one customer
// at every per-customer cap (engine.MaxLiveBlocks live blocks and
// engine.MaxActiveReservations active reservations, each with metadata of the largest
// size the API takes) charged under a rule of engine.MaxTiers graduated
// tiers. Every money script the API runs on it is timed by Redis itself
// (SLOWLOG with slowlog-log-slower-than 0, only this run's keys), and the
// slowest single script call must stay within worstBudget.

// worstBudget is the most Redis time one script call may take.
const worstBudget = time.Millisecond

const metricWorst = "worst_tiers"

// WorstResult is the scenario's outcome.
type WorstResult struct {
	Blocks       int          `json:"live_blocks"`
	Reservations int          `json:"active_holds"`
	Tiers        int          `json:"tiers"`
	MetaBytes    int          `json:"metadata_bytes_per_block"`
	Phases       []WorstPhase `json:"phases"`
	MaxUS        int64        `json:"max_script_us"`
	MaxPhase     string       `json:"max_script_phase"`
	Refusals     []string     `json:"cap_refusals"`
	P99US        int64        `json:"max_phase_p99_us"`
	ReadMaxUS    int64        `json:"max_read_us"`
	ReadMaxCmd   string       `json:"max_read_command"`
	// Setting says where the figures were taken: the private redis-server,
	// the pace, and what else ran on the machine.
	Setting    string        `json:"setting"`
	Error      string        `json:"error,omitempty"`
	HashBytes  int64         `json:"account_hash_bytes"`
	Imports    []WorstImport `json:"imports"`
	ScriptRuns int           `json:"script_calls"`
}

// WorstPhase is the Redis time of the script calls of one kind of request.
type WorstPhase struct {
	Name  string `json:"name"`
	Calls int    `json:"script_calls"`
	MaxUS int64  `json:"max_us"`
	P99US int64  `json:"p99_us"`
	P50US int64  `json:"p50_us"`
	// The same over the money scripts alone (those on the account hash;
	// the rest are the HTTP idempotency scripts).
	MoneyCalls int   `json:"money_script_calls"`
	MoneyP50US int64 `json:"money_p50_us"`
	// CmdUSPerCall is INFO commandstats usec per script call (every
	// EVALSHA on the private Redis): time inside the command, as SLOWLOG.
	CmdUSPerCall float64 `json:"commandstats_us_per_script_call"`
	// CPUUSPerCall is the redis-server main thread's CPU time
	// (/proc/<pid>/task/<pid>/schedstat) over the phase divided by its
	// script calls: everything Redis did, scripts or not, per script call.
	CPUUSPerCall float64 `json:"redis_cpu_us_per_script_call"`
	// WaitUS is how long the main thread was runnable but not running
	// (waiting for a core) during the phase.
	WaitUS int64 `json:"redis_runqueue_wait_us"`
	// RequestMaxCPUUS is the most CPU Redis's main thread spent within one
	// request of the phase (every command of it, and whatever else Redis
	// did meanwhile); RequestMaxWaitUS the most it waited for a core.
	RequestMaxCPUUS  int64 `json:"request_max_redis_cpu_us"`
	RequestMaxWaitUS int64 `json:"request_max_redis_wait_us"`
	// MaxCallCPUUS and MaxCallWaitUS are the Redis main thread's CPU and
	// run-queue wait within the request that made the slowest script call
	// (-1: not known): when that CPU is below the call's SLOWLOG time, the
	// call spent the difference without a core.
	MaxCallCPUUS  int64 `json:"slowest_call_request_redis_cpu_us"`
	MaxCallWaitUS int64 `json:"slowest_call_request_redis_wait_us"`
	maxID         int64 // SLOWLOG id of the slowest script call
	// Compiles counts EVAL calls (a script's first call on this Redis;
	// the warm-up should leave none).
	Compiles int `json:"compiles"`
	// TopCmd is the slowest non-script command of the phase.
	TopCmd   string `json:"top_other_command"`
	TopCmdUS int64  `json:"top_other_command_us"`
}

// WorstImport is one import call at a call limit, timed from the client.
type WorstImport struct {
	Customers int     `json:"customers"`
	Blocks    int     `json:"blocks_each"`
	Seconds   float64 `json:"seconds"`
	Created   int     `json:"created"`
	Errors    int     `json:"errors"`
}

// worstMeta is a metadata object whose canonical JSON is exactly n bytes
// (n >= 64; the API caps it at engine.MaxMetadataBytes): member "tag", then
// keys of 8 characters with values of up to the longest string allowed.
func worstMeta(n int, tag string) map[string]any {
	m := map[string]any{"tag": tag}
	size := 10 + len(tag) // {"tag":"<tag>"}
	for i := 0; size < n; i++ {
		// ,"k0000000":"<v>" is 14 bytes besides v; a value of at least one
		// character must fit, else the last one takes what is left.
		v := min(engine.MaxMetadataStringChars, n-size-14)
		if rest := n - size - 14 - v; rest > 0 && rest < 15 {
			v -= 15 - rest
		}
		m[fmt.Sprintf("k%07d", i)] = strings.Repeat(string(rune('a'+i%26)), v)
		size += v + 14
	}
	return m
}

// worst builds the worst allowed customer and times its scripts, on a
// redis-server and a creditd of its own: on the shared Redis other
// branches' scripts and traffic put calls of any script over the budget.
func (b *Bench) worst(ctx context.Context) {
	r := &WorstResult{Tiers: engine.MaxTiers}
	b.res.Worst = r
	err := func() error {
		wb, stop, err := b.worstStack(ctx, r)
		if err != nil {
			return err
		}
		defer stop()
		return wb.worstRun(ctx, r)
	}()
	if err != nil {
		r.Error = err.Error()
		logf("worst: %v", err)
	}
}

// worstStack starts the scenario's own redis-server (every command logged
// by SLOWLOG, nothing saved) and its own creditd on a fresh database, and
// returns a Bench that drives them; stop ends both by PID and drops the
// database.
func (b *Bench) worstStack(ctx context.Context, r *WorstResult) (wb *Bench, stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	pr, err := startPrivateRedis(ctx, filepath.Join(b.tmp, "redis-worst.log"),
		"--slowlog-log-slower-than", "0", "--slowlog-max-len", "100000")
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, pr.Stop)
	rs, rdb, raddr := pr.cmd, pr.rdb, pr.Addr
	version, _ := redisInfo(ctx, rdb, "server", "redis_version")
	nice := ""
	if b.o.WorstRedisRT {
		// SCHED_FIFO priority 1 for the main thread only: it then never
		// waits behind the box's ordinary tasks (the bench's load
		// generator, Postgres, other users), as on a core of its own; its
		// scripts are bounded, and the kernel's RT throttling keeps 5 % of
		// each second for everything else even if one spun.
		out, err := exec.CommandContext(ctx, "chrt", "-f", "-p", "1", strconv.Itoa(rs.Process.Pid)).CombinedOutput()
		if err != nil {
			logf("worst: chrt -f 1 for redis-server failed (%v: %s); falling back to nice %d", err, strings.TrimSpace(string(out)), b.o.WorstRedisNice)
		} else {
			nice = ", main thread at real-time priority SCHED_FIFO 1"
		}
	}
	if nice == "" && b.o.WorstRedisNice != 0 {
		// Only the main thread, the one that runs commands.
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, rs.Process.Pid, b.o.WorstRedisNice); err != nil {
			return nil, nil, fmt.Errorf("nice %d for redis-server: %w", b.o.WorstRedisNice, err)
		}
		nice = fmt.Sprintf(", main thread at nice %d", b.o.WorstRedisNice)
	}

	dbName, dbURL, drop, err := b.scenarioDatabase(ctx, "worst", "w")
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, drop)
	addr, err := freeAddr()
	if err != nil {
		return nil, nil, err
	}
	prefix := b.prefix + "w"
	redisURL := "redis://" + raddr + "/0"
	cd, err := startProc("creditd-worst", b.bin, []string{"serve"}, creditdEnv(redisURL, dbURL, prefix, addr, "bench-worst"),
		addr, filepath.Join(b.tmp, "creditd-worst.log"))
	if err != nil {
		return nil, nil, err
	}
	stops = append(stops, cd.Stop)
	api, err := newTenant(addr, b.runID)
	if err != nil {
		return nil, nil, fmt.Errorf("tenant: %w", err)
	}
	w := *b
	w.rdb, w.prefix, w.addr, w.api, w.dbURL, w.redisURL = rdb, prefix, addr, api, dbURL, redisURL
	w.worstRedisPid = rs.Process.Pid
	others := "the bench's own creditd idle on the shared Redis"
	if b.o.has("memory") {
		others = "the bench's creditd idle after the memory scenario, before any load scenario (its persister polling the shared Redis)"
	}
	load := ""
	if lb, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Join(strings.Fields(string(lb))[:3], " ")
	}
	r.Setting = fmt.Sprintf("a private redis-server %s (pid %d%s, no persistence, 0 other scripts cached, only this scenario's creditd as client) "+
		"and a creditd of its own on a fresh database; each measured call after a %s pause; also on the %d-core machine: %s and whatever other "+
		"users ran (load average %s at the start)", version, rs.Process.Pid, nice, b.o.WorstPace, runtime.NumCPU(), others, load)
	logf("worst: private redis-server %s on %s (pid %d), creditd on %s (database %s)", version, raddr, rs.Process.Pid, addr, dbName)
	return &w, stop, nil
}

// worstWarm runs each kind of request once on a customer of its own and
// returns the scripts each ran (SHA -> request).
func (b *Bench) worstWarm(ctx context.Context, idem func() []string) (map[string]string, error) {
	ext := "warm-" + b.runID
	scripts := map[string]string{}
	var reservationID string
	steps := []struct {
		name            string
		method, path    string
		body            func() any
		want            int
		keepReservation bool
	}{
		{"create customer", "POST", "/v1/customers", func() any { return map[string]any{"external_id": ext} }, 201, false},
		{"grant", "POST", "/v1/customers/" + ext + "/credits/grant", func() any {
			return map[string]any{"credits": grantCredits, "source": "promotional", "reason": "warm"}
		}, 201, false},
		{"consume", "POST", "/v1/entitlements/consume", func() any {
			return map[string]any{"customer_id": ext, "billable_metric_key": metricWorst, "units": 1}
		}, 200, false},
		{"usage", "POST", "/v1/usage", func() any {
			return map[string]any{"events": []map[string]any{{"event_id": b.runID + "-warm-ev", "customer_id": ext,
				"billable_metric_key": metricWorst, "units": 1}}}
		}, 200, false},
		{"reserve", "POST", "/v1/reservations", func() any {
			return map[string]any{"customer_id": ext, "billable_metric_key": metricWorst, "estimated_units": 1, "ttl_seconds": 3600}
		}, 201, true},
		{"commit", "POST", "/v1/reservations/{reservation}/commit", func() any { return map[string]any{"actual_units": 1} }, 200, false},
		{"reserve", "POST", "/v1/reservations", func() any {
			return map[string]any{"customer_id": ext, "billable_metric_key": metricWorst, "estimated_units": 1, "ttl_seconds": 3600}
		}, 201, true},
		{"release", "POST", "/v1/reservations/{reservation}/release", func() any { return map[string]any{} }, 200, false},
		{"adjust", "POST", "/v1/customers/" + ext + "/credits/adjust", func() any {
			return map[string]any{"delta": -1, "source": "manual", "reason": "warm"}
		}, 200, false},
		{"check", "GET", "/v1/entitlements/check?customer_id=" + ext + "&billable_metric_key=" + metricWorst + "&units=1", nil, 200, false},
	}
	for _, st := range steps {
		if err := b.rdb.SlowLogReset(ctx).Err(); err != nil {
			return nil, err
		}
		var body any
		if st.body != nil {
			body = st.body()
		}
		a, err := b.api.Call(st.method, strings.Replace(st.path, "{reservation}", reservationID, 1), body, idem()...)
		if err != nil {
			return nil, err
		}
		if a.Status != st.want {
			return nil, fmt.Errorf("%s: want %d, got %s", st.name, st.want, a)
		}
		if st.keepReservation {
			var h struct{ ID string }
			if err := a.Decode(&h); err != nil {
				return nil, err
			}
			reservationID = h.ID
		}
		logs, err := b.rdb.SlowLogGet(ctx, -1).Result()
		if err != nil {
			return nil, err
		}
		for _, l := range logs {
			if len(l.Args) > 1 && scriptCommand(l.Args[0]) && !strings.EqualFold(l.Args[0], "eval") {
				if _, seen := scripts[l.Args[1]]; !seen {
					scripts[l.Args[1]] = st.name
				}
			}
		}
	}
	return scripts, nil
}

// requestWindow is one request of the worst scenario: the newest SLOWLOG
// id before it, and the CPU and run-queue wait of Redis's main thread while
// it ran.
type requestWindow struct {
	after         int64
	cpuUS, waitUS int64
}

// threadSched is a thread's time on a CPU and waiting for one
// (/proc/<pid>/task/<pid>/schedstat, nanoseconds).
func threadSched(pid int) (run, wait int64, err error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/schedstat", pid, pid))
	if err != nil {
		return 0, 0, err
	}
	f := strings.Fields(string(raw))
	if len(f) < 2 {
		return 0, 0, fmt.Errorf("schedstat of %d: %q", pid, raw)
	}
	run, _ = strconv.ParseInt(f[0], 10, 64)
	wait, _ = strconv.ParseInt(f[1], 10, 64)
	return run, wait, nil
}

// scriptStats sums INFO commandstats over the script commands.
func scriptStats(ctx context.Context, rdb *redis.Client) (calls, usec int64) {
	for name, v := range commandStats(ctx, rdb) {
		if scriptCommand(name) {
			calls += v[0]
			usec += v[1]
		}
	}
	return calls, usec
}

// scriptCommand: the command runs a Lua script.
func scriptCommand(name string) bool {
	switch strings.ToLower(name) {
	case "evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro":
		return true
	}
	return false
}

func (b *Bench) worstRun(ctx context.Context, r *WorstResult) error {
	idemN := 0
	idem := func() []string {
		idemN++
		return []string{"Idempotency-Key", b.runID + "-worst-" + strconv.Itoa(idemN)}
	}
	tiers := make([]map[string]any, engine.MaxTiers)
	for i := range tiers {
		t := map[string]any{"unit_cost": 1 + i%7, "flat_cost": i % 3}
		if i < len(tiers)-1 {
			t["up_to"] = i + 1
		} else {
			t["up_to"] = nil
		}
		tiers[i] = t
	}
	if _, err := b.api.Expect(201, "POST", "/v1/metering-rules", map[string]any{"billable_metric_key": metricWorst,
		"cost_type": "tiered", "tier_config": map[string]any{"mode": "graduated", "tiers": tiers}}, idem()...); err != nil {
		return fmt.Errorf("tiered rule: %w", err)
	}
	tooMany := append(tiers, map[string]any{"unit_cost": 1, "flat_cost": 0, "up_to": nil})
	tooMany[len(tiers)-1] = map[string]any{"unit_cost": 1, "flat_cost": 0, "up_to": len(tiers)}
	if a, _ := b.api.Call("POST", "/v1/metering-rules", map[string]any{"billable_metric_key": metricWorst + "_over",
		"cost_type": "tiered", "tier_config": map[string]any{"mode": "graduated", "tiers": tooMany}}, idem()...); a.Status != 422 {
		return fmt.Errorf("a rule of %d tiers: want 422, got %s", len(tooMany), a)
	}
	r.Refusals = append(r.Refusals, fmt.Sprintf("rule of %d tiers: 422", len(tooMany)))

	ext := "worst-" + b.runID
	if _, err := b.api.Expect(201, "POST", "/v1/customers", map[string]any{"external_id": ext}, idem()...); err != nil {
		return err
	}
	// The largest metadata the API takes (the boundary's limits may be
	// tighter than the first guess).
	pace := time.Duration(0)
	// call sends one request and keeps the most CPU and run-queue wait
	// Redis's main thread had within one request (all its commands): a
	// SLOWLOG time above that CPU was spent waiting for a core.
	// Each request's window starts after the newest SLOWLOG entry before
	// it, so the slowest call can be matched to its request's CPU.
	var winCPU, winWait int64
	var windows []requestWindow
	call := func(method, path string, body any, headers ...string) (Answer, error) {
		var after int64 = -1
		if l, err := b.rdb.SlowLogGet(ctx, 1).Result(); err == nil && len(l) == 1 {
			after = l[0].ID
		}
		run0, wait0, err0 := threadSched(b.worstRedisPid)
		a, err := b.api.Call(method, path, body, headers...)
		if run1, wait1, err1 := threadSched(b.worstRedisPid); err0 == nil && err1 == nil && after >= 0 {
			w := requestWindow{after: after, cpuUS: (run1 - run0) / 1e3, waitUS: (wait1 - wait0) / 1e3}
			winCPU, winWait = max(winCPU, w.cpuUS), max(winWait, w.waitUS)
			windows = append(windows, w)
		}
		return a, err
	}
	grant := func(i int, meta map[string]any, extra map[string]any) (Answer, error) {
		time.Sleep(pace)
		body := map[string]any{"credits": grantCredits, "source": "promotional", "reason": "worst",
			"priority": i % 5, "duration_seconds": 30*24*3600 + i*60, "metadata": meta}
		for k, v := range extra {
			body[k] = v
		}
		return call("POST", "/v1/customers/"+ext+"/credits/grant", body, idem()...)
	}
	var meta map[string]any
	for _, n := range []int{b.o.WorstMetaBytes, engine.MaxMetadataBytes, engine.MaxMetadataBytes / 2, engine.MaxMetadataBytes / 4} {
		meta = worstMeta(n, "b0")
		a, err := grant(0, meta, nil)
		if err != nil {
			return err
		}
		if a.Status == 201 {
			r.MetaBytes = n
			break
		}
		logf("worst: metadata of %d bytes refused (%d); trying smaller", n, a.Status)
	}
	if r.MetaBytes == 0 {
		return fmt.Errorf("no metadata size was accepted")
	}
	logf("worst: %d blocks and %d reservations with %d bytes of metadata each, a rule of %d tiers",
		engine.MaxLiveBlocks, engine.MaxActiveReservations, r.MetaBytes, engine.MaxTiers)
	// All but one block, so a stack_after grant can still fill the last slot.
	for i := 1; i < engine.MaxLiveBlocks-1; i++ {
		if a, err := grant(i, worstMeta(r.MetaBytes, "b"+strconv.Itoa(i)), nil); err != nil || a.Status != 201 {
			return fmt.Errorf("grant %d: %v %s", i, err, a)
		}
	}
	reservations := make([]string, 0, engine.MaxActiveReservations)
	reserve := func(tag string) (Answer, error) {
		time.Sleep(pace)
		return call("POST", "/v1/reservations", map[string]any{"customer_id": ext, "billable_metric_key": metricWorst,
			"estimated_units": 10, "ttl_seconds": 3600, "metadata": worstMeta(r.MetaBytes, tag)}, idem()...)
	}
	// reservation reserves one more reservation (a 201 is required) and keeps its id.
	reservation := func(tag string) error {
		a, err := reserve(tag)
		if err != nil || a.Status != 201 {
			return fmt.Errorf("reserve %s: %v %s", tag, err, a)
		}
		var h struct{ ID string }
		if err := a.Decode(&h); err != nil {
			return err
		}
		reservations = append(reservations, h.ID)
		return nil
	}
	for i := 0; i < engine.MaxActiveReservations-1; i++ {
		if err := reservation("h" + strconv.Itoa(i)); err != nil {
			return err
		}
	}

	// Warm every script on a small customer of its own first: on a fresh
	// Redis the first call of a script compiles it (EVALSHA answers
	// NOSCRIPT, then EVAL of 40-55 KB of source, 1.7-2.2 ms), a cost of
	// the Redis process, not of the input. The SHAs seen per request name
	// the scripts in BENCH_WORST_DEBUG output.
	scripts, err := b.worstWarm(ctx, idem)
	if err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}

	pace = b.o.WorstPace
	phase := func(name string, f func() error) error {
		if err := b.rdb.SlowLogReset(ctx).Err(); err != nil {
			return err
		}
		calls0, usec0 := scriptStats(ctx, b.rdb)
		run0, wait0, serr := threadSched(b.worstRedisPid)
		winCPU, winWait, windows = 0, 0, nil
		if err := f(); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		run1, wait1, serr1 := threadSched(b.worstRedisPid)
		calls1, usec1 := scriptStats(ctx, b.rdb)
		p, err := b.slowlogPhase(ctx, name, scripts)
		if err != nil {
			return err
		}
		if n := calls1 - calls0; n > 0 {
			p.CmdUSPerCall = float64(usec1-usec0) / float64(n)
		}
		if serr == nil && serr1 == nil {
			if p.Calls > 0 {
				p.CPUUSPerCall = float64(run1-run0) / 1e3 / float64(p.Calls)
			}
			p.WaitUS = (wait1 - wait0) / 1e3
		}
		p.RequestMaxCPUUS, p.RequestMaxWaitUS = winCPU, winWait
		p.MaxCallCPUUS, p.MaxCallWaitUS = -1, -1
		for _, w := range windows {
			if w.after < p.maxID {
				p.MaxCallCPUUS, p.MaxCallWaitUS = w.cpuUS, w.waitUS
			}
		}
		if p.TopCmdUS > r.ReadMaxUS {
			r.ReadMaxUS, r.ReadMaxCmd = p.TopCmdUS, p.TopCmd
		}
		r.Phases = append(r.Phases, p)
		r.ScriptRuns += p.Calls
		if p.MaxUS > r.MaxUS {
			r.MaxUS, r.MaxPhase = p.MaxUS, name
		}
		r.P99US = max(r.P99US, p.P99US)
		if p.Compiles > 0 {
			logf("worst: %s: %d script compiles (EVAL) in a measured phase", name, p.Compiles)
		}
		logf("worst: %-46s %4d script calls: max %5d us, p99 %5d us, p50 %4d us; Redis CPU %5.0f us/call, in-command %5.0f us/call, "+
			"run-queue wait %d us; one request at most %d us CPU, %d us wait; the slowest call's request %d us CPU, %d us wait; top other %s %d us",
			name, p.Calls, p.MaxUS, p.P99US, p.P50US, p.CPUUSPerCall, p.CmdUSPerCall, p.WaitUS, p.RequestMaxCPUUS, p.RequestMaxWaitUS,
			p.MaxCallCPUUS, p.MaxCallWaitUS, p.TopCmd, p.TopCmdUS)
		return nil
	}
	expect := func(want int, a Answer, err error) error {
		if err != nil {
			return err
		}
		if a.Status != want {
			return fmt.Errorf("want %d, got %s", want, a)
		}
		return nil
	}
	// paced leaves creditd and its persister idle before each measured
	// call, so SLOWLOG times the script, not the CPU it shares with them.
	paced := func(method, path string, body any, headers ...string) (Answer, error) {
		time.Sleep(b.o.WorstPace)
		return call(method, path, body, headers...)
	}
	nomatch := map[string]any{"stack_after": map[string]any{"metadata_match": map[string]any{"tag": "none", "k0000000": "x"},
		"fallback": "now"}}
	steps := []struct {
		name string
		f    func() error
	}{
		{"grant: stack_after scanning every block", func() error {
			a, err := grant(engine.MaxLiveBlocks-1, worstMeta(r.MetaBytes, "last"), nomatch)
			return expect(201, a, err)
		}},
		{"grant past the live-block cap (409)", func() error {
			a, err := grant(engine.MaxLiveBlocks, worstMeta(r.MetaBytes, "over"), nomatch)
			if err := expect(409, a, err); err != nil {
				return err
			}
			r.Refusals = append(r.Refusals, fmt.Sprintf("grant %d: 409", engine.MaxLiveBlocks+1))
			return nil
		}},
		{"consume through every tier", func() error {
			for i := 0; i < 20; i++ {
				a, err := paced("POST", "/v1/entitlements/consume", map[string]any{"customer_id": ext,
					"billable_metric_key": metricWorst, "units": engine.MaxTiers + 50, "metadata": worstMeta(r.MetaBytes, "c")}, idem()...)
				if err := expect(200, a, err); err != nil {
					return err
				}
			}
			return nil
		}},
		{"usage batch of 100 events", func() error {
			events := make([]map[string]any, 100)
			for i := range events {
				events[i] = map[string]any{"event_id": b.runID + "-worst-ev-" + strconv.Itoa(i), "customer_id": ext,
					"billable_metric_key": metricWorst, "units": engine.MaxTiers + 1}
			}
			a, err := paced("POST", "/v1/usage", map[string]any{"events": events}, idem()...)
			return expect(200, a, err)
		}},
		{"reserve to the reservation cap, then past it (409)", func() error {
			if err := reservation("last"); err != nil {
				return err
			}
			a, err := reserve("over")
			if err := expect(409, a, err); err != nil {
				return err
			}
			r.Refusals = append(r.Refusals, fmt.Sprintf("reservation %d: 409", engine.MaxActiveReservations+1))
			return nil
		}},
		{"commit reservations with metadata", func() error {
			for i := 0; i < 10; i++ {
				id := reservations[len(reservations)-1]
				reservations = reservations[:len(reservations)-1]
				a, err := paced("POST", "/v1/reservations/"+id+"/commit", map[string]any{"actual_units": engine.MaxTiers + 5,
					"metadata": worstMeta(r.MetaBytes, "commit")}, idem()...)
				if err := expect(200, a, err); err != nil {
					return err
				}
			}
			return nil
		}},
		{"release reservations", func() error {
			for i := 0; i < 10; i++ {
				id := reservations[len(reservations)-1]
				reservations = reservations[:len(reservations)-1]
				a, err := paced("POST", "/v1/reservations/"+id+"/release", map[string]any{}, idem()...)
				if err := expect(200, a, err); err != nil {
					return err
				}
			}
			return nil
		}},
		{"reserve and release to the kept-reservation cap", func() error {
			// Active holds back at the cap and finalized ones past theirs,
			// so the next calls read the most holds a hash may keep.
			for i := 0; i < 2*engine.MaxActiveReservations; i++ {
				if len(reservations) == engine.MaxActiveReservations {
					a, err := paced("POST", "/v1/reservations/"+reservations[0]+"/release", map[string]any{}, idem()...)
					if err := expect(200, a, err); err != nil {
						return err
					}
					reservations = reservations[1:]
				}
				if err := reservation("cycle"); err != nil {
					return err
				}
			}
			return nil
		}},
		{"consume with every reservation kept", func() error {
			for i := 0; i < 20; i++ {
				a, err := paced("POST", "/v1/entitlements/consume", map[string]any{"customer_id": ext,
					"billable_metric_key": metricWorst, "units": engine.MaxTiers + 50}, idem()...)
				if err := expect(200, a, err); err != nil {
					return err
				}
			}
			return nil
		}},
		{"negative adjust draining blocks", func() error {
			for i := 0; i < 5; i++ {
				a, err := paced("POST", "/v1/customers/"+ext+"/credits/adjust", map[string]any{"delta": -(grantCredits + 7), "source": "manual",
					"reason": "worst drain"}, idem()...)
				if err := expect(200, a, err); err != nil {
					return err
				}
			}
			return nil
		}},
		{"check and balance reads (not scripts)", func() error {
			for i := 0; i < 10; i++ {
				a, err := paced("GET", "/v1/entitlements/check?customer_id="+ext+"&billable_metric_key="+metricWorst+"&units=150", nil)
				if err := expect(200, a, err); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	for _, s := range steps {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := phase(s.name, s.f); err != nil {
			return err
		}
	}
	if a, err := b.api.Call("GET", "/v1/customers/"+ext, nil); err == nil && a.Status == 200 {
		var c struct{ ID string }
		if a.Decode(&c) == nil {
			if id, err := uuid.Parse(c.ID); err == nil {
				r.HashBytes, _ = b.rdb.MemoryUsage(ctx, accountKey(b.prefix, id)).Result()
			}
		}
	}
	r.Blocks, r.Reservations = engine.MaxLiveBlocks, engine.MaxActiveReservations

	// Import at its limits: it must finish well inside its 30 s claim.
	for _, shape := range [][2]int{{engine.MaxImportTotalBlocks / engine.MaxImportBlocks, engine.MaxImportBlocks},
		{engine.MaxImportCustomers, engine.MaxImportTotalBlocks / engine.MaxImportCustomers}} {
		rows := make([]map[string]any, shape[0])
		for i := range rows {
			credits := make([]map[string]any, shape[1])
			for j := range credits {
				credits[j] = map[string]any{"credits": 1000 + j, "priority": j % 5}
			}
			rows[i] = map[string]any{"external_id": fmt.Sprintf("imp-%d-%d-%s", shape[0], i, b.runID), "credits": credits}
		}
		t0 := time.Now()
		a, err := b.api.Call("POST", "/v1/import", map[string]any{"customers": rows}, idem()...)
		if err := expect(200, a, err); err != nil {
			return fmt.Errorf("import %dx%d: %w", shape[0], shape[1], err)
		}
		var res struct {
			Created int
			Errors  []any
		}
		if err := a.Decode(&res); err != nil {
			return err
		}
		im := WorstImport{Customers: shape[0], Blocks: shape[1], Seconds: time.Since(t0).Seconds(), Created: res.Created, Errors: len(res.Errors)}
		r.Imports = append(r.Imports, im)
		logf("worst: import of %d customers x %d blocks: %.2f s, %d created, %d errors", im.Customers, im.Blocks, im.Seconds, im.Created, im.Errors)
	}
	return nil
}

// slowlogPhase reads the SLOWLOG entries of this run's keys: script calls
// (EVALSHA, EVAL) make the phase; the slowest other command is kept as
// TopCmd.
// Script calls over 1 ms are logged with the request that first ran the
// script (scripts) when BENCH_WORST_DEBUG is set; over that many µs when
// it is a number (0 logs every call).
func (b *Bench) slowlogPhase(ctx context.Context, name string, scripts map[string]string) (WorstPhase, error) {
	logs, err := b.rdb.SlowLogGet(ctx, -1).Result()
	if err != nil {
		return WorstPhase{}, err
	}
	p := WorstPhase{Name: name}
	var us, money []int64
	var slowest int64
	debugUS := int64(-1)
	if v := os.Getenv("BENCH_WORST_DEBUG"); v != "" {
		debugUS = 1000
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && v != "1" {
			debugUS = n
		}
	}
	for _, l := range logs {
		if !ownCommand(l.Args, b.prefix) {
			continue
		}
		d := l.Duration.Microseconds()
		if debugUS >= 0 && d > debugUS {
			what := ""
			if len(l.Args) > 1 {
				what = scripts[l.Args[1]]
			}
			logf("  slow: %d us (script of %q) %q", d, what, l.Args[:min(len(l.Args), 8)])
		}
		if strings.EqualFold(l.Args[0], "eval") {
			p.Compiles++
		}
		if scriptCommand(l.Args[0]) {
			if len(us) == 0 || d > slowest {
				slowest, p.maxID = d, l.ID
			}
			us = append(us, d)
			if len(l.Args) > 3 && strings.Contains(l.Args[3], "}:a:") {
				money = append(money, d)
			}
		} else if d > p.TopCmdUS {
			p.TopCmd, p.TopCmdUS = strings.ToUpper(l.Args[0]), d
		}
	}
	sort.Slice(us, func(i, j int) bool { return us[i] < us[j] })
	sort.Slice(money, func(i, j int) bool { return money[i] < money[j] })
	p.Calls, p.MoneyCalls = len(us), len(money)
	if len(us) > 0 {
		p.MaxUS, p.P50US, p.P99US = us[len(us)-1], us[len(us)/2], us[len(us)*99/100]
	}
	if len(money) > 0 {
		p.MoneyP50US = money[len(money)/2]
	}
	return p, nil
}

// ownCommand: one of the arguments names a key of this run.
func ownCommand(args []string, prefix string) bool {
	if len(args) == 0 {
		return false
	}
	for _, a := range args[1:min(len(args), 8)] {
		if strings.Contains(a, "{"+prefix+":") {
			return true
		}
	}
	return false
}

// ownRedis is a redis-server of a scenario's own (nothing saved), so
// that other branches' scripts and traffic on the shared Redis stay out of
// its figures.
type ownRedis struct {
	Addr string
	cmd  *exec.Cmd
	rdb  *redis.Client
	log  *os.File
}

// startPrivateRedis starts redis-server on a free port with args added,
// logging to logPath, and waits until it answers PING.
func startPrivateRedis(ctx context.Context, logPath string, args ...string) (*ownRedis, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	_, port, _ := net.SplitHostPort(addr)
	rlog, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	rs := exec.Command("redis-server", append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}, args...)...)
	rs.Stdout, rs.Stderr = rlog, rlog
	rs.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := rs.Start(); err != nil {
		rlog.Close()
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	p := &ownRedis{Addr: addr, cmd: rs, rdb: redis.NewClient(&redis.Options{Addr: addr}), log: rlog}
	for i := 0; p.rdb.Ping(ctx).Err() != nil; i++ {
		if i == 100 || ctx.Err() != nil {
			p.Stop()
			return nil, fmt.Errorf("private redis-server on %s did not answer:\n%s", addr, tail(logPath, 1000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p, nil
}

// Pid is the redis-server's process id.
func (p *ownRedis) Pid() int { return p.cmd.Process.Pid }

// Stop closes the client and ends the redis-server by its PID (SIGTERM,
// then SIGKILL after 5 s).
func (p *ownRedis) Stop() {
	p.rdb.Close()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	p.log.Close()
}
