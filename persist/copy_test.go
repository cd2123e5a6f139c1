package persist

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// TestLeanApplyReplays states that the lean write, by COPY or by INSERT,
// keeps Apply idempotent: a batch holding Mutations already stored (a
// replay after a crash between commit and acknowledgement, whole or mixed
// with new ones) falls back to the ON CONFLICT write and stores every row
// exactly once, while a fresh batch (duplicates within it included) never
// needs the fallback.
func TestLeanApplyReplays(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, way := range []struct {
		name    string
		copyMin int
	}{{"copy", 1}, {"insert", copyMinMutations}} {
		t.Run(way.name, func(t *testing.T) {
			leanApplyReplays(t, b, &Store{pool: b.pool, copyMin: way.copyMin})
		})
	}
}

func leanApplyReplays(t *testing.T, b *bundle, store *Store) {
	tenant := uuid.New()
	tests := []struct {
		name string
		// batches are applied in order; each is a list of indexes into the
		// customer's consumes.
		batches      [][]int
		keyless      bool
		wantFallback int64
	}{
		{"fresh batches", [][]int{{0, 1}, {2}}, false, 0},
		{"duplicate inside one batch", [][]int{{0, 0, 1, 1}}, false, 0},
		{"same batch twice", [][]int{{0, 1, 2}, {0, 1, 2}}, false, 1},
		{"stored mixed with new", [][]int{{0}, {0, 1, 2}}, false, 1},
		{"new, then a replay of an older one alone", [][]int{{0, 1}, {2}, {1}}, false, 1},
		{"keyless replay", [][]int{{0, 1}, {1, 2}}, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 2, balance: 2_000_000}
			if err := store.Apply(b.ctx, []engine.Mutation{c.grant(tenant)}); err != nil {
				t.Fatal(err)
			}
			ms := make([]engine.Mutation, 3)
			for i := range ms {
				ms[i] = c.consume(tenant, true)
				if tt.keyless {
					ms[i].IdempotencyKey = ""
				}
			}
			before := store.ReplayedApplies()
			seen := map[int]bool{}
			for _, idx := range tt.batches {
				var batch []engine.Mutation
				for _, i := range idx {
					batch = append(batch, ms[i])
					seen[i] = true
				}
				if err := store.Apply(b.ctx, batch); err != nil {
					t.Fatal(err)
				}
			}
			if got := store.ReplayedApplies() - before; got != tt.wantFallback {
				t.Errorf("%d Applies fell back to ON CONFLICT, want %d", got, tt.wantFallback)
			}
			n := len(seen)
			wantOps := n + 1 // and the grant's
			if tt.keyless {
				wantOps = 1
			}
			for _, q := range []struct {
				sql  string
				want int
			}{
				{`SELECT count(*) FROM ledger_entries WHERE customer_id = $1 AND type = 'consumption'`, n},
				// A keyed operation is recorded once: an operations row, or a
				// lean consume's op head on its ledger entry (ophead.go).
				{`SELECT (SELECT count(*) FROM operations WHERE customer_id = $1) +
					(SELECT count(*) FROM ledger_entries WHERE customer_id = $1 AND op_head IS NOT NULL)`, wantOps},
				{`SELECT count(*) FROM ` + storedEventsSQL + ` WHERE customer_id = $1 AND event_type = 'credit.consumed'`, n},
			} {
				var got int
				if err := b.pool.QueryRow(b.ctx, q.sql, c.id).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != q.want {
					t.Errorf("%s: %d, want %d", q.sql, got, q.want)
				}
			}
			var sum int64
			if err := b.pool.QueryRow(b.ctx, `SELECT sum(delta) FROM ledger_entries WHERE customer_id = $1`, c.id).Scan(&sum); err != nil {
				t.Fatal(err)
			}
			if want := int64(2_000_000 - 300*n); sum != want {
				t.Errorf("ledger sums to %d, want %d", sum, want)
			}
			checkSequences(t, b, tenant)
		})
	}
}

