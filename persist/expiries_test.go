package persist

import (
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// TestDueExpiries: the sweep's look-up lists a customer once, with its
// soonest block past expiry in the window (since, now], only while
// Postgres shows that block with credit, and pages by that expiry.
func TestDueExpiries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	start := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	at := func(m int) *time.Time { v := start.Add(time.Duration(m) * time.Minute); return &v }

	two := newAccount(live, start) // blocks expiring at +10 and +20 min
	g1, g2 := two.grant("", 100, at(10)), two.grant("", 50, at(20))
	sb := newAccount(sandbox, start) // expires at +15, then drained to zero
	g3 := sb.grant("", 7, at(15))
	drained := sb.drain(*sb.blocks[*g3.Entries[0].BlockID], 7)
	late := newAccount(live, start) // expires at +90 min
	g4 := late.grant("", 1, at(90))
	never := newAccount(live, start) // no expiry
	g5 := never.grant("", 1, nil)
	if err := b.store.Apply(b.ctx, []engine.Mutation{g1, g2, g3, drained, g4, g5}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name       string
		since, now int // minutes from start
		limit      int
		want       []engine.CustomerKey
		wantAt     []int
	}{
		{"nothing due yet", -60, 5, 10, nil, nil},
		{"soonest block decides, once per customer", -60, 30, 10, []engine.CustomerKey{two.key}, []int{10}},
		{"window excludes since", 10, 30, 10, []engine.CustomerKey{two.key}, []int{20}},
		{"drained block is not due", 14, 16, 10, nil, nil},
		{"later customer after the first", -60, 120, 10, []engine.CustomerKey{two.key, late.key}, []int{10, 90}},
		{"limit pages by soonest expiry", -60, 120, 1, []engine.CustomerKey{two.key}, []int{10}},
		{"next page starts after the last", 10, 120, 1, []engine.CustomerKey{two.key}, []int{20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := b.store.DueExpiries(b.ctx, *at(tc.since), *at(tc.now), tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %d customers %+v, want %d", len(got), got, len(tc.want))
			}
			for i := range got {
				if got[i].Customer != tc.want[i] || !got[i].ExpiresAt.Equal(*at(tc.wantAt[i])) {
					t.Errorf("row %d: %+v at %v, want %+v at %v", i, got[i].Customer, got[i].ExpiresAt, tc.want[i], *at(tc.wantAt[i]))
				}
			}
		})
	}
}

// TestDueExpiryCount: the expiry sweep's backlog counts customers, not
// blocks, with credit left past expiry in the window.
func TestDueExpiryCount(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	start := time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return start.Add(time.Duration(m) * time.Minute) }
	a, c := newAccount(live, start), newAccount(live, start)
	e1, e2, e3 := at(5), at(6), at(50)
	if err := b.store.Apply(b.ctx, []engine.Mutation{a.grant("", 1, &e1), a.grant("", 1, &e2), c.grant("", 1, &e3)}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		now  int
		want int64
	}{{4, 0}, {10, 1}, {60, 2}} {
		if n, err := b.store.DueExpiryCount(b.ctx, at(-60), at(tc.now)); err != nil || n != tc.want {
			t.Errorf("at +%d min: %d (%v), want %d", tc.now, n, err, tc.want)
		}
	}
}
