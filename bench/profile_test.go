package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/app"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

// These benchmarks run creditd's request handler in process, with no
// network between the client and the handler (Redis and Postgres are real),
// so a CPU profile shows creditd's own work per request:
//
//	go test ./bench -run '^$' -bench HotPath -benchtime 5s -cpuprofile /tmp/cpu.out
//	go tool pprof -top -nodecount 40 bench.test /tmp/cpu.out
//
// They need Redis and Postgres: TEST_REDIS_URL / TEST_DATABASE_URL, else
// REDIS_URL / DATABASE_URL, else the local defaults. Speed targets are
// judged by `go run ./bench`, never here.

func envOr(names []string, def string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return def
}

// inproc is an in-process creditd with a seeded tenant.
type inproc struct {
	handler   fasthttp.RequestHandler
	key       string
	customers []string
	remote    net.Addr
	rdb       *redis.Client
}

func (p *inproc) call(method, path string, body []byte, headers ...string) (int, []byte) {
	var ctx fasthttp.RequestCtx
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI(path)
	if body != nil {
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(body)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	ctx.Init(&req, p.remote, nil)
	p.handler(&ctx)
	return ctx.Response.StatusCode(), append([]byte(nil), ctx.Response.Body()...)
}

func newInproc(b *testing.B, customers int) *inproc {
	b.Helper()
	ctx := context.Background()
	rdb, _, baseDB := benchServices(b, 64)
	name := "benchprof" + fmt.Sprintf("%08x", uuid.New().ID())
	dbURL, err := createDatabase(ctx, baseDB, name)
	if err != nil {
		b.Skipf("no Postgres: %v", err)
	}
	pool, err := persist.Open(ctx, dbURL)
	if err != nil {
		b.Fatal(err)
	}
	if err := persist.Migrate(ctx, pool); err != nil {
		b.Fatal(err)
	}
	a := app.New(rdb, pool, app.Config{RedisPrefix: name, AdminToken: adminToken, Consumer: "prof"}, zerolog.Nop())
	a.Start()
	// PROFILE_NO_PERSIST: the persister's seen_add calls come in batches
	// whose size follows timing, so two builds compare by their money
	// scripts alone with it stopped.
	if os.Getenv("PROFILE_NO_PERSIST") != "" {
		a.Persister.Stop()
	}
	b.Cleanup(func() {
		a.Stop(5 * time.Second)
		pool.Close()
		_ = dropDatabase(context.Background(), baseDB, name)
		_, _ = deletePrefix(context.Background(), rdb, name)
		rdb.Close()
	})
	p := &inproc{handler: a.Server.Handler(), remote: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4242}, rdb: rdb}
	bearer := []string{"Authorization", "Bearer " + adminToken}
	st, raw := p.call("POST", "/admin/v1/tenants", []byte(`{"name":"prof"}`), bearer...)
	if st != 201 {
		b.Fatalf("create tenant: %d %s", st, raw)
	}
	var tn struct {
		Tenant  struct{ ID string }   `json:"tenant"`
		APIKeys struct{ Live string } `json:"api_keys"`
	}
	_ = json.Unmarshal(raw, &tn)
	p.key = tn.APIKeys.Live
	p.call("PATCH", "/admin/v1/tenants/"+tn.Tenant.ID, []byte(`{"rate_limit_per_second":1000000,"rate_limit_burst":10000000}`), bearer...)
	auth := func(idem string) []string { return []string{"X-API-Key", p.key, "Idempotency-Key", name + idem} }
	if st, raw := p.call("POST", "/v1/metering-rules", []byte(`{"billable_metric_key":"api_calls","cost_type":"per_unit","unit_cost":1}`), auth("rule")...); st != 201 {
		b.Fatalf("metering rule: %d %s", st, raw)
	}
	for i := 0; i < customers; i++ {
		ext := fmt.Sprintf("prof-%05d", i)
		for k := 0; k < 3; k++ {
			body := fmt.Sprintf(`{"credits":%d,"source":"promotional","reason":"prof","priority":%d}`, grantCredits, k)
			if st, raw := p.call("POST", "/v1/customers/"+ext+"/credits/grant", []byte(body), auth(ext+strconv.Itoa(k))...); st != 201 {
				b.Fatalf("grant: %d %s", st, raw)
			}
		}
		p.customers = append(p.customers, ext)
	}
	return p
}

