package engine

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/google/uuid"
)

func i64(v int64) *int64 { return &v }

// TestThresholdCrossed checks the crossing rule at its edges: from at or
// above to strictly below fires; landing on the threshold, staying below,
// rising, and a 0 (unresolved) threshold do not.
func TestThresholdCrossed(t *testing.T) {
	tests := []struct {
		name                     string
		before, after, threshold int64
		want                     bool
	}{
		{"above to below", 500, 50, 100, true},
		{"exactly at to below", 100, 99, 100, true},
		{"above to exactly at", 500, 100, 100, false},
		{"below stays below", 99, 10, 100, false},
		{"rising through", 50, 500, 100, false},
		{"unresolved threshold", 500, 0, 0, false},
		{"into overdraft", 100, -5, 1, true},
	}
	for _, tt := range tests {
		if got := ThresholdCrossed(tt.before, tt.after, tt.threshold); got != tt.want {
			t.Errorf("%s: ThresholdCrossed(%d, %d, %d) = %v, want %v", tt.name, tt.before, tt.after, tt.threshold, got, tt.want)
		}
	}
}

// TestResolveThreshold checks the percent bases, floor rounding, no
// overflow near MaxInt64, and an unknown base (0) leaving the threshold off.
func TestResolveThreshold(t *testing.T) {
	pct := func(typ ThresholdType, p int64) AlertThreshold { return AlertThreshold{Type: typ, Percent: &p} }
	tests := []struct {
		name               string
		t                  AlertThreshold
		lastGrant, allowed int64
		want               int64
	}{
		{"absolute", AlertThreshold{Type: ThresholdAbsolute, AmountMC: i64(2500)}, 0, 0, 2500},
		{"20% of last grant", pct(ThresholdPercentOfLastGrant, 20), 10_000, 99, 2000},
		{"floor", pct(ThresholdPercentOfLastGrant, 33), 1001, 0, 330},
		{"10% of allowance", pct(ThresholdPercentOfPeriodAllowance, 10), 5, 50_000, 5000},
		{"no grant yet", pct(ThresholdPercentOfLastGrant, 50), 0, 1000, 0},
		{"no subscription", pct(ThresholdPercentOfPeriodAllowance, 50), 1000, 0, 0},
		{"100% of max", pct(ThresholdPercentOfLastGrant, 100), math.MaxInt64, 0, math.MaxInt64},
		{"99% of max", pct(ThresholdPercentOfLastGrant, 99), math.MaxInt64, 0, math.MaxInt64/100*99 + math.MaxInt64%100*99/100},
	}
	for _, tt := range tests {
		if got := ResolveThreshold(tt.t, tt.lastGrant, tt.allowed); got != tt.want {
			t.Errorf("%s: got %d, want %d", tt.name, got, tt.want)
		}
	}
}

// alertStep is one Mutation of an alert walk: its kind, the effective
// balance after it, the credits it granted, its time offset in seconds.
type alertStep struct {
	kind    MutationKind
	after   int64
	granted int64
	atS     int64
	// replay re-sends the previous step's Mutation (same version).
	replay bool
	want   []string
}

