// Fork repair (issue 25, docs/decisions.md "Forks are repaired from the
// ledger"): an op a forked Redis ran after a failover was acknowledged, so
// once the fork is fenced and Redis reloaded from Postgres it is applied
// again, as a new operation on the true state, through the same scripts as
// any request. Planning is pure (PlanForkRepair); RepairFork runs a plan.

package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// ForkShortfallMetric is the metric key a repaired debit (a negative
// adjust) books its shortfall under, as overage of an allow consume, when
// the true state no longer holds the credit it drew on: a debit has no
// metric of its own, and the overage report is the one place the model
// shows money charged that no block paid.
const ForkShortfallMetric = "creditd_fork_shortfall"

// ForkRepairMetaKey is the entry metadata key naming the forked op a
// repair re-applies, so the ledger ties each repair to its dead letter.
const ForkRepairMetaKey = "fork_repair_of"

// ForkRepairReasonKey is the entry metadata key that keeps a debit's
// reason when its repair becomes a consume (engine.ForkShortfallMetric).
const ForkRepairReasonKey = "fork_repair_reason"

// forkRepairNamespace seeds ForkRepairOpID; changing it would re-key every
// repair, and a rerun after the change would apply a repair twice.
var forkRepairNamespace = uuid.MustParse("3b0f8e2c-4d71-4a8e-9f15-6c2d7e90a1b4")

// ForkRepairOpID is the op id of the repair of forked op: derived, so its
// ledger entry ids are the same on every attempt.
func ForkRepairOpID(forked uuid.UUID) uuid.UUID { return uuid.NewSHA1(forkRepairNamespace, forked[:]) }

// ForkRepairKey is the idempotency key of the repair of forked op: a crash
// between the script and the dead letter's resolution, or two nodes
// repairing at once, replay the first repair instead of applying another.
func ForkRepairKey(forked uuid.UUID) string { return "fork-repair:" + forked.String() }

// ForkRepairAction is what a repair does.
type ForkRepairAction string

// Fork repair actions.
const (
	// ForkRepairGrant grants the forked op's block again (a grant, a
	// topup, a positive adjust).
	ForkRepairGrant ForkRepairAction = "grant"
	// ForkRepairConsume charges a forked consume or commit again: the same
	// metric, units and cost under allow, so what the true state cannot
	// pay is overage.
	ForkRepairConsume ForkRepairAction = "consume"
	// ForkRepairCommit settles a forked commit's reservation when the true state
	// still has it active (the reserve was persisted before the fork): the
	// same units at the same cost under allow; a reservation it no longer has
	// makes it ForkRepairConsume's charge (the same idempotency key).
	ForkRepairCommit ForkRepairAction = "commit"
	// ForkRepairDebit drains a forked debit's amount again in spend order;
	// when the effective balance is short it becomes an allow consume of
	// ForkShortfallMetric (the same idempotency key, so one or the other).
	ForkRepairDebit ForkRepairAction = "debit"
	// ForkRepairNone applies nothing: the op moved no money that the true
	// state can take (a reservation made or returned on a reservation it does not have,
	// an expiry the sweep redoes, a gauge move, a refusal record).
	ForkRepairNone ForkRepairAction = "none"
)

// ForkRepairPlan is how one forked op is applied again.
type ForkRepairPlan struct {
	Action ForkRepairAction
	// Why is the reason for ForkRepairNone, for the dead letter's record.
	Why string
	// Grant, Consume and Debit are the commands of their action, without
	// their header (RepairFork sets it).
	Grant   GrantCommand
	Consume ConsumeCommand
	Commit  CommitCommand
	Debit   DebitCommand
}

