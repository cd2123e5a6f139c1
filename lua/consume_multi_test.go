package lua

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// multiCmd is a multi-metric consume of items for c.
func multiCmd(c engine.CustomerKey, policy engine.OveragePolicy, items ...engine.ConsumeLine) engine.ConsumeCommand {
	cmd := consumeCmd(c, 0, engine.RuleTerms{}, policy, t0)
	cmd.Metric, cmd.Items = "", items
	for _, it := range items {
		cmd.Units += it.Units
	}
	return cmd
}

func line(metric string, units int64, terms engine.RuleTerms) engine.ConsumeLine {
	return engine.ConsumeLine{Metric: metric, Units: units, Terms: terms}
}

// TestConsumeMulti: consume_multi.lua charges the items' total once (one
// consumption entry, blocks drained once), all or none under block, the
// total's overage under allow and notify, refuses a total past int64, and
// replays the original numbers; on every backend.
func TestConsumeMulti(t *testing.T) {
	t.Parallel()
	grad := tieredTerms(engine.TierGraduated, tier(ptr[int64](2), 10, 5), tier(nil, 1, 0)) // 4 units: 27
	three := []engine.ConsumeLine{line("api.calls", 3, perUnitTerms(10)), line("gpu.seconds", 1, flatTerms(20)),
		line("tokens", 4, grad)} // 30 + 20 + 27 = 77
	cases := []struct {
		name        string
		policy      engine.OveragePolicy
		items       []engine.ConsumeLine
		wantErr     error
		wantDraws   []string
		wantCost    int64
		wantCharged int64
	}{
		{"block within", engine.OveragePolicyBlock, three, nil, []string{"-:-77[b1:60 b2:17]"}, 77, 77},
		{"block exact", engine.OveragePolicyBlock, append(three[:2:2], line("tokens", 50, flatTerms(50))), nil,
			[]string{"-:-100[b1:60 b2:40]"}, 100, 100},
		{"block one short", engine.OveragePolicyBlock, append(three[:2:2], line("tokens", 1, flatTerms(51))),
			engine.ErrInsufficientCredits, nil, 101, 0},
		{"allow overage of the total", engine.OveragePolicyAllow, append(three[:2:2], line("tokens", 1, flatTerms(80))),
			nil, []string{"-:-100/o30[b1:60 b2:40]"}, 130, 100},
		{"notify overage of the total", engine.OveragePolicyNotify, append(three[:2:2], line("tokens", 1, flatTerms(80))),
			nil, []string{"-:-100/o30[b1:60 b2:40]"}, 130, 100},
		{"total overflows", engine.OveragePolicyAllow, []engine.ConsumeLine{line("a", 1, flatTerms(math.MaxInt64)),
			line("b", 1, flatTerms(1))}, engine.ErrOverflow, nil, 0, 0},
		{"zero cost", engine.OveragePolicyBlock, []engine.ConsumeLine{line("a", 3, flatTerms(0)), line("b", 1, flatTerms(0))},
			nil, []string{"-:0"}, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, b bundle) {
				c, ids := b.funded(t)
				names := map[uuid.UUID]string{ids[0]: "b1", ids[1]: "b2"}
				cmd := multiCmd(c, tc.policy, tc.items...)
				cmd.IdempotencyKey, cmd.RequestHash = "multi-1", "h1"
				cmd.EntryMetadata = engine.Metadata{"job": json.RawMessage(`"j1"`)}
				before := b.dump(t, c, "multi-1")
				res, err := b.store.Consume(context.Background(), cmd)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Fatalf("err %v, want %v", err, tc.wantErr)
					}
					if errors.Is(err, engine.ErrInsufficientCredits) {
						ob := b.outbox(t, c)
						u := ob[len(ob)-1].Usage
						if u == nil || !u.Refused || u.Cost != tc.wantCost || len(u.Items) != len(tc.items) ||
							len(ob[len(ob)-1].Entries) != 0 {
							t.Errorf("refusal usage %+v", u)
						}
						b.rdb.XDel(context.Background(), b.store.outboxKey(Partition(c.CustomerID)), lastOutboxID(t, b, c))
					}
					if after := b.dump(t, c, "multi-1"); after != before {
						t.Errorf("refused consume changed state:\n%s\n->\n%s", before, after)
					}
					return
				}
				if err != nil {
					t.Fatalf("consume: %v", err)
				}
				m := res.Mutation
				if got := draws(m, names); fmt.Sprint(got) != fmt.Sprint(tc.wantDraws) {
					t.Errorf("entries %v, want %v", got, tc.wantDraws)
				}
				u := m.Usage
				var units int64
				want := make([]engine.UsageItem, len(tc.items))
				for i, it := range tc.items {
					p, _ := engine.Price(engine.MeteringRule{CostType: it.Terms.CostType, BaseCost: it.Terms.BaseCost,
						UnitCost: it.Terms.UnitCost, TierConfig: it.Terms.TierConfig}, it.Units)
					want[i] = engine.UsageItem{Metric: it.Metric, Units: it.Units, Cost: p}
					units += it.Units
				}
				if u == nil || u.Cost != tc.wantCost || u.Charged != tc.wantCharged || u.Overage != tc.wantCost-tc.wantCharged ||
					u.Metric != "" || u.Units != units || fmt.Sprint(u.Items) != fmt.Sprint(want) {
					t.Errorf("usage %+v, want items %v", u, want)
				}
				e := m.Entries[len(m.Entries)-1]
				wantMeta, _ := json.Marshal(want)
				if e.Metric != nil || e.Units != nil || e.Type != engine.EntryConsumption ||
					string(e.Metadata) != `{"items":`+string(wantMeta)+`,"job":"j1"}` {
					t.Errorf("entry %+v meta %s", e, e.Metadata)
				}
				// A retry replays the original numbers; another body is refused.
				again := cmd
				again.OpID = uuid.New()
				r2, err := b.store.Consume(context.Background(), again)
				if err != nil || !r2.Replayed || r2.Mutation.OpID != cmd.OpID ||
					fmt.Sprint(r2.Mutation.Usage.Items) != fmt.Sprint(u.Items) || r2.Mutation.Account.Balance != m.Account.Balance {
					t.Errorf("replay: %v %+v", err, r2)
				}
				again.RequestHash = "h2"
				if _, err := b.store.Consume(context.Background(), again); !errors.Is(err, engine.ErrIdempotencyMismatch) {
					t.Errorf("other body: %v", err)
				}
			})
		})
	}
}

