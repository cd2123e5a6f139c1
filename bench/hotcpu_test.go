package main

import (
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkHotCPU runs checks and consumes through the in-process handler
// (real Redis and Postgres) and reports the process's CPU per op
// (cpu-µs/op: user+system time of every thread, creditd's background work
// included) besides allocations. CPU time, unlike ns/op, holds up on a
// shared, loaded machine:
//
//	go test ./bench -run '^$' -bench HotCPU -benchtime 20000x -benchmem
func BenchmarkHotCPU(b *testing.B) {
	p := newInproc(b, 200)
	var seq atomic.Uint64
	run := func(b *testing.B, op func(n uint64) (int, []byte), want int) {
		// As many requests in flight as the bench's load generator keeps
		// (128 workers), not just one per CPU.
		b.SetParallelism(64)
		b.ReportAllocs()
		b.ResetTimer()
		before := cpuTime()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if st, raw := op(seq.Add(1)); st != want {
					b.Errorf("status %d: %s", st, raw)
					return
				}
			}
		})
		b.StopTimer()
		b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/op")
	}
	b.Run("check", func(b *testing.B) {
		run(b, func(n uint64) (int, []byte) {
			c := p.customers[n%uint64(len(p.customers))]
			return p.call("GET", "/v1/entitlements/check?customer_id="+c+"&billable_metric_key=api_calls&units=1", nil, "X-API-Key", p.key)
		}, 200)
	})
	b.Run("consume", func(b *testing.B) {
		run(b, func(n uint64) (int, []byte) {
			c := p.customers[n%uint64(len(p.customers))]
			return p.call("POST", "/v1/entitlements/consume", []byte(`{"customer_id":"`+c+`","billable_metric_key":"api_calls","units":1}`),
				"X-API-Key", p.key, "Idempotency-Key", "cpu-c-"+strconv.FormatUint(n, 10)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
		}, 200)
	})
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
