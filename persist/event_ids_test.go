package persist

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestEveryOwedEventIsWritten is the property behind issue 24: for random
// batches of Mutations (grants, debits, consumes, reservations, commits, releases,
// expiries, each possibly expiring blocks first) under random alert
// settings, the rows the persister writes (eventRowsOf) hold every event
// every emitter owes (EventsOf, EvaluateAlerts, LowBalanceEvent), each
// under its own id. Equal ids are stored once, so a shared id would show
// here as a missing row.
func TestEveryOwedEventIsWritten(t *testing.T) {
	for seed := range uint64(3000) {
		rng := rand.New(rand.NewPCG(seed, 24))
		ms, subjects, thresholds, want := randomAlertBatch(rng)
		out := &alertOutcome{events: map[uuid.UUID][]engine.Event{}, thresholds: thresholds}
		owed := 0
		for i := range ms {
			m := &ms[i]
			owed += len(engine.EventsOf(*m))
			if sub := subjects[m.CustomerID]; sub != nil {
				evs := engine.EvaluateAlerts(sub, m)
				out.events[m.OpID] = append(out.events[m.OpID], evs...)
				owed += len(evs)
			}
			if m.Context == nil {
				if _, ok := engine.LowBalanceEvent(*m, thresholds[m.CustomerID]); ok {
					owed++
				}
			}
		}
		plain, filled, carried := eventRowsOf(ms, out, shapeLean, true)
		got := map[engine.EventType]int{}
		for _, b := range []*eventBatch{plain, filled, carried} {
			for _, typ := range b.typ {
				got[engine.EventType(typ)]++
			}
		}
		written := len(plain.id) + len(filled.id) + len(carried.id)
		if written != owed {
			t.Fatalf("seed %d: %d events written of %d owed (%v)", seed, written, owed, got)
		}
		for typ, n := range want {
			if got[typ] != n {
				t.Fatalf("seed %d: %d %s written, want %d (all: %v)", seed, got[typ], typ, n, got)
			}
		}
	}
}

// randomAlertBatch makes a batch of 1..4 customers with 1..3 Mutations
// each, their alert subjects (absolute thresholds and a top-up rule, or
// none) and low-balance thresholds, and counts independently the
// expiry, threshold, top-up and low-balance events the batch owes.
func randomAlertBatch(rng *rand.Rand) ([]engine.Mutation, map[uuid.UUID]*engine.AlertSubject, map[uuid.UUID]int64,
	map[engine.EventType]int) {
	kinds := []engine.MutationKind{engine.MutationGrant, engine.MutationDebit, engine.MutationConsume,
		engine.MutationReserve, engine.MutationCommit, engine.MutationRelease, engine.MutationExpire}
	amount := func() int64 { return rng.Int64N(2000) }
	var ms []engine.Mutation
	subjects := map[uuid.UUID]*engine.AlertSubject{}
	thresholds := map[uuid.UUID]int64{}
	want := map[engine.EventType]int{}
	tenant := uuid.New()
	for range 1 + rng.IntN(4) {
		customer := uuid.New()
		var settings engine.AlertSettings
		for range rng.IntN(engine.MaxAlertThresholds + 1) {
			settings.Thresholds = append(settings.Thresholds, engine.AlertThreshold{Type: engine.ThresholdAbsolute, AmountMC: ptr(1 + amount())})
		}
		if rng.IntN(2) == 0 {
			settings.Topup = &engine.TopupRule{BelowMC: 1 + amount(), AmountMC: 1000, DedupeWindowSeconds: 3600}
		}
		if !settings.Empty() {
			subjects[customer] = &engine.AlertSubject{ExternalID: "ext", Settings: settings}
		}
		lowBalance := rng.Int64N(3) * amount()
		thresholds[customer] = lowBalance
		topupFired := false
		balance := amount()
		for v := range int64(1 + rng.IntN(3)) {
			kind := kinds[rng.IntN(len(kinds))]
			m := engine.Mutation{OpID: uuid.New(), Kind: kind, TenantID: tenant, CustomerID: customer,
				Environment: engine.EnvironmentLive, AtMS: 1_700_000_000_000 + v*1000}
			// The alert rules measure the drop from before the expiries; the
			// script's effective balance before (eb) leaves due blocks out.
			start := balance
			for range rng.IntN(9) {
				d := -rng.Int64N(300)
				if d < 0 {
					want[engine.EventCreditExpired]++
				}
				balance += d
				src := engine.SourceManual
				m.Entries = append(m.Entries, engine.MutationEntry{Role: engine.RoleExpiry, Delta: d, Type: engine.EntryExpiry,
					Source: &src, BlockID: ptr(uuid.New())})
			}
			before := balance
			main := func(delta int64, typ engine.EntryType) {
				src := engine.SourceManual
				m.Entries = append(m.Entries, engine.MutationEntry{Role: engine.RoleMain, Delta: delta, Type: typ, Source: &src})
				balance += delta
			}
			switch kind {
			case engine.MutationGrant:
				main(1+amount(), engine.EntryAdjustment)
			case engine.MutationDebit:
				main(-1-amount(), engine.EntryAdjustment)
			case engine.MutationConsume, engine.MutationCommit:
				charged := amount()
				refused := kind == engine.MutationConsume && rng.IntN(5) == 0
				if refused {
					charged = 0
				}
				main(-charged, engine.EntryConsumption)
				m.Usage = &engine.MutationUsage{Metric: "tokens", Units: 1, Cost: charged, Charged: charged, Refused: refused}
			case engine.MutationReserve:
				m.Reservation = &engine.MutationReservation{ID: uuid.New(), Metric: "tokens"}
			}
			m.Account = engine.MutationAccount{ID: "a", Version: v + 1, Balance: balance}
			m.EffectiveBefore = ptr(before)
			if rng.IntN(3) > 0 {
				m.Context = &engine.MutationContext{ExternalID: "ext", ThresholdMC: lowBalance, Policy: engine.OveragePolicyBlock}
			}
			refused := m.Usage != nil && m.Usage.Refused
			switch kind {
			case engine.MutationConsume, engine.MutationReserve, engine.MutationCommit, engine.MutationDebit:
				if !refused && engine.LowBalanceCrossed(before, balance, lowBalance) {
					want[engine.EventCreditLowBalance]++
				}
			}
			for _, th := range settings.Thresholds {
				if engine.ThresholdCrossed(start, balance, *th.AmountMC) {
					want[engine.EventCreditThresholdCrossed]++
				}
			}
			if r := settings.Topup; r != nil && !topupFired && engine.ThresholdCrossed(start, balance, r.BelowMC) {
				want[engine.EventCreditTopupRequested]++
				topupFired = true
			}
			ms = append(ms, m)
		}
	}
	return ms, subjects, thresholds, want
}

