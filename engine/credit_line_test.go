package engine

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/google/uuid"
)

// TestExhaustedCrossed fixes what "exhausted" means with a credit line
// (docs/rules.md "Credit line"): what the customer may still spend, the
// effective balance plus the line, goes from > 0 to <= 0.
func TestExhaustedCrossed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                  string
		before, after, lineMC int64
		want                  bool
	}{
		{"no line: to zero", 10, 0, 0, true},
		{"no line: stays above", 10, 1, 0, false},
		{"no line: already at zero", 0, 0, 0, false},
		{"line: into debt, room left", 10, -20, 50, false},
		{"line: to minus the line", 10, -50, 50, true},
		{"line: from debt to minus the line", -20, -50, 50, true},
		{"line: already used up", -50, -50, 50, false},
		{"line: a lowered line leaves it below", -40, -45, 30, false},
		{"saturates rather than wraps", math.MinInt64, math.MinInt64, math.MaxInt64, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ExhaustedCrossed(tt.before, tt.after, tt.lineMC); got != tt.want {
				t.Fatalf("ExhaustedCrossed(%d, %d, %d) = %v, want %v", tt.before, tt.after, tt.lineMC, got, tt.want)
			}
		})
	}
}

// TestAvailableOf: the line counts under block only.
func TestAvailableOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		effective, limit int64
		policy           OveragePolicy
		want             int64
	}{
		{100, 50, OveragePolicyBlock, 150},
		{-30, 50, OveragePolicyBlock, 20},
		{100, 50, OveragePolicyAllow, 100},
		{100, 50, OveragePolicyNotify, 100},
		{math.MaxInt64, 1, OveragePolicyBlock, math.MaxInt64},
	}
	for _, tt := range tests {
		if got := AvailableOf(tt.effective, tt.limit, tt.policy); got != tt.want {
			t.Errorf("AvailableOf(%d, %d, %s) = %d, want %d", tt.effective, tt.limit, tt.policy, got, tt.want)
		}
	}
}

// TestEventsOfCreditLine: a consume that uses up the line fires
// credit.exhausted with the effective balance; one that goes into debt
// with room left fires none, and allow ignores the line.
func TestEventsOfCreditLine(t *testing.T) {
	t.Parallel()
	consume := func(before, after, lim int64, policy OveragePolicy) Mutation {
		eb := before
		return Mutation{OpID: uuid.New(), Kind: MutationConsume, Account: MutationAccount{Version: 2, Balance: after, Debt: -min(after, 0)},
			Entries:         []MutationEntry{{Role: RoleMain, Type: EntryConsumption, Delta: after - before}},
			Context:         &MutationContext{ExternalID: "x", Policy: policy, LimitMC: lim},
			EffectiveBefore: &eb, Usage: &MutationUsage{Metric: "m", Units: 1, Cost: before - after, Charged: before - after}}
	}
	exhausted := func(m Mutation) (int64, bool) {
		for _, e := range EventsOf(m) {
			if e.EventType == EventCreditExhausted {
				var env struct {
					Data ExhaustedData `json:"data"`
				}
				if err := json.Unmarshal(e.Payload, &env); err != nil {
					t.Fatal(err)
				}
				return env.Data.BalanceMC, true
			}
		}
		return 0, false
	}
	if b, ok := exhausted(consume(100, -50, 50, OveragePolicyBlock)); !ok || b != -50 {
		t.Errorf("to minus the line: exhausted %v with %d, want -50", ok, b)
	}
	if _, ok := exhausted(consume(100, -20, 50, OveragePolicyBlock)); ok {
		t.Error("into debt with room left fired credit.exhausted")
	}
	if b, ok := exhausted(consume(100, 0, 50, OveragePolicyAllow)); !ok || b != 0 {
		t.Errorf("allow to zero: exhausted %v with %d, want 0", ok, b)
	}
}

// TestLineSplit fixes the rule of a charge under block with a credit line:
// refused past minus the line; the blocks pay all they hold beyond the
// other reservations, the rest is debt.
func TestLineSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                            string
		effective, debt, held, cost, ln int64
		wantBlocks, wantDebt            int64
		wantOK                          bool
	}{
		{"no line, fits", 100, 0, 0, 100, 0, 100, 0, true},
		{"no line, short", 100, 0, 0, 101, 0, 0, 0, false},
		{"into the line", 100, 0, 0, 130, 50, 100, 30, true},
		{"past the line", 100, 0, 0, 151, 50, 0, 0, false},
		{"in debt: all on the line", -30, 30, 0, 20, 50, 0, 20, true},
		{"debt beside blocks a release freed", 50, 30, 0, 60, 100, 60, 0, true},
		{"a commit's reservation first", 20, 0, 80, 150, 50, 100, 50, true},
		{"expired blocks under a reservation, no line", -20, 0, 80, 60, 0, 60, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b, d, ok := LineSplit(tt.effective, tt.debt, tt.held, tt.cost, tt.ln)
			if ok != tt.wantOK || (ok && (b != tt.wantBlocks || d != tt.wantDebt)) {
				t.Fatalf("LineSplit = %d, %d, %v; want %d, %d, %v", b, d, ok, tt.wantBlocks, tt.wantDebt, tt.wantOK)
			}
		})
	}
}
