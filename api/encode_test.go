package api

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestAppendMatchesEncoder: the appended check and consume bodies are byte
// for byte what encoding/json's Encoder writes, for every member shape.
func TestAppendMatchesEncoder(t *testing.T) {
	t.Parallel()
	n := func(v int64) *int64 { return &v }
	s := func(v string) *string { return &v }
	on, off := true, false
	pol := engine.OveragePolicyNotify
	id := uuid.MustParse("0191e3c1-8b7a-7c2d-9e4f-a1b2c3d4e5f6")
	checks := map[string]engine.CheckResult{
		"metered": {Type: engine.MetricMetered, Allowed: true, CustomerID: id, BillableMetricKey: "api_calls",
			Units: n(3), Balance: n(9_000_000_000_000), ReservedBalance: n(0), PendingBalance: n(7), EffectiveBalance: n(-12),
			EstimatedCost: n(9), BalanceAfter: n(-21), OveragePolicy: &pol},
		"metered with subscription": {Type: engine.MetricMetered, CustomerID: id, BillableMetricKey: "a.b:c-d",
			Units: n(1), Balance: n(1), ReservedBalance: n(1), PendingBalance: n(0), EffectiveBalance: n(0),
			EstimatedCost: n(1), BalanceAfter: n(-1), SubscriptionStatus: s("past_due"), OveragePolicy: &pol},
		"boolean": {Type: engine.MetricBoolean, Allowed: false, CustomerID: id, BillableMetricKey: "sso", Enabled: &off},
		"boolean on": {Type: engine.MetricBoolean, Allowed: true, CustomerID: id, BillableMetricKey: "sso", Enabled: &on,
			SubscriptionStatus: s("active")},
		"gauge":          {Type: engine.MetricGauge, Allowed: true, CustomerID: id, BillableMetricKey: "seats", Current: n(2), Cap: n(5), Headroom: n(3)},
		"escaped key":    {Type: engine.MetricGauge, CustomerID: id, BillableMetricKey: "<a&b>\"\\\u2028é\xff\n"},
		"zero customer":  {Type: engine.MetricMetered},
		"empty statuses": {Type: engine.MetricMetered, SubscriptionStatus: s("")},
	}
	for name, r := range checks {
		var want bytes.Buffer
		_ = json.NewEncoder(&want).Encode(&r)
		if got := appendCheck(nil, &r); !bytes.Equal(got, want.Bytes()) {
			t.Errorf("check %s:\n got %s\nwant %s", name, got, want.Bytes())
		}
	}
	tx := uuid.MustParse("0191e3c1-8b7a-7c2d-9e4f-000000000001")
	consumes := map[string]engine.ConsumeResult{
		"charged": {TransactionID: &tx, CustomerID: id, BillableMetricKey: s("api_calls"), Units: n(2), Cost: 6, Charged: 6,
			BalanceAfter: 994, EffectiveBalance: 994},
		"overage": {TransactionID: &tx, CustomerID: id, BillableMetricKey: s("api_calls"), Units: n(2), Cost: 6, Charged: 1,
			OverageMC: 5, BalanceAfter: -5, EffectiveBalance: -5},
		"replay":   {CustomerID: id, BillableMetricKey: s("k"), Units: n(0), Reason: s(engine.ReasonDuplicateReplay)},
		"escaped":  {BillableMetricKey: s("<\u2029>"), Units: n(0), Reason: s("a&b")},
		"negative": {BillableMetricKey: s(""), Units: n(-1), Cost: -9_223_372_036_854_775_808},
		"items": {TransactionID: &tx, CustomerID: id, Cost: 9, Charged: 9, Items: []engine.ItemCost{
			{BillableMetricKey: "api_calls", Units: 2, Cost: 6}, {BillableMetricKey: "<gpu>", Units: 5, Cost: 3}}},
		"one item": {TransactionID: &tx, CustomerID: id, Cost: 6, Charged: 6, Items: []engine.ItemCost{
			{BillableMetricKey: "api_calls", Units: 2, Cost: 6}}},
		"dry run": {CustomerID: id, BillableMetricKey: s("api_calls"), Units: n(2), Cost: 6, Charged: 6, BalanceAfter: 4,
			EffectiveBalance: 4, Dry: true, Draws: []engine.BlockDraw{{BlockID: tx, Amount: 5}, {BlockID: id, Amount: 1}},
			Events: []engine.EventType{engine.EventCreditConsumed, engine.EventCreditLowBalance}},
	}
	for name, r := range consumes {
		var want bytes.Buffer
		_ = json.NewEncoder(&want).Encode(&r)
		if got := appendConsume(nil, &r); !bytes.Equal(got, want.Bytes()) {
			t.Errorf("consume %s:\n got %s\nwant %s", name, got, want.Bytes())
		}
	}
	at := time.Date(2026, 12, 2, 11, 30, 0, 123456789, time.UTC)
	berlin := time.FixedZone("CET", 3600)
	acct := engine.ReservationAccount{Balance: 1000, ReservedBalance: 30, EffectiveBalance: -970}
	reserves := map[string]engine.ReserveResult{
		"active": {ID: tx, CustomerID: id, BillableMetricKey: "gpu.seconds", EstimatedUnits: 3, EstimatedCost: 30,
			Environment: engine.EnvironmentLive, Status: engine.ReservationActive, ExpiresAt: at.Add(time.Hour), Account: acct, CreatedAt: at},
		// What a reservation made without metadata answers (engine.orEmpty).
		"empty metadata": {ID: tx, CustomerID: id, BillableMetricKey: "api_calls", EstimatedUnits: 10, EstimatedCost: 10,
			Environment: engine.EnvironmentLive, Status: engine.ReservationActive, ExpiresAt: at, Account: acct,
			Metadata: engine.Metadata{}, CreatedAt: at},
		"whole seconds, another zone": {ID: tx, CustomerID: id, BillableMetricKey: "k", Environment: engine.EnvironmentSandbox,
			Status: engine.ReservationActive, ExpiresAt: time.Date(2027, 1, 1, 0, 0, 0, 0, berlin), CreatedAt: at.Truncate(time.Second)},
		"escaped key, zero times": {BillableMetricKey: "<a&b>\u2028é", EstimatedUnits: -1, EstimatedCost: -9_223_372_036_854_775_808},
	}
	for name, r := range reserves {
		var want bytes.Buffer
		_ = json.NewEncoder(&want).Encode(&r)
		if got := appendReserve(nil, &r); !bytes.Equal(got, want.Bytes()) {
			t.Errorf("reserve %s:\n got %s\nwant %s", name, got, want.Bytes())
		}
	}
	key, units := "gpu.seconds", int64(80)
	commits := map[string]engine.CommitResult{
		"committed": {ReservationID: tx, Status: engine.ReservationCommitted, EstimatedUnits: 10, ActualUnits: 8, EstimatedCost: 100,
			ActualCost: 80, Released: 20, Transaction: engine.ReservationTransaction{ID: id, CustomerID: &id, Delta: -80,
				Type: engine.EntryConsumption, BillableMetricKey: &key, CostUnits: &units, ReferenceID: &tx, CreatedAt: at},
			Account: acct, SettledUnits: 8, SettledCost: 80},
		"partial, bare transaction": {ReservationID: tx, Status: engine.ReservationActive, ActualUnits: 1, ActualCost: 10,
			Transaction:  engine.ReservationTransaction{ID: id, Type: engine.EntryConsumption, CreatedAt: at.In(berlin)},
			SettledUnits: 1, SettledCost: 10, RemainingCost: 90},
		"escaped key": {Transaction: engine.ReservationTransaction{BillableMetricKey: func() *string { v := "<\u2029>"; return &v }()}},
	}
	gauges := map[string]engine.GaugeResult{
		"allowed":  {BillableMetricKey: "seats", Current: 3, Cap: 10, Allowed: true, Headroom: 7},
		"refused":  {BillableMetricKey: "<seats&>", Current: 10, Cap: 10, Headroom: 0},
		"negative": {Current: -1, Cap: -9_223_372_036_854_775_808, Headroom: -2},
	}
	for name, r := range gauges {
		var want bytes.Buffer
		_ = json.NewEncoder(&want).Encode(&r)
		if got := appendGauge(nil, &r); !bytes.Equal(got, want.Bytes()) {
			t.Errorf("gauge %s:\n got %s\nwant %s", name, got, want.Bytes())
		}
	}
	for name, r := range commits {
		var want bytes.Buffer
		_ = json.NewEncoder(&want).Encode(&r)
		if got := appendCommit(nil, &r); !bytes.Equal(got, want.Bytes()) {
			t.Errorf("commit %s:\n got %s\nwant %s", name, got, want.Bytes())
		}
	}
}
