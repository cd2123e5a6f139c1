package main

import (
	"strings"
	"testing"
)

// TestGoals28 evaluates issue 28's row from fixtures: the ratio of the
// controlled consume's CPU to the plain one's, never met while parent
// pools are not built, and "not measured" without either scenario.
func TestGoals28(t *testing.T) {
	plain := ScenarioResult{Name: "consume", Run: &RunResult{OK: 1000, Seconds: 1}, CPU: CPUSample{"creditd": 0.1, "redis-server": 0.05, "postgres": 0.05}}
	ctl := ScenarioResult{Name: scenarioControlled, Run: &RunResult{OK: 1000, Seconds: 1}, CPU: CPUSample{"creditd": 0.11, "redis-server": 0.06, "postgres": 0.05}}
	dear := ScenarioResult{Name: scenarioControlled, Run: &RunResult{OK: 1000, Seconds: 1}, CPU: CPUSample{"creditd": 0.13, "redis-server": 0.06, "postgres": 0.05}}
	for _, tc := range []struct {
		name      string
		scenarios []ScenarioResult
		wantNow   string
		wantMet   *bool
	}{
		{"within 15 %", []ScenarioResult{plain, ctl}, "1.10x", boolp(true)},
		{"past 15 %", []ScenarioResult{plain, dear}, "1.20x", boolp(false)},
		{"controlled missing", []ScenarioResult{plain}, "not measured", nil},
		{"plain missing", []ScenarioResult{ctl}, "not measured", nil},
		// The twin at the same rate decides, whatever the 70 % run says.
		{"twin within 15 %", []ScenarioResult{plain, withTwin(dear, 0.13, 0.06, 0.05)}, "1.00x", boolp(true)},
		{"twin past 15 %", []ScenarioResult{plain, withTwin(ctl, 0.08, 0.04, 0.04)}, "1.38x", boolp(false)},
		{"twin alone", []ScenarioResult{withTwin(ctl, 0.1, 0.05, 0.05)}, "1.10x", boolp(true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Results{Scenarios: tc.scenarios}
			r.computeGoals28()
			if len(r.Goals28) != 1 {
				t.Fatalf("%d rows, want 1", len(r.Goals28))
			}
			g := r.Goals28[0]
			if !strings.HasPrefix(g.Now, tc.wantNow) || (g.Met == nil) != (tc.wantMet == nil) || (g.Met != nil && *g.Met != *tc.wantMet) {
				t.Errorf("row %q met %v, want %q... met %v", g.Now, g.Met, tc.wantNow, tc.wantMet)
			}
		})
	}
}

// withTwin is s with a plain twin run of 1000 ops that used these CPU
// seconds.
func withTwin(s ScenarioResult, creditd, redis, postgres float64) ScenarioResult {
	s.PlainTwin = &TwinRun{Scenario: "consume", Run: RunResult{OK: 1000, Seconds: 1},
		CPU: CPUSample{"creditd": creditd, "redis-server": redis, "postgres": postgres}}
	return s
}
