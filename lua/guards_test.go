package lua

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// guardCase is one bound a money script guards with BADARG and engine
// owns (issue 29: each rule is checked in one Go layer, the script keeps a
// last line). in is the value just inside the bound, out the one just
// outside: owner(in) passes and the script runs; owner(out) is the error
// naming field, and the script called with out answers BADARG.
type guardCase struct {
	name    string
	script  string
	owner   func(v int64) error
	field   string
	kind    engine.Kind
	in, out int64
	run     func(t *testing.T, b bundle, v int64) error
}

// isBadArg reports whether err is a script's BADARG reply.
func isBadArg(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "BADARG")
}

// guardCases are the scripts' BADARG guards on values a request carries.
// Bounds only Go holds (ttl_seconds and lease_seconds up to 86400, the
// metric key's form) are not here: the scripts do not repeat them.
func guardCases() []guardCase {
	ctx := context.Background()
	consumeItems := func(t *testing.T, b bundle, n int64) error {
		c, _ := b.funded(t)
		var items []engine.ConsumeLine
		for i := range n {
			items = append(items, line(fmt.Sprintf("m%d", i), 1, flatTerms(1)))
		}
		if items == nil {
			items = []engine.ConsumeLine{}
		}
		_, err := b.store.Consume(ctx, multiCmd(c, engine.OveragePolicyAllow, items...))
		return err
	}
	reserveItems := func(t *testing.T, b bundle, n int64) error {
		c, _ := b.funded(t)
		items := []engine.ReserveLine{}
		for i := range n {
			items = append(items, engine.ReserveLine{Metric: fmt.Sprintf("m%d", i), EstimatedUnits: 1, Terms: flatTerms(1)})
		}
		_, err := b.store.Reserve(ctx, multiReserveCmd(c, items...))
		return err
	}
	// commitItems commits n items of a reservation of min(n, MaxConsumeItems)
	// items (at least one), each at its estimate; an item past the reservation's
	// names a metric it does not hold.
	commitItems := func(t *testing.T, b bundle, n int64) error {
		c, _ := b.funded(t)
		var lines []engine.ReserveLine
		for i := range max(1, min(n, engine.MaxConsumeItems)) {
			lines = append(lines, engine.ReserveLine{Metric: fmt.Sprintf("m%d", i), EstimatedUnits: 1, Terms: flatTerms(1)})
		}
		reservation := b.reserve(t, multiReserveCmd(c, lines...)).Reservation
		actual, terms := make([]int64, len(reservation.Items)), make([]engine.RuleTerms, len(reservation.Items))
		for i := range terms {
			actual[i], terms[i] = 1, flatTerms(1)
		}
		cmd := multiCommitCmd(c, *reservation, actual, terms)
		cmd.Items = cmd.Items[:min(n, int64(len(cmd.Items)))]
		for i := int64(len(cmd.Items)); i < n; i++ {
			cmd.Items = append(cmd.Items, engine.CommitLine{Metric: fmt.Sprintf("m%d", i), EstimatedUnits: 1,
				EstimatedCost: 1, ActualUnits: 1, Terms: flatTerms(1)})
		}
		if cmd.Items == nil {
			cmd.Items = []engine.CommitLine{}
		}
		_, err := b.store.Commit(ctx, cmd)
		return err
	}
	held := func(t *testing.T, b bundle) (engine.CustomerKey, uuid.UUID) {
		c, _ := b.funded(t)
		rc := reserveCmd(c, 3, perUnitTerms(1), time.Hour, t0)
		b.reserve(t, rc)
		return c, rc.ReservationID
	}
	gauge := func(t *testing.T, b bundle, delta, leaseSeconds int64) error {
		c := newCustomer()
		b.known(t, c)
		cmd := engine.GaugeCommand{CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: t0},
			Metric: "seats", Delta: delta, Cap: 1 << 40}
		if leaseSeconds != 0 {
			cmd.LeaseID, cmd.LeaseSeconds = uuid.New(), leaseSeconds
		}
		_, err := b.store.Gauge(ctx, cmd)
		return err
	}
	// rollover carries v percent of the funded customer's first block into
	// a new one.
	rollover := func(t *testing.T, b bundle, v int64) error {
		c, blocks := b.funded(t)
		exp := t0.Add(48 * time.Hour)
		_, err := b.store.Rollover(ctx, engine.RolloverCommand{OpID: uuid.New(), Customer: c, Now: t0,
			Blocks: blocks[:1], Percentage: int(v), Block: engine.Block{ID: uuid.New(), Source: engine.SourcePlanGrant, ExpiresAt: &exp},
			EntryType: engine.EntryPlanGrant})
		return err
	}
	count := func(v int64) error { return engine.CheckItemCount(int(v)) }
	units := func(u engine.ItemUnits, prefix string) func(int64) error {
		return func(v int64) error { return u.Check(prefix, v) }
	}
	return []guardCase{
		{"consume units", "consume.lua", units(engine.ConsumeItemUnits, ""), "units", engine.KindBadRequest, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				c, _ := b.funded(t)
				_, err := b.store.Consume(ctx, consumeCmd(c, v, perUnitTerms(1), engine.OveragePolicyAllow, t0))
				return err
			}},
		{"consume items, fewest", "consume_multi.lua", count, "items", engine.KindBadRequest, 1, 0, consumeItems},
		{"consume items, most", "consume_multi.lua", count, "items", engine.KindBadRequest, engine.MaxConsumeItems, engine.MaxConsumeItems + 1, consumeItems},
		{"consume item units", "consume_multi.lua", units(engine.ConsumeItemUnits, "items[0]."), "items[0].units", engine.KindBadRequest, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				c, _ := b.funded(t)
				_, err := b.store.Consume(ctx, multiCmd(c, engine.OveragePolicyAllow, line("a", v, perUnitTerms(1))))
				return err
			}},
		{"reserve estimated_units", "reserve.lua", units(engine.ReserveItemUnits, ""), "estimated_units", engine.KindValidation, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				c, _ := b.funded(t)
				_, err := b.store.Reserve(ctx, reserveCmd(c, v, perUnitTerms(1), time.Hour, t0))
				return err
			}},
		{"reserve ttl_seconds", "reserve.lua", engine.CheckReservationTTL, "ttl_seconds", engine.KindValidation, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				c, _ := b.funded(t)
				_, err := b.store.Reserve(ctx, reserveCmd(c, 1, perUnitTerms(1), time.Duration(v)*time.Second, t0))
				return err
			}},
		{"reserve items, fewest", "reserve_multi.lua", count, "items", engine.KindBadRequest, 1, 0, reserveItems},
		{"reserve items, most", "reserve_multi.lua", count, "items", engine.KindBadRequest, engine.MaxConsumeItems, engine.MaxConsumeItems + 1, reserveItems},
		{"reserve item estimated_units", "reserve_multi.lua", units(engine.ReserveItemUnits, "items[0]."), "items[0].estimated_units", engine.KindValidation, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				c, _ := b.funded(t)
				_, err := b.store.Reserve(ctx, multiReserveCmd(c, engine.ReserveLine{Metric: "a", EstimatedUnits: v, Terms: flatTerms(1)}))
				return err
			}},
		{"commit actual_units", "commit.lua", units(engine.CommitItemUnits, ""), "actual_units", engine.KindValidation, 0, -1,
			func(t *testing.T, b bundle, v int64) error {
				c, id := held(t, b)
				_, err := b.store.Commit(ctx, commitCmd(c, id, v, perUnitTerms(1), t0.Add(time.Minute)))
				return err
			}},
		{"partial commit actual_units", "commit.lua", units(engine.PartialCommitUnits, ""), "actual_units", engine.KindValidation, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				c, id := held(t, b)
				_, err := b.store.Commit(ctx, partialCmd(c, id, v, perUnitTerms(1), t0.Add(time.Minute)))
				return err
			}},
		{"commit items, fewest", "commit_multi.lua", count, "items", engine.KindBadRequest, 1, 0, commitItems},
		{"commit items, most", "commit_multi.lua", count, "items", engine.KindBadRequest, engine.MaxConsumeItems, engine.MaxConsumeItems + 1, commitItems},
		{"commit item actual_units", "commit_multi.lua", units(engine.CommitItemUnits, "items[0]."), "items[0].actual_units", engine.KindValidation, 0, -1,
			func(t *testing.T, b bundle, v int64) error {
				c, _ := b.funded(t)
				reservation := b.reserve(t, multiReserveCmd(c, engine.ReserveLine{Metric: "a", EstimatedUnits: 2, Terms: flatTerms(1)})).Reservation
				_, err := b.store.Commit(ctx, multiCommitCmd(c, *reservation, []int64{v}, []engine.RuleTerms{flatTerms(1)}))
				return err
			}},
		// An extend that gives no new expiry must add units: the API's
		// additional_units 0 is the script's 0 with expires_at 0.
		{"extend additional_units", "extend.lua", units(engine.ExtendUnits, ""), "additional_units", engine.KindValidation, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				c, id := held(t, b)
				_, err := b.store.Extend(ctx, extendCmd(c, id, v, perUnitTerms(1), time.Time{}, t0.Add(time.Minute)))
				return err
			}},
		{"grant credits", "grant.lua", units(engine.GrantAmount, ""), "credits", engine.KindValidation, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				c := newCustomer()
				b.known(t, c)
				_, err := b.store.Grant(ctx, grantCmd(c, v, t0))
				return err
			}},
		{"grant accumulation_cap", "grant.lua", units(engine.AccumulationCap, ""), "accumulation_cap", engine.KindValidation, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				c := newCustomer()
				b.known(t, c)
				g := grantCmd(c, 5, t0)
				g.AccumulationCap = &v
				_, err := b.store.Grant(ctx, g)
				return err
			}},
		{"rollover percentage, least", "rollover.lua", engine.CheckRolloverPercentage, "rollover_percentage", engine.KindValidation, 0, -1, rollover},
		{"rollover percentage, most", "rollover.lua", engine.CheckRolloverPercentage, "rollover_percentage", engine.KindValidation, 100, 101, rollover},
		// An adjust's negative delta debits its opposite.
		{"adjust debit", "debit.lua", func(v int64) error { return engine.CheckAdjustDelta(-v) }, "delta", engine.KindValidation, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				c, _ := b.funded(t)
				_, err := b.store.Debit(ctx, debitCmd(c, v, t0))
				return err
			}},
		{"gauge amount", "gauge.lua", units(engine.GaugeAmount, ""), "amount", engine.KindBadRequest, 1, 0,
			func(t *testing.T, b bundle, v int64) error { return gauge(t, b, v, 0) }},
		{"gauge lease_seconds", "gauge.lua", engine.CheckLeaseSeconds, "lease_seconds", engine.KindValidation, 1, 0,
			func(t *testing.T, b bundle, v int64) error {
				if v == 0 {
					v = -1 // 0 means "no lease" in the command; the script sees the length as given
				}
				return gauge(t, b, 1, v)
			}},
	}
}

