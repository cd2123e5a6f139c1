package lua

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// budgetStep is one charge of a budget test: units of metric at t0+at under
// budgets, and whether a budget refuses it (spent: the spend it names) or
// the charge brings budgets to their limit (reached: how many).
type budgetStep struct {
	at      time.Duration
	metric  string
	units   int64
	policy  engine.OveragePolicy
	budgets []engine.Budget
	refused bool
	spent   int64
	reached int
}

// TestBudgetConsume holds prelude/budgets.lua's budget counters (docs/rules.md
// "Budgets"): a consume past a cap is refused whatever the policy and the
// balance, exactly to it is allowed; a new period starts at zero; a budget
// set again counts from then; a stale context never rolls a counter back;
// a budget of a metric ignores the others; credit.budget_reached is owed
// once per period.
func TestBudgetConsume(t *testing.T) {
	t.Parallel()
	api := "api.calls"
	day := func(limit int64, since time.Duration) []engine.Budget {
		return []engine.Budget{{Period: engine.BudgetDay, TimeZone: "UTC", LimitMC: limit, Since: t0.Add(since)}}
	}
	block, allow := engine.OveragePolicyBlock, engine.OveragePolicyAllow
	tests := []struct {
		name  string
		steps []budgetStep
	}{
		{"caps a day, to the limit exactly", []budgetStep{
			{at: time.Hour, units: 6, budgets: day(10, -time.Hour)},
			{at: 2 * time.Hour, units: 5, budgets: day(10, -time.Hour), refused: true, spent: 6, reached: 1},
			{at: 3 * time.Hour, units: 4, budgets: day(10, -time.Hour)},
			{at: 4 * time.Hour, units: 1, budgets: day(10, -time.Hour), refused: true, spent: 10},
		}},
		{"reaching the limit fires once", []budgetStep{
			{at: time.Hour, units: 10, budgets: day(10, -time.Hour), reached: 1},
			{at: 2 * time.Hour, units: 1, budgets: day(10, -time.Hour), refused: true, spent: 10},
		}},
		{"a new day starts at zero", []budgetStep{
			{at: time.Hour, units: 10, budgets: day(10, -time.Hour), reached: 1},
			{at: 23 * time.Hour, units: 1, budgets: day(10, -time.Hour), refused: true, spent: 10},
			{at: 25 * time.Hour, units: 10, budgets: day(10, -time.Hour), reached: 1},
		}},
		{"under allow the budget still refuses", []budgetStep{
			{at: time.Hour, units: 90, policy: allow, budgets: day(95, -time.Hour)},
			{at: time.Hour, units: 6, policy: allow, budgets: day(95, -time.Hour), refused: true, spent: 90, reached: 1},
			// Past the balance of 100: overage, counted too.
			{at: time.Hour, units: 5, policy: allow, budgets: day(200, -time.Hour)},
			{at: time.Hour, units: 106, policy: allow, budgets: day(200, -time.Hour), refused: true, spent: 95},
		}},
		{"a budget set again counts from then; a stale context keeps the count", []budgetStep{
			{at: time.Hour, units: 8, budgets: day(10, -time.Hour)},
			{at: 3 * time.Hour, units: 8, budgets: day(10, 2*time.Hour)},
			{at: 4 * time.Hour, units: 3, budgets: day(10, -time.Hour), refused: true, spent: 8, reached: 1},
		}},
		{"a budget of a metric ignores the others", []budgetStep{
			{at: time.Hour, units: 9, budgets: []engine.Budget{{BillableMetricKey: &api, Period: engine.BudgetMonth, TimeZone: "UTC",
				LimitMC: 10, Since: t0}}},
			{at: time.Hour, metric: "other", units: 50, budgets: []engine.Budget{{BillableMetricKey: &api, Period: engine.BudgetMonth,
				TimeZone: "UTC", LimitMC: 10, Since: t0}}},
			{at: time.Hour, units: 2, budgets: []engine.Budget{{BillableMetricKey: &api, Period: engine.BudgetMonth, TimeZone: "UTC",
				LimitMC: 10, Since: t0}}, refused: true, spent: 9, reached: 1},
		}},
		{"a budget set after the command's instant neither counts nor refuses it", []budgetStep{
			{at: time.Hour, units: 50, budgets: day(10, 2*time.Hour)},
			{at: 3 * time.Hour, units: 10, budgets: day(10, 2*time.Hour), reached: 1},
		}},
		{"a zero limit refuses any cost", []budgetStep{
			{at: time.Hour, units: 1, budgets: day(0, -time.Hour), refused: true, spent: 0, reached: 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, b bundle) {
				ctx := context.Background()
				c, _ := b.funded(t) // balance 100
				balance := int64(100)
				for i, st := range tt.steps {
					policy := st.policy
					if policy == "" {
						policy = block
					}
					cmd := consumeCmd(c, st.units, perUnitTerms(1), policy, t0.Add(st.at))
					if st.metric != "" {
						cmd.Metric = st.metric
					}
					cmd.Context.Budgets = st.budgets
					res, err := b.store.Consume(ctx, cmd)
					var e *engine.Error
					refused := errors.As(err, &e) && e.Kind == engine.KindBudgetExceeded
					if refused != st.refused || (err != nil && !refused) {
						t.Fatalf("step %d: err %v, want refused %v", i, err, st.refused)
					}
					if refused {
						got := e.Extra["budget"].(map[string]any)["spent_mc"].(int64)
						if got != st.spent {
							t.Errorf("step %d: refusal names spent %d, want %d", i, got, st.spent)
						}
						// The refusal record, if any, owes credit.budget_reached and
						// nothing for credit.
						continue
					}
					balance -= st.units
					reached := 0
					if res.Mutation.Budget != nil {
						reached = len(res.Mutation.Budget.Reached)
					}
					if reached != st.reached {
						t.Errorf("step %d: %d budgets reached, want %d (%+v)", i, reached, st.reached, res.Mutation.Budget)
					}
				}
				// Refusals changed nothing in the account.
				if acct := b.snapshot(t, c, t0.Add(30*time.Hour)); acct.Balance != balance {
					t.Errorf("balance %d, want %d", acct.Balance, balance)
				}
				// Every event owed: reached by a charge or by the first refusal.
				want := 0
				for _, st := range tt.steps {
					want += st.reached
				}
				got := 0
				for _, m := range b.outbox(t, c) {
					if m.Budget != nil {
						got += len(m.Budget.Reached)
						if m.Budget.Refused {
							for _, ev := range engine.EventsOf(m) {
								if ev.EventType == engine.EventCreditExhausted {
									t.Errorf("a budget's refusal owes credit.exhausted")
								}
							}
						}
					}
				}
				if got != want {
					t.Errorf("outbox owes %d credit.budget_reached, want %d", got, want)
				}
			})
		})
	}
}

