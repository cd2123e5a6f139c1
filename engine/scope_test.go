package engine

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestScopeKeys: applies_to is 1 to MaxScopeKeys valid metric keys,
// stored sorted without repeats; anything else is a 422 naming the field.
func TestScopeKeys(t *testing.T) {
	many := make([]string, MaxScopeKeys+1)
	for i := range many {
		many[i] = "k" + string(rune('a'+i))
	}
	for _, tc := range []struct {
		name string
		in   *AppliesTo
		want []string
		bad  bool
	}{
		{"none: every metric", nil, nil, false},
		{"sorted and compacted", &AppliesTo{BillableMetricKeys: []string{"b", "a", "b"}}, []string{"a", "b"}, false},
		{"the most keys", &AppliesTo{BillableMetricKeys: many[:MaxScopeKeys]}, many[:MaxScopeKeys], false},
		{"empty", &AppliesTo{BillableMetricKeys: []string{}}, nil, true},
		{"too many", &AppliesTo{BillableMetricKeys: many}, nil, true},
		{"a space", &AppliesTo{BillableMetricKeys: []string{"a b"}}, nil, true},
		{"a comma", &AppliesTo{BillableMetricKeys: []string{"a,b"}}, nil, true},
		{"a pipe", &AppliesTo{BillableMetricKeys: []string{"a|b"}}, nil, true},
		{"empty key", &AppliesTo{BillableMetricKeys: []string{""}}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ScopeKeys("applies_to", tc.in)
			if tc.bad {
				var ve *Error
				if !errors.As(err, &ve) || ve.Field != "applies_to.billable_metric_keys" {
					t.Fatalf("err %v, want a validation error naming applies_to.billable_metric_keys", err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v %v, want %v", got, err, tc.want)
			}
		})
	}
}

// scopedBlock is a started block of rem at priority prio created at
// created, scoped to keys.
func scopedBlock(rem int64, prio int, created int64, keys ...string) Block {
	id := uuid.New()
	b := Block{ID: id, OriginalAmount: rem, RemainingAmount: rem, Priority: prio,
		StartsAt: time.UnixMilli(created), CreatedAt: time.UnixMilli(created)}
	if len(keys) > 0 {
		b.AppliesTo = &AppliesTo{BillableMetricKeys: keys}
	}
	return b
}

// TestMetricAvailable: what checks and snapshots answer per metric, as the
// money scripts decide (prelude scope_split): the blocks that apply to the
// metric, less what the reservations of other metrics need of them, plus what is
// left of the line under block.
func TestMetricAvailable(t *testing.T) {
	blocks := []Block{scopedBlock(1000, 0, 1, "a"), scopedBlock(500, 0, 2, "b"), scopedBlock(300, 1, 3)}
	acct := Account{Balance: 1800, EffectiveBalance: 1800, Blocks: blocks}
	held := acct
	held.ReservedBalance, held.EffectiveBalance, held.ReservationMetrics = 700, 1100, []string{"b"}
	debt := acct
	debt.Blocks = []Block{scopedBlock(1000, 0, 1, "a")}
	debt.Balance, debt.EffectiveBalance, debt.DebtMC = 900, 900, 100
	for _, tc := range []struct {
		name   string
		acct   Account
		limit  int64
		policy OveragePolicy
		metric string
		want   int64
	}{
		{"scoped and unscoped", acct, 0, OveragePolicyBlock, "a", 1300},
		{"other metric: unscoped only", acct, 0, OveragePolicyBlock, "c", 300},
		{"a line on top", acct, 200, OveragePolicyBlock, "c", 500},
		{"allow ignores the line", acct, 200, OveragePolicyAllow, "c", 300},
		{"a reservation of b keeps 200 unscoped", held, 0, OveragePolicyBlock, "a", 1100},
		{"the reservation's own metric", held, 0, OveragePolicyBlock, "b", 100},
		{"debt uses the line", debt, 150, OveragePolicyBlock, "c", 50},
		{"debt: the effective balance bounds", debt, 150, OveragePolicyBlock, "a", 1050},
		{"no scope at all: the account's figure", Account{EffectiveBalance: 40, Blocks: []Block{scopedBlock(40, 0, 1)}},
			10, OveragePolicyBlock, "x", 50},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := MetricAvailable(tc.acct, tc.limit, tc.policy, tc.metric, 10); got != tc.want {
				t.Fatalf("MetricAvailable = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestScopeBalances: the credit by scope, unscoped first (always), then
// each scope by its keys; pending is what has not started at now.
func TestScopeBalances(t *testing.T) {
	later := scopedBlock(70, 0, 1, "a")
	later.StartsAt = time.UnixMilli(50)
	got := ScopeBalances([]Block{scopedBlock(10, 0, 1, "b"), scopedBlock(20, 0, 1, "a"), later, scopedBlock(5, 0, 1, "b")},
		time.UnixMilli(10))
	want := []ScopeBalance{{Balance: 0}, {AppliesTo: &AppliesTo{BillableMetricKeys: []string{"a"}}, Balance: 90, Pending: 70},
		{AppliesTo: &AppliesTo{BillableMetricKeys: []string{"b"}}, Balance: 15}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("ScopeBalances = %+v, want %+v", got, want)
	}
}

// TestReconcileComparesScopes: a block whose scope differs between Redis
// and Postgres is a difference, named applies_to.
func TestReconcileComparesScopes(t *testing.T) {
	b := MutationBlock{ID: uuid.New(), Original: 10, Remaining: 10, Scope: []string{"a"}}
	other := b
	other.Scope = nil
	if sameBlocks([]MutationBlock{b}, []MutationBlock{other}) {
		t.Fatal("sameBlocks ignores the scope")
	}
	diffs := blockDifferences([]MutationBlock{b}, []MutationBlock{other})
	if len(diffs) != 1 || diffs[0].Redis != "a" || diffs[0].Postgres != "" {
		t.Fatalf("differences %+v, want one of applies_to", diffs)
	}
}
