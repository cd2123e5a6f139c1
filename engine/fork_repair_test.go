package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

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
				// The fallback when the reservation is gone.
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

// fakeRepairStore records the scripts a repair asks for; debitErr and
// commitErr are what Debit and Commit answer.
type fakeRepairStore struct {
	calls               []string
	headers             []CommandHeader
	consumed            ConsumeCommand
	debitErr, commitErr error
}

func (f *fakeRepairStore) Grant(_ context.Context, cmd GrantCommand) (MutationResult, error) {
	f.calls, f.headers = append(f.calls, "grant"), append(f.headers, cmd.CommandHeader)
	return MutationResult{Mutation: Mutation{OpID: cmd.OpID, Kind: MutationGrant}}, nil
}

func (f *fakeRepairStore) Debit(_ context.Context, cmd DebitCommand) (MutationResult, error) {
	f.calls, f.headers = append(f.calls, "debit"), append(f.headers, cmd.CommandHeader)
	return MutationResult{Mutation: Mutation{OpID: cmd.OpID, Kind: MutationDebit}}, f.debitErr
}

func (f *fakeRepairStore) Consume(_ context.Context, cmd ConsumeCommand) (MutationResult, error) {
	f.calls, f.headers, f.consumed = append(f.calls, "consume"), append(f.headers, cmd.CommandHeader), cmd
	return MutationResult{Mutation: Mutation{OpID: cmd.OpID, Kind: MutationConsume,
		Usage: &MutationUsage{Metric: cmd.Metric, Cost: cmd.Terms.BaseCost, Overage: cmd.Terms.BaseCost}}}, nil
}

func (f *fakeRepairStore) Commit(_ context.Context, cmd CommitCommand) (MutationResult, error) {
	f.calls, f.headers = append(f.calls, "commit"), append(f.headers, cmd.CommandHeader)
	return MutationResult{Mutation: Mutation{OpID: cmd.OpID, Kind: MutationCommit}}, f.commitErr
}

func (f *fakeRepairStore) Load(context.Context, AccountState) (bool, error) { return true, nil }

// fakeApplied answers every look-up with m, found when found.
type fakeApplied struct {
	m     Mutation
	found bool
}

func (f fakeApplied) AppliedOps(_ context.Context, refs []OpRef) ([]Mutation, []bool, error) {
	return []Mutation{f.m}, []bool{f.found}, nil
}

func (fakeApplied) AccountState(context.Context, CustomerKey, time.Time) (AccountState, bool, error) {
	return AccountState{}, false, nil
}

// TestRepairForkRoutes: a debit short of credit becomes an allow consume
// of ForkShortfallMetric under the very header (op id, key) the debit
// had, so a rerun replays whichever applied; a commit whose hold the true
// state lacks becomes the consume the same way; and a forked op whose own
// idempotency key Postgres holds from another op (a client's retry of the
// op the true history has) applies nothing, while one it does not hold
// is applied.
func TestRepairForkRoutes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.UnixMilli(1_800_000_000_000).UTC()
	op := uuid.New()
	src := Source("manual")
	reason := "fee"
	debit := Mutation{OpID: op, Kind: MutationDebit, IdempotencyKey: "k1", Entries: []MutationEntry{
		{Role: RoleMain, Delta: -50, Type: EntryAdjustment, Source: &src, Reason: &reason}}}

	f := &fakeRepairStore{debitErr: ErrInsufficientCredits}
	rep, err := RepairFork(ctx, f, fakeApplied{}, fakeApplied{}, debit, now)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(f.calls) != "[debit consume]" || f.headers[0] != f.headers[1] || f.headers[0].OpID != ForkRepairOpID(op) ||
		f.headers[0].IdempotencyKey != ForkRepairKey(op) {
		t.Fatalf("calls %v headers %+v", f.calls, f.headers)
	}
	if c := f.consumed; c.Metric != ForkShortfallMetric || c.Terms.BaseCost != 50 || c.Policy != OveragePolicyAllow ||
		string(c.EntryMetadata[ForkRepairReasonKey]) != `"fee"` {
		t.Fatalf("shortfall consume %+v", c)
	}
	if rep.ShortfallMC != 50 || !strings.Contains(rep.Note(), ForkShortfallMetric) {
		t.Fatalf("repair %+v note %q", rep, rep.Note())
	}

	reservation := uuid.New()
	commit := Mutation{OpID: op, Kind: MutationCommit, Entries: []MutationEntry{{Role: RoleMain, Delta: -30, Type: EntryConsumption}},
		Usage: &MutationUsage{Metric: "gpu", Units: 3, Cost: 30, Charged: 30, ReservationID: &reservation}}
	f = &fakeRepairStore{commitErr: ErrReservationNotFound}
	if _, err := RepairFork(ctx, f, fakeApplied{}, nil, commit, now); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(f.calls) != "[commit consume]" || f.headers[0] != f.headers[1] || f.consumed.Metric != "gpu" {
		t.Fatalf("commit of a missing reservation: calls %v, consume %+v", f.calls, f.consumed)
	}

	f = &fakeRepairStore{}
	rep, err = RepairFork(ctx, f, fakeApplied{}, fakeApplied{m: Mutation{OpID: uuid.New()}, found: true}, debit, now)
	if err != nil || len(f.calls) != 0 || rep.Plan.Action != ForkRepairNone {
		t.Fatalf("a key Postgres holds from another op: calls %v, plan %+v, %v", f.calls, rep.Plan, err)
	}
	f = &fakeRepairStore{}
	if _, err := RepairFork(ctx, f, fakeApplied{}, fakeApplied{}, debit, now); err != nil || fmt.Sprint(f.calls) != "[debit]" {
		t.Fatalf("a key Postgres does not hold: calls %v, %v", f.calls, err)
	}
}
