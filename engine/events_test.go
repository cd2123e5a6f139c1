package engine

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
)

// mut builds a Mutation of kind with the effective balance moving from
// before to after (balance only; reserved and pending 0) and threshold th.
func mut(kind MutationKind, before, after, th int64, policy OveragePolicy, usage *MutationUsage, entries ...MutationEntry) Mutation {
	m := Mutation{
		OpID: uuid.New(), Kind: kind, TenantID: uuid.New(), CustomerID: uuid.New(),
		Environment: EnvironmentLive, IdempotencyKey: "k1", AtMS: 1_700_000_000_000,
		Account: MutationAccount{ID: "a", Version: 2, Balance: after},
		Entries: entries, Usage: usage,
		Context:         &MutationContext{ExternalID: "ext-1", ThresholdMC: th, Policy: policy},
		EffectiveBefore: &before,
	}
	return m
}

func mainEntry(delta int64, typ EntryType) MutationEntry {
	src := SourceManual
	return MutationEntry{Role: RoleMain, Delta: delta, Type: typ, Source: &src}
}

func types(evs []Event) []EventType {
	out := []EventType{}
	for _, e := range evs {
		out = append(out, e.EventType)
	}
	return out
}

// TestEventsOf checks which events each Mutation owes (docs/spec/interface.md "Event
// kinds and emitters", docs/spec/addendum.md §8): crossings exactly at the threshold,
// exhaustion from > 0 to 0, refusals, notify overage, and the silent kinds.
func TestEventsOf(t *testing.T) {
	consumed := EventCreditConsumed
	low, exh, granted := EventCreditLowBalance, EventCreditExhausted, EventCreditGranted
	expired := EventCreditExpired
	use := func(charged, overage int64, refused bool) *MutationUsage {
		return &MutationUsage{Metric: "tokens", Units: 3, Cost: charged + overage, Charged: charged, Overage: overage, Refused: refused}
	}
	tests := []struct {
		name string
		m    Mutation
		want []EventType
	}{
		{"grant", mut(MutationGrant, 0, 500, 100, "", nil, mainEntry(500, EntryAdjustment)), []EventType{granted}},
		{"grant never crosses", mut(MutationGrant, 50, 550, 100, "", nil, mainEntry(500, EntryAdjustment)), []EventType{granted}},
		{"debit above threshold", mut(MutationDebit, 1000, 900, 100, "", nil, mainEntry(-100, EntryAdjustment)), []EventType{consumed}},
		{"debit lands exactly on threshold: no crossing", mut(MutationDebit, 1000, 100, 100, "", nil, mainEntry(-900, EntryAdjustment)), []EventType{consumed}},
		{"debit from exactly threshold to below", mut(MutationDebit, 100, 99, 100, "", nil, mainEntry(-1, EntryAdjustment)), []EventType{consumed, low}},
		{"debit already below: no second low", mut(MutationDebit, 99, 50, 100, "", nil, mainEntry(-49, EntryAdjustment)), []EventType{consumed}},
		{"debit to zero", mut(MutationDebit, 100, 0, 100, "", nil, mainEntry(-100, EntryAdjustment)), []EventType{consumed, low, exh}},
		{"threshold 0 is off", mut(MutationDebit, 100, 0, 0, "", nil, mainEntry(-100, EntryAdjustment)), []EventType{consumed, exh}},
		{"consume charged", mut(MutationConsume, 500, 300, 0, OveragePolicyBlock, use(200, 0, false), mainEntry(-200, EntryConsumption)), []EventType{consumed}},
		{"consume crossing", mut(MutationConsume, 500, 50, 100, OveragePolicyBlock, use(450, 0, false), mainEntry(-450, EntryConsumption)), []EventType{consumed, low}},
		{"consume refused under block", mut(MutationConsume, 50, 50, 100, OveragePolicyBlock, use(0, 0, true)), []EventType{exh}},
		{"allow overage to zero", mut(MutationConsume, 50, 0, 0, OveragePolicyAllow, use(50, 70, false), mainEntry(-50, EntryConsumption)), []EventType{consumed, exh}},
		{"allow overage only", mut(MutationConsume, 0, 0, 0, OveragePolicyAllow, use(0, 70, false), mainEntry(0, EntryConsumption)), []EventType{consumed}},
		{"notify overage only: nothing", mut(MutationConsume, 0, 0, 0, OveragePolicyNotify, use(0, 70, false), mainEntry(0, EntryConsumption)), nil},
		{"notify charges what it can", mut(MutationConsume, 50, 0, 0, OveragePolicyNotify, use(50, 70, false), mainEntry(-50, EntryConsumption)), []EventType{consumed, exh}},
		{"reserve crossing", mut(MutationReserve, 500, 0, 100, "", nil, MutationEntry{Role: RoleMain, Type: EntryReservation}), []EventType{low, exh}},
		{"commit", mut(MutationCommit, 500, 400, 0, "", use(100, 0, false), mainEntry(-100, EntryConsumption)), []EventType{consumed}},
		{"release", mut(MutationRelease, 0, 500, 100, "", nil, MutationEntry{Role: RoleMain, Type: EntryRelease}), nil},
		{"expire with credit left", mut(MutationExpire, 500, 0, 100, "", nil, MutationEntry{Role: RoleExpiry, Delta: -500, Type: EntryExpiry}), []EventType{expired}},
		{"expire of two blocks", mut(MutationExpire, 500, 0, 100, "", nil, MutationEntry{Role: RoleExpiry, Delta: -300, Type: EntryExpiry},
			MutationEntry{Role: RoleExpiry, Delta: -200, Type: EntryExpiry}), []EventType{expired, expired}},
		{"consume after an expiry", mut(MutationConsume, 500, 300, 0, OveragePolicyBlock, use(200, 0, false),
			MutationEntry{Role: RoleExpiry, Delta: -50, Type: EntryExpiry}, mainEntry(-200, EntryConsumption)), []EventType{expired, consumed}},
		{"gauge", mut(MutationGaugeKind, 0, 0, 100, "", nil), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := EventsOf(tc.m)
			if want := tc.want; !reflect.DeepEqual(types(got), append([]EventType{}, want...)) {
				t.Fatalf("events = %v, want %v", types(got), want)
			}
			// A replay derives the same ids.
			again := EventsOf(tc.m)
			for i := range got {
				if got[i].ID != again[i].ID {
					t.Fatalf("event %d id changed on replay", i)
				}
			}
			// For a persister whose ledger row carries credit.consumed: the
			// same events, that one without its payload, the others whole.
			carried := EventsOfCarried(tc.m)
			if len(carried) != len(got) {
				t.Fatalf("carried events = %v, want %v", types(carried), types(got))
			}
			for i, e := range carried {
				want := got[i]
				if e.EventType == EventCreditConsumed && e.ID == EventID(tc.m.OpID, SlotMain) {
					if e.Payload != nil {
						t.Errorf("carried credit.consumed has a payload: %s", e.Payload)
					}
					want.Payload = nil
				}
				if !reflect.DeepEqual(e, want) {
					t.Errorf("carried event %d = %+v, want %+v", i, e, want)
				}
			}
		})
	}
}

