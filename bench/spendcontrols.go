package main

import (
	"context"
	"fmt"
	"strings"
)

// The consume-controlled scenario (issue 28): the consume scenario's very
// request against customers that carry every spend control creditd has
// built: credits scoped to the metric and to another one besides unscoped
// credit, a credit line, two budgets (a daily cap of every metric and a
// monthly one of the consumed metric in a time zone) and a parent pool
// with a daily draw limit (one parent per controlledFamily customers), all
// checked inside the charging script. Its CPU per op against the plain
// consume of the same run is issue 28's "within 15 %" row. The children's
// own credit covers the run, as a member's usually covers most of its
// charges: the pool is configured, not drawn (a draw costs a second
// Mutation, the parent's).

// scenarioControlled names the scenario.
const scenarioControlled = "consume-controlled"

// controlledBudgetMC is each budget's limit: far above what a run spends,
// so every consume is checked against the budgets and none is refused.
const controlledBudgetMC = 1_000_000_000_000

// controlledFamily is how many controlled customers share one parent.
const controlledFamily = 16

// seedControlled creates n customers with the spend controls (ctl-%07d),
// through the API as seed does: the budgets and the credit line on the
// customer, then three grants: scoped to the consumed metric, scoped to
// another, and unscoped.
func (b *Bench) seedControlled(ctx context.Context, n int) ([]Customer, error) {
	idem := func(s string) []string { return []string{"Idempotency-Key", b.runID + "-seed-ctl-" + s} }
	out := make([]Customer, n)
	logf("seeding %d customers with scoped credit, a credit line, budgets and a parent pool", n)
	parents := make([]string, (n+controlledFamily-1)/controlledFamily)
	if err := parallel(len(parents), 16, func(i int) error {
		ext := fmt.Sprintf("ctl-org-%05d", i)
		if _, err := b.api.Expect(201, "POST", "/v1/customers", map[string]any{"external_id": ext}, idem("org-"+ext)...); err != nil {
			return err
		}
		parents[i] = ext
		_, err := b.api.Expect(201, "POST", "/v1/customers/"+ext+"/credits/grant", map[string]any{"credits": grantCredits,
			"source": "promotional", "reason": "bench seed"}, idem("org-grant-"+ext)...)
		return err
	}); err != nil {
		return nil, err
	}
	err := parallel(n, 16, func(i int) error {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		ext := fmt.Sprintf("ctl-%07d", i)
		a, err := b.api.Expect(201, "POST", "/v1/customers", map[string]any{
			"external_id":     ext,
			"credit_limit_mc": 1_000_000,
			"budgets": []map[string]any{
				{"period": "day", "limit_mc": controlledBudgetMC},
				{"billable_metric_key": metricConsume, "period": "month", "time_zone": "Europe/Berlin", "limit_mc": controlledBudgetMC},
			},
			"parent_id":         parents[i/controlledFamily],
			"parent_draw_limit": map[string]any{"period": "day", "limit_mc": controlledBudgetMC},
		}, idem("cust-"+ext)...)
		if err != nil {
			return err
		}
		var c struct{ ID string }
		if err := a.Decode(&c); err != nil {
			return err
		}
		out[i] = Customer{Ext: ext, ID: c.ID}
		for k, scope := range [][]string{{metricConsume}, {metricUsage}, nil} {
			body := map[string]any{"credits": grantCredits, "source": "promotional", "reason": "bench seed", "priority": k}
			if scope != nil {
				body["applies_to"] = map[string]any{"billable_metric_keys": scope}
			}
			if _, err := b.api.Expect(201, "POST", "/v1/customers/"+ext+"/credits/grant", body,
				idem(fmt.Sprintf("grant-%s-%d", ext, k))...); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}

// consumeControlled is consume against the controlled customers.
func (t *Target) consumeControlled(hot bool) opFunc {
	return func(w *worker, seq uint64) (int, error) {
		c := t.pickControlled(seq, hot)
		body := []byte(`{"customer_id":"` + c.Ext + `","billable_metric_key":"` + metricConsume + `","units":1}`)
		st, err := t.post(w, "/v1/entitlements/consume", "cc", seq, body)
		t.ack(st, err, &t.Acks.Consumes, 1)
		return st, err
	}
}

// pickControlled is pick over the controlled customers.
func (t *Target) pickControlled(seq uint64, hot bool) *Customer {
	if len(t.Controlled) == 0 {
		return &Customer{Ext: "no-controlled-customer-seeded"}
	}
	if hot {
		return &t.Controlled[0]
	}
	return &t.Controlled[(seq*0x9E3779B97F4A7C15>>20)%uint64(len(t.Controlled))]
}

// computeGoals28 fills Goals28: issue 28's bench row.
func (r *Results) computeGoals28() {
	const name = "consume CPU per op with spend controls / plain consume, same run"
	const goal = "<= 1.15x with scoped credits, budgets and a parent pool"
	plain, plainRate, okPlain := r.runCPU("consume", false)
	ctl, rate, okCtl := r.runCPU(scenarioControlled, false)
	if !okCtl {
		r.Goals28 = []Goal{{Name: name, Goal: goal, Now: "not measured"}}
		return
	}
	// The plain consume at the controlled run's own rate when the bench ran
	// it (CPU per op falls as the rate rises: the persister's and the
	// runners' idle work spreads over more ops), else the consume
	// scenario's 70 % run.
	if tw := r.scenario(scenarioControlled).PlainTwin; tw != nil && tw.Run.OK > 0 && tw.Run.ErrorRate <= 0.01 {
		twin := perOp(tw.CPU, float64(tw.Run.OK))
		if twin.total() > 0 {
			ratio := ctl.total() / twin.total()
			now := fmt.Sprintf("%.2fx: %s per consume at %.0f/s against %s per plain consume at %.0f/s, the same offered rate, "+
				"run right after it", ratio, ctl, rate, twin, float64(tw.Run.OK)/tw.Run.Seconds)
			if okPlain && plain.total() > 0 {
				now += fmt.Sprintf(" (against the consume scenario's 70 %% run, %s at %.0f/s: %.2fx)", plain, plainRate, ctl.total()/plain.total())
			}
			now += "; scoped credits, a credit line, two budgets and a parent pool with a draw limit, not drawn"
			r.Goals28 = []Goal{{Name: name, Goal: goal, Now: now, Met: boolp(ratio <= 1.15)}}
			return
		}
	}
	if !okPlain || plain.total() <= 0 {
		r.Goals28 = []Goal{{Name: name, Goal: goal, Now: "not measured"}}
		return
	}
	ratio := ctl.total() / plain.total()
	now := fmt.Sprintf("%.2fx: %s per consume at %.0f/s against %s at %.0f/s (scoped credits, a credit line, two budgets and a parent "+
		"pool with a draw limit, not drawn)", ratio, ctl, rate, plain, plainRate)
	r.Goals28 = []Goal{{Name: name, Goal: goal, Now: now, Met: boolp(ratio <= 1.15)}}
}

// goals28Markdown writes issue 28's table.
func (r *Results) goals28Markdown(w func(string, ...any)) {
	if len(r.Goals28) == 0 {
		return
	}
	w("## Goals (issue 28: spend controls)\n\n")
	w("The `%s` scenario is the consume scenario's request against customers with credits scoped to the metric and to another one, "+
		"unscoped credit, a credit line, two budgets (a daily cap of every metric, a monthly Europe/Berlin cap of the metric) "+
		"and a parent (one per %d customers) with a daily draw limit, each cap far above what the run spends and the pool not drawn; "+
		"CPU per op as in the consume row (creditd, Redis and Postgres during the 70 %% run), against the plain consume scenario "+
		"run right after it at the same offered rate for as long (CPU per op depends on the rate: the idle loops' work spreads "+
		"over fewer ops at a lower one).\n\n", scenarioControlled, controlledFamily)
	w("| figure | goal | measured | met |\n|---|---|---|---|\n")
	for _, g := range r.Goals28 {
		met := "not measured"
		if g.Met != nil {
			met = map[bool]string{true: "**met**", false: "**missed**"}[*g.Met]
		}
		w("| %s | %s | %s | %s |\n", g.Name, g.Goal, strings.ReplaceAll(g.Now, "|", "\\|"), met)
	}
	w("\n")
}