// TestBudgetReservations: a reservation is checked against the budgets with its estimate
// but not counted; its commit counts the actual cost and is never refused.
func TestBudgetReservations(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		budgets := []engine.Budget{{Period: engine.BudgetDay, TimeZone: "UTC", LimitMC: 10, Since: t0}}
		at := t0.Add(time.Hour)
		over := reserveCmd(c, 11, perUnitTerms(1), time.Hour, at)
		over.Context = engine.MutationContext{Policy: engine.OveragePolicyBlock, Budgets: budgets}
		if _, err := b.store.Reserve(ctx, over); !errors.Is(err, engine.ErrBudgetExceeded) {
			t.Fatalf("reserve 11 of 10: %v, want budget-exceeded", err)
		}
		h := reserveCmd(c, 8, perUnitTerms(1), time.Hour, at)
		h.Context = over.Context
		if _, err := b.store.Reserve(ctx, h); err != nil {
			t.Fatal(err)
		}
		// The reservation is not counted: 9 more still fit.
		cons := consumeCmd(c, 9, perUnitTerms(1), engine.OveragePolicyBlock, at)
		cons.Context.Budgets = budgets
		if _, err := b.store.Consume(ctx, cons); err != nil {
			t.Fatalf("consume 9 beside a reservation of 8: %v", err)
		}
		// The commit counts 8, past the cap, and is not refused.
		cm := commitCmd(c, h.ReservationID, 8, perUnitTerms(1), at)
		cm.Context = over.Context
		res, err := b.store.Commit(ctx, cm)
		if err != nil {
			t.Fatalf("commit past the cap: %v", err)
		}
		// The refused reservation already fired credit.budget_reached for the day.
		if res.Mutation.Budget != nil {
			t.Errorf("commit budget section %+v, want none: the period's event fired", res.Mutation.Budget)
		}
		one := consumeCmd(c, 1, perUnitTerms(1), engine.OveragePolicyBlock, at)
		one.Context.Budgets = budgets
		_, err = b.store.Consume(ctx, one)
		var e *engine.Error
		if !errors.As(err, &e) || e.Kind != engine.KindBudgetExceeded || e.Extra["budget"].(map[string]any)["spent_mc"].(int64) != 17 {
			t.Errorf("consume after the commit: %v, want budget-exceeded at 17 spent", err)
		}
	})
}

