package engine

import (
	"encoding/json"
	"testing"

	"github.com/google/uuid"
)

// TestPlanForkRepair holds the rule of docs/decisions.md "Forks are
// repaired from the ledger": every forked op that moved money is applied
// again with the same amount (a grant its block, a consume or commit its
// metric, units and cost under allow, a debit its amount), and the others
// apply nothing, with a reason. The repair's op id and key depend on the
// forked op alone, so every attempt is the same operation.
func TestPlanForkRepair(t *testing.T) {
	t.Parallel()
	op := uuid.MustParse("0190b5a2-0000-7000-8000-000000000001")
	block := uuid.MustParse("0190b5a2-0000-7000-8000-0000000000b1")
	src := Source("manual")
	reason := "support call"
	entry := func(delta int64, typ EntryType) MutationEntry {
		return MutationEntry{Role: RoleMain, Delta: delta, Type: typ, Source: &src, BlockID: &block, Reason: &reason,
			Metadata: json.RawMessage(`{"job":"j1"}`)}
	}
	expires := int64(1_900_000_000_000)
	for _, tc := range []struct {
		name string
		m    Mutation
		want ForkRepairAction
		// check looks at the plan's command.
		check func(t *testing.T, p ForkRepairPlan)
	}{
		{name: "grant", want: ForkRepairGrant, m: Mutation{Kind: MutationGrant, Entries: []MutationEntry{entry(500, EntryAdjustment)},
			Blocks: []MutationBlock{{ID: block, Original: 500, Remaining: 500, Priority: 3, Source: src, ExpiresMS: &expires}}},
			check: func(t *testing.T, p ForkRepairPlan) {
				b := p.Grant.Block
				if b.ID != block || b.OriginalAmount != 500 || b.Priority != 3 || b.ExpiresAt == nil ||
					b.ExpiresAt.UnixMilli() != expires || *p.Grant.Reason != reason || p.Grant.EntryType != EntryAdjustment {
					t.Fatalf("grant plan %+v", p.Grant)
				}
			}},
		{name: "consume", want: ForkRepairConsume, m: Mutation{Kind: MutationConsume, Entries: []MutationEntry{entry(-300, EntryConsumption)},
			Usage: &MutationUsage{Metric: "api_call", Units: 3, Cost: 300, Charged: 300}},
			check: func(t *testing.T, p ForkRepairPlan) {
				c := p.Consume
				if c.Metric != "api_call" || c.Units != 3 || c.Terms.CostType != CostFlat || c.Terms.BaseCost != 300 ||
					c.Policy != OveragePolicyAllow || string(c.EntryMetadata["job"]) != `"j1"` {
					t.Fatalf("consume plan %+v", c)
				}
			}},
		{name: "consume with overage charges the whole cost", want: ForkRepairConsume,
			m: Mutation{Kind: MutationConsume, Entries: []MutationEntry{entry(-100, EntryConsumption)},
				Usage: &MutationUsage{Metric: "api_call", Units: 3, Cost: 300, Charged: 100, Overage: 200}},
			check: func(t *testing.T, p ForkRepairPlan) {
				if p.Consume.Terms.BaseCost != 300 {
					t.Fatalf("consume plan cost %d, want 300", p.Consume.Terms.BaseCost)
				}
			}},
		{name: "multi-metric consume", want: ForkRepairConsume, m: Mutation{Kind: MutationConsume,
			Entries: []MutationEntry{entry(-70, EntryConsumption)},
			Usage:   &MutationUsage{Units: 5, Cost: 70, Items: []UsageItem{{Metric: "a", Units: 2, Cost: 20}, {Metric: "b", Units: 3, Cost: 50}}}},
			check: func(t *testing.T, p ForkRepairPlan) {
				if len(p.Consume.Items) != 2 || p.Consume.Items[1].Terms.BaseCost != 50 || p.Consume.Items[0].Units != 2 {
					t.Fatalf("items %+v", p.Consume.Items)
				}
			}},
		{name: "commit", want: ForkRepairCommit, m: Mutation{Kind: MutationCommit, Entries: []MutationEntry{entry(-40, EntryConsumption)},
			Usage: &MutationUsage{Metric: "gpu", Units: 4, Cost: 40, Charged: 40, ReservationID: &block}},
			check: func(t *testing.T, p ForkRepairPlan) {
				c := p.Commit
				if c.ReservationID != block || c.ActualUnits != 4 || c.Terms.BaseCost != 40 || c.Context.Policy != OveragePolicyAllow {
					t.Fatalf("commit plan %+v", c)
				}
				// The fallback when the hold is gone.
				if p.Consume.Metric != "gpu" || p.Consume.Units != 4 || p.Consume.Terms.BaseCost != 40 {
					t.Fatalf("commit's consume %+v", p.Consume)
				}
			}},
		{name: "multi-metric commit", want: ForkRepairConsume, m: Mutation{Kind: MutationCommit,
			Entries: []MutationEntry{entry(-40, EntryConsumption)},
			Usage:   &MutationUsage{Units: 4, Cost: 40, ReservationID: &block, Items: []UsageItem{{Metric: "a", Units: 4, Cost: 40}}}}},
		{name: "negative adjust", want: ForkRepairDebit, m: Mutation{Kind: MutationDebit,
			Entries: []MutationEntry{entry(-30, EntryAdjustment), entry(-20, EntryAdjustment)}},
			check: func(t *testing.T, p ForkRepairPlan) {
				d := p.Debit
				if d.Amount != 50 || d.EntryType != EntryAdjustment || d.Source == nil || *d.Source != src || *d.Reason != reason {
					t.Fatalf("debit plan %+v", d)
				}
			}},
		{name: "refusal record", want: ForkRepairNone, m: Mutation{Kind: MutationConsume,
			Usage: &MutationUsage{Metric: "m", Units: 1, Cost: 10, Refused: true}}},
		{name: "reserve", want: ForkRepairNone, m: Mutation{Kind: MutationReserve}},
		{name: "release", want: ForkRepairNone, m: Mutation{Kind: MutationRelease}},
		{name: "expire", want: ForkRepairNone, m: Mutation{Kind: MutationExpire,
			Entries: []MutationEntry{{Role: RoleExpiry, Delta: -5, Type: EntryExpiry, BlockID: &block}}}},
		{name: "gauge", want: ForkRepairNone, m: Mutation{Kind: MutationGaugeKind}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.m.OpID = op
			p := PlanForkRepair(tc.m)
			if p.Action != tc.want {
				t.Fatalf("action %s, want %s", p.Action, tc.want)
			}
			if p.Action == ForkRepairNone && p.Why == "" {
				t.Fatal("a repair that applies nothing gives no reason")
			}
			if p.Action != ForkRepairNone {
				var meta Metadata
				switch p.Action {
				case ForkRepairGrant:
					meta = p.Grant.EntryMetadata
				case ForkRepairConsume, ForkRepairCommit:
					meta = p.Consume.EntryMetadata
				case ForkRepairDebit:
					meta = p.Debit.EntryMetadata
				}
				if string(meta[ForkRepairMetaKey]) != `"`+op.String()+`"` {
					t.Fatalf("entry metadata %v does not name the forked op", meta)
				}
			}
			if tc.check != nil {
				tc.check(t, p)
			}
		})
	}
	if ForkRepairOpID(op) != ForkRepairOpID(op) || ForkRepairOpID(op) == op || ForkRepairKey(op) != ForkRepairKey(op) {
		t.Fatal("a repair's op id and key must be derived from the forked op alone")
	}
}
