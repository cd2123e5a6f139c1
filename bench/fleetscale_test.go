package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestFleetCPU: CPU per op sums processes by kind, names the busiest
// master's share, and above idle takes off each process's idle rate over
// the run's length (never below zero).
func TestFleetCPU(t *testing.T) {
	run := FleetRun{Run: &RunResult{OK: 1000, Seconds: 2}, CPU: CPUSample{
		"creditd 1": 0.2, "creditd 2": 0.1, "redis master 1": 0.09, "redis master 2": 0.03, "redis master 3": 0.03,
		"redis replica 4": 0.02, "postgres": 0.05, "bench (load generator)": 0.04, otherKey: 0.5,
	}}
	count := FleetCount{Idle: CPUSample{"creditd 1": 0.05, "creditd 2": 0.05, "postgres": 0.1, "redis master 1": 0}}
	for _, tc := range []struct {
		name string
		got  func() (fleetCPU, bool)
		want fleetCPU
	}{
		{"per op", run.cpu, fleetCPU{creditd: 300, masters: 150, replicas: 20, postgres: 50, gen: 40, other: 500, hottestMaster: 0.6}},
		// creditd: 0.3 s - 2 s x 0.1 s/s = 0.1 s; Postgres: 0.05 - 0.2 < 0 -> 0.
		{"above idle", func() (fleetCPU, bool) { return count.aboveIdle(run) }, fleetCPU{creditd: 100, masters: 150, replicas: 20, postgres: 0, gen: 40, other: 500, hottestMaster: 0.6}},
	} {
		got, ok := tc.got()
		if !ok {
			t.Fatalf("%s: not ok", tc.name)
		}
		for _, f := range []struct {
			field     string
			got, want float64
		}{{"creditd", got.creditd, tc.want.creditd}, {"masters", got.masters, tc.want.masters}, {"replicas", got.replicas, tc.want.replicas},
			{"postgres", got.postgres, tc.want.postgres}, {"gen", got.gen, tc.want.gen}, {"other", got.other, tc.want.other},
			{"hottest master", got.hottestMaster, tc.want.hottestMaster}} {
			if math.Abs(f.got-f.want) > 1e-6 {
				t.Errorf("%s: %s = %v, want %v", tc.name, f.field, f.got, f.want)
			}
		}
	}
	if _, ok := (FleetRun{}).cpu(); ok {
		t.Error("a run that did not happen has a CPU per op")
	}
}

// TestFleetCounts: a run measures every node count from 1, a quick one the
// two ends.
func TestFleetCounts(t *testing.T) {
	for _, tc := range []struct {
		quick bool
		want  string
	}{{false, "[1 2 3]"}, {true, "[1 3]"}} {
		if got := fmt.Sprint(fleetCounts(tc.quick)); got != tc.want {
			t.Errorf("fleetCounts(quick=%v) = %s, want %s", tc.quick, got, tc.want)
		}
	}
}

// TestFleetScaleGoal: the goal row names the node counts measured, not
// their number.
func TestFleetScaleGoal(t *testing.T) {
	run := func(max float64) FleetRun {
		return FleetRun{Max: max, Run: &RunResult{OK: 100, Seconds: 1}, CPU: CPUSample{"creditd 1": 0.03}}
	}
	r := &FleetScaleResult{Counts: []FleetCount{{Nodes: 1, Consume: run(1000), Check: run(9000)}, {Nodes: 3, Consume: run(800), Check: run(7000)}}}
	now, ok := fleetScaleGoal(r)
	if want := "max consumes/s with 1 / 3 nodes: 1000 / 800; checks/s: 9000 / 7000; CPU per consume at 3 nodes: creditd 300,"; !ok || !strings.HasPrefix(now, want) {
		t.Fatalf("goal row %q (ok %v), want it to start %q", now, ok, want)
	}
	if now, ok := fleetScaleGoal(&FleetScaleResult{Error: "boom"}); ok || now != "failed: boom" {
		t.Fatalf("failed run's row %q (ok %v)", now, ok)
	}
}
