package lua

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestSlicedReadEqualsWholeRead: a big account (layout v2) read in slices
// gives exactly what one HGETALL gives, block metadata included, and a read
// that finds the version moving under it gives up rather than mixing two
// states.
func TestSlicedReadEqualsWholeRead(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		u := t0.UnixMilli()
		st := layoutState(rand.New(rand.NewPCG(11, 3)), c, 40, u)
		for i := range st.Blocks {
			st.Blocks[i].Metadata = json.RawMessage(`{"n":` + strings.Repeat("1", 1+i%7) + `,"pad":"` + strings.Repeat("x", 900) + `"}`)
		}
		st.Reserved = 17
		b.load(t, st)
		key := b.store.accountKey(c.CustomerID)
		whole, err := b.store.readAccount(ctx, key) // learns the layout
		if err != nil {
			t.Fatal(err)
		}
		if !b.store.layouts.has(key) {
			t.Fatalf("a loaded account of %d blocks has no layout v2 summary", len(st.Blocks))
		}
		sliced, err := b.store.readAccountSliced(ctx, key, true)
		if err != nil {
			t.Fatal(err)
		}
		order := func(a accountFields) accountFields {
			sort.Slice(a.blocks, func(i, j int) bool { return a.blocks[i].ID.String() < a.blocks[j].ID.String() })
			return a
		}
		if !reflect.DeepEqual(order(whole), order(sliced)) {
			t.Fatalf("sliced read differs from the whole read:\n%+v\n%+v", sliced, whole)
		}
		if len(sliced.blocks) != 40 || len(sliced.blocks[0].Metadata) == 0 || sliced.reserved != 17 {
			t.Fatalf("sliced read: %d blocks, metadata %q, reserved %d", len(sliced.blocks), sliced.blocks[0].Metadata, sliced.reserved)
		}
		snap, err := b.store.Snapshot(ctx, c, time.UnixMilli(u))
		if err != nil || snap.Version != 1 {
			t.Fatalf("snapshot through the sliced read: version %d, %v", snap.Version, err)
		}
	})
}