// walkAlerts runs steps through EvaluateAlerts on one subject and reports,
// per step, the events as "type:threshold_mc" (topup: "topup:requested").
func walkAlerts(t *testing.T, s *AlertSubject, steps []alertStep) {
	t.Helper()
	var version int64 = 10
	balance := s.State.BalanceMC
	var prev Mutation
	for i, st := range steps {
		m := prev
		if !st.replay {
			version++
			m = Mutation{OpID: uuid.New(), Kind: st.kind, TenantID: uuid.New(), CustomerID: uuid.New(),
				Environment: EnvironmentLive, AtMS: 1_700_000_000_000 + st.atS*1000,
				Account: MutationAccount{Version: version, Balance: st.after}}
			switch {
			case st.granted > 0:
				m.Entries = []MutationEntry{mainEntry(st.granted, EntryPlanGrant)}
			case st.kind == MutationDebit:
				// A debit's before is derived from what it took.
				m.Entries = []MutationEntry{mainEntry(st.after-balance, EntryAdjustment)}
			}
			balance = st.after
		}
		prev = m
		got := []string{}
		for _, e := range EvaluateAlerts(s, &m) {
			var env struct {
				Data map[string]any `json:"data"`
			}
			if err := json.Unmarshal(e.Payload, &env); err != nil {
				t.Fatal(err)
			}
			switch e.EventType {
			case EventCreditThresholdCrossed:
				got = append(got, "crossed:"+jsonNumber(env.Data["threshold_mc"]))
			case EventCreditTopupRequested:
				got = append(got, "topup:"+jsonNumber(env.Data["requested_mc"]))
				key, _ := env.Data["idempotency_key"].(string)
				if !strings.HasSuffix(key, e.ID.String()) {
					t.Errorf("step %d: topup idempotency_key %q does not name the event %s", i, key, e.ID)
				}
			}
		}
		if !reflect.DeepEqual(got, st.want) && !(len(got) == 0 && len(st.want) == 0) {
			t.Errorf("step %d (%s to %d): events %v, want %v", i, st.kind, st.after, got, st.want)
		}
	}
}

