package persist

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/creditd/creditd/engine"
)

// usageRowT is one usage_hourly row as a test compares it.
type usageRowT struct {
	Metric             string
	Hour               time.Time
	Units, Cost, Count int64
}

// rollup reads every usage_hourly row of customer, by hour then metric.
func (b *bundle) rollup(t *testing.T, customer uuid.UUID) []usageRowT {
	t.Helper()
	rows, err := b.pool.Query(b.ctx, `SELECT billable_metric_key, hour_start, units, cost, count FROM usage_hourly
		WHERE customer_id = $1 ORDER BY hour_start, billable_metric_key COLLATE "C"`, customer)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (usageRowT, error) {
		var u usageRowT
		err := r.Scan(&u.Metric, &u.Hour, &u.Units, &u.Cost, &u.Count)
		u.Hour = u.Hour.UTC()
		return u, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// consumeMulti charges amount from block for several metrics' items in one
// consumption entry, as consume_multi.lua writes it.
func (a *account) consumeMulti(block uuid.UUID, amount int64, items []engine.UsageItem) engine.Mutation {
	b := a.blocks[block]
	b.Remaining -= amount
	a.balance -= amount
	doc, _ := json.Marshal(map[string]any{"items": items, "note": "x"})
	e := engine.MutationEntry{Role: engine.RoleMain, Delta: -amount, Type: engine.EntryConsumption, BlockID: &block, Metadata: doc}
	return a.mutation(engine.MutationConsume, "", []engine.MutationEntry{e}, *b)
}

// usageFixture is a customer's batch: a grant, two single consumes in one
// hour (one with overage), a multi-metric consume, a reservation commit
// in the next hour, and entries the rollup must skip (a release, a debit).
func usageFixture(a *account) (batch []engine.Mutation, want []usageRowT) {
	g := a.grant("g", 10_000, nil)
	var block uuid.UUID
	for id := range a.blocks {
		block = id
	}
	hour := a.at.UTC().Truncate(time.Hour)
	a.at = hour.Add(10 * time.Minute)
	c1 := a.consume("", block, 300, "api_call", 0)
	c1.Entries[0].Units = ptr(int64(3))
	c2 := a.consume("", block, 200, "api_call", 50)
	c2.Entries[0].Units = ptr(int64(5))
	multi := a.consumeMulti(block, 700, []engine.UsageItem{{Metric: "api_call", Units: 2, Cost: 100}, {Metric: "tokens", Units: 40, Cost: 600}})
	a.at = hour.Add(time.Hour + 5*time.Minute)
	res := uuid.New()
	commit := a.consume("", block, 90, "gpu_seconds", 0)
	commit.Kind = engine.MutationCommit
	commit.Entries[0].Units, commit.Entries[0].Ref = ptr(int64(9)), &res
	release := a.mutation(engine.MutationRelease, "", []engine.MutationEntry{{Role: engine.RoleMain, Type: engine.EntryRelease, Metric: ptr("gpu_seconds"), Ref: &res}})
	batch = []engine.Mutation{g, c1, c2, multi, commit, release}
	want = []usageRowT{
		{Metric: "api_call", Hour: hour, Units: 3 + 5 + 2, Cost: 300 + 250 + 100, Count: 3},
		{Metric: "tokens", Hour: hour, Units: 40, Cost: 600, Count: 1},
		{Metric: "gpu_seconds", Hour: hour.Add(time.Hour), Units: 9, Cost: 90, Count: 1},
	}
	return batch, want
}

func sameRollup(t *testing.T, what string, got, want []usageRowT) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: rollup %+v, want %+v", what, got, want)
	}
	for i := range got {
		if !got[i].Hour.Equal(want[i].Hour) || got[i].Metric != want[i].Metric || got[i].Units != want[i].Units ||
			got[i].Cost != want[i].Cost || got[i].Count != want[i].Count {
			t.Fatalf("%s: rollup row %d %+v, want %+v", what, i, got[i], want[i])
		}
	}
}