// TestEventPayloads checks the envelope and data of each kind (docs/spec/addendum.md §8).
func TestEventPayloads(t *testing.T) {
	m := mut(MutationDebit, 150, 0, 100, "", nil, mainEntry(-100, EntryAdjustment), mainEntry(-50, EntryAdjustment))
	evs := EventsOf(m)
	if len(evs) != 3 {
		t.Fatalf("events = %v", types(evs))
	}
	var env map[string]any
	if err := json.Unmarshal(evs[0].Payload, &env); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"event_id", "event_type", "tenant_id", "environment", "customer_id", "external_customer_id", "created_at", "idempotency_key", "data"} {
		if _, ok := env[k]; !ok {
			t.Errorf("envelope lacks %s", k)
		}
	}
	if env["event_id"] != evs[0].ID.String() || env["external_customer_id"] != "ext-1" || env["idempotency_key"] != "k1" {
		t.Errorf("envelope = %v", env)
	}
	if env["created_at"] != time.UnixMilli(m.AtMS).UTC().Format(time.RFC3339Nano) {
		t.Errorf("created_at = %v", env["created_at"])
	}
	data := env["data"].(map[string]any)
	want := map[string]any{"transaction_id": EntryID(m.OpID, 0).String(), "billable_metric_key": nil, "units": nil,
		"credits": 150.0, "overage_mc": 0.0, "balance_after": 0.0, "reservation_id": nil}
	if !reflect.DeepEqual(data, want) {
		t.Errorf("consumed data = %v, want %v", data, want)
	}
	var lowEnv, exhEnv struct {
		Data map[string]any `json:"data"`
	}
	_ = json.Unmarshal(evs[1].Payload, &lowEnv)
	_ = json.Unmarshal(evs[2].Payload, &exhEnv)
	if !reflect.DeepEqual(lowEnv.Data, map[string]any{"balance_mc": 0.0, "threshold_mc": 100.0}) {
		t.Errorf("low_balance data = %v", lowEnv.Data)
	}
	if !reflect.DeepEqual(exhEnv.Data, map[string]any{"balance_mc": 0.0, "billable_metric_key": nil}) {
		t.Errorf("exhausted data = %v", exhEnv.Data)
	}

	g := mut(MutationGrant, 0, 700, 0, "", nil, mainEntry(700, EntryAdjustment))
	reason := "welcome"
	g.Entries[0].Reason = &reason
	var ge struct {
		Data map[string]any `json:"data"`
	}
	_ = json.Unmarshal(EventsOf(g)[0].Payload, &ge)
	for k, v := range map[string]any{"transaction_id": EntryID(g.OpID, 0).String(), "id": EntryID(g.OpID, 0).String(),
		"credits": 700.0, "source": "manual", "reason": "welcome", "balance_after": 700.0, "delta": 700.0, "type": "adjustment"} {
		if ge.Data[k] != v {
			t.Errorf("granted data %s = %v, want %v", k, ge.Data[k], v)
		}
	}
}