func jsonNumber(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestEvaluateAlertsFiresOncePerCrossing walks a customer down through two
// thresholds, keeps consuming below them (nothing), lifts it back with a
// grant (re-armed) and crosses again; a replayed Mutation fires nothing.
func TestEvaluateAlertsFiresOncePerCrossing(t *testing.T) {
	s := &AlertSubject{ExternalID: "acme", Settings: AlertSettings{Thresholds: []AlertThreshold{
		{Type: ThresholdAbsolute, AmountMC: i64(500)},
		{Type: ThresholdPercentOfLastGrant, Percent: i64(20)},
	}}, State: AlertState{BalanceMC: 1000, BalanceKnown: true, LastGrantMC: 1000, Version: 10}}
	walkAlerts(t, s, []alertStep{
		{kind: MutationConsume, after: 600},
		{kind: MutationConsume, after: 450, want: []string{"crossed:500"}},
		{replay: true},
		{kind: MutationConsume, after: 300},
		{kind: MutationDebit, after: 150, want: []string{"crossed:200"}},
		{kind: MutationConsume, after: 100},
		// A grant of 2000 lifts the balance and makes the percent threshold 400.
		{kind: MutationGrant, after: 2100, granted: 2000},
		{kind: MutationConsume, after: 450, want: []string{"crossed:500"}},
		{kind: MutationConsume, after: 399, want: []string{"crossed:400"}},
		// An expiry is a downward move like any other; a gauge is none.
		{kind: MutationGrant, after: 1000, granted: 601},
		{kind: MutationGaugeKind, after: 1000},
		{kind: MutationExpire, after: 10, want: []string{"crossed:500", "crossed:120"}},
	})
}

// TestEvaluateAlertsTopupDedupe checks the top-up rule fires once per
// crossing and not again within its dedupe window even when re-armed, then
// again on the first crossing after the window.
func TestEvaluateAlertsTopupDedupe(t *testing.T) {
	s := &AlertSubject{Settings: AlertSettings{Topup: &TopupRule{BelowMC: 100, AmountMC: 5000, DedupeWindowSeconds: 3600}},
		State: AlertState{BalanceMC: 1000, BalanceKnown: true, Version: 10}}
	walkAlerts(t, s, []alertStep{
		{kind: MutationConsume, after: 90, atS: 0, want: []string{"topup:5000"}},
		{kind: MutationConsume, after: 50, atS: 10},
		{kind: MutationGrant, after: 500, granted: 450, atS: 20},
		{kind: MutationConsume, after: 20, atS: 3599},
		{kind: MutationGrant, after: 500, granted: 480, atS: 3600},
		{kind: MutationConsume, after: 0, atS: 3600, want: []string{"topup:5000"}},
	})
}

// TestEvaluateAlertsUnknownStart: with no state, the Mutation's own
// before figure decides; without one, the first Mutation only sets the
// state and fires nothing.
func TestEvaluateAlertsUnknownStart(t *testing.T) {
	s := &AlertSubject{Settings: AlertSettings{Thresholds: []AlertThreshold{{Type: ThresholdAbsolute, AmountMC: i64(100)}}}}
	before := int64(200)
	m := Mutation{OpID: uuid.New(), Kind: MutationConsume, Account: MutationAccount{Version: 3, Balance: 50},
		EffectiveBefore: &before, Context: &MutationContext{ExternalID: "ctx-ext"}}
	evs := EvaluateAlerts(s, &m)
	if len(evs) != 1 || evs[0].ID != EventID(m.OpID, ThresholdSlot(0)) {
		t.Fatalf("events %v, want one in threshold slot 0", types(evs))
	}
	if !strings.Contains(string(evs[0].Payload), `"external_customer_id":"ctx-ext"`) {
		t.Errorf("payload %s lacks the context's external id", evs[0].Payload)
	}
	s = &AlertSubject{Settings: s.Settings}
	m = Mutation{OpID: uuid.New(), Kind: MutationGrant, Account: MutationAccount{Version: 3, Balance: 50}}
	if evs := EvaluateAlerts(s, &m); len(evs) != 0 || !s.State.BalanceKnown || s.State.BalanceMC != 50 {
		t.Fatalf("unknown start: events %v, state %+v", types(evs), s.State)
	}
	// Without a before figure of its own, the next version continues the
	// state; a version further on (Mutations nobody evaluated in between,
	// say while the settings were removed) does not compare with it.
	s.State.BalanceMC = 500
	m = Mutation{OpID: uuid.New(), Kind: MutationRelease, Account: MutationAccount{Version: 4, Balance: 50}}
	if evs := EvaluateAlerts(s, &m); len(evs) != 1 {
		t.Fatalf("continuous state: events %v, want one crossing", types(evs))
	}
	s.State.BalanceMC = 500
	m = Mutation{OpID: uuid.New(), Kind: MutationRelease, Account: MutationAccount{Version: 9, Balance: 50}}
	if evs := EvaluateAlerts(s, &m); len(evs) != 0 || s.State.Version != 9 {
		t.Fatalf("stale state: events %v, state %+v; want none", types(evs), s.State)
	}
}

// TestEvaluateAlertsCountsExpiredCredit (issue 24): an expiry's script
// reports the balance before it without the due blocks (they already count
// for nothing), so before == after; the alert rules add what the expiry
// entries took and see the drop that crossed them.
func TestEvaluateAlertsCountsExpiredCredit(t *testing.T) {
	tests := []struct {
		name    string
		expired []int64
		want    []EventType
	}{
		{"one block across both", []int64{-100}, []EventType{EventCreditThresholdCrossed, EventCreditTopupRequested}},
		{"six blocks across both", []int64{-10, -10, -10, -10, -10, -10}, []EventType{EventCreditThresholdCrossed, EventCreditTopupRequested}},
		{"a spent block crosses nothing", []int64{0}, []EventType{}},
		{"too little to cross", []int64{-5}, []EventType{}},
	}
	for _, tt := range tests {
		s := &AlertSubject{Settings: AlertSettings{
			Thresholds: []AlertThreshold{{Type: ThresholdAbsolute, AmountMC: i64(1030)}},
			Topup:      &TopupRule{BelowMC: 1050, AmountMC: 500, DedupeWindowSeconds: 3600}}}
		eb := int64(1000)
		m := Mutation{OpID: uuid.New(), Kind: MutationExpire, Account: MutationAccount{Version: 4, Balance: 1000}, EffectiveBefore: &eb}
		for _, d := range tt.expired {
			m.Entries = append(m.Entries, MutationEntry{Role: RoleExpiry, Type: EntryExpiry, Delta: d})
		}
		if got := types(EvaluateAlerts(s, &m)); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: events %v, want %v", tt.name, got, tt.want)
		}
	}
}
