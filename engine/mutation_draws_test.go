package engine

import (
	"reflect"
	"testing"

	"github.com/google/uuid"
)

// TestPaidBy states the one form a debit is stored and shown in: the block
// when one paid (however the script wrote it), else no block and the draws.
func TestPaidBy(t *testing.T) {
	b1, b2 := uuid.New(), uuid.New()
	two := []EntryDraw{{BlockID: b1, Amount: 100}, {BlockID: b2, Amount: 200}}
	tests := []struct {
		name      string
		entry     MutationEntry
		wantBlock *uuid.UUID
		wantDraws []EntryDraw
	}{
		{"one block, no draws", MutationEntry{BlockID: &b1}, &b1, nil},
		{"no block, no draws", MutationEntry{}, nil, nil},
		{"one draw", MutationEntry{Delta: -100, Draws: two[:1]}, &b1, nil},
		{"one draw and its block", MutationEntry{Delta: -100, BlockID: &b1, Draws: two[:1]}, &b1, nil},
		// A charge partly on the credit line, and a debt repayment: the one
		// draw is kept, as it says what the block paid.
		{"one draw and debt", MutationEntry{Delta: -150, Draws: two[:1]}, nil, two[:1]},
		{"a debt repayment", MutationEntry{Type: EntryDebtRepayment, Draws: two[:1]}, nil, two[:1]},
		{"two draws", MutationEntry{Draws: two}, nil, two},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			block, draws := tt.entry.PaidBy()
			if !reflect.DeepEqual(block, tt.wantBlock) || !reflect.DeepEqual(draws, tt.wantDraws) {
				t.Fatalf("PaidBy = %v, %+v; want %v, %+v", block, draws, tt.wantBlock, tt.wantDraws)
			}
			e := (&Mutation{OpID: uuid.New()}).ledgerEntry(0, tt.entry)
			if !reflect.DeepEqual(e.CreditBlockID, tt.wantBlock) || len(e.Draws) != len(tt.wantDraws) {
				t.Fatalf("ledger entry = block %v, draws %+v; want %v and %d draws", e.CreditBlockID, e.Draws, tt.wantBlock, len(tt.wantDraws))
			}
			for i, d := range e.Draws {
				if d.CreditBlockID != tt.wantDraws[i].BlockID || d.Amount != tt.wantDraws[i].Amount {
					t.Fatalf("draw %d = %+v, want %+v", i, d, tt.wantDraws[i])
				}
			}
		})
	}
}