func BenchmarkHotPath(b *testing.B) {
	newInproc(b, 200).checkAndConsume(b, "prof-c-", func(b *testing.B, run func()) {
		b.ReportAllocs()
		b.ResetTimer()
		run()
	})
}

// checkAndConsume runs the check and consume sub-benchmarks through p on
// its customers in turn, failing on any status but 200; measure wraps each
// sub-benchmark's parallel run (idem prefixes the consumes' idempotency
// keys).
func (p *inproc) checkAndConsume(b *testing.B, idem string, measure func(b *testing.B, run func())) {
	var seq atomic.Uint64
	bench := func(b *testing.B, op func(n uint64) (int, []byte)) {
		measure(b, func() {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if st, raw := op(seq.Add(1)); st != 200 {
						b.Errorf("status %d: %s", st, raw)
						return
					}
				}
			})
		})
	}
	b.Run("check", func(b *testing.B) {
		bench(b, func(n uint64) (int, []byte) {
			c := p.customers[n%uint64(len(p.customers))]
			return p.call("GET", "/v1/entitlements/check?customer_id="+c+"&billable_metric_key=api_calls&units=1", nil, "X-API-Key", p.key)
		})
	})
	b.Run("consume", func(b *testing.B) {
		bench(b, func(n uint64) (int, []byte) {
			c := p.customers[n%uint64(len(p.customers))]
			return p.call("POST", "/v1/entitlements/consume", []byte(`{"customer_id":"`+c+`","billable_metric_key":"api_calls","units":1}`),
				"X-API-Key", p.key, "Idempotency-Key", idem+strconv.FormatUint(n, 10)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
		})
	})
}

// BenchmarkLuaPrelude measures what a script costs Redis by itself: a bare
// one-HGET script and the same HGET behind the prelude (lua/prelude/, which
// a script run by EVALSHA carries where the server has no Functions), on a
// private redis-server so INFO commandstats holds only these calls:
//
//	go test ./bench -run '^$' -bench LuaPrelude
func BenchmarkLuaPrelude(b *testing.B) {
	prelude := lua.Prelude()
	rdb := privateRedis(b)
	ctx := context.Background()
	// One account hash as the prelude encodes it: account fields and
	// three blocks (remaining|original|priority|created|starts|expires|source|meta).
	key := "{p:p00}:a:00000000-0000-4000-8000-000000000001"
	rdb.HSet(ctx, key, "id", "00000000-0000-4000-8000-000000000002", "t", "00000000-0000-4000-8000-000000000003", "e", "live",
		"v", "3", "rs", "0", "le", "3000000000", "ua", "1763700000000",
		"b:00000000-0000-4000-8000-00000000000a", "1000000000|1000000000|0|mi6kq0xc||1fzjdc0|p|",
		"b:00000000-0000-4000-8000-00000000000b", "1000000000|1000000000|1|mi6kq0xc|||p|",
		"b:00000000-0000-4000-8000-00000000000c", "1000000000|1000000000|2|mi6kq0xc|||p|")
	for _, tc := range []struct{ name, src string }{
		{"bare-hget", hgetScript},
		{"prelude+hget", prelude + "\n" + hgetScript},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s := redis.NewScript(tc.src)
			if err := s.Run(ctx, rdb, []string{key}, "v").Err(); err != nil && err != redis.Nil {
				b.Fatalf("%s: %v", tc.name, err)
			}
			before := commandStats(ctx, rdb)["evalsha"]
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if err := s.Run(ctx, rdb, []string{key}, "v").Err(); err != nil && err != redis.Nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			after := commandStats(ctx, rdb)["evalsha"]
			if n := after[0] - before[0]; n > 0 {
				b.ReportMetric(float64(after[1]-before[1])/float64(n), "redis-µs/call")
			}
		})
	}
}

