package engine

import (
	"math"
	"testing"

	"github.com/google/uuid"
)

func ms(v int64) *int64 { return &v }

func blk(id string, remaining int64, priority int, expires *int64, created, starts int64) MutationBlock {
	return MutationBlock{ID: uuid.MustParse(id), Original: remaining, Remaining: remaining, Priority: priority,
		ExpiresMS: expires, CreatedMS: created, StartsMS: starts}
}

const (
	idA = "00000000-0000-0000-0000-00000000000a"
	idB = "00000000-0000-0000-0000-00000000000b"
	idC = "00000000-0000-0000-0000-00000000000c"
	idD = "00000000-0000-0000-0000-00000000000d"
)

// TestSpendOrder states the burn-down order of docs/spec/interface.md "Credit block":
// lowest priority first, then soonest expiry (none last), then oldest.
func TestSpendOrder(t *testing.T) {
	tests := []struct {
		name   string
		blocks []MutationBlock
		want   []string
	}{
		{"priority wins over expiry", []MutationBlock{
			blk(idA, 1, 5, ms(100), 0, 0), blk(idB, 1, 1, nil, 0, 0)}, []string{idB, idA}},
		{"soonest expiry first at equal priority", []MutationBlock{
			blk(idA, 1, 0, ms(300), 0, 0), blk(idB, 1, 0, ms(200), 0, 0)}, []string{idB, idA}},
		{"no expiry spends last", []MutationBlock{
			blk(idA, 1, 0, nil, 0, 0), blk(idB, 1, 0, ms(900), 5, 0)}, []string{idB, idA}},
		{"oldest first when all else ties", []MutationBlock{
			blk(idA, 1, 0, nil, 20, 0), blk(idB, 1, 0, nil, 10, 0)}, []string{idB, idA}},
		{"id breaks a full tie", []MutationBlock{
			blk(idB, 1, 0, nil, 10, 0), blk(idA, 1, 0, nil, 10, 0)}, []string{idA, idB}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			SpendOrder(tt.blocks)
			for i, id := range tt.want {
				if got := tt.blocks[i].ID.String(); got != id {
					t.Fatalf("position %d: got %s want %s", i, got, id)
				}
			}
		})
	}
}

// TestComputeBalances: a block stops counting at its expires_at instant and
// a block that starts later is pending (in balance, not in effective).
func TestComputeBalances(t *testing.T) {
	blocks := []MutationBlock{
		blk(idA, 100, 0, ms(1000), 0, 0),   // expires exactly at now=1000
		blk(idB, 50, 0, nil, 0, 0),         // plain
		blk(idC, 30, 0, ms(5000), 0, 2000), // starts later
		blk(idD, 0, 0, nil, 0, 0),          // drained
	}
	got := ComputeBalances(blocks, 20, 1000)
	want := Balances{Balance: 80, Reserved: 20, Pending: 30, Effective: 30}
	if got != want {
		t.Fatalf("got %+v want %+v", got, want)
	}
	if got := ComputeBalances(blocks, 0, 999); got.Balance != 180 {
		t.Fatalf("one ms before expiry the block counts: balance %d", got.Balance)
	}
}

// TestPlanDebit: debits drain started blocks in spend order and refuse, with
// no draws, what the effective balance cannot cover.
func TestPlanDebit(t *testing.T) {
	blocks := []MutationBlock{
		blk(idA, 10, 1, nil, 0, 0),
		blk(idB, 10, 0, ms(5000), 0, 0),
		blk(idC, 10, 0, nil, 0, 500), // pending until 500
	}
	tests := []struct {
		name     string
		reserved int64
		amount   int64
		now      int64
		ok       bool
		draws    map[string]int64
	}{
		{"one block", 0, 5, 100, true, map[string]int64{idB: 5}},
		{"spans blocks", 0, 15, 100, true, map[string]int64{idB: 10, idA: 5}},
		{"pending block not spendable", 0, 21, 100, false, nil},
		{"reserved not spendable", 5, 16, 100, false, nil},
		{"started later block joins", 0, 30, 600, true, map[string]int64{idB: 10, idC: 10, idA: 10}},
		{"exact effective", 0, 20, 100, true, map[string]int64{idB: 10, idA: 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			draws, ok := PlanDebit(append([]MutationBlock(nil), blocks...), tt.reserved, tt.amount, tt.now)
			if ok != tt.ok {
				t.Fatalf("ok = %v want %v", ok, tt.ok)
			}
			if len(draws) != len(tt.draws) {
				t.Fatalf("draws %v want %v", draws, tt.draws)
			}
			for _, d := range draws {
				if tt.draws[d.Block.ID.String()] != d.Amount {
					t.Fatalf("draw %s = %d want %d", d.Block.ID, d.Amount, tt.draws[d.Block.ID.String()])
				}
			}
		})
	}
}

// TestAddChecked: overflow is refused, never wrapped (invariant 7).
func TestAddChecked(t *testing.T) {
	tests := []struct {
		a, b int64
		ok   bool
	}{
		{math.MaxInt64, 0, true},
		{math.MaxInt64, 1, false},
		{math.MinInt64, -1, false},
		{-5, 5, true},
	}
	for _, tt := range tests {
		if _, ok := AddChecked(tt.a, tt.b); ok != tt.ok {
			t.Fatalf("AddChecked(%d, %d) ok=%v", tt.a, tt.b, ok)
		}
	}
}

// TestEntryID: every reader derives the same, distinct entry ids.
func TestEntryID(t *testing.T) {
	op := uuid.MustParse(idA)
	if EntryID(op, 0) != EntryID(op, 0) {
		t.Fatal("EntryID is not deterministic")
	}
	if EntryID(op, 0) == EntryID(op, 1) || EntryID(op, 1) == EntryID(uuid.MustParse(idB), 1) {
		t.Fatal("EntryID collides")
	}
}

// TestAffordableUnits: the snapshot's affordable_units is the most units
// whose price fits the effective balance.
func TestAffordableUnits(t *testing.T) {
	perUnit := MeteringRule{CostType: CostPerUnit, UnitCost: 7}
	flat := MeteringRule{CostType: CostFlat, BaseCost: 50}
	tests := []struct {
		name      string
		rule      MeteringRule
		effective int64
		want      *int64
	}{
		{"per unit floors", perUnit, 100, ms(14)},
		{"per unit none", perUnit, 6, ms(0)},
		{"flat covered is unbounded", flat, 50, nil},
		{"flat not covered", flat, 49, ms(0)},
		{"empty balance", perUnit, 0, ms(0)},
	}
	for _, tt := range tests {
		got := affordableUnits(tt.rule, tt.effective)
		if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
			t.Fatalf("%s: got %v want %v", tt.name, deref(got), deref(tt.want))
		}
	}
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}
