package persist

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestAccountStatesPageOperations: one page of many accounts reads its
// operations with one id-range scan; every account gets exactly its own
// applied operations (none of a neighbour's), in order.
func TestAccountStatesPageOperations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	want := map[uuid.UUID][]string{}
	for i := 0; i < 12; i++ {
		a := newAccount(live, now)
		for k := 0; k <= i%3; k++ {
			key := fmt.Sprintf("grant-%d-%d", i, k)
			if err := b.store.Apply(b.ctx, []engine.Mutation{a.grant(key, 10, nil)}); err != nil {
				t.Fatal(err)
			}
			want[a.key.CustomerID] = append(want[a.key.CustomerID], key)
		}
	}
	got := b.allAccountStates(t, 5, now.Add(-24*time.Hour))
	if len(got) != len(want) {
		t.Fatalf("walked %d accounts, want %d", len(got), len(want))
	}
	for i, st := range got {
		if i > 0 && bytes.Compare(got[i-1].CustomerID[:], st.CustomerID[:]) >= 0 {
			t.Fatalf("accounts out of order at %d", i)
		}
		keys := want[st.CustomerID]
		if len(st.Applied) != len(keys) {
			t.Fatalf("account %s: %d applied, want %v", st.CustomerID, len(st.Applied), keys)
		}
		for k, m := range st.Applied {
			if m.IdempotencyKey != keys[k] {
				t.Fatalf("account %s: applied %d is %q, want %q", st.CustomerID, k, m.IdempotencyKey, keys[k])
			}
		}
	}
}

// allAccountStates walks AccountStates page by page (size accounts each)
// from the first customer id and returns every account it read.
func (b *bundle) allAccountStates(t *testing.T, size int, since time.Time) []engine.AccountState {
	t.Helper()
	var all []engine.AccountState
	after := uuid.Nil
	for {
		page, err := b.store.AccountStates(b.ctx, after, size, since)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			return all
		}
		all = append(all, page...)
		after = page[len(page)-1].CustomerID
	}
}
