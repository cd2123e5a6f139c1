package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/internal/pgserver"
)

// The pg-outage scenario (issue 26): what a money call needs from Postgres
// and what Postgres keeps per consume, measured on a stack of its own,
// because it stops its Postgres and the machine's server is shared:
// internal/pgserver's private cluster, a private redis-server, and a
// creditd on them. In order:
//
//   - round trips: a creditd whose Redis and Postgres connections go
//     through counting proxies (rtproxy.go) answers consumes and checks one
//     at a time; each request's window counts the trips to each server;
//   - storage: 20,000 consumes, then a CHECKPOINT; every relation's size
//     (indexes and TOAST included) and pg_stat_user_tables' inserted and
//     updated rows, before and after, per consume;
//   - outage: Postgres stopped as `pg_ctl stop -m immediate` does for
//     -outage (60 s; -quick 15 s) under mixed money load and checks on
//     customers whose state is in Redis; every answer sent meanwhile is
//     counted by status; after Postgres is back and the persister drained,
//     the ledger is compared with what was acknowledged;
//   - the outbox budget: MEMORY USAGE of a stream of copies of a real
//     consume's outbox entry, per entry, times the run's max consume rate.

const (
	// hotPathCustomers are the scenario's seeded customers (state in
	// Redis from the seeding on).
	hotPathCustomers = 200
	// storageConsumes is the consumes the storage figures are over (the
	// issue's 20,000).
	storageConsumes = 20_000
	// storageRate is their offered rate: well under a 2-core box's max, so
	// the persister keeps up and groups as it does in steady work.
	storageRate = 1500
	// storageLimit bounds the chunks that reach storageConsumes.
	storageLimit = 3 * time.Minute
	// rtGap separates the one-at-a-time requests of the round-trip count,
	// and rtReservation delays the persister's wake-up (rtproxy.go): together they
	// keep its trips out of the next request's window.
	rtGap         = 120 * time.Millisecond
	rtReservation = 40 * time.Millisecond
	// outageMoneyRate and outageCheckRate are the outage's offered load.
	outageMoneyRate = 200
	outageCheckRate = 200
	// outboxCopies is the scratch stream's length for the bytes per entry.
	outboxCopies = 10_000
)

// HotPathResult is the pg-outage scenario's outcome.
type HotPathResult struct {
	Setting    string         `json:"setting"`
	RoundTrips []RoundTripRun `json:"round_trips"`
	Storage    *PGStorage     `json:"postgres_storage,omitempty"`
	Outage     *OutageResult  `json:"postgres_outage,omitempty"`
	Outbox     *OutboxBudget  `json:"outbox_budget,omitempty"`
	Error      string         `json:"error,omitempty"`
}

// RoundTripRun is the trips each request of one kind made, one request at
// a time.
type RoundTripRun struct {
	Scenario string `json:"scenario"`
	Requests int    `json:"requests"`
	Failed   int    `json:"failed"`
	// RedisMedian and PostgresMedian are the median request's trips,
	// background loops' trips left out; the mean and max show the spread
	// (a cache refill, a new pooled connection).
	RedisMedian    float64 `json:"redis_median"`
	PostgresMedian float64 `json:"postgres_median"`
	RedisMean      float64 `json:"redis_mean"`
	PostgresMean   float64 `json:"postgres_mean"`
	RedisMax       int64   `json:"redis_max"`
	PostgresMax    int64   `json:"postgres_max"`
	// WithPostgres is the requests whose window saw a Postgres trip not
	// of the background loops.
	WithPostgres int `json:"requests_with_postgres"`
	// BackgroundRedis and BackgroundPostgres are the background loops'
	// trips per window (backgroundTrip), counted apart from the above.
	BackgroundRedis    float64 `json:"background_redis_per_window"`
	BackgroundPostgres float64 `json:"background_postgres_per_window"`
	// Redis and Postgres name the trips seen in the windows, by what they
	// sent, with how many per request.
	Redis    []TripKind `json:"redis_trips"`
	Postgres []TripKind `json:"postgres_trips"`
}

// TripKind is one kind of trip and how often a request's window held it.
type TripKind struct {
	Sent       string  `json:"sent"`
	PerRequest float64 `json:"per_request"`
}