// PlanForkRepair decides how forked op m is applied again on the true
// state. It reads only m.
func PlanForkRepair(m Mutation) ForkRepairPlan {
	if m.Usage != nil && m.Usage.Refused {
		return ForkRepairPlan{Action: ForkRepairNone, Why: "a refusal record moves no money"}
	}
	var credit, debit int64
	var first, firstCredit, firstDebit *MutationEntry
	for i := range m.Entries {
		e := &m.Entries[i]
		if e.Role != RoleMain {
			// Expiry entries are redone by the true state's own sweep.
			continue
		}
		if first == nil {
			first = e
		}
		switch {
		case e.Delta > 0:
			credit += e.Delta
			if firstCredit == nil {
				firstCredit = e
			}
		case e.Delta < 0:
			debit -= e.Delta
			if firstDebit == nil {
				firstDebit = e
			}
		}
	}
	meta := func(e *MutationEntry) Metadata {
		out := Metadata{}
		if e != nil && len(e.Metadata) > 0 {
			_ = json.Unmarshal(e.Metadata, &out)
		}
		out[ForkRepairMetaKey] = rawJSON(m.OpID.String())
		return out
	}
	ctx := MutationContext{}
	if m.Context != nil {
		ctx = *m.Context
	}
	switch m.Kind {
	case MutationGrant:
		if firstCredit == nil {
			return ForkRepairPlan{Action: ForkRepairNone, Why: "the grant added no credit"}
		}
		return planGrant(m, firstCredit, meta(firstCredit), ctx)
	case MutationConsume, MutationCommit:
		u := m.Usage
		if u == nil || u.Cost <= 0 {
			if debit > 0 {
				return planDebit(m, debit, firstDebit, meta(firstDebit), ctx)
			}
			return ForkRepairPlan{Action: ForkRepairNone, Why: "nothing was charged"}
		}
		ctx.Policy = OveragePolicyAllow
		cmd := ConsumeCommand{Policy: OveragePolicyAllow, EntryMetadata: meta(first), Context: ctx}
		if len(u.Items) > 0 {
			for _, it := range u.Items {
				units := max(it.Units, 1)
				cmd.Items = append(cmd.Items, ConsumeLine{Metric: it.Metric, Units: units,
					Terms: RuleTerms{CostType: CostFlat, BaseCost: it.Cost}})
			}
		} else {
			cmd.Metric, cmd.Units = u.Metric, max(u.Units, 1)
			cmd.Terms = RuleTerms{CostType: CostFlat, BaseCost: u.Cost}
		}
		plan := ForkRepairPlan{Action: ForkRepairConsume, Consume: cmd}
		if m.Kind == MutationCommit && u.ReservationID != nil && len(u.Items) == 0 && u.Units > 0 {
			plan.Action = ForkRepairCommit
			// A partial commit's part is settled as a partial commit again:
			// the true state keeps the rest of the reservation open.
			plan.Commit = CommitCommand{ReservationID: *u.ReservationID, ActualUnits: u.Units,
				Terms: RuleTerms{CostType: CostFlat, BaseCost: u.Cost}, Context: ctx, Metadata: cmd.EntryMetadata,
				Partial: m.Reservation != nil && m.Reservation.Status == ReservationActive}
		}
		return plan
	case MutationDebit:
		if debit > 0 {
			return planDebit(m, debit, firstDebit, meta(firstDebit), ctx)
		}
		return ForkRepairPlan{Action: ForkRepairNone, Why: "the debit drew nothing"}
	case MutationReserve:
		return ForkRepairPlan{Action: ForkRepairNone, Why: "the reservation it made is not in the true state; a commit of it answers 404"}
	case MutationRelease:
		return ForkRepairPlan{Action: ForkRepairNone, Why: "the reservation it returned is not in the true state"}
	case MutationExpire:
		return ForkRepairPlan{Action: ForkRepairNone, Why: "the expiry sweep expires the true state's blocks itself"}
	}
	return ForkRepairPlan{Action: ForkRepairNone, Why: fmt.Sprintf("a %s op moves no credit", m.Kind)}
}

