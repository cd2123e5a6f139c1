package main

import (
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
	newInproc(b, 200).checkAndConsume(b, "cpu-c-", func(b *testing.B, run func()) {
		// As many requests in flight as the bench's load generator keeps
		// (128 workers), not just one per CPU.
		b.SetParallelism(64)
		b.ReportAllocs()
		b.ResetTimer()
		before := cpuTime()
		run()
		b.StopTimer()
		b.ReportMetric(float64((cpuTime()-before).Microseconds())/float64(b.N), "cpu-µs/op")
	})
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