// TestUsageRollupReplay states the rollup's exactly-once: whichever way a
// batch is written (COPY, INSERT), replaying it, replaying it inside a
// bigger batch, or racing Applies of it leave the rollup as one Apply
// made it; only the new entries of a mixed batch add to it.
func TestUsageRollupReplay(t *testing.T) {
	t.Parallel()
	for _, way := range []struct {
		name    string
		copyMin int
	}{{"copy", 1}, {"insert", copyMinMutations}} {
		t.Run(way.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			store := &Store{pool: b.pool, copyMin: way.copyMin}
			live, _ := b.tenant(t)
			a := newAccount(live, time.Date(2026, 3, 1, 7, 0, 0, 0, time.UTC))
			batch, want := usageFixture(a)
			if err := store.Apply(b.ctx, batch); err != nil {
				t.Fatal(err)
			}
			sameRollup(t, "first apply", b.rollup(t, a.key.CustomerID), want)

			if err := store.Apply(b.ctx, batch); err != nil {
				t.Fatal(err)
			}
			sameRollup(t, "replayed batch", b.rollup(t, a.key.CustomerID), want)

			// A redelivery of old Mutations next to a new one: only the new
			// consume adds (3 units, 30 mc, one more in the api_call hour).
			var block uuid.UUID
			for id := range a.blocks {
				block = id
			}
			a.at = want[0].Hour.Add(30 * time.Minute)
			fresh := a.consume("", block, 30, "api_call", 0)
			fresh.Entries[0].Units = ptr(int64(3))
			mixed := append(append([]engine.Mutation{}, batch...), fresh)
			if err := store.Apply(b.ctx, mixed); err != nil {
				t.Fatal(err)
			}
			want[0].Units, want[0].Cost, want[0].Count = want[0].Units+3, want[0].Cost+30, want[0].Count+1
			sameRollup(t, "mixed batch", b.rollup(t, a.key.CustomerID), want)

			var wg sync.WaitGroup
			errs := make(chan error, 6)
			for range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- store.Apply(b.ctx, mixed)
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("concurrent Apply: %v", err)
				}
			}
			sameRollup(t, "racing replays", b.rollup(t, a.key.CustomerID), want)
			if replays := store.ReplayedApplies(); replays < 2 {
				t.Fatalf("%d replayed applies, want the ON CONFLICT path taken", replays)
			}
		})
	}
}

// TestUsageRollupRacingFirstApplies states that two Applies of one new
// batch racing from the start (a claimed batch written by two nodes) add
// it once.
func TestUsageRollupRacingFirstApplies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Date(2026, 3, 1, 7, 0, 0, 0, time.UTC))
	batch, want := usageFixture(a)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- b.store.Apply(b.ctx, batch)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Apply: %v", err)
		}
	}
	sameRollup(t, "racing applies", b.rollup(t, a.key.CustomerID), want)
}

// TestUsageBackfillMatchesPersister states that migration 020's backfill
// and the persister agree: the rollup rebuilt from the ledger equals the
// one Apply kept.
func TestUsageBackfillMatchesPersister(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Date(2026, 3, 1, 7, 0, 0, 0, time.UTC))
	batch, want := usageFixture(a)
	if err := b.store.Apply(b.ctx, batch); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("migrations/020_usage_rollup.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	backfill := string(src)[strings.Index(string(src), "INSERT INTO usage_hourly"):]
	if _, err := b.pool.Exec(b.ctx, "DELETE FROM usage_hourly"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, backfill); err != nil {
		t.Fatalf("backfill: %v", err)
	}
	sameRollup(t, "backfill", b.rollup(t, a.key.CustomerID), want)
}