// privateRedis starts a redis-server of our own on a free port.
func privateRedis(b *testing.B) *redis.Client {
	b.Helper()
	addr, err := freeAddr()
	if err != nil {
		b.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		b.Skipf("no redis-server: %v", err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	b.Cleanup(func() { rdb.Close() })
	for i := 0; i < 100; i++ {
		if rdb.Ping(context.Background()).Err() == nil {
			return rdb
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatal("private redis-server did not start")
	return nil
}

// benchServices is the test Redis (TEST_REDIS_URL, else the local one) as
// a client of poolSize connections (0: go-redis' default), its URL, and the
// base Postgres URL databases are made from (TEST_DATABASE_URL); the
// benchmark is skipped without a Redis.
func benchServices(b *testing.B, poolSize int) (rdb *redis.Client, redisURL, baseDB string) {
	b.Helper()
	redisURL = envOr([]string{"TEST_REDIS_URL", "REDIS_URL"}, "redis://127.0.0.1:6379/0")
	baseDB = envOr([]string{"TEST_DATABASE_URL", "DATABASE_URL"}, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		b.Fatal(err)
	}
	if poolSize > 0 {
		opt.PoolSize = poolSize
	}
	rdb = redis.NewClient(opt)
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		_ = rdb.Close()
		b.Skipf("no Redis: %v", err)
	}
	return rdb, redisURL, baseDB
}

// BenchmarkRedisFlows sends money requests one at a time through an
// in-process creditd, so the Redis it runs on sees exactly one request's
// scripts and their persisting at a time: run against a private
// redis-server under callgrind, it counts Redis's instructions per request
// (the shared box's microseconds are noise):
//
//	valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p redis-server --port 6398 &
//	PROFILE_CALLGRIND=<its pid> TEST_REDIS_URL=redis://127.0.0.1:6398/0 \
//	  go test ./bench -run '^$' -bench 'RedisFlows/reserve' -benchtime 1000x
//	callgrind_annotate --inclusive=yes /tmp/cg.<pid>.<last dump>
//
// Each flow warms up first (the change feed and the outbox reach their
// steady size); the counters are zeroed before the timed requests and
// dumped two seconds after them, the persister's work included (with
// PROFILE_NO_PERSIST=1 the persister is stopped: the money scripts alone,
// which is how two builds compare within a percent). PROFILE_CUSTOMERS=n
// spreads the requests over n customers instead of 200: a few take each
// customer to its steady shape (a reserving one keeps its last eight
// finalized reservations).
func BenchmarkRedisFlows(b *testing.B) {
	customers := 200
	if v, err := strconv.Atoi(os.Getenv("PROFILE_CUSTOMERS")); err == nil && v > 0 {
		customers = v
	}
	p := newInproc(b, customers)
	cg := os.Getenv("PROFILE_CALLGRIND")
	var n int
	ok := func(st int, raw []byte, want int) {
		if st != want {
			b.Fatalf("status %d, want %d: %s", st, want, raw)
		}
	}
	flows := []struct {
		name string
		op   func(c, idem string)
	}{
		{"consume", func(c, idem string) {
			st, raw := p.call("POST", "/v1/entitlements/consume", []byte(`{"customer_id":"`+c+`","billable_metric_key":"api_calls","units":1}`),
				"X-API-Key", p.key, "Idempotency-Key", idem)
			ok(st, raw, 200)
		}},
		{"reserve+commit", func(c, idem string) {
			st, raw := p.call("POST", "/v1/reservations", []byte(`{"customer_id":"`+c+`","billable_metric_key":"api_calls","estimated_units":10,"ttl_seconds":600}`),
				"X-API-Key", p.key, "Idempotency-Key", idem)
			ok(st, raw, 201)
			i := bytes.Index(raw, []byte(`"id":"`))
			if i < 0 || len(raw) < i+6+36 {
				b.Fatalf("no reservation id: %s", raw)
			}
			st, raw = p.call("POST", "/v1/reservations/"+string(raw[i+6:i+6+36])+"/commit", []byte(`{"actual_units":8}`),
				"X-API-Key", p.key, "Idempotency-Key", idem+"c")
			ok(st, raw, 200)
		}},
		{"gauge", func(c, idem string) {
			st, raw := p.call("POST", "/v1/customers/"+c+"/entitlements/seats/increment", []byte(`{"amount":1,"policy":"allow"}`),
				"X-API-Key", p.key, "Idempotency-Key", idem)
			ok(st, raw, 200)
		}},
		{"usage10", func(c, idem string) {
			var body bytes.Buffer
			body.WriteString(`{"events":[`)
			for k := range 10 {
				if k > 0 {
					body.WriteByte(',')
				}
				fmt.Fprintf(&body, `{"event_id":"%s-%d","customer_id":"%s","billable_metric_key":"api_calls","units":1}`,
					idem, k, p.customers[(n*10+k)%len(p.customers)])
			}
			body.WriteString(`]}`)
			st, raw := p.call("POST", "/v1/usage", body.Bytes(), "X-API-Key", p.key, "Idempotency-Key", idem)
			ok(st, raw, 200)
		}},
	}
	st, raw := p.call("POST", "/v1/billable-metrics", []byte(`{"key":"seats","name":"Seats","type":"gauge","default_value":{"cap":1000000000}}`),
		"X-API-Key", p.key, "Idempotency-Key", "flows-seats")
	ok(st, raw, 201)
	for _, f := range flows {
		b.Run(f.name, func(b *testing.B) {
			run := func() {
				n++
				f.op(p.customers[n%len(p.customers)], "flow-"+strconv.Itoa(n)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
			}
			for range 2 * engine.ChangeFeedCap {
				run()
			}
			time.Sleep(2 * time.Second)
			if cg != "" {
				_ = exec.Command("callgrind_control", "-z", cg).Run()
			}
			before := commandStats(context.Background(), p.rdb)
			b.ResetTimer()
			for range b.N {
				run()
			}
			b.StopTimer()
			if cg != "" {
				time.Sleep(2 * time.Second)
				_ = exec.Command("callgrind_control", "-d", cg).Run()
			}
			if os.Getenv("PROFILE_STATS") != "" {
				time.Sleep(2 * time.Second)
				reportCommandStats(b, before, commandStats(context.Background(), p.rdb))
			}
		})
	}
}

// reportCommandStats logs, per timed request, each command's calls and
// Redis microseconds between two INFO commandstats readings (a script's
// own commands count inside its FCALL too), and reports the total of the
// commands a client sent as redis-µs/op. With PROFILE_STATS set, against a
// private redis-server, it compares two builds' money scripts in seconds
// where callgrind takes minutes (noisier: wall time, not instructions).
func reportCommandStats(b *testing.B, before, after map[string][2]int64) {
	var total float64
	var lines []string
	for name, a := range after {
		d := [2]int64{a[0] - before[name][0], a[1] - before[name][1]}
		if d[0] == 0 {
			continue
		}
		per := float64(d[1]) / float64(b.N)
		lines = append(lines, fmt.Sprintf("%-14s calls/op %6.2f  µs/op %8.2f", name, float64(d[0])/float64(b.N), per))
	}
	for _, n := range []string{"fcall", "fcall_ro", "evalsha", "eval"} {
		total += float64(after[n][1]-before[n][1]) / float64(b.N)
	}
	sort.Strings(lines)
	for _, l := range lines {
		b.Log(l)
	}
	b.ReportMetric(total, "script-µs/op")
}