// TestEventIDsOfOneOperationAreDistinct: the ids of every event one
// Mutation owes, from every emitter, differ (the shape issue 24 found:
// several expired blocks, a threshold and a top-up in one operation),
// and deriving them again gives the same ids.
func TestEventIDsOfOneOperationAreDistinct(t *testing.T) {
	for blocks := range 12 {
		m := engine.Mutation{OpID: uuid.New(), Kind: engine.MutationExpire, TenantID: uuid.New(), CustomerID: uuid.New(),
			Environment: engine.EnvironmentLive, AtMS: 1_700_000_000_000}
		before := int64(1000) // the script's eb: due blocks count for nothing
		for range blocks {
			src := engine.SourceManual
			m.Entries = append(m.Entries, engine.MutationEntry{Role: engine.RoleExpiry, Delta: -10, Type: engine.EntryExpiry,
				Source: &src, BlockID: ptr(uuid.New())})
		}
		m.Account = engine.MutationAccount{Version: 2, Balance: 1000}
		m.EffectiveBefore = &before
		settings := engine.AlertSettings{Topup: &engine.TopupRule{BelowMC: 1000 + 10*int64(blocks), AmountMC: 500, DedupeWindowSeconds: 60}}
		for i := range engine.MaxAlertThresholds {
			settings.Thresholds = append(settings.Thresholds, engine.AlertThreshold{Type: engine.ThresholdAbsolute, AmountMC: ptr(1001 + int64(i))})
		}
		ids := func() []uuid.UUID {
			var out []uuid.UUID
			for _, e := range engine.EventsOf(m) {
				out = append(out, e.ID)
			}
			for _, e := range engine.EvaluateAlerts(&engine.AlertSubject{Settings: settings}, &m) {
				out = append(out, e.ID)
			}
			return out
		}
		first := ids()
		// With a block expiring the balance falls from at least 1010 to
		// 1000: every threshold (1001..1010) and the top-up rule are crossed.
		wantN := 0
		if blocks > 0 {
			wantN = blocks + engine.MaxAlertThresholds + 1
		}
		seen := map[uuid.UUID]bool{}
		for _, id := range first {
			if seen[id] {
				t.Fatalf("%d blocks: id %s given to two events", blocks, id)
			}
			seen[id] = true
		}
		if again := ids(); fmt.Sprint(again) != fmt.Sprint(first) {
			t.Fatalf("%d blocks: ids not deterministic:\n%v\n%v", blocks, first, again)
		}
		if len(first) != wantN {
			t.Fatalf("%d blocks: %d events, want %d", blocks, len(first), wantN)
		}
	}
}