// planGrant grants e's block again with the block id the client was
// answered with: the true state never had it.
func planGrant(m Mutation, e *MutationEntry, meta Metadata, ctx MutationContext) ForkRepairPlan {
	b := Block{OriginalAmount: e.Delta, CustomerID: m.CustomerID, Metadata: Metadata{}}
	if e.Source != nil {
		b.Source = *e.Source
	}
	if e.BlockID != nil {
		b.ID = *e.BlockID
		for _, mb := range m.Blocks {
			if mb.ID != *e.BlockID {
				continue
			}
			b.Priority, b.Source = mb.Priority, mb.Source
			if mb.ExpiresMS != nil {
				t := time.UnixMilli(*mb.ExpiresMS).UTC()
				b.ExpiresAt = &t
			}
			if len(mb.Metadata) > 0 {
				_ = json.Unmarshal(mb.Metadata, &b.Metadata)
			}
		}
	} else {
		b.ID = uuid.NewSHA1(forkRepairNamespace, append(m.OpID[:], 'b'))
	}
	typ := e.Type
	if typ == "" {
		typ = EntryAdjustment
	}
	return ForkRepairPlan{Action: ForkRepairGrant, Grant: GrantCommand{
		AccountID: uuid.NewSHA1(forkRepairNamespace, append(m.OpID[:], 'a')),
		EntryType: typ, Reason: e.Reason, EntryMetadata: meta, Block: b, Context: &ctx}}
}

// planDebit drains amount again with e's type, reason and (when every
// entry shares it) source.
func planDebit(m Mutation, amount int64, e *MutationEntry, meta Metadata, ctx MutationContext) ForkRepairPlan {
	src := e.Source
	for _, o := range m.Entries {
		if o.Role == RoleMain && o.Delta < 0 && (o.Source == nil || src == nil || *o.Source != *src) {
			src = nil
			break
		}
	}
	return ForkRepairPlan{Action: ForkRepairDebit, Debit: DebitCommand{Amount: amount, EntryType: e.Type,
		Source: src, Reason: e.Reason, EntryMetadata: meta, Context: &ctx}}
}

// ForkRepair is what RepairFork did.
type ForkRepair struct {
	Plan ForkRepairPlan
	// Result is the repair's Mutation (zero for ForkRepairNone); Replayed
	// when an earlier attempt had applied it.
	Result MutationResult
	// ShortfallMC is the overage the repair booked: what the true state
	// could no longer pay.
	ShortfallMC int64
}

// Note says in one line what the repair did, for the dead letter's record.
func (r ForkRepair) Note() string {
	if r.Plan.Action == ForkRepairNone {
		return "nothing to re-apply: " + r.Plan.Why
	}
	m := r.Result.Mutation
	how := string(r.Plan.Action)
	switch {
	case r.Plan.Action == ForkRepairDebit && m.Kind == MutationConsume:
		how = "debit short of credit, charged as an allow consume of " + ForkShortfallMetric
	case r.Plan.Action == ForkRepairCommit && m.Kind == MutationConsume:
		how = "commit of a reservation the true state does not have, charged as an allow consume"
	}
	note := fmt.Sprintf("re-applied as %s op %s at version %d", how, m.OpID, m.Account.Version)
	if r.ShortfallMC > 0 {
		note += fmt.Sprintf(", shortfall %d mc booked as overage", r.ShortfallMC)
	}
	return note
}