// checkSequences fails unless the tenant's events are numbered exactly
// 1..N (issue 15 item 2: a replay or a skipped row hands out no number)
// and its counter stands at N.
func checkSequences(t *testing.T, b *bundle, tenant uuid.UUID) {
	t.Helper()
	var n, distinct, top, counter int64
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*), count(DISTINCT sequence), COALESCE(max(sequence), 0),
		COALESCE((SELECT next FROM event_sequences WHERE tenant_id = $1), 0)
		FROM `+storedEventsSQL+` WHERE tenant_id = $1`, tenant).Scan(&n, &distinct, &top, &counter); err != nil {
		t.Fatal(err)
	}
	if n != distinct || n != top || n != counter {
		t.Errorf("%d events, %d distinct sequences, highest %d, counter %d: want all equal", n, distinct, top, counter)
	}
}

// TestLeanWriteStoresWhatConflictWriteStores states that the lean write,
// by COPY and by INSERT, stores row for row what the ON CONFLICT statements
// store, over Mutations of every section: grants and top-ups with metadata,
// expiry and reason, debits with overage, consumes with draws and with a
// Context (events stored as sent), drains without block metadata, reservations,
// gauges and keyless Mutations, in batches of several sizes.
func TestLeanWriteStoresWhatConflictWriteStores(t *testing.T) {
	t.Parallel()
	now := time.Now().UTC().Truncate(time.Millisecond)
	expires := now.Add(48 * time.Hour)
	live := engine.Scope{TenantID: uuid.New(), Environment: engine.EnvironmentLive}
	var ms []engine.Mutation
	for i := range 3 {
		a := newAccount(live, now)
		g := a.grant(fmt.Sprintf("g%d", i), 5000, &expires)
		tp := a.topup(fmt.Sprintf("t%d", i), 3000, ptr("ref-1"), 2, nil)
		ms = append(ms, g, tp,
			a.consume(fmt.Sprintf("c%d", i), g.Blocks[0].ID, 100, "tokens", 7),
			a.consumeAcross(fmt.Sprintf("x%d", i), []uuid.UUID{g.Blocks[0].ID, tp.Blocks[0].ID}, []int64{200, 300}),
			a.drain(*a.blocks[tp.Blocks[0].ID], 10))
		r, h := a.reserve(fmt.Sprintf("r%d", i), "tokens", 400, time.Hour)
		ms = append(ms, r, a.finish(h, engine.ReservationCommitted, 250), a.gauge("seats", int64(i+1)))
		c := &profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 2, balance: 2_000_000}
		ms = append(ms, c.grant(live.TenantID), c.consume(live.TenantID, true), c.consume(live.TenantID, false))
	}
	ways := []struct {
		name  string
		apply func(s *Store, ctx context.Context, ms []engine.Mutation, alerts *alertOutcome) error
	}{
		{"on conflict", (*Store).pipelinedApply},
		{"copy", (*Store).copyApply},
		{"insert", (*Store).insertApply},
	}
	// The lean writes keep a lean consume's credit.consumed on its ledger
	// entry (carried.go), the ON CONFLICT write as a row: the tables are
	// compared without where the event is kept, and the events as every
	// read sees them (storedEvents).
	tables := []string{"operations", "ledger_entries", "credit_blocks", "credit_accounts",
		"reservations", "gauges"}
	var want map[string][]string
	for _, way := range ways {
		b := setup(t)
		customerRows(t, b, ms)
		for _, size := range []int{1, 4, len(ms)} {
			// Each size writes the whole list once more: the first pass stores it,
			// the later ones must fail (lean) or skip (ON CONFLICT) on stored rows.
			for i := 0; i < len(ms); i += size {
				err := way.apply(b.store, b.ctx, ms[i:min(i+size, len(ms))], nil)
				if size > 1 && way.name != "on conflict" {
					if sqlState(err) != uniqueViolation {
						t.Fatalf("%s: replayed batch of %d: %v, want a unique violation", way.name, size, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: batch of %d: %v", way.name, size, err)
				}
			}
		}
		got := map[string][]string{}
		for _, table := range tables {
			rows, err := b.pool.Query(b.ctx, `SELECT (to_jsonb(t) - 'event_sequence')::text FROM `+table+` t ORDER BY 1`)
			if err != nil {
				t.Fatal(err)
			}
			got[table], err = pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if len(got[table]) == 0 {
				t.Fatalf("%s: %s is empty", way.name, table)
			}
		}
		got["events"] = storedEvents(t, b, live.TenantID)
		if want == nil {
			want = got
			continue
		}
		for _, table := range append(tables, "events") {
			if !slices.Equal(got[table], want[table]) {
				t.Errorf("%s: %s differs from the ON CONFLICT write:\n got %q\nwant %q", way.name, table, got[table], want[table])
			}
		}
	}
}

// TestEventCopy states that a group whose events are all stored as sent
// (consumes with a Context), copied or inserted by leanEventsSQL, stores
// what the INSERT of eventsSQLTemplate stores: the same rows, each tenant's numbered 1..N in
// batch order (not id order), the Context's external id in the payload; a
// Mutation given twice in the group owes its event once; and the same
// group persisted again falls back and inserts nothing twice.
func TestEventCopy(t *testing.T) {
	t.Parallel()
	tenants := []uuid.UUID{uuid.New(), uuid.New()}
	var grants, group []engine.Mutation
	var customers []*profileCustomer
	for i := range 4 {
		c := &profileCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, version: 2, balance: 2_000_000}
		customers = append(customers, c)
		grants = append(grants, c.grant(tenants[i%2]))
	}
	for range 3 {
		for i, c := range customers {
			group = append(group, c.consume(tenants[i%2], true))
		}
	}
	group = append(group, group[1])
	// The grants' events are completed in SQL (no Context): they are
	// inserted, never copied; the consumes' are carried by their entries
	// (carried.go), so no row is copied either.
	for _, c := range []struct {
		name string
		ms   []engine.Mutation
		want bool
	}{{"consumes", group, false}, {"grants", grants, false}} {
		steps, err := copySteps(c.ms, nil, shapeLean)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.ContainsFunc(steps, func(s copyStep) bool { return s.name == "COPY webhook_events" }); got != c.want {
			t.Errorf("copySteps of the %s copies the events: %v, want %v", c.name, got, c.want)
		}
	}
	tests := []struct {
		name  string
		apply func(s *Store, ctx context.Context, ms []engine.Mutation, alerts *alertOutcome) error
	}{
		{"on conflict", (*Store).pipelinedApply},
		{"copy", (*Store).copyApply},
		{"insert", (*Store).insertApply},
	}
	var want []string
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t)
			customerRows(t, b, append(grants, group...))
			if err := b.store.Apply(b.ctx, grants); err != nil {
				t.Fatal(err)
			}
			if err := tt.apply(b.store, b.ctx, group, nil); err != nil {
				t.Fatal(err)
			}
			store := &Store{pool: b.pool, copyMin: 1}
			if err := store.Apply(b.ctx, group); err != nil {
				t.Fatal(err)
			}
			if store.ReplayedApplies() != 1 {
				t.Errorf("the replayed group fell back %d times, want 1", store.ReplayedApplies())
			}
			var got []string
			for _, tenant := range tenants {
				for _, e := range storedEvents(t, b, tenant) {
					if strings.Contains(e, " credit.consumed ") {
						got = append(got, e)
					}
				}
			}
			if len(got) != 12 {
				t.Fatalf("%d credit.consumed events, want 12 (one per consume)", len(got))
			}
			for _, tenant := range tenants {
				checkSequences(t, b, tenant)
			}
			// Each tenant's events follow its consumes' batch order.
			for _, tenant := range tenants {
				read, err := b.store.EventsAfter(b.ctx, tenant, nil, 0, 100)
				if err != nil {
					t.Fatal(err)
				}
				type ev struct {
					version  int64
					external string
					customer uuid.UUID
				}
				var evs []ev
				for _, e := range read {
					if e.EventType != engine.EventCreditConsumed {
						continue
					}
					var body struct {
						External string `json:"external_customer_id"`
					}
					if err := json.Unmarshal(e.Payload, &body); err != nil {
						t.Fatal(err)
					}
					evs = append(evs, ev{*e.Version, body.External, *e.CustomerID})
				}
				var order []ev
				for _, m := range group[:12] {
					if m.TenantID == tenant {
						order = append(order, ev{m.Account.Version, m.Context.ExternalID, m.CustomerID})
					}
				}
				if !slices.Equal(evs, order) {
					t.Errorf("tenant %s: events by sequence %v, want the batch order %v", tenant, evs, order)
				}
			}
			if want == nil {
				want = got
			} else if !slices.Equal(got, want) {
				t.Errorf("copied events differ from the ON CONFLICT write:\n got %q\nwant %q", got, want)
			}
		})
	}
}
