package lua

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// lineCtx is the context of a block customer with a credit line of limit.
func lineCtx(limit int64) engine.MutationContext {
	return engine.MutationContext{ExternalID: "ext-1", Policy: engine.OveragePolicyBlock, LimitMC: limit}
}

// lineConsume is a block consume of units at 1 mc each under a line of limit.
func lineConsume(c engine.CustomerKey, units, limit int64) engine.ConsumeCommand {
	cmd := consumeCmd(c, units, perUnitTerms(1), engine.OveragePolicyBlock, t0)
	cmd.Context = lineCtx(limit)
	return cmd
}

// ledgerSum is the sum of the deltas of every entry of ms.
func ledgerSum(ms ...engine.Mutation) int64 {
	var n int64
	for _, m := range ms {
		for _, e := range m.Entries {
			n += e.Delta
		}
	}
	return n
}

// TestCreditLineConsume holds the credit line of a block customer
// (docs/rules.md "Credit line"): a consume may take the effective balance
// down to minus the limit and no further; the blocks pay first and the rest
// is debt, which the entry's delta counts while its draws say what the
// blocks paid; balance = blocks - debt = the ledger's sum.
func TestCreditLineConsume(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name               string
		limit              int64
		units              []int64 // consumed in order
		wantRefused        []bool
		wantBalance        int64
		wantDebt           int64
		wantLastDelta      int64
		wantLastBlocksPaid int64
	}{
		{"no line refuses past the balance", 0, []int64{130}, []bool{true}, 100, 0, 0, 0},
		{"within the line", 50, []int64{130}, []bool{false}, -30, 30, -130, 100},
		{"to the limit exactly", 50, []int64{150}, []bool{false}, -50, 50, -150, 100},
		{"one past the limit", 50, []int64{151}, []bool{true}, 100, 0, 0, 0},
		{"in debt already: all on the line", 50, []int64{120, 20, 11}, []bool{false, false, true}, -40, 40, -20, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, b bundle) {
				ctx := context.Background()
				c, _ := b.funded(t) // balance 100
				var last engine.Mutation
				for i, u := range tt.units {
					res, err := b.store.Consume(ctx, lineConsume(c, u, tt.limit))
					if refused := errors.Is(err, engine.ErrInsufficientCredits); refused != tt.wantRefused[i] {
						t.Fatalf("consume %d of %d: err %v, want refused %v", i, u, err, tt.wantRefused[i])
					} else if err != nil && !refused {
						t.Fatal(err)
					}
					if err == nil {
						last = res.Mutation
					}
				}
				acct := b.snapshot(t, c, t0)
				if acct.Balance != tt.wantBalance || acct.DebtMC != tt.wantDebt || acct.EffectiveBalance != tt.wantBalance {
					t.Fatalf("account balance %d debt %d effective %d, want %d, %d", acct.Balance, acct.DebtMC,
						acct.EffectiveBalance, tt.wantBalance, tt.wantDebt)
				}
				var blocks int64
				for _, bl := range acct.Blocks {
					blocks += bl.RemainingAmount
				}
				if blocks-acct.DebtMC != acct.Balance {
					t.Fatalf("blocks %d - debt %d != balance %d", blocks, acct.DebtMC, acct.Balance)
				}
				if len(last.Entries) == 0 {
					return
				}
				if last.Account.Debt != tt.wantDebt || last.Account.Balance != tt.wantBalance {
					t.Fatalf("mutation account %+v, want balance %d debt %d", last.Account, tt.wantBalance, tt.wantDebt)
				}
				e := last.Entries[len(last.Entries)-1]
				block, draws := e.PaidBy()
				paid := int64(0)
				if block != nil {
					paid = -e.Delta
				}
				for _, d := range draws {
					paid += d.Amount
				}
				if e.Delta != tt.wantLastDelta || paid != tt.wantLastBlocksPaid {
					t.Fatalf("last entry delta %d, blocks paid %d; want %d, %d (entry %+v)", e.Delta, paid,
						tt.wantLastDelta, tt.wantLastBlocksPaid, e)
				}
				if u := last.Usage; u == nil || u.Charged != -e.Delta || u.Overage != 0 {
					t.Fatalf("usage %+v, want charged %d and no overage", u, -e.Delta)
				}
			})
		})
	}
}

