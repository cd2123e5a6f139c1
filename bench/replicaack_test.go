package main

import (
	"strings"
	"testing"
)

func TestReplicaAckGoal(t *testing.T) {
	run := func(acks string, max, p50 float64, ok int64, creditdCPU float64, atRate float64) ReplicaAckRun {
		return ReplicaAckRun{Acks: acks, AtRate: atRate, Result: ScenarioResult{Max: max,
			Run: &RunResult{OK: ok, Latency: Latency{P50: p50, P99: 10 * p50}}, CPU: CPUSample{"creditd": creditdCPU}}}
	}
	full := &ReplicaAckResult{Runs: []ReplicaAckRun{run("0", 4000, 2, 1000, 0.3, 0), run("1", 3000, 3, 1000, 0.4, 0), run("0", 0, 1.5, 1000, 0.2, 2100)}}
	noLatency := &ReplicaAckResult{Runs: []ReplicaAckRun{run("0", 4000, 2, 1000, 0.3, 0), {Acks: "1"}, run("0", 0, 1.5, 1000, 0.2, 2100)}}
	tests := []struct {
		name     string
		r        *ReplicaAckResult
		measured bool
		want     []string
	}{
		{"not run", nil, false, []string{"not measured"}},
		{"failed", &ReplicaAckResult{Error: "replica not online"}, false, []string{"failed: replica not online"}},
		{"acks-on run missing", noLatency, false, []string{"not measured"}},
		// Latency and CPU against the equal-rate run (p50 1.5, 200 µs),
		// throughput against the ramped acks-off run.
		{"measured", full, true, []string{"max 3000 vs 4000 consumes/s (x0.75)", "at 2100/s p50 3.000 vs 1.500 ms (+1.500)", "CPU 400 vs 200 µs per consume (x2.00)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			now, measured := replicaAckGoal(tc.r)
			if measured != tc.measured {
				t.Errorf("measured = %v, want %v (%s)", measured, tc.measured, now)
			}
			for _, w := range tc.want {
				if !strings.Contains(now, w) {
					t.Errorf("now = %q, want it to contain %q", now, w)
				}
			}
		})
	}
}