// RepairFork applies forked op m again on the state store holds, which
// must be the true one (the fork fenced and reloaded), under
// ForkRepairKey(m.OpID) at now. Applying it twice applies it once. An op
// whose own idempotency key Postgres holds (applied, when not nil, tells)
// applies nothing: it was a client's retry of an op the true history has,
// and re-applying it would charge one request twice.
// Errors are the scripts' (a grant the store refuses,
// ErrIdempotencyMismatch), the look-up's or the load's.
func RepairFork(ctx context.Context, store ForkRepairStore, accounts AccountReader, applied AppliedOps, m Mutation,
	now time.Time) (ForkRepair, error) {
	out := ForkRepair{Plan: PlanForkRepair(m)}
	if out.Plan.Action == ForkRepairNone {
		return out, nil
	}
	c := CustomerKey{TenantID: m.TenantID, Environment: m.Environment, CustomerID: m.CustomerID}
	if m.IdempotencyKey != "" && applied != nil {
		ms, found, err := applied.AppliedOps(ctx, []OpRef{{Customer: c, Key: m.IdempotencyKey}})
		if err != nil {
			return out, fmt.Errorf("engine: repair forked op %s: applied look-up: %w", m.OpID, err)
		}
		if found[0] {
			why := fmt.Sprintf("its idempotency key was applied as op %s, which the true history holds", ms[0].OpID)
			if ms[0].OpID == m.OpID {
				why = "Postgres holds the op itself"
			}
			out.Plan = ForkRepairPlan{Action: ForkRepairNone, Why: why}
			return out, nil
		}
	}
	key := ForkRepairKey(m.OpID)
	h := CommandHeader{OpID: ForkRepairOpID(m.OpID), Customer: c, IdempotencyKey: key, RequestHash: key, Now: now}
	run := func() (MutationResult, error) {
		switch out.Plan.Action {
		case ForkRepairGrant:
			cmd := out.Plan.Grant
			cmd.CommandHeader = h
			return store.Grant(ctx, cmd)
		case ForkRepairConsume:
			cmd := out.Plan.Consume
			cmd.CommandHeader = h
			return store.Consume(ctx, cmd)
		case ForkRepairCommit:
			cmd := out.Plan.Commit
			cmd.CommandHeader = h
			res, err := store.Commit(ctx, cmd)
			if !errors.Is(err, ErrReservationNotFound) && !errors.Is(err, ErrReservationNotActive) &&
				!errors.Is(err, ErrReservationExpired) {
				return res, err
			}
			// As the debit's fallback below: one key for both, so a rerun
			// replays whichever applied.
			c := out.Plan.Consume
			c.CommandHeader = h
			return store.Consume(ctx, c)
		}
		cmd := out.Plan.Debit
		cmd.CommandHeader = h
		res, err := store.Debit(ctx, cmd)
		if !errors.Is(err, ErrInsufficientCredits) {
			return res, err
		}
		// The same key and header: a rerun's debit finds this consume's op
		// key (or its persisted operation) and replays it, so a grant made
		// in between never lets the debit apply as well.
		meta := cmd.EntryMetadata
		if cmd.Reason != nil {
			// A consumption entry has no reason of its own.
			meta = Metadata{ForkRepairReasonKey: rawJSON(*cmd.Reason)}
			for k, v := range cmd.EntryMetadata {
				meta[k] = v
			}
		}
		c := ConsumeCommand{CommandHeader: h, Metric: ForkShortfallMetric, Units: 1,
			Terms: RuleTerms{CostType: CostFlat, BaseCost: cmd.Amount}, Policy: OveragePolicyAllow,
			EntryMetadata: meta}
		if cmd.Context != nil {
			c.Context = *cmd.Context
		}
		c.Context.Policy = OveragePolicyAllow
		return store.Consume(ctx, c)
	}
	res, err := run()
	if errors.Is(err, ErrStateMissing) {
		st, ok, lerr := accounts.AccountState(ctx, h.Customer, now.Add(-AppliedRetention))
		if lerr != nil {
			return out, lerr
		}
		if !ok {
			st = AccountState{TenantID: m.TenantID, CustomerID: m.CustomerID, Environment: m.Environment}
		}
		if _, lerr := store.Load(ctx, st); lerr != nil {
			return out, lerr
		}
		res, err = run()
	}
	if err != nil {
		return out, fmt.Errorf("engine: repair forked op %s (%s): %w", m.OpID, out.Plan.Action, err)
	}
	out.Result = res
	if u := res.Mutation.Usage; u != nil {
		out.ShortfallMC = u.Overage
	}
	return out, nil
}