// TestCreditLineRepaidByGrant: a grant that starts at once pays the debt
// first (a debt_repayment entry of zero delta whose draw is what the new
// block paid); a grant smaller than the debt goes whole to it and leaves no
// block in the hash; the ledger's sum stays the balance throughout.
func TestCreditLineRepaidByGrant(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t) // balance 100
		res, err := b.store.Consume(ctx, lineConsume(c, 150, 50))
		if err != nil {
			t.Fatal(err)
		}
		ms := []engine.Mutation{res.Mutation}
		small := b.grant(t, grantCmd(c, 20, t0))
		ms = append(ms, small)
		if small.Account.Debt != 30 || small.Account.Balance != -30 || len(small.Entries) != 2 {
			t.Fatalf("after a grant of 20: account %+v, %d entries", small.Account, len(small.Entries))
		}
		rep := small.Entries[1]
		if _, draws := rep.PaidBy(); rep.Type != engine.EntryDebtRepayment || rep.Delta != 0 || len(draws) != 1 ||
			draws[0].Amount != 20 {
			t.Fatalf("repayment entry %+v", rep)
		}
		if len(small.Blocks) != 1 || small.Blocks[0].Remaining != 0 || small.Blocks[0].Original != 20 {
			t.Fatalf("blocks %+v, want the grant's block emptied by the debt", small.Blocks)
		}
		big := b.grant(t, grantCmd(c, 80, t0))
		ms = append(ms, big)
		if big.Account.Debt != 0 || big.Account.Balance != 50 || big.Blocks[0].Remaining != 50 {
			t.Fatalf("after a grant of 80: account %+v, blocks %+v", big.Account, big.Blocks)
		}
		acct := b.snapshot(t, c, t0)
		if acct.Balance != 50 || acct.DebtMC != 0 || len(acct.Blocks) != 1 || acct.Blocks[0].RemainingAmount != 50 {
			t.Fatalf("snapshot %+v", acct)
		}
		// funded granted 100 before ms.
		if got := 100 + ledgerSum(ms...); got != acct.Balance {
			t.Fatalf("ledger sum %d, balance %d", got, acct.Balance)
		}
		// A further consume under the line spends the block, then the line.
		res, err = b.store.Consume(ctx, lineConsume(c, 60, 50))
		if err != nil || res.Mutation.Account.Balance != -10 || res.Mutation.Account.Debt != 10 {
			t.Fatalf("consume 60: %v %+v", err, res.Mutation.Account)
		}
	})
}

// TestCreditLineReservations: under block a reservation (and its extension) may
// lean on the line; the commit takes the reservation, then the free balance, then
// the line, and is refused past it with the reservation left as it was.
func TestCreditLineReservations(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t) // balance 100
		over := reserveCmd(c, 160, perUnitTerms(1), time.Hour, t0)
		over.Context = lineCtx(50)
		if _, err := b.store.Reserve(ctx, over); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("reserve past the line: %v", err)
		}
		rc := reserveCmd(c, 140, perUnitTerms(1), time.Hour, t0)
		rc.Context = lineCtx(50)
		r := b.reserve(t, rc).Reservation
		if acct := b.snapshot(t, c, t0); acct.EffectiveBalance != -40 || acct.Balance != 100 {
			t.Fatalf("after the reserve: %+v", acct)
		}
		past := commitCmd(c, r.ID, 151, perUnitTerms(1), t0)
		past.Context = lineCtx(50)
		if _, err := b.store.Commit(ctx, past); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("commit past the line: %v", err)
		}
		cc := commitCmd(c, r.ID, 150, perUnitTerms(1), t0)
		cc.Context = lineCtx(50)
		res, err := b.store.Commit(ctx, cc)
		if err != nil {
			t.Fatal(err)
		}
		m := res.Mutation
		if m.Account.Balance != -50 || m.Account.Debt != 50 || m.Account.Reserved != 0 || m.Usage.Charged != 150 {
			t.Fatalf("commit: account %+v usage %+v", m.Account, m.Usage)
		}
		if ledgerSum(m) != -150 {
			t.Fatalf("commit entries sum %d, want -150", ledgerSum(m))
		}
	})
}

// TestCreditLineAllowIgnoresIt: the line is for policy block only; under
// allow the balance still floors at zero and the rest is overage.
func TestCreditLineAllowIgnoresIt(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		c, _ := b.funded(t)
		cmd := consumeCmd(c, 130, perUnitTerms(1), engine.OveragePolicyAllow, t0)
		cmd.Context.LimitMC = 50
		res, err := b.store.Consume(context.Background(), cmd)
		if err != nil {
			t.Fatal(err)
		}
		if m := res.Mutation; m.Account.Balance != 0 || m.Account.Debt != 0 || m.Usage.Overage != 30 {
			t.Fatalf("allow: account %+v usage %+v", m.Account, m.Usage)
		}
	})
}

// TestCreditLineBigAccount runs the line on an account past
// LAYOUT_MIN_ITEMS blocks, whose scripts read the summary (field "s")
// rather than every block: the debt (field "d") rides in the same read,
// and a rebuild (LoadAt) restores it.
func TestCreditLineBigAccount(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		for range 12 {
			b.grant(t, grantCmd(c, 10, t0.Add(-time.Minute)))
		}
		res, err := b.store.Consume(ctx, lineConsume(c, 150, 40))
		if err != nil || res.Mutation.Account.Debt != 30 || res.Mutation.Account.Balance != -30 {
			t.Fatalf("consume: %v %+v", err, res.Mutation.Account)
		}
		if _, err := b.store.Consume(ctx, lineConsume(c, 11, 40)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("consume past the line: %v", err)
		}
		bal, err := b.store.Balances(ctx, c, t0)
		if err != nil || bal.Balance != -30 || bal.Effective != -30 || bal.Debt != 30 {
			t.Fatalf("balances %+v %v", bal, err)
		}
		// A rebuild of the same state: the debt comes back with it.
		acct := b.snapshot(t, c, t0)
		st := engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
			AccountID: acct.ID, Version: acct.Version + 1, LifetimeEarned: acct.LifetimeEarned, Debt: acct.DebtMC,
			UpdatedAtMS: t0.UnixMilli()}
		b.load(t, st)
		got := b.snapshot(t, c, t0)
		if got.DebtMC != 30 || got.Balance != -30 {
			t.Fatalf("after the load: %+v", got)
		}
		g := b.grant(t, grantCmd(c, 100, t0))
		if g.Account.Debt != 0 || g.Account.Balance != 70 {
			t.Fatalf("grant after the load: %+v", g.Account)
		}
	})
}