// TestConsumeMultiBounds: 20 items are charged in one script; 21, none,
// or a bad item are the script's BADARG (engine names the field first:
// guards_test.go).
func TestConsumeMultiBounds(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		c, _ := b.funded(t)
		var items []engine.ConsumeLine
		for i := 0; i < engine.MaxConsumeItems; i++ {
			items = append(items, line(fmt.Sprintf("m%d", i), int64(i+1), perUnitTerms(1)))
		}
		// 1+..+20 = 210 > 100: refused whole under block, a partial charge
		// under allow.
		if _, err := b.store.Consume(context.Background(), multiCmd(c, engine.OveragePolicyBlock, items...)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Fatalf("20 items under block: %v", err)
		}
		res, err := b.store.Consume(context.Background(), multiCmd(c, engine.OveragePolicyAllow, items...))
		if err != nil || len(res.Mutation.Usage.Items) != 20 || res.Mutation.Usage.Cost != 210 || res.Mutation.Usage.Charged != 100 {
			t.Fatalf("20 items under allow: %v %+v", err, res.Mutation.Usage)
		}
		for name, items := range map[string][]engine.ConsumeLine{
			"21 items": append(items, line("m20", 1, flatTerms(1))),
			"no items": {},
			"units 0":  {line("a", 1, flatTerms(1)), line("b", 0, flatTerms(1))},
		} {
			_, err := b.store.Consume(context.Background(), multiCmd(c, engine.OveragePolicyAllow, items...))
			if !isBadArg(err) {
				t.Errorf("%s: %v, want BADARG", name, err)
			}
		}
	})
}
