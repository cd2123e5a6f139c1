// Plan grant firing and rollover: the credit a subscription owes, granted
// through the hot store under keys derived from the subscription.

package engine

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/google/uuid"
)

// EmitterSubscription marks credit.granted events of plan grants.
const EmitterSubscription = "subscription"

// firingKey names one firing of grant g on r: the base of its operation id,
// block id and idempotency key, the same in every process and every retry.
func firingKey(r *SubscriptionRecord, g PlanGrant, tag string) string {
	return "subscription:" + r.ID.String() + ":grant:" + g.ID.String() + ":" + tag
}

// subscriptionNamespace seeds the name-based ids of firings and events.
var subscriptionNamespace = uuid.MustParse("8b1f4c0e-5d2a-4e77-9c3b-2f6a1d0e9b47")

// fire grants one firing of g due at `at` (now is the clock), then moves
// the grant's schedule on. A recurring grant fires only while the
// subscription is active (trial grants while trialing); a firing that comes
// due in another state is skipped.
func (s *Subscriptions) fire(ctx context.Context, r *SubscriptionRecord, g PlanGrant, cycle BillingCycle, st *GrantState,
	at time.Time, c Customer, now time.Time) error {
	clockBound := g.GrantType == GrantRecurring && !PeriodBound(g, cycle)
	tag := st.NextKey
	if clockBound {
		tag = "clock:" + msText(st.Anchor) + ":" + strconv.FormatInt(st.Fired, 10)
	}
	allowed := r.Status == SubscriptionActive
	if g.GrantType == GrantTrial {
		allowed = r.Status == SubscriptionTrialing
	}
	if allowed {
		key := firingKey(r, g, tag)
		meta := Metadata{"subscription_id": rawJSON(r.ID), "plan_grant_id": rawJSON(g.ID)}
		cmd := GrantCommand{
			CommandHeader: CommandHeader{OpID: uuid.NewSHA1(subscriptionNamespace, []byte(key)), Customer: CustomerKey{TenantID: r.TenantID,
				Environment: r.Environment, CustomerID: r.CustomerID}, IdempotencyKey: key, RequestHash: key, Now: now},
			AccountID: uuid.Must(uuid.NewV7()), EntryType: EntryPlanGrant, EntryMetadata: meta,
			Block: Block{ID: uuid.NewSHA1(subscriptionNamespace, []byte(key+":block")), CustomerID: r.CustomerID,
				OriginalAmount: g.Credits, Priority: 0, Source: g.Source, Metadata: meta, AppliesTo: g.AppliesTo},
			Context:         &MutationContext{ExternalID: c.ExternalID, Emitter: EmitterSubscription},
			AccumulationCap: g.AccumulationCap,
		}
		if cmd.Block.Source == "" {
			cmd.Block.Source = SourcePlanGrant
		}
		if g.ExpiresAfterSeconds != nil {
			exp := at.Add(time.Duration(*g.ExpiresAfterSeconds) * time.Second)
			cmd.Block.ExpiresAt = &exp
		}
		res, err := withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) { return s.blocks.Grant(ctx, cmd) })
		if err != nil {
			return err
		}
		for _, e := range res.Mutation.Entries {
			if e.Role == RoleMain && e.BlockID != nil {
				st.BlockIDs = append(st.BlockIDs, *e.BlockID)
			}
		}
		fired := at
		st.LastFiredAt = &fired
	}
	if !clockBound {
		st.NextFireAt, st.NextKey = nil, ""
		return nil
	}
	iv := g.Interval()
	if allowed {
		st.Fired++
	} else {
		// Skip every firing the subscription cannot take up to now.
		st.Fired = max(st.Fired+1, iv.FiringsThrough(st.Anchor, now))
	}
	next := iv.FireAt(st.Anchor, st.Fired)
	st.NextFireAt = &next
	return nil
}

// runRollover expires the grant's previous-cycle blocks and carries the
// pending percentage of their unused credit into a new block.
func (s *Subscriptions) runRollover(ctx context.Context, r *SubscriptionRecord, grants map[uuid.UUID]PlanGrant, st *GrantState,
	c Customer, now time.Time) error {
	p := st.Rollover
	st.Rollover = nil
	g, ok := grants[st.PlanGrantID]
	if !ok || len(st.BlockIDs) == 0 || s.rollover == nil {
		st.BlockIDs = []uuid.UUID{}
		return nil
	}
	key := firingKey(r, g, p.Key)
	meta := Metadata{"subscription_id": rawJSON(r.ID), "plan_grant_id": rawJSON(g.ID), "rollover": json.RawMessage("true")}
	cmd := RolloverCommand{
		OpID: uuid.NewSHA1(subscriptionNamespace, []byte(key)), Customer: CustomerKey{TenantID: r.TenantID,
			Environment: r.Environment, CustomerID: r.CustomerID},
		IdempotencyKey: key, Now: now, Blocks: st.BlockIDs, Percentage: p.Percent,
		Block: Block{ID: uuid.NewSHA1(subscriptionNamespace, []byte(key+":block")), CustomerID: r.CustomerID,
			Source: g.Source, Metadata: meta},
		EntryType: EntryPlanGrant, EntryMetadata: meta,
		Context: &MutationContext{ExternalID: c.ExternalID, Emitter: EmitterSubscription},
	}
	if cmd.Block.Source == "" {
		cmd.Block.Source = SourcePlanGrant
	}
	if g.ExpiresAfterSeconds != nil {
		exp := now.Add(time.Duration(*g.ExpiresAfterSeconds) * time.Second)
		cmd.Block.ExpiresAt = &exp
	}
	res, err := withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) { return s.rollover.Rollover(ctx, cmd) })
	if err != nil {
		return err
	}
	st.BlockIDs = []uuid.UUID{}
	for _, e := range res.Mutation.Entries {
		if e.Role == RoleMain && e.BlockID != nil {
			st.BlockIDs = append(st.BlockIDs, *e.BlockID)
		}
	}
	return nil
}
