package main

import (
	"strings"
	"testing"
)

// TestGoals27: issue 27's rows are met or missed by the edge scenario's
// figures against their goals, a missed change misses the propagation row
// whatever its p99, and the local consume rows stay not measured.
func TestGoals27(t *testing.T) {
	t.Parallel()
	verdict := func(r *Results, name string) string {
		for _, g := range r.Goals27 {
			if strings.HasPrefix(g.Name, name) {
				if g.Met == nil {
					return "not measured"
				}
				return map[bool]string{true: "met", false: "missed"}[*g.Met]
			}
		}
		return "absent"
	}
	cases := []struct {
		name                string
		edge                *EdgeResult
		check, rate, spread string
	}{
		{"not run", nil, "not measured", "not measured", "not measured"},
		{"within every goal", &EdgeResult{Checks: 10, P99NS: 5000, OneCPUPerSecond: 1e6, All: EdgePropagation{N: 100, P99MS: 250}},
			"met", "met", "met"},
		{"past every goal", &EdgeResult{Checks: 10, P99NS: 5001, OneCPUPerSecond: 999_999, All: EdgePropagation{N: 100, P99MS: 250.5}},
			"missed", "missed", "missed"},
		{"an answer not from memory voids the p99", &EdgeResult{Checks: 10, P99NS: 100, NotMemory: 1, OneCPUPerSecond: 2e6, All: EdgePropagation{N: 100, P99MS: 10}},
			"missed", "met", "met"},
		{"a change never seen", &EdgeResult{Checks: 10, P99NS: 100, OneCPUPerSecond: 2e6, All: EdgePropagation{N: 100, Missed: 1, P99MS: 10}},
			"met", "met", "missed"},
		{"setup failed", &EdgeResult{Error: "setup: boom"}, "missed", "missed", "missed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &Results{Edge: tc.edge}
			r.computeGoals27()
			if len(r.Goals27) != 6 {
				t.Fatalf("%d rows, want issue 27's 6", len(r.Goals27))
			}
			for _, row := range []struct{ name, want string }{
				{"local check p99", tc.check}, {"local checks per core", tc.rate}, {"propagation", tc.spread},
				{"local consume throughput", "not measured"}, {"server CPU per locally consumed unit", "not measured"}, {"books after", "not measured"},
			} {
				if got := verdict(r, row.name); got != row.want {
					t.Errorf("%s: %s, want %s", row.name, got, row.want)
				}
			}
		})
	}
}

// TestQuantile: nearest rank, so a p99 over 100 changes is the 99th
// slowest, not an interpolation below it.
func TestQuantile(t *testing.T) {
	t.Parallel()
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i)
	}
	for _, tc := range []struct{ q, want float64 }{{0.5, 50}, {0.99, 99}, {1, 100}, {0.001, 1}} {
		if got := quantile(xs, tc.q); got != tc.want {
			t.Errorf("q %g: %g, want %g", tc.q, got, tc.want)
		}
	}
	if quantile(nil, 0.99) != 0 {
		t.Error("no values: want 0")
	}
}