// TestUsageRows sums the hours into each granularity's UTC buckets, per
// metric, for a customer and for its tenant, with the metric filter.
func TestUsageRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	start := time.Date(2026, 1, 31, 22, 0, 0, 0, time.UTC)
	one := newAccount(live, start)
	two := newAccount(live, start)
	other := newAccount(sandbox, start)
	var batch []engine.Mutation
	for _, a := range []*account{one, two, other} {
		batch = append(batch, a.grant("", 100_000, nil))
		var block uuid.UUID
		for id := range a.blocks {
			block = id
		}
		// Jan 31 22:xx, Jan 31 23:xx, Feb 1 00:xx: two days, two months.
		for h := range 3 {
			a.at = start.Add(time.Duration(h)*time.Hour + time.Minute)
			m := a.consume("", block, 10, "api_call", 0)
			m.Entries[0].Units = ptr(int64(h + 1))
			batch = append(batch, m)
		}
		batch = append(batch, a.consumeMulti(block, 5, []engine.UsageItem{{Metric: "tokens", Units: 7, Cost: 5}}))
	}
	if err := b.store.Apply(b.ctx, batch); err != nil {
		t.Fatal(err)
	}
	jan31, feb1 := time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC)
	jan1 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tokens := "tokens"
	for _, tc := range []struct {
		name     string
		customer *uuid.UUID
		metric   *string
		g        engine.UsageGranularity
		from, to time.Time
		want     []engine.UsageRow
	}{
		{"hour", &one.key.CustomerID, nil, engine.UsageGranularityHour, jan31, feb1.Add(24 * time.Hour), []engine.UsageRow{
			{BillableMetricKey: "api_call", Start: start, Units: 1, Cost: 10, Count: 1},
			{BillableMetricKey: "api_call", Start: start.Add(time.Hour), Units: 2, Cost: 10, Count: 1},
			{BillableMetricKey: "api_call", Start: feb1, Units: 3, Cost: 10, Count: 1},
			{BillableMetricKey: "tokens", Start: feb1, Units: 7, Cost: 5, Count: 1},
		}},
		{"day", &one.key.CustomerID, nil, engine.UsageGranularityDay, jan31, feb1.Add(24 * time.Hour), []engine.UsageRow{
			{BillableMetricKey: "api_call", Start: jan31, Units: 3, Cost: 20, Count: 2},
			{BillableMetricKey: "api_call", Start: feb1, Units: 3, Cost: 10, Count: 1},
			{BillableMetricKey: "tokens", Start: feb1, Units: 7, Cost: 5, Count: 1},
		}},
		{"month, tenant-wide", nil, nil, engine.UsageGranularityMonth, jan1, feb1.AddDate(0, 1, 0), []engine.UsageRow{
			{BillableMetricKey: "api_call", Start: jan1, Units: 6, Cost: 40, Count: 4},
			{BillableMetricKey: "api_call", Start: feb1, Units: 6, Cost: 20, Count: 2},
			{BillableMetricKey: "tokens", Start: feb1, Units: 14, Cost: 10, Count: 2},
		}},
		{"window cuts hours, metric filter", &two.key.CustomerID, &tokens, engine.UsageGranularityHour, jan31, feb1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := b.store.UsageRows(b.ctx, engine.UsageQuery{TenantID: live.TenantID, Environment: live.Environment,
				CustomerID: tc.customer, BillableMetricKey: tc.metric, Granularity: tc.g, From: tc.from, To: tc.to})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("rows %+v, want %+v", got, tc.want)
			}
			for i := range got {
				g, w := got[i], tc.want[i]
				if g.BillableMetricKey != w.BillableMetricKey || !g.Start.Equal(w.Start) || g.Units != w.Units || g.Cost != w.Cost || g.Count != w.Count {
					t.Fatalf("row %d %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

// TestUsageRollupSaturates states that sums past int64 are held at its
// maximum rather than failing the persister's transaction (invariant 12).
func TestUsageRollupSaturates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Date(2026, 3, 1, 7, 0, 0, 0, time.UTC))
	g := a.grant("", 10, nil)
	var block uuid.UUID
	for id := range a.blocks {
		block = id
	}
	first := a.consume("", block, 1, "api_call", 0)
	first.Entries[0].Units = ptr(int64(math.MaxInt64))
	second := a.consume("", block, 1, "api_call", 0)
	second.Entries[0].Units = ptr(int64(math.MaxInt64))
	third := a.consume("", block, 1, "api_call", 0)
	third.Entries[0].Units = ptr(int64(5))
	for _, batch := range [][]engine.Mutation{{g, first, second}, {third}} {
		if err := b.store.Apply(b.ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	got := b.rollup(t, a.key.CustomerID)
	if len(got) != 1 || got[0].Units != math.MaxInt64 || got[0].Count != 3 || got[0].Cost != 3 {
		t.Fatalf("rollup %+v, want units held at MaxInt64, count 3, cost 3", got)
	}
}
