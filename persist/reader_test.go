package persist

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

func firstBlock(a *account) uuid.UUID {
	for id := range a.blocks {
		return id
	}
	return uuid.Nil
}

func TestHistoryFiltersAndPaging(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := newAccount(live, start)
	other := newAccount(live, start)
	g := a.grant("g", 10_000, nil)
	blk := firstBlock(a)
	batch := []engine.Mutation{g, other.grant("og", 5, nil)}
	for i := range 6 {
		metric := "api_call"
		if i%2 == 1 {
			metric = "tokens"
		}
		batch = append(batch, a.consume("", blk, 10, metric, 0))
	}
	// One mutation with two entries at one instant: paging must split ties by id.
	two := a.consume("", blk, 1, "api_call", 0)
	two.Entries = append(two.Entries, two.Entries[0])
	batch = append(batch, two)
	if err := b.store.Apply(b.ctx, batch); err != nil {
		t.Fatal(err)
	}
	at := func(i int) *time.Time { v := start.Add(time.Duration(i) * time.Second); return &v }

	tests := []struct {
		name string
		q    engine.HistoryQuery
		want int
	}{
		{"all", engine.HistoryQuery{}, 9},
		{"type", engine.HistoryQuery{Type: ptr(engine.EntryConsumption)}, 8},
		{"source", engine.HistoryQuery{Source: ptr(engine.SourcePromotional)}, 1},
		{"metric", engine.HistoryQuery{BillableMetricKey: ptr("tokens")}, 3},
		{"from inclusive", engine.HistoryQuery{From: at(7)}, 3},
		{"to exclusive", engine.HistoryQuery{To: at(2)}, 1},
		{"window", engine.HistoryQuery{From: at(2), To: at(4), BillableMetricKey: ptr("api_call")}, 1},
		{"empty", engine.HistoryQuery{Type: ptr(engine.EntryExpiry)}, 0},
	}
	for _, tc := range tests {
		for _, limit := range []int{2, 100} {
			q := tc.q
			q.TenantID, q.CustomerID, q.Limit = a.key.TenantID, a.key.CustomerID, limit
			seen := map[uuid.UUID]bool{}
			var prev *engine.LedgerEntry
			for pages := 0; ; pages++ {
				p, err := b.store.History(b.ctx, q)
				if err != nil {
					t.Fatalf("%s: %v", tc.name, err)
				}
				if p.Data == nil || len(p.Data) > limit {
					t.Fatalf("%s: page of %d rows", tc.name, len(p.Data))
				}
				for i := range p.Data {
					e := p.Data[i]
					if seen[e.ID] || e.CustomerID != a.key.CustomerID {
						t.Fatalf("%s: duplicate or foreign entry %s", tc.name, e.ID)
					}
					seen[e.ID] = true
					if prev != nil && e.CreatedAt.After(prev.CreatedAt) {
						t.Fatalf("%s: not newest first", tc.name)
					}
					prev = &e
				}
				if !p.HasMore {
					break
				}
				q.Cursor = p.NextCursor
			}
			if len(seen) != tc.want {
				t.Fatalf("%s (limit %d): %d entries, want %d", tc.name, limit, len(seen), tc.want)
			}
		}
	}

	// The stored entry reads back as the engine derives it from the Mutation.
	p, err := b.store.History(b.ctx, engine.HistoryQuery{TenantID: a.key.TenantID, CustomerID: a.key.CustomerID, Source: ptr(engine.SourcePromotional), Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	want := g.LedgerEntries("")[0]
	got := p.Data[0]
	wj, _ := json.Marshal(want)
	gj, _ := json.Marshal(got)
	if string(wj) != string(gj) {
		t.Fatalf("entry round trip:\n got %s\nwant %s", gj, wj)
	}

	_, err = b.store.History(b.ctx, engine.HistoryQuery{TenantID: a.key.TenantID, CustomerID: a.key.CustomerID, Limit: 5, Cursor: "bad"})
	if e, ok := engine.AsError(err); !ok || e.Kind != engine.KindBadRequest {
		t.Fatalf("bad cursor: %v", err)
	}
}

func TestOverageSumsHalfOpenWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	start := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	a := newAccount(live, start)
	batch := []engine.Mutation{a.grant("", 100, nil)} // t+1s
	blk := firstBlock(a)
	batch = append(batch,
		a.consume("", blk, 10, "tokens", 5),   // t+2s
		a.consume("", blk, 10, "api_call", 7), // t+3s
		a.consume("", blk, 10, "tokens", 0),   // t+4s: no overage
		a.consume("", blk, 10, "tokens", 11),  // t+5s
		a.consume("", blk, 10, "b_metric", 1), // t+6s
	)
	if err := b.store.Apply(b.ctx, batch); err != nil {
		t.Fatal(err)
	}
	at := func(i int) time.Time { return start.Add(time.Duration(i) * time.Second) }
	tests := []struct {
		name     string
		from, to time.Time
		want     []engine.OverageLine
	}{
		{"everything", at(0), at(100), []engine.OverageLine{{BillableMetricKey: "api_call", OverageMC: 7}, {BillableMetricKey: "b_metric", OverageMC: 1}, {BillableMetricKey: "tokens", OverageMC: 16}}},
		{"from inclusive", at(5), at(6), []engine.OverageLine{{BillableMetricKey: "tokens", OverageMC: 11}}},
		{"to exclusive", at(2), at(5), []engine.OverageLine{{BillableMetricKey: "api_call", OverageMC: 7}, {BillableMetricKey: "tokens", OverageMC: 5}}},
		{"empty", at(6).Add(time.Millisecond), at(100), []engine.OverageLine{}},
	}
	for _, tc := range tests {
		got, err := b.store.Overage(b.ctx, a.key, tc.from, tc.to)
		if err != nil {
			t.Fatal(err)
		}
		if got == nil || len(got) != len(tc.want) {
			t.Fatalf("%s: got %v, want %v", tc.name, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("%s: got %v, want %v", tc.name, got, tc.want)
			}
		}
	}
}

func TestAccountStates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	now := time.Now().UTC().Truncate(time.Millisecond)

	a := newAccount(live, now)
	exp := now.Add(-time.Hour) // already past: still returned, Load judges time
	g1 := a.grant("grant-1", 100, &exp)
	spent := firstBlock(a)
	g2 := a.grant("grant-2", 50, nil)
	d := a.consume("", spent, 100, "m", 0) // drains the first block: not returned
	old := a.grant("grant-old", 1, nil)
	old.AtMS = now.Add(-48 * time.Hour).UnixMilli() // applied before appliedSince
	// Order blocks by version the same as Redis would.
	for _, m := range []engine.Mutation{g1, g2, d, old} {
		if err := b.store.Apply(b.ctx, []engine.Mutation{m}); err != nil {
			t.Fatal(err)
		}
	}
	s2 := newAccount(sandbox, now)
	if err := b.store.Apply(b.ctx, []engine.Mutation{s2.grant("", 7, nil)}); err != nil {
		t.Fatal(err)
	}

	st, ok, err := b.store.AccountState(b.ctx, a.key, now.Add(-24*time.Hour))
	if err != nil || !ok {
		t.Fatalf("AccountState: %v %v", ok, err)
	}
	if st.Version != 4 || st.AccountID != a.id || st.LifetimeEarned != 151 || st.TenantID != live.TenantID ||
		st.Environment != engine.EnvironmentLive || st.UpdatedAtMS != old.AtMS {
		t.Fatalf("state = %+v", st)
	}
	if len(st.Blocks) != 2 {
		t.Fatalf("blocks = %+v, want the two with credit left", st.Blocks)
	}
	for _, blk := range st.Blocks {
		if blk.ID == spent || blk.Remaining <= 0 || string(blk.Metadata) != `{"campaign": "x"}` {
			t.Fatalf("block = %+v (meta %s)", blk, blk.Metadata)
		}
	}
	if len(st.Applied) != 2 || st.Applied[0].IdempotencyKey != "grant-1" || st.Applied[1].IdempotencyKey != "grant-2" {
		t.Fatalf("applied = %+v", st.Applied)
	}
	wj, _ := json.Marshal(g2)
	gj, _ := json.Marshal(st.Applied[1])
	var wv, gv any
	_ = json.Unmarshal(wj, &wv)
	_ = json.Unmarshal(gj, &gv)
	if wjs, gjs := mustJSON(wv), mustJSON(gv); wjs != gjs {
		t.Fatalf("applied mutation round trip:\n got %s\nwant %s", gjs, wjs)
	}

	if _, ok, err := b.store.AccountState(b.ctx, engine.CustomerKey{TenantID: live.TenantID, CustomerID: uuid.New()}, now); ok || err != nil {
		t.Fatalf("unknown account: ok %v err %v", ok, err)
	}

	// Paging by customer id walks both accounts once, in order.
	all := b.allAccountStates(t, 1, now.Add(-24*time.Hour))
	if len(all) != 2 || all[0].CustomerID.String() >= all[1].CustomerID.String() {
		t.Fatalf("AccountStates walked %d accounts", len(all))
	}
	for _, st := range all {
		wantBlocks := map[uuid.UUID]int{a.key.CustomerID: 2, s2.key.CustomerID: 1}[st.CustomerID]
		if len(st.Blocks) != wantBlocks || st.Applied == nil {
			t.Fatalf("account %s: %d blocks, want %d", st.CustomerID, len(st.Blocks), wantBlocks)
		}
	}
	if n, err := b.store.CountAccounts(b.ctx); err != nil || n != 2 {
		t.Fatalf("CountAccounts = %d, %v", n, err)
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