// backgroundTrip says whether a trip is one only creditd's background
// loops make, never a request: the persister's stream reads, claims and
// acknowledgements (lua/outbox.go), INFO, a connection ping, its group
// transaction (persist/persister.go, fenced by credit_outbox_fence),
// webhook delivery, and outbox partition leases in Redis and Postgres
// (persist/owners.go). Their loops run
// on their own clocks, so some land in a request's window; they are
// counted apart, by name, not left out of the report.
func backgroundTrip(postgres bool, head string) bool {
	if !postgres {
		f := strings.Fields(head)
		if len(f) == 0 {
			return false
		}
		if f[0] == "MULTI" && len(f) > 1 {
			f = f[1:] // the persister acknowledges a group in a MULTI block
		}
		// The outbox partitions' owner leases and the persisters' roll
		// (persist/owners.go) are scripts on keys no request touches.
		if f[0] == "EVALSHA" && len(f) > 1 {
			k := strings.TrimSuffix(f[1], "}")
			if strings.HasSuffix(k, ":owner") || strings.HasSuffix(k, ":persisters") {
				return true
			}
		}
		switch f[0] {
		case "XREADGROUP", "XAUTOCLAIM", "XACK", "XDEL", "XTRIM", "XPENDING", "XCLAIM", "INFO", "PING":
			return true
		}
		return false
	}
	return head == "--" || strings.Contains(head, "credit_outbox_fence") || strings.Contains(head, "webhook_events") ||
		strings.Contains(head, "outbox_leases")
}

// requestTrips counts the heads that are not background trips.
func requestTrips(postgres bool, heads []string) int64 {
	var n int64
	for _, h := range heads {
		if !backgroundTrip(postgres, h) {
			n++
		}
	}
	return n
}

