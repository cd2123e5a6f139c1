package lua

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// poolMulti is a multi-metric consume by child of items (1 mc a unit each)
// drawing on parent within limit (nil: none), with credit line line.
func poolMulti(child, parent engine.CustomerKey, policy engine.OveragePolicy, limit *engine.DrawLimit, line int64,
	items ...engine.ConsumeLine) engine.ConsumeCommand {
	cmd := multiCmd(child, policy, items...)
	cmd.Context = engine.MutationContext{ExternalID: "child", Policy: policy, LimitMC: line}
	cmd.Pool = &engine.PoolDraw{Parent: parent, OpID: engine.PoolOpID(cmd.OpID), Limit: limit,
		ParentContext: engine.MutationContext{ExternalID: "parent", Policy: engine.OveragePolicyBlock}}
	return cmd
}

// grants is n grants of amount each, at priorities 0..n-1.
func grants(n int, amount int64) []engine.GrantCommand {
	out := make([]engine.GrantCommand, n)
	for i := range out {
		out[i] = scopedGrant(engine.CustomerKey{}, amount, i)
	}
	return out
}

// TestPoolConsumeMulti holds a child's multi-metric charge to docs/rules.md
// "Shared pools" as TestPoolConsume holds a single one: item by item, the
// child's blocks that apply to the item's metric, then its parent's that
// apply within the draw limit, then its line; under block a charge the
// three cannot cover is refused whole and changes nothing; under allow the
// rest is overage. The parent's part is its own Mutation, appended before
// the child's, whose pool_draw entry names the child and no metric; each
// ledger sums to its own balance.
func TestPoolConsumeMulti(t *testing.T) {
	t.Parallel()
	day := &engine.DrawLimit{Period: engine.BudgetDay, TimeZone: "UTC", LimitMC: 30, Since: t0.Add(-time.Hour)}
	a, b := line("a.calls", 80, perUnitTerms(1)), line("b.calls", 50, perUnitTerms(1))
	tests := []struct {
		name          string
		child, parent []engine.GrantCommand // grants, customer filled in
		policy        engine.OveragePolicy
		limit         *engine.DrawLimit
		line          int64
		charges       [][]engine.ConsumeLine
		wantRefused   []bool
		wantChild     int64 // the child's balance after
		wantParent    int64
		wantDebt      int64
		wantPooled    int64 // pool_mc of the last charge that passed
		wantOverage   int64
	}{
		{"own blocks first", []engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 200, 0)},
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 500, 0)}, engine.OveragePolicyBlock, nil, 0,
			[][]engine.ConsumeLine{{a, b}}, []bool{false}, 70, 500, 0, 0, 0},
		{"split across own and the parent", []engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 100, 0)},
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 500, 0)}, engine.OveragePolicyBlock, nil, 0,
			[][]engine.ConsumeLine{{a, b}}, []bool{false}, 0, 470, 0, 30, 0},
		// The child's block pays a.calls only: b.calls is the parent's,
		// and the child keeps what a.calls left of its block.
		{"the child's scope holds per item", []engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 100, 0, "a.calls")},
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 500, 0)}, engine.OveragePolicyBlock, nil, 0,
			[][]engine.ConsumeLine{{a, b}}, []bool{false}, 20, 450, 0, 50, 0},
		// The parent's block pays a.calls only: b.calls is short under
		// block, and overage under allow.
		{"the parent's scope holds per item", nil,
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 500, 0, "a.calls")}, engine.OveragePolicyBlock, nil, 0,
			[][]engine.ConsumeLine{{a, b}}, []bool{true}, 0, 500, 0, 0, 0},
		{"scoped parent, allow: overage past the pool", nil,
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 500, 0, "a.calls")}, engine.OveragePolicyAllow, nil, 0,
			[][]engine.ConsumeLine{{a, b}}, []bool{false}, 0, 420, 0, 80, 50},
		{"parent short refuses whole", []engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 100, 0)},
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 20, 0)}, engine.OveragePolicyBlock, nil, 0,
			[][]engine.ConsumeLine{{a, b}}, []bool{true}, 100, 20, 0, 0, 0},
		{"draw limit caps the pool", []engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 100, 0)},
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 500, 0)}, engine.OveragePolicyBlock, day, 0,
			[][]engine.ConsumeLine{{a, b}, {line("a.calls", 1, perUnitTerms(1)), line("b.calls", 1, perUnitTerms(1))}},
			[]bool{false, true}, 0, 470, 0, 30, 0},
		{"the line after the pool", []engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 100, 0)},
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 500, 0)}, engine.OveragePolicyBlock, day, 20,
			[][]engine.ConsumeLine{{a, line("b.calls", 60, perUnitTerms(1))}}, []bool{false}, -10, 470, 10, 30, 0},
		{"own, pool and line short refuses whole", []engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 100, 0)},
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 500, 0)}, engine.OveragePolicyBlock, day, 20,
			[][]engine.ConsumeLine{{a, line("b.calls", 71, perUnitTerms(1))}}, []bool{true}, 100, 500, 0, 0, 0},
		// The parent's one block pays both items: one draw of it.
		{"a parent's block paying two items", nil,
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 500, 0, "a.calls", "b.calls"), scopedGrant(engine.CustomerKey{}, 500, 1, "c.calls")},
			engine.OveragePolicyBlock, nil, 0, [][]engine.ConsumeLine{{a, b}}, []bool{false}, 0, 870, 0, 130, 0},
		// Ten blocks a side: both hashes read on the fast path, whose
		// drain reads the blocks afresh from the hash.
		{"fast path on both sides", grants(10, 10), grants(10, 50), engine.OveragePolicyBlock, day, 0,
			[][]engine.ConsumeLine{{a, b}}, []bool{false}, 0, 470, 0, 30, 0},
		{"allow: overage past the pool", []engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 100, 0)},
			[]engine.GrantCommand{scopedGrant(engine.CustomerKey{}, 10, 0)}, engine.OveragePolicyAllow, nil, 0,
			[][]engine.ConsumeLine{{a, b}}, []bool{false}, 0, 0, 0, 10, 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, bk bundle) {
				ctx := context.Background()
				parent := newCustomer()
				bk.known(t, parent)
				for _, g := range tt.parent {
					g.Customer = parent
					bk.grant(t, g)
				}
				child := sameSlotCustomer(parent)
				bk.known(t, child)
				for _, g := range tt.child {
					g.Customer = child
					bk.grant(t, g)
				}
				var last engine.Mutation
				for i, items := range tt.charges {
					before := bk.dump(t, parent) + bk.dump(t, child)
					balBefore := bk.snapshot(t, child, t0).Balance
					ob := len(bk.outbox(t, child))
					res, err := bk.store.Consume(ctx, poolMulti(child, parent, tt.policy, tt.limit, tt.line, items...))
					if refused := errors.Is(err, engine.ErrInsufficientCredits); refused != tt.wantRefused[i] {
						t.Fatalf("charge %d: err %v, want refused %v", i, err, tt.wantRefused[i])
					} else if err != nil && !refused {
						t.Fatal(err)
					}
					if err != nil {
						// Only the refusal record: no Mutation of the
						// parent, no block or counter moved.
						got := bk.outbox(t, child)
						if len(got) != ob+1 || got[len(got)-1].Usage == nil || !got[len(got)-1].Usage.Refused {
							t.Fatalf("refusal appended %d records, want one refusal record", len(got)-ob)
						}
						// The record shows the account as it stays.
						if r := got[len(got)-1]; r.Account.Balance != balBefore || len(r.Entries) != 0 {
							t.Errorf("refusal record balance %d, %d entries; want %d and none", r.Account.Balance, len(r.Entries), balBefore)
						}
						bk.rdb.XDel(ctx, bk.store.outboxKey(Partition(child.CustomerID)), lastOutboxID(t, bk, child))
						if after := bk.dump(t, parent) + bk.dump(t, child); after != before {
							t.Errorf("refused charge changed state:\n%s\n->\n%s", before, after)
						}
						continue
					}
					last = res.Mutation
				}
				if got := bk.snapshot(t, child, t0); got.Balance != tt.wantChild || got.DebtMC != tt.wantDebt {
					t.Errorf("child balance %d debt %d, want %d, %d", got.Balance, got.DebtMC, tt.wantChild, tt.wantDebt)
				}
				if got := bk.snapshot(t, parent, t0).Balance; got != tt.wantParent {
					t.Errorf("parent balance %d, want %d", got, tt.wantParent)
				}
				if u := last.Usage; u != nil && (u.Pool != tt.wantPooled || u.Overage != tt.wantOverage ||
					u.Charged != u.Cost-tt.wantOverage) {
					t.Errorf("last usage %+v, want pool %d overage %d", u, tt.wantPooled, tt.wantOverage)
				}
				if last.Usage == nil && tt.wantPooled != 0 {
					t.Errorf("no charge passed, want one with pool %d", tt.wantPooled)
				}
				// Each ledger sums to its own balance; the parent's
				// Mutation comes right before the child's it pays for.
				var childSum, parentSum int64
				ms := bk.outbox(t, child)
				for i, m := range ms {
					switch m.CustomerID {
					case child.CustomerID:
						childSum += ledgerSum(m)
					case parent.CustomerID:
						parentSum += ledgerSum(m)
						for _, e := range m.Entries {
							if e.Type != engine.EntryPoolDraw {
								continue
							}
							if e.Ref == nil || *e.Ref != child.CustomerID || e.Metric != nil {
								t.Errorf("pool_draw entry ref %v metric %v, want the child and no metric", e.Ref, e.Metric)
							}
							seen := map[uuid.UUID]bool{}
							for _, d := range e.Draws {
								if seen[d.BlockID] {
									t.Errorf("pool_draw entry draws block %s twice: %+v", d.BlockID, e.Draws)
								}
								seen[d.BlockID] = true
							}
							if e.BlockID == nil && len(e.Draws) == 0 && e.Delta != 0 {
								t.Errorf("pool_draw entry %+v names no block", e)
							}
							if i+1 >= len(ms) || ms[i+1].CustomerID != child.CustomerID || ms[i+1].Usage == nil ||
								ms[i+1].Usage.Pool != -e.Delta {
								t.Errorf("the parent's pool_draw of %d is not followed by the child's charge naming it", -e.Delta)
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

// TestPoolMultiNeedsParentState: a child's multi-metric charge that needs
// its parent, whose state Redis does not hold, answers ErrPoolStateMissing
// and changes nothing, as a single charge does; one the child's own credit
// covers never reads the parent.
func TestPoolMultiNeedsParentState(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		parent := newCustomer()
		child := sameSlotCustomer(parent)
		b.known(t, child)
		b.grant(t, grantCmd(child, 100, t0.Add(-time.Minute)))
		before := b.dump(t, child)
		_, err := b.store.Consume(ctx, poolMulti(child, parent, engine.OveragePolicyBlock, nil, 0,
			line("a.calls", 80, perUnitTerms(1)), line("b.calls", 50, perUnitTerms(1))))
		if !errors.Is(err, engine.ErrPoolStateMissing) {
			t.Fatalf("err %v, want ErrPoolStateMissing", err)
		}
		if after := b.dump(t, child); after != before {
			t.Fatalf("the refused run changed something:\n%s\n->\n%s", before, after)
		}
		res, err := b.store.Consume(ctx, poolMulti(child, parent, engine.OveragePolicyBlock, nil, 0,
			line("a.calls", 5, perUnitTerms(1)), line("b.calls", 5, perUnitTerms(1))))
		if err != nil || res.Mutation.Usage == nil || res.Mutation.Usage.Pool != 0 || res.Mutation.Usage.Charged != 10 {
			t.Fatalf("a charge the child's own credit covers: %v %+v", err, res.Mutation.Usage)
		}
	})
}

// TestPoolMultiDry: a dry run of a pooled multi-metric charge answers the
// parent's Mutation beside the child's (engine's draws and events read
// it) and changes nothing.
func TestPoolMultiDry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		parent := newCustomer()
		b.known(t, parent)
		pg := grantCmd(parent, 500, t0.Add(-time.Minute))
		b.grant(t, pg)
		child := sameSlotCustomer(parent)
		b.known(t, child)
		b.grant(t, grantCmd(child, 100, t0.Add(-time.Minute)))
		before := b.dump(t, parent) + b.dump(t, child)
		res, err := b.store.ConsumeDry(ctx, poolMulti(child, parent, engine.OveragePolicyBlock, nil, 0,
			line("a.calls", 80, perUnitTerms(1)), line("b.calls", 50, perUnitTerms(1))))
		if err != nil {
			t.Fatal(err)
		}
		if u := res.Mutation.Usage; u == nil || u.Pool != 30 || u.Charged != 130 {
			t.Errorf("dry usage %+v, want pool 30 of 130", u)
		}
		if res.Pool == nil || res.Pool.CustomerID != parent.CustomerID || ledgerSum(*res.Pool) != -30 {
			t.Fatalf("dry run's parent Mutation %+v, want the parent's draw of 30", res.Pool)
		}
		if e := res.Pool.Entries[len(res.Pool.Entries)-1]; e.BlockID == nil || *e.BlockID != pg.Block.ID {
			t.Errorf("parent's entry %+v, want it paid by block %s", e, pg.Block.ID)
		}
		if after := b.dump(t, parent) + b.dump(t, child); after != before {
			t.Errorf("a dry run changed state:\n%s\n->\n%s", before, after)
		}
	})
}
