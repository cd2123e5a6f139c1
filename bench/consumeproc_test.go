package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"
)

// BenchmarkConsumeProc measures creditd's own CPU per consume the way the
// bench's consume scenario sees it (issue 26): cmd/creditd built from this
// tree runs as its own process on the local Redis and Postgres, and b.N
// consumes (1 unit, each with its own Idempotency-Key, 200 customers) go to
// it over loopback at a fixed rate from 64 connections. It reports
// creditd's CPU per consume from /proc/<pid>/stat (its background work, the
// persister's COPYs included) and its allocations per consume from the
// runtime's own counters (/debug/pprof/allocs?debug=1):
//
//	go test ./bench -run '^$' -bench ConsumeProc -benchtime 30000x
//
// Knobs (environment): CONSUMEPROC_BIN a creditd binary to run instead
// (to compare two builds turn by turn); CONSUMEPROC_RATE consumes/s (default 3000, near the
// bench's 70 % run); CONSUMEPROC_LOG_LEVEL creditd's LOG_LEVEL (default warn,
// as the bench; info writes the access log, to a file);
// CONSUMEPROC_PROFILE a file for creditd's CPU profile of the run;
// CONSUMEPROC_CHECK=1 sends metered checks (GET /v1/entitlements/check of
// 1 unit) instead of consumes, to measure a check the same way;
// CONSUMEPROC_ALLOCS a file prefix for creditd's allocs profiles before
// (.0) and after (.1) the run (go tool pprof -base); CONSUMEPROC_STRACE a file for strace -c's count of creditd's syscalls
// (strace slows creditd: read the CPU figures from a run without it).
func BenchmarkConsumeProc(b *testing.B) {
	if testing.Short() {
		b.Skip("starts creditd")
	}
	ctx := context.Background()
	rdb, redisURL, baseDB := benchServices(b, 0)
	defer rdb.Close()
	root, _ := filepath.Abs("..")
	dir := b.TempDir()
	bin := os.Getenv("CONSUMEPROC_BIN")
	if bin == "" {
		var err error
		if bin, err = buildCreditd(root, dir); err != nil {
			b.Fatal(err)
		}
	}
	name := "benchproc" + fmt.Sprintf("%08x", uuid.New().ID())
	dbURL, err := createDatabase(ctx, baseDB, name)
	if err != nil {
		b.Skipf("no Postgres: %v", err)
	}
	defer func() {
		_ = dropDatabase(context.Background(), baseDB, name)
		_, _ = deletePrefix(context.Background(), rdb, name)
	}()
	addr, _ := freeAddr()
	pprofAddr, _ := freeAddr()
	level := envOr([]string{"CONSUMEPROC_LOG_LEVEL"}, "warn")
	env := creditdEnv(redisURL, dbURL, name, addr, "proc", "CREDITD_PPROF_ADDR="+pprofAddr, "LOG_LEVEL="+level)
	proc, err := startProc("creditd", bin, nil, env, addr, filepath.Join(dir, "creditd.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer proc.Stop()

	api, err := newTenant(addr, name)
	if err != nil {
		b.Fatal(err)
	}
	idem := func(s string) []string { return []string{"Idempotency-Key", name + "-seed-" + s} }
	if _, err := api.Expect(201, "POST", "/v1/metering-rules",
		map[string]any{"billable_metric_key": metricConsume, "cost_type": "per_unit", "unit_cost": 1}, idem("rule")...); err != nil {
		b.Fatal(err)
	}
	customers := make([]string, 200)
	if err := parallel(len(customers), 16, func(i int) error {
		ext := fmt.Sprintf("proc-%05d", i)
		customers[i] = ext
		for k := 0; k < 3; k++ {
			body := map[string]any{"credits": grantCredits, "source": "promotional", "reason": "proc", "priority": k}
			if _, err := api.Expect(201, "POST", "/v1/customers/"+ext+"/credits/grant", body, idem(fmt.Sprintf("%s-%d", ext, k))...); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}

	rate, _ := strconv.Atoi(envOr([]string{"CONSUMEPROC_RATE"}, "3000"))
	checks := os.Getenv("CONSUMEPROC_CHECK") != ""
	hc := &fasthttp.HostClient{Addr: addr, MaxConns: 64}
	var seq, failed atomic.Uint64
	drive := func(n int) {
		const workers = 64
		tokens := make(chan struct{}, workers)
		go func() {
			// A token per consume, released at the rate on a 1 ms clock.
			t := time.NewTicker(time.Millisecond)
			defer t.Stop()
			start := time.Now()
			sent := 0
			for sent < n {
				<-t.C
				due := min(n, int(time.Since(start).Seconds()*float64(rate)))
				for ; sent < due; sent++ {
					tokens <- struct{}{}
				}
			}
			close(tokens)
		}()
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				for range tokens {
					s := seq.Add(1)
					c := customers[s%uint64(len(customers))]
					req.Reset()
					req.Header.Set("X-API-Key", api.Key)
					if checks {
						req.Header.SetMethod("GET")
						req.SetRequestURI("http://" + addr + "/v1/entitlements/check?customer_id=" + c + "&billable_metric_key=" + metricConsume + "&units=1")
					} else {
						req.Header.SetMethod("POST")
						req.SetRequestURI("http://" + addr + "/v1/entitlements/consume")
						req.Header.SetContentType("application/json")
						req.Header.Set("Idempotency-Key", name+"-c-"+strconv.FormatUint(s, 10))
						req.SetBodyString(`{"customer_id":"` + c + `","billable_metric_key":"` + metricConsume + `","units":1}`)
					}
					if err := hc.DoTimeout(req, resp, requestTimeout); err != nil || resp.StatusCode() != 200 {
						if failed.Add(1) == 1 {
							b.Errorf("%s: %v %d %s", req.URI().Path(), err, resp.StatusCode(), resp.Body())
						}
					}
				}
			}()
		}
		wg.Wait()
	}
	drive(min(2000, b.N)) // warm up: connections, caches, the persister's COPY
	time.Sleep(time.Second)

	var profile chan []byte
	loadDur := time.Duration(float64(b.N) / float64(rate) * float64(time.Second))
	if path := os.Getenv("CONSUMEPROC_PROFILE"); path != "" {
		profile = make(chan []byte, 1)
		go func() {
			raw, err := fetchProfile(ctx, pprofAddr, loadDur)
			if err != nil {
				b.Errorf("profile: %v", err)
			}
			_ = os.WriteFile(path, raw, 0o644)
			profile <- raw
		}()
	}
	var strace *exec.Cmd
	straceOut := os.Getenv("CONSUMEPROC_STRACE")
	if straceOut != "" {
		strace = exec.Command("strace", "-c", "-f", "-o", straceOut, "-p", strconv.Itoa(proc.Pid()))
		if err := strace.Start(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	allocsTo := os.Getenv("CONSUMEPROC_ALLOCS")
	saveAllocs := func(suffix string) {
		if allocsTo == "" {
			return
		}
		if res, err := http.Get("http://" + pprofAddr + "/debug/pprof/allocs"); err == nil {
			raw, _ := io.ReadAll(res.Body)
			res.Body.Close()
			_ = os.WriteFile(allocsTo+suffix, raw, 0o644)
		}
	}
	saveAllocs(".0")
	m0, err := mallocs(pprofAddr)
	if err != nil {
		b.Fatal(err)
	}
	cpu0, _, _, _ := procTimes(proc.Pid())
	b.ResetTimer()
	drive(b.N)
	// The write-behind of these consumes: the persister reads and COPYs
	// in batches a few ms behind; wait out its batch before reading the CPU.
	time.Sleep(300 * time.Millisecond)
	b.StopTimer()
	cpu1, _, _, _ := procTimes(proc.Pid())
	m1, err := mallocs(pprofAddr)
	if err != nil {
		b.Fatal(err)
	}
	saveAllocs(".1")
	if strace != nil {
		_ = strace.Process.Signal(syscall.SIGINT)
		_ = strace.Wait()
		if raw, err := os.ReadFile(straceOut); err == nil {
			calls := straceTotal(raw)
			b.ReportMetric(float64(calls)/float64(b.N), "syscalls/op")
		}
	}
	if profile != nil {
		<-profile
	}
	n := float64(b.N)
	b.ReportMetric((cpu1-cpu0)*1e6/n, "creditd-cpu-µs/op")
	b.ReportMetric(float64(m1.mallocs-m0.mallocs)/n, "creditd-allocs/op")
	b.ReportMetric(float64(m1.bytes-m0.bytes)/n, "creditd-B/op")
	if f := failed.Load(); f > 0 {
		b.Errorf("%d consumes failed", f)
	}
}

// memCounts is the runtime's cumulative allocation counters.
type memCounts struct{ mallocs, bytes uint64 }

// mallocs reads Mallocs and TotalAlloc from the allocs profile's text form
// (its footer prints runtime.MemStats).
func mallocs(pprofAddr string) (memCounts, error) {
	res, err := http.Get("http://" + pprofAddr + "/debug/pprof/allocs?debug=1")
	if err != nil {
		return memCounts{}, err
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		return memCounts{}, err
	}
	var m memCounts
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "# Mallocs = "); ok {
			m.mallocs, _ = strconv.ParseUint(v, 10, 64)
		}
		if v, ok := strings.CutPrefix(line, "# TotalAlloc = "); ok {
			m.bytes, _ = strconv.ParseUint(v, 10, 64)
		}
	}
	if m.mallocs == 0 {
		return m, fmt.Errorf("no MemStats in the allocs profile")
	}
	return m, nil
}

// straceTotal is the calls column of strace -c's total line.
func straceTotal(raw []byte) int {
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 && f[len(f)-1] == "total" {
			n, _ := strconv.Atoi(f[3])
			return n
		}
	}
	return 0
}