// TestEventsWithoutContext: the foundation's grant and debit scripts carry no
// Context; the effective balance before a debit is derived, and the
// threshold is left to LowBalanceEvent.
func TestEventsWithoutContext(t *testing.T) {
	m := mut(MutationDebit, 0, 0, 0, "", nil, mainEntry(-100, EntryAdjustment))
	m.Context, m.EffectiveBefore = nil, nil
	got := types(EventsOf(m))
	if !reflect.DeepEqual(got, []EventType{EventCreditConsumed, EventCreditExhausted}) {
		t.Fatalf("events = %v", got)
	}
	ev, ok := LowBalanceEvent(m, 100)
	if !ok || ev.ID != EventID(m.OpID, SlotLowBalance) {
		t.Fatalf("LowBalanceEvent = %v, %v", ev, ok)
	}
	if _, ok := LowBalanceEvent(m, 101); ok {
		t.Fatal("no crossing when before (100) is under the threshold")
	}
}

// TestConsumedItems: a multi-metric consume fires one credit.consumed
// whose data lists each item (metric, units, cost) with a null metric and
// units; the decoder reads the items of the script's usage on its fast path.
func TestConsumedItems(t *testing.T) {
	usage := &MutationUsage{Units: 7, Cost: 90, Charged: 90, Items: []UsageItem{
		{Metric: "api.calls", Units: 2, Cost: 60}, {Metric: "gpu", Units: 5, Cost: 30}}}
	m := mut(MutationConsume, 100, 10, 0, OveragePolicyBlock, usage, mainEntry(-90, EntryConsumption))
	evs := EventsOf(m)
	if len(evs) != 1 || evs[0].EventType != EventCreditConsumed {
		t.Fatalf("events = %v", types(evs))
	}
	var env struct {
		Data map[string]any `json:"data"`
	}
	if err := json.Unmarshal(evs[0].Payload, &env); err != nil {
		t.Fatal(err)
	}
	items, _ := json.Marshal(env.Data["items"])
	if env.Data["billable_metric_key"] != nil || env.Data["units"] != nil || env.Data["credits"] != 90.0 ||
		string(items) != `[{"billable_metric_key":"api.calls","cost":60,"units":2},{"billable_metric_key":"gpu","cost":30,"units":5}]` {
		t.Errorf("consumed data = %v", env.Data)
	}
	m.Blocks = []MutationBlock{} // as the scripts write it
	doc, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var back Mutation
	if err := DecodeMutation(doc, &back); err != nil || !reflect.DeepEqual(back.Usage, m.Usage) {
		t.Errorf("decoded usage %+v (%v), want %+v", back.Usage, err, m.Usage)
	}
	if !MutationFastPath(doc) {
		t.Errorf("usage items leave the fast decoder: %s", doc)
	}
}

// TestExpiredEventPayload checks credit.expired's data (docs/spec/addendum.md §8 "a
// block expired with credit left"): the expiry entry's id, its block, the
// credit taken (positive) and the block's source; distinct ids per block.
func TestExpiredEventPayload(t *testing.T) {
	src := SourceReferral
	b1, b2 := uuid.New(), uuid.New()
	m := mut(MutationExpire, 500, 0, 0, "", nil,
		MutationEntry{Role: RoleExpiry, Delta: -300, Type: EntryExpiry, Source: &src, BlockID: &b1},
		MutationEntry{Role: RoleExpiry, Delta: -200, Type: EntryExpiry, Source: &src, BlockID: &b2})
	evs := EventsOf(m)
	if len(evs) != 2 || evs[0].ID == evs[1].ID {
		t.Fatalf("events = %v", types(evs))
	}
	for i, block := range []uuid.UUID{b1, b2} {
		var env struct {
			EventType string         `json:"event_type"`
			Data      map[string]any `json:"data"`
		}
		if err := json.Unmarshal(evs[i].Payload, &env); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"transaction_id": EntryID(m.OpID, i).String(), "credit_block_id": block.String(),
			"credits": float64([]int64{300, 200}[i]), "source": "referral"}
		if env.EventType != "credit.expired" || !reflect.DeepEqual(env.Data, want) {
			t.Errorf("event %d: %s %v, want credit.expired %v", i, env.EventType, env.Data, want)
		}
	}
}