// TestGuardsMatchGo holds each script's BADARG guard to the Go check that
// owns the rule: the value just inside passes both, the value just outside
// is engine's error naming the field and the script's BADARG (the store no
// longer checks it first, so the script is the last line).
func TestGuardsMatchGo(t *testing.T) {
	t.Parallel()
	for _, tc := range guardCases() {
		if err := tc.owner(tc.in); err != nil {
			t.Errorf("%s: Go refuses %d, inside the bound: %v", tc.name, tc.in, err)
		}
		e, ok := engine.AsError(tc.owner(tc.out))
		if !ok || e.Field != tc.field || e.Kind != tc.kind {
			t.Errorf("%s: Go answers %d with %v, want a %s naming %s", tc.name, tc.out, e, tc.kind, tc.field)
		}
	}
	eachBackend(t, func(t *testing.T, b bundle) {
		for _, tc := range guardCases() {
			if err := tc.run(t, b, tc.in); err != nil {
				t.Errorf("%s: %s refuses %d, inside the bound: %v", tc.name, tc.script, tc.in, err)
			}
			if err := tc.run(t, b, tc.out); !isBadArg(err) {
				t.Errorf("%s: %s answers %d with %v, want BADARG", tc.name, tc.script, tc.out, err)
			}
		}
	})
}

// TestGuardsCovered: every script that bounds its item count has both
// bounds in guardCases, so a new multi-metric script cannot skip the test.
func TestGuardsCovered(t *testing.T) {
	covered := map[string]int{}
	for _, tc := range guardCases() {
		if tc.field == "items" {
			covered[tc.script]++
		}
	}
	found := 0
	for _, file := range scriptFiles(t) {
		if !regexp.MustCompile(`n < 1 or n > \d+`).MatchString(readLua(t, file)) {
			continue
		}
		found++
		if covered[file] != 2 {
			t.Errorf("%s bounds its items; guardCases has %d of its two bounds", file, covered[file])
		}
	}
	if found == 0 {
		t.Errorf("no script bounds its items: the pattern no longer matches the scripts")
	}
}