// TestBudgetTextsRemembered holds what the library remembers across calls
// (prelude/budgets.lua: budgets parsed per "bud" text, counters per value
// text) to what a fresh parse answers: one budget text shared by two
// customers counts each on its own counter, a counter rewritten from
// outside (as a rebuild's fill writes it) is read as written, and a
// remembered budget whose window does not hold the command's instant is
// neither counted nor refusing.
func TestBudgetTextsRemembered(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		from := t0.Truncate(24 * time.Hour)
		text := "u:d:|" + strconv.FormatInt(from.UnixMilli(), 10) + "|" + strconv.FormatInt(from.Add(24*time.Hour).UnixMilli(), 10) + "|50"
		a, _ := b.funded(t)
		other, _ := b.funded(t)
		steps := []struct {
			name    string
			c       engine.CustomerKey
			at      time.Time
			units   int64
			refused bool
			set     string // the counter's value written before the step
		}{
			{"counts 30 of 50", a, from.Add(time.Hour), 30, false, ""},
			{"another customer, same text, its own counter", other, from.Add(time.Hour), 30, false, ""},
			{"the remembered counter refuses past the limit", a, from.Add(2 * time.Hour), 30, true, ""},
			{"a counter written from outside is read as written", a, from.Add(3 * time.Hour), 30, false,
				strconv.FormatInt(from.UnixMilli(), 10) + " 10"},
			{"a window that does not hold now neither counts nor refuses", a, from.Add(25 * time.Hour), 30, false, ""},
		}
		for i, st := range steps {
			if st.set != "" {
				if err := b.rdb.HSet(ctx, b.store.accountKey(st.c.CustomerID), "u:d:", st.set).Err(); err != nil {
					t.Fatal(err)
				}
			}
			cmd := consumeCmd(st.c, st.units, perUnitTerms(1), engine.OveragePolicyAllow, st.at)
			cmd.Context.BudgetArg = text
			_, err := b.store.Consume(ctx, cmd)
			var e *engine.Error
			refused := errors.As(err, &e) && e.Kind == engine.KindBudgetExceeded
			if refused != st.refused || (err != nil && !refused) {
				t.Fatalf("step %d (%s): err %v, want refused %v", i, st.name, err, st.refused)
			}
		}
		want := map[engine.CustomerKey]string{a: strconv.FormatInt(from.UnixMilli(), 10) + " 40", other: strconv.FormatInt(from.UnixMilli(), 10) + " 30"}
		for c, w := range want {
			if got := b.rdb.HGet(ctx, b.store.accountKey(c.CustomerID), "u:d:").Val(); got != w {
				t.Errorf("counter of %s: %q, want %q", c.CustomerID, got, w)
			}
		}
	})
}
