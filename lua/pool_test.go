package lua

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// sameSlotCustomer is a new customer of parent's tenant whose id falls in
// parent's slot, as engine.Customers mints a child's.
func sameSlotCustomer(parent engine.CustomerKey) engine.CustomerKey {
	for {
		c := engine.CustomerKey{TenantID: parent.TenantID, Environment: parent.Environment, CustomerID: uuid.New()}
		if Partition(c.CustomerID) == Partition(parent.CustomerID) {
			return c
		}
	}
}

// poolConsume is a consume by child of units at 1 mc each under policy,
// drawing on parent within limit (nil: none).
func poolConsume(child, parent engine.CustomerKey, units int64, policy engine.OveragePolicy, limit *engine.DrawLimit, line int64) engine.ConsumeCommand {
	cmd := consumeCmd(child, units, perUnitTerms(1), policy, t0)
	cmd.Context = engine.MutationContext{ExternalID: "child", Policy: policy, LimitMC: line}
	cmd.Pool = &engine.PoolDraw{Parent: parent, OpID: engine.PoolOpID(cmd.OpID), Limit: limit,
		ParentContext: engine.MutationContext{ExternalID: "parent", Policy: engine.OveragePolicyBlock}}
	return cmd
}

// TestPoolConsume holds a child's charge to docs/rules.md "Shared pools":
// its own blocks pay first, then the parent's within the draw limit, then
// its credit line; under block a charge the three cannot cover is refused
// whole; under allow the rest is overage. The parent's part is a Mutation
// of the parent (one pool_draw entry naming the child), so each ledger
// sums to its own balance.
func TestPoolConsume(t *testing.T) {
	t.Parallel()
	day := &engine.DrawLimit{Period: engine.BudgetDay, TimeZone: "UTC", LimitMC: 30, Since: t0.Add(-time.Hour)}
	tests := []struct {
		name        string
		parentFunds int64
		units       []int64
		policy      engine.OveragePolicy
		limit       *engine.DrawLimit
		line        int64
		wantRefused []bool
		wantChild   int64 // child's balance after (it starts at 100)
		wantParent  int64
		wantPooled  int64 // pool_mc of the last charge
		wantOverage int64
	}{
		{"own blocks first", 500, []int64{80}, engine.OveragePolicyBlock, nil, 0, []bool{false}, 20, 500, 0, 0},
		{"the parent pays the rest", 500, []int64{130}, engine.OveragePolicyBlock, nil, 0, []bool{false}, 0, 470, 30, 0},
		{"parent short refuses whole", 20, []int64{130}, engine.OveragePolicyBlock, nil, 0, []bool{true}, 100, 20, 0, 0},
		{"draw limit caps the pool", 500, []int64{100, 30, 1}, engine.OveragePolicyBlock, day, 0, []bool{false, false, true}, 0, 470, 30, 0},
		{"the line after the pool", 500, []int64{100, 40}, engine.OveragePolicyBlock, day, 20, []bool{false, false}, -10, 470, 30, 0},
		{"allow: overage past the pool", 10, []int64{130}, engine.OveragePolicyAllow, nil, 0, []bool{false}, 0, 0, 10, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, b bundle) {
				ctx := context.Background()
				parent := newCustomer()
				b.known(t, parent)
				if tt.parentFunds > 0 {
					b.grant(t, grantCmd(parent, tt.parentFunds, t0.Add(-time.Minute)))
				}
				child := sameSlotCustomer(parent)
				b.known(t, child)
				b.grant(t, grantCmd(child, 100, t0.Add(-time.Minute)))
				var last engine.Mutation
				for i, u := range tt.units {
					res, err := b.store.Consume(ctx, poolConsume(child, parent, u, tt.policy, tt.limit, tt.line))
					if refused := errors.Is(err, engine.ErrInsufficientCredits); refused != tt.wantRefused[i] {
						t.Fatalf("consume %d of %d: err %v, want refused %v", i, u, err, tt.wantRefused[i])
					} else if err != nil && !refused {
						t.Fatal(err)
					}
					if err == nil {
						last = res.Mutation
					}
				}
				if got := b.snapshot(t, child, t0).Balance; got != tt.wantChild {
					t.Errorf("child balance %d, want %d", got, tt.wantChild)
				}
				if got := b.snapshot(t, parent, t0).Balance; got != tt.wantParent {
					t.Errorf("parent balance %d, want %d", got, tt.wantParent)
				}
				if last.Usage != nil && (last.Usage.Pool != tt.wantPooled || last.Usage.Overage != tt.wantOverage) {
					t.Errorf("last usage pool %d overage %d, want %d, %d", last.Usage.Pool, last.Usage.Overage, tt.wantPooled, tt.wantOverage)
				}
				// Each customer's ledger sums to its balance: the child's
				// from 100, the parent's from its funds.
				var childSum, parentSum int64
				for _, m := range b.outbox(t, child) {
					switch m.CustomerID {
					case child.CustomerID:
						childSum += ledgerSum(m)
					case parent.CustomerID:
						parentSum += ledgerSum(m)
						for _, e := range m.Entries {
							if e.Type == engine.EntryPoolDraw && (e.Ref == nil || *e.Ref != child.CustomerID) {
								t.Errorf("pool_draw entry ref %v, want the child %s", e.Ref, child.CustomerID)
							}
						}
					}
				}
				if childSum != tt.wantChild || parentSum != tt.wantParent {
					t.Errorf("ledger sums child %d parent %d, want %d, %d", childSum, parentSum, tt.wantChild, tt.wantParent)
				}
			})
		})
	}
}

// TestPoolNeedsParentState: a child's charge whose parent Redis does not
// hold answers ErrPoolStateMissing and changes nothing, so the caller may
// load the parent and run it again.
func TestPoolNeedsParentState(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		parent := newCustomer()
		child := sameSlotCustomer(parent)
		b.known(t, child)
		b.grant(t, grantCmd(child, 100, t0.Add(-time.Minute)))
		before := len(b.outbox(t, child))
		_, err := b.store.Consume(ctx, poolConsume(child, parent, 10, engine.OveragePolicyBlock, nil, 0))
		if !errors.Is(err, engine.ErrPoolStateMissing) {
			t.Fatalf("err %v, want ErrPoolStateMissing", err)
		}
		if got := b.snapshot(t, child, t0).Balance; got != 100 || len(b.outbox(t, child)) != before {
			t.Fatalf("balance %d, outbox %d -> %d: the refused run changed something", got, before, len(b.outbox(t, child)))
		}
	})
}
