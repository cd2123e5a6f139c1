package engine

import (
	"bytes"
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// pageSource serves sorted ids the way persist's AccountStates does:
// greater than after, in id order, at most limit.
type pageSource struct {
	ids  []uuid.UUID
	fail uuid.UUID // a page holding this id fails
}

func (p *pageSource) AccountStates(_ context.Context, after uuid.UUID, limit int, _ time.Time) ([]AccountState, error) {
	i := sort.Search(len(p.ids), func(i int) bool { return bytes.Compare(p.ids[i][:], after[:]) > 0 })
	var out []AccountState
	for ; i < len(p.ids) && len(out) < limit; i++ {
		if p.ids[i] == p.fail {
			return nil, errors.New("page read failed")
		}
		out = append(out, AccountState{CustomerID: p.ids[i], Version: 1})
	}
	return out, nil
}

func (p *pageSource) CountAccounts(context.Context) (int64, error) { return int64(len(p.ids)), nil }

func (p *pageSource) AccountIDCuts(_ context.Context, parts int) ([]uuid.UUID, error) {
	var cuts []uuid.UUID
	for k := 1; k < parts && len(p.ids) >= parts; k++ {
		cuts = append(cuts, p.ids[len(p.ids)*k/parts])
	}
	return cuts, nil
}

// batchStore records every load; ids in ahead are "already newer".
type batchStore struct {
	BlockStore
	mu     sync.Mutex
	loads  map[uuid.UUID]int
	ahead  map[uuid.UUID]bool
	chunks int
}

func (b *batchStore) LoadBatch(_ context.Context, states []AccountState) ([]bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.chunks++
	out := make([]bool, len(states))
	for i, st := range states {
		b.loads[st.CustomerID]++
		out[i] = !b.ahead[st.CustomerID]
	}
	return out, nil
}

// TestRebuildVisitsEveryAccountOnce: the parallel range readers together
// load every account exactly once, including ids on the range edges, and
// count the fenced ones apart; a failed page read fails the rebuild.
func TestRebuildVisitsEveryAccountOnce(t *testing.T) {
	edge := func(first byte, fill byte) uuid.UUID {
		var u uuid.UUID
		for i := range u {
			u[i] = fill
		}
		u[0] = first
		return u
	}
	var ids []uuid.UUID
	for i := 0; i < 5000; i++ {
		ids = append(ids, uuid.New())
	}
	for r := 0; r < rebuildReaders; r++ {
		b := byte(r * 256 / rebuildReaders)
		ids = append(ids, edge(b, 0xff), edge(b-1, 0xff))
		if b > 0 { // the nil id is no customer's: a page read starts after it
			ids = append(ids, edge(b, 0))
		}
	}
	ids = append(ids, edge(0xff, 0xff))
	sort.Slice(ids, func(i, j int) bool { return bytes.Compare(ids[i][:], ids[j][:]) < 0 })
	ids = uniqueIDs(ids)
	for _, tc := range []struct {
		name     string
		pageSize int
	}{{"pages of 1", 1}, {"pages of 7", 7}, {"pages of 1000", 1000}, {"one page", 100000}} {
		t.Run(tc.name, func(t *testing.T) {
			store := &batchStore{loads: map[uuid.UUID]int{}, ahead: map[uuid.UUID]bool{ids[3]: true, ids[4000]: true}}
			var last RebuildProgress
			pr, err := Rebuild(context.Background(), &pageSource{ids: ids}, store, SystemClock{}, tc.pageSize,
				func(p RebuildProgress) { last = p })
			if err != nil {
				t.Fatal(err)
			}
			if pr.Done != int64(len(ids)) || pr.Loaded != int64(len(ids)-2) || pr.Total != int64(len(ids)) || last != pr {
				t.Fatalf("progress %+v (last reported %+v); want %d done, %d loaded", pr, last, len(ids), len(ids)-2)
			}
			for _, id := range ids {
				if store.loads[id] != 1 {
					t.Fatalf("account %s loaded %d times", id, store.loads[id])
				}
			}
			if len(store.loads) != len(ids) {
				t.Fatalf("%d accounts loaded, %d exist", len(store.loads), len(ids))
			}
		})
	}
	t.Run("failed page read", func(t *testing.T) {
		store := &batchStore{loads: map[uuid.UUID]int{}}
		_, err := Rebuild(context.Background(), &pageSource{ids: ids, fail: ids[2500]}, store, SystemClock{}, 100, nil)
		if err == nil {
			t.Fatal("rebuild succeeded past a failed page read")
		}
	})
}

func uniqueIDs(ids []uuid.UUID) []uuid.UUID {
	out := ids[:0]
	for i, id := range ids {
		if i == 0 || id != ids[i-1] {
			out = append(out, id)
		}
	}
	return out
}

// TestRebuildRangesSplitV7IDs: time-ordered (v7) ids share their leading
// bytes, yet the readers' ranges, cut where the source says, each get a
// quarter of them and cover each id exactly once.
func TestRebuildRangesSplitV7IDs(t *testing.T) {
	ids := make([]uuid.UUID, 4000)
	for i := range ids {
		ids[i] = uuid.Must(uuid.NewV7())
	}
	sort.Slice(ids, func(i, j int) bool { return bytes.Compare(ids[i][:], ids[j][:]) < 0 })
	cuts, _ := (&pageSource{ids: ids}).AccountIDCuts(context.Background(), rebuildReaders)
	per := make([]int, len(cuts)+1)
	for _, id := range ids {
		in := 0
		for r := range per {
			from, to := rebuildRange(r, cuts)
			if bytes.Compare(id[:], from[:]) > 0 && (to == nil || bytes.Compare(id[:], to[:]) < 0) {
				in++
				per[r]++
			}
		}
		if in != 1 {
			t.Fatalf("id %s is in %d ranges", id, in)
		}
	}
	if len(per) != rebuildReaders {
		t.Fatalf("%d ranges, want %d", len(per), rebuildReaders)
	}
	for r, n := range per {
		if n != len(ids)/rebuildReaders {
			t.Fatalf("reader %d gets %d of %d ids (all: %v)", r, n, len(ids), per)
		}
	}
}