// tripKinds counts heads per request, most first.
func tripKinds(heads []string, requests int) []TripKind {
	if requests == 0 {
		return nil
	}
	n := map[string]int{}
	for _, h := range heads {
		n[h]++
	}
	var out []TripKind
	for h, c := range n {
		out = append(out, TripKind{Sent: h, PerRequest: float64(c) / float64(requests)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PerRequest != out[j].PerRequest {
			return out[i].PerRequest > out[j].PerRequest
		}
		return out[i].Sent < out[j].Sent
	})
	return out
}

// tripText is kinds as "SENT xN.NN" text.
func tripText(kinds []TripKind) string {
	var out []string
	for _, k := range kinds {
		out = append(out, fmt.Sprintf("%s x%.2f", k.Sent, k.PerRequest))
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}

// PGStorage is what Postgres keeps and writes per consume.
type PGStorage struct {
	Consumes        int64         `json:"consumes"`
	Rate            float64       `json:"achieved_rate"`
	Errors          string        `json:"errors"`
	BytesBefore     int64         `json:"bytes_before"`
	BytesAfter      int64         `json:"bytes_after"`
	BytesPerConsume float64       `json:"bytes_per_consume"`
	RowsPerConsume  float64       `json:"rows_written_per_consume"`
	Tables          []TableGrowth `json:"tables"`
	DrainSeconds    float64       `json:"drain_seconds"`
	Error           string        `json:"error,omitempty"`
}

// TableGrowth is one table's bytes (with its indexes and TOAST) and rows
// written (inserted + updated) per consume.
type TableGrowth struct {
	Name    string  `json:"name"`
	Bytes   float64 `json:"bytes_per_consume"`
	Written float64 `json:"rows_written_per_consume"`
}

// OutageResult is the Postgres outage under load.
type OutageResult struct {
	Planned float64 `json:"planned_seconds"`
	Down    float64 `json:"down_seconds"`
	Quick   bool    `json:"quick"`
	// Money and Checks are the answers to requests sent while Postgres was
	// down.
	Money  OutageCalls `json:"money"`
	Checks OutageCalls `json:"checks"`
	// RecoverSeconds is how long the persister took to drain once
	// Postgres was back.
	RecoverSeconds float64 `json:"recover_seconds"`
	// Ledger is every metric's ledger rows against the acknowledged ops of
	// the scenario's stack (seeding, round trips, storage and outage).
	Ledger      *LedgerCheck `json:"ledger,omitempty"`
	ExactlyOnce bool         `json:"exactly_once"`
	LedgerNote  string       `json:"ledger_note"`
	// OutboxEntries and RedisBytes are the outbox streams' growth in
	// entries and INFO used_memory's growth over the outage.
	OutboxEntries int64  `json:"outbox_entries_added"`
	RedisBytes    int64  `json:"redis_used_memory_added"`
	Error         string `json:"error,omitempty"`
}

// OutageCalls counts answers by kind.
type OutageCalls struct {
	Sent     int64   `json:"sent"`
	OK       int64   `json:"ok_2xx"`
	S503     int64   `json:"status_503"`
	Other5xx int64   `json:"other_5xx"`
	Other    int64   `json:"other"` // 4xx, timeouts, resets
	NotSent  int64   `json:"not_sent"`
	Errors   string  `json:"errors"`
	P99MS    float64 `json:"p99_ms"`
}

// OutboxBudget is how long an outage Redis can absorb.
type OutboxBudget struct {
	EntryBytes    float64 `json:"bytes_per_outbox_entry"`
	Copies        int     `json:"copies"`
	SampleBytes   int     `json:"sample_entry_json_bytes"`
	Rate          float64 `json:"consume_rate"`
	RateSource    string  `json:"rate_source"`
	SecondsPerGiB float64 `json:"seconds_per_gib_of_headroom"`
	Error         string  `json:"error,omitempty"`
}

// outcomeOf sorts a run's answers: 2xx, 503, other 5xx, and the rest
// ("late" jobs were never sent).
func outcomeOf(r RunResult) OutageCalls {
	c := OutageCalls{OK: r.OK, Errors: r.ErrorSummary(), P99MS: r.Latency.P99}
	for k, v := range r.Errors {
		switch n, err := strconv.Atoi(k); {
		case k == "late":
			c.NotSent += v
		case err == nil && n == 503:
			c.S503 += v
		case err == nil && n >= 500:
			c.Other5xx += v
		default:
			c.Other += v
		}
	}
	c.Sent = c.OK + c.S503 + c.Other5xx + c.Other
	return c
}

// share is part over whole in percent (0 when whole is 0).
func share(part, whole int64) float64 {
	if whole <= 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// median is xs' median (0 for none).
func median(xs []int64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]int64(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return float64(s[len(s)/2])
	}
	return float64(s[len(s)/2-1]+s[len(s)/2]) / 2
}

// outageSeconds is how long Redis absorbs an outage with headroom bytes
// free, entryBytes per outbox entry and rate entries per second.
func outageSeconds(headroom, entryBytes, rate float64) float64 {
	if entryBytes <= 0 || rate <= 0 {
		return 0
	}
	return headroom / (entryBytes * rate)
}

// hotPath runs the scenario and stores its result; a failure is reported,
// not fatal to the rest of the bench.
func (b *Bench) hotPath(ctx context.Context) {
	r := &HotPathResult{}
	b.res.HotPath = r
	t0 := time.Now()
	if err := b.hotPathRun(ctx, r); err != nil {
		r.Error = err.Error()
		logf("pg-outage: %v", err)
	}
	logf("pg-outage: done in %.0fs", time.Since(t0).Seconds())
}

func (b *Bench) hotPathRun(ctx context.Context, r *HotPathResult) error {
	pg, err := pgserver.New(ctx, 100)
	defer pg.Remove()
	if err != nil {
		return fmt.Errorf("private postgres: %w", err)
	}
	rs, err := startPrivateRedis(ctx, filepath.Join(b.tmp, "redis-outage.log"))
	if err != nil {
		return err
	}
	defer rs.Stop()
	dbURL, err := createDatabase(ctx, pg.URL(), "creditd")
	if err != nil {
		return err
	}
	rp, err := startRTProxy(rs.Addr, false)
	if err != nil {
		return err
	}
	defer rp.Close()
	pp, err := startRTProxy("127.0.0.1:"+strconv.Itoa(pg.Port), true)
	if err != nil {
		return err
	}
	defer pp.Close()
	proxiedDB, err := url.Parse(dbURL)
	if err != nil {
		return err
	}
	proxiedDB.Host = pp.Addr()

	addr, err := freeAddr()
	if err != nil {
		return err
	}
	prefix := b.prefix + "o"
	redisURL := "redis://" + rs.Addr + "/0"
	start := func(name, redisURL, dbURL string) (*Proc, error) {
		return startProc(name, b.bin, []string{"serve"}, creditdEnv(redisURL, dbURL, prefix, addr, "bench-outage"),
			addr, filepath.Join(b.tmp, name+".log"))
	}
	cd, err := start("creditd-proxied", "redis://"+rp.Addr()+"/0", proxiedDB.String())
	if err != nil {
		return err
	}
	defer func() { cd.Stop() }()
	r.Setting = fmt.Sprintf("internal/pgserver's private Postgres (fsync=off, as make chaos's), a private redis-server (no persistence), "+
		"a creditd of its own on them, %d customers with 3 blocks each seeded through the API", hotPathCustomers)
	logf("pg-outage: private Postgres on port %d, redis-server %s, creditd on %s", pg.Port, rs.Addr, addr)

	w := *b
	w.res = &Results{}
	w.o.Customers = hotPathCustomers
	w.o.Scenarios = []string{"consume"}
	w.rdb, w.prefix, w.addr, w.dbURL, w.redisURL, w.pprofAddr = rs.rdb, prefix, addr, dbURL, redisURL, ""
	w.probe = &CPUProbe{Extra: map[string]int{}}
	if w.pg, err = pgx.Connect(ctx, dbURL); err != nil {
		return err
	}
	defer func() { w.pg.Close(context.Background()) }()
	if err := w.seed(ctx); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	if _, errText := w.waitDrained(ctx, time.Minute); errText != "" {
		return fmt.Errorf("after seeding: %s", errText)
	}
	sc := w.target.scenarios()
	for _, name := range []string{"consume", "check"} {
		run := w.roundTrips(ctx, name, sc[name](false).op, rp, pp)
		r.RoundTrips = append(r.RoundTrips, run)
		logf("pg-outage: %s round trips (median of %d): Redis %.1f, Postgres %.1f (means %.2f, %.2f)",
			name, run.Requests, run.RedisMedian, run.PostgresMedian, run.RedisMean, run.PostgresMean)
	}
	// The rest talks to its servers directly: the outage must look to
	// creditd as a stopped Postgres does (connections refused), not as a
	// proxy that accepts and hangs up.
	cd.Stop()
	direct, err := start("creditd-outage", redisURL, dbURL)
	if err != nil {
		return err
	}
	cd = direct
	if ctx.Err() == nil {
		r.Storage = w.pgStorage(ctx)
	}
	if ctx.Err() == nil {
		r.Outbox = w.outboxBudget(ctx, b.res)
	}
	if ctx.Err() == nil {
		r.Outage = w.pgOutage(ctx, pg)
	}
	return nil
}

// roundTrips sends requests of op one at a time and counts each one's
// trips to Redis and Postgres through the proxies.
func (b *Bench) roundTrips(ctx context.Context, name string, op opFunc, rp, pp *rtProxy) RoundTripRun {
	n := 100
	if b.o.Quick {
		n = 60
	}
	out := RoundTripRun{Scenario: name}
	g := NewGenerator(b.addr, 4)
	// Warm: connections open, scripts loaded, every customer's caches
	// filled (1,000 ops over 200 customers).
	_ = g.Run(ctx, 500, 2*time.Second, op)
	time.Sleep(300 * time.Millisecond)
	wk := &worker{hc: g.hc, req: fasthttp.AcquireRequest(), resp: fasthttp.AcquireResponse()}
	defer fasthttp.ReleaseRequest(wk.req)
	defer fasthttp.ReleaseResponse(wk.resp)
	rp.reservationBlocking.Store(int64(rtReservation))
	defer rp.reservationBlocking.Store(0)
	rp.record.Store(true)
	pp.record.Store(true)
	defer rp.record.Store(false)
	defer pp.record.Store(false)
	var rd, pd []int64
	var rh, ph []string
	for i := 0; i < n && ctx.Err() == nil; i++ {
		r0, p0 := rp.Trips(), pp.Trips()
		st, err := op(wk, opSeq.Add(1))
		r1, p1 := rp.Trips(), pp.Trips()
		if err != nil || st < 200 || st > 299 {
			out.Failed++
		} else {
			rw, pw := rp.Heads(r0, r1), pp.Heads(p0, p1)
			rq, pq := requestTrips(false, rw), requestTrips(true, pw)
			rd, pd = append(rd, rq), append(pd, pq)
			rh, ph = append(rh, rw...), append(ph, pw...)
			out.BackgroundRedis += float64(r1 - r0 - rq)
			out.BackgroundPostgres += float64(p1 - p0 - pq)
			if pq > 0 {
				out.WithPostgres++
			}
		}
		time.Sleep(rtGap)
	}
	out.Requests = len(rd)
	if out.Requests > 0 {
		out.BackgroundRedis /= float64(out.Requests)
		out.BackgroundPostgres /= float64(out.Requests)
	}
	out.Redis, out.Postgres = tripKinds(rh, len(rd)), tripKinds(ph, len(pd))
	out.RedisMedian, out.PostgresMedian = median(rd), median(pd)
	for i := range rd {
		out.RedisMean += float64(rd[i]) / float64(len(rd))
		out.PostgresMean += float64(pd[i]) / float64(len(pd))
		out.RedisMax, out.PostgresMax = max(out.RedisMax, rd[i]), max(out.PostgresMax, pd[i])
	}
	return out
}

// relSizes is every user relation's total size (indexes and TOAST
// included) by table.
func relSizes(ctx context.Context, conn *pgx.Conn) (map[string]int64, error) {
	rows, err := conn.Query(ctx, `SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c
		JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'm', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var name string
		var size int64
		if err := rows.Scan(&name, &size); err != nil {
			return nil, err
		}
		out[name] = size
	}
	return out, rows.Err()
}

// pgStorage runs storageConsumes consumes and measures Postgres's growth.
func (b *Bench) pgStorage(ctx context.Context) *PGStorage {
	out := &PGStorage{}
	snap := func() (map[string]int64, PGStats, error) {
		if _, errText := b.waitDrained(ctx, 3*time.Minute); errText != "" {
			return nil, PGStats{}, errors.New(errText)
		}
		// Backends report their counters about once a second.
		time.Sleep(1500 * time.Millisecond)
		if _, err := b.pg.Exec(ctx, "CHECKPOINT"); err != nil {
			return nil, PGStats{}, err
		}
		sizes, err := relSizes(ctx, b.pg)
		return sizes, pgStats(ctx, b.pg), err
	}
	s0, st0, err := snap()
	if err != nil {
		out.Error = err.Error()
		return out
	}
	// Chunks until storageConsumes are acknowledged: on a busy box a
	// fixed-rate run of their number falls short (queued ops go "late").
	g := NewGenerator(b.addr, b.o.Workers)
	op := b.target.scenarios()["consume"](false).op
	rate := float64(storageRate)
	var secs float64
	errs := map[string]int64{}
	for t0 := time.Now(); out.Consumes < storageConsumes && time.Since(t0) < storageLimit && ctx.Err() == nil; {
		left := float64(storageConsumes - out.Consumes)
		res := g.Run(ctx, rate, time.Duration(min(left/rate, 5)*float64(time.Second))+time.Millisecond, op)
		out.Consumes += res.OK
		secs += res.Seconds
		for k, v := range res.Errors {
			errs[k] += v
		}
		if res.ErrorRate > 0.01 {
			rate = max(rate/2, 100)
		}
	}
	out.Errors = RunResult{Errors: errs}.ErrorSummary()
	if secs > 0 {
		out.Rate = float64(out.Consumes) / secs
	}
	t0 := time.Now()
	s1, st1, err := snap()
	out.DrainSeconds = time.Since(t0).Seconds()
	if err != nil {
		out.Error = err.Error()
		return out
	}
	if out.Consumes == 0 {
		out.Error = "no consume acknowledged: " + out.Errors
		return out
	}
	n := float64(out.Consumes)
	d := st1.sub(st0, n)
	written := map[string]float64{}
	for _, t := range d.Tables {
		written[t.Name] = t.Inserted + t.Updated
		out.RowsPerConsume += t.Inserted + t.Updated
	}
	for name, v := range s1 {
		out.BytesAfter += v
		out.BytesBefore += s0[name]
		if g := float64(v-s0[name]) / n; g != 0 || written[name] != 0 {
			out.Tables = append(out.Tables, TableGrowth{Name: name, Bytes: g, Written: written[name]})
		}
	}
	sort.Slice(out.Tables, func(i, j int) bool { return out.Tables[i].Bytes > out.Tables[j].Bytes })
	out.BytesPerConsume = float64(out.BytesAfter-out.BytesBefore) / n
	logf("pg-outage: storage: %d consumes, %.0f B and %.2f rows written per consume", out.Consumes, out.BytesPerConsume, out.RowsPerConsume)
	return out
}

// outboxKeys lists the prefix's outbox streams.
func (b *Bench) outboxKeys(ctx context.Context) []string {
	var keys []string
	iter := b.rdb.Scan(ctx, 0, "{"+b.prefix+":p*}:outbox", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	return keys
}

// outboxLen is the outbox streams' entries, summed.
func (b *Bench) outboxLen(ctx context.Context) int64 {
	var n int64
	for _, k := range b.outboxKeys(ctx) {
		l, _ := b.rdb.XLen(ctx, k).Result()
		n += l
	}
	return n
}

// outboxBudget catches a real consume's outbox entry during a burst (the
// persister deletes entries once applied, so one is caught only while it
// waits), stores outboxCopies copies of it in a scratch stream and reads
// the stream's MEMORY USAGE per entry; main is the run's results, whose
// consume scenario's max is the rate.
func (b *Bench) outboxBudget(ctx context.Context, main *Results) *OutboxBudget {
	out := &OutboxBudget{Copies: outboxCopies}
	keys := b.outboxKeys(ctx)
	if len(keys) == 0 {
		out.Error = "no outbox stream of the prefix"
		return out
	}
	g := NewGenerator(b.addr, b.o.Workers)
	entry, burst := b.catchConsumeEntry(ctx, keys, func() RunResult {
		return g.Run(ctx, 1000, 2*time.Second, b.target.scenarios()["consume"](false).op)
	})
	if entry == "" {
		out.Error = fmt.Sprintf("no consume outbox entry caught during a burst (%d acknowledged)", burst.OK)
		return out
	}
	out.SampleBytes = len(entry)
	// The scratch stream shares the outbox's hash tag, so it is sized as
	// one of them is, on the same server.
	scratch := strings.TrimSuffix(keys[0], ":outbox") + ":outbox-copy"
	defer b.rdb.Del(context.WithoutCancel(ctx), scratch)
	for i := 0; i < outboxCopies; i += 500 {
		p := b.rdb.Pipeline()
		for k := i; k < min(i+500, outboxCopies); k++ {
			p.Do(ctx, "XADD", scratch, "*", "m", entry)
		}
		if _, err := p.Exec(ctx); err != nil {
			out.Error = err.Error()
			return out
		}
	}
	used, err := b.rdb.Do(ctx, "MEMORY", "USAGE", scratch, "SAMPLES", "0").Int64()
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.EntryBytes = float64(used) / outboxCopies
	out.Rate, out.RateSource = burst.Achieved, "this scenario's burst (no consume scenario in the run)"
	if s := main.scenario("consume"); s != nil && s.Max > 0 {
		out.Rate, out.RateSource = s.Max, "the consume scenario's max in this run"
	}
	out.SecondsPerGiB = outageSeconds(1<<30, out.EntryBytes, out.Rate)
	logf("pg-outage: outbox entry %.0f B in Redis (JSON %d B); at %.0f consumes/s a GiB of headroom absorbs %.0f s", out.EntryBytes, out.SampleBytes, out.Rate, out.SecondsPerGiB)
	return out
}

// moneyMix is the outage's money load: 60 % consumes, 15 % gauge
// increments, 15 % reservation create + commit, 10 % usage calls of 10
// events.
func (t *Target) moneyMix() opFunc {
	consume, gauge, reserve, usage := t.consume(false), t.gauge(false), t.reserve(false), t.usage(false)
	return func(w *worker, seq uint64) (int, error) {
		switch r := (seq * 0xC2B2AE3D27D4EB4F >> 32) % 100; {
		case r < 60:
			return consume(w, seq)
		case r < 75:
			return gauge(w, seq)
		case r < 90:
			return reserve(w, seq)
		default:
			return usage(w, seq)
		}
	}
}

// pgOutage stops pg under money load and checks, starts it again, waits
// for the persister and compares the ledger with what was acknowledged.
func (b *Bench) pgOutage(ctx context.Context, pg *pgserver.Server) *OutageResult {
	d := 60 * time.Second
	if b.o.Quick {
		d = 15 * time.Second
	}
	out := &OutageResult{Planned: d.Seconds(), Quick: b.o.Quick}
	if _, errText := b.waitDrained(ctx, 3*time.Minute); errText != "" {
		out.Error = errText
		return out
	}
	sc := b.target.scenarios()
	money, checks := NewGenerator(b.addr, b.o.Workers), NewGenerator(b.addr, b.o.Workers)
	// Warm both paths so every customer's state and the caches are as a
	// running service has them.
	_ = money.Run(ctx, outageMoneyRate, time.Second, b.target.moneyMix())
	_ = checks.Run(ctx, outageCheckRate, time.Second, sc["check"](false).op)
	if _, errText := b.waitDrained(ctx, time.Minute); errText != "" {
		out.Error = errText
		return out
	}
	mem0, _ := redisUsedMemory(ctx, b.rdb)
	len0 := b.outboxLen(ctx)
	logf("pg-outage: Postgres stopped (immediate) for %s under %d money ops/s and %d checks/s", d, outageMoneyRate, outageCheckRate)
	pg.Stop()
	stopped := time.Now()
	var mr, cr RunResult
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); mr = money.Run(ctx, outageMoneyRate, d, b.target.moneyMix()) }()
	go func() { defer wg.Done(); cr = checks.Run(ctx, outageCheckRate, d, sc["check"](false).op) }()
	wg.Wait()
	// Every answer counted came while Postgres was down: Run returns once
	// its last request is answered, and Postgres starts after.
	if rest := d - time.Since(stopped); rest > 0 {
		time.Sleep(rest)
	}
	mem1, _ := redisUsedMemory(ctx, b.rdb)
	out.OutboxEntries, out.RedisBytes = b.outboxLen(ctx)-len0, mem1-mem0
	out.Money, out.Checks = outcomeOf(mr), outcomeOf(cr)
	err := pg.Start(ctx)
	out.Down = time.Since(stopped).Seconds()
	logf("pg-outage: down %.1f s; money %d sent, %.1f %% 2xx, %.1f %% 503, %d other 5xx; checks %d sent, %.1f %% 2xx",
		out.Down, out.Money.Sent, share(out.Money.OK, out.Money.Sent), share(out.Money.S503, out.Money.Sent), out.Money.Other5xx,
		out.Checks.Sent, share(out.Checks.OK, out.Checks.Sent))
	if err != nil {
		out.Error = "postgres did not start again: " + err.Error()
		return out
	}
	t0 := time.Now()
	if _, errText := b.waitDrained(ctx, 3*time.Minute); errText != "" {
		out.Error = "after the outage: " + errText
	}
	out.RecoverSeconds = time.Since(t0).Seconds()
	// The bench's connection died with the server.
	b.pg.Close(context.Background())
	if c, err := pgx.Connect(ctx, b.dbURL); err == nil {
		b.pg = c
	}
	b.ledger(ctx)
	out.Ledger = b.res.Ledger
	out.ExactlyOnce, out.LedgerNote = exactlyOnce(out.Ledger)
	logf("pg-outage: ledger: %s", out.LedgerNote)
	return out
}

// exactlyOnce judges a ledger check: every metric's rows are distinct ops
// (none twice), at least every acknowledged op is there, and at most the
// acknowledged plus the ambiguous (no answer: outcome unknown) ones.
func exactlyOnce(lc *LedgerCheck) (bool, string) {
	if lc == nil {
		return false, "not checked"
	}
	if lc.Error != "" {
		return false, "ledger check failed: " + lc.Error
	}
	ok := true
	var notes []string
	for _, row := range lc.Rows {
		if row.Acknowledged == nil {
			continue
		}
		ack := *row.Acknowledged
		good := row.Rows == row.Ops && row.Rows >= ack && row.Rows <= ack+lc.Ambiguous
		ok = ok && good
		notes = append(notes, fmt.Sprintf("%s: %d rows, %d distinct ops, %d acknowledged%s", row.Metric, row.Rows, row.Ops, ack,
			map[bool]string{true: "", false: " (NOT exactly once)"}[good]))
	}
	if len(notes) == 0 {
		return false, "no acknowledged ledger-writing op"
	}
	return ok, fmt.Sprintf("%s; %d calls without an answer", strings.Join(notes, "; "), lc.Ambiguous)
}

// catchConsumeEntry runs burst while another goroutine reads the tails of
// the outbox streams keys, and returns the longest consume Mutation it saw:
// the persister deletes an entry once applied, so one is caught only while
// it waits.
func (b *Bench) catchConsumeEntry(ctx context.Context, keys []string, burst func() RunResult) (string, RunResult) {
	var entry string
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			for _, k := range keys {
				msgs, err := b.rdb.XRevRangeN(ctx, k, "+", "-", 4).Result()
				if err != nil {
					continue
				}
				for _, m := range msgs {
					if v, ok := m.Values["m"].(string); ok && strings.Contains(v, `"kind":"consume"`) && len(v) > len(entry) {
						entry = v
					}
				}
			}
		}
	}()
	sum := burst()
	close(done)
	wg.Wait()
	return entry, sum
}
