package lua

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// TestProfileScripts measures Redis CPU per script call (INFO commandstats
// usec_per_call of evalsha) on a private Redis named by PROFILE_REDIS
// (host:port; it is flushed). It asserts nothing: speed lives in bench/,
// this only prints the per-script figures docs/decisions.md quotes.
// PROFILE_ONLY_CONSUME limits it to consumes; PROFILE_KEEP keeps the
// callgrind dumps (for callgrind_annotate).
func TestProfileScripts(t *testing.T) {
	ctx := context.Background()
	rdb := profileRedis(t)
	s := NewStore(rdb, "prof")
	n := 2000
	usec := func() (float64, int64) {
		st := commandStats(t, rdb)
		for _, c := range []string{"fcall", "evalsha"} {
			if v, ok := st[c]; ok && v[0] > 0 {
				return float64(v[1]) / float64(v[0]), v[0]
			}
		}
		return 0, 0
	}
	// PROFILE_CALLGRIND names the pid of a redis-server run under
	// valgrind --tool=callgrind: instructions per call are then counted
	// exactly (a shared box makes microseconds noisy).
	cgPid := os.Getenv("PROFILE_CALLGRIND")
	if cgPid != "" {
		n = 100
	}
	// untimed runs setup calls inside a measured case (the reservation a commit
	// settles): their calls and microseconds leave the case's figure. Not
	// under callgrind, which counts them: the pairs' figures serve there.
	var skipUs float64
	var skipCalls int64
	untimed := func(f func()) {
		u0, c0 := usec()
		f()
		u1, c1 := usec()
		skipUs += u1*float64(c1) - u0*float64(c0)
		skipCalls += c1 - c0
	}
	measure := func(name string, run func(i int)) {
		run(-1) // warm: script loaded
		rdb.ConfigResetStat(ctx)
		skipUs, skipCalls = 0, 0
		if cgPid != "" {
			_ = exec.Command("callgrind_control", "-z", cgPid).Run()
		}
		for i := 0; i < n; i++ {
			run(i)
		}
		u, calls := usec()
		if skipCalls > 0 && calls > skipCalls {
			u, calls = (u*float64(calls)-skipUs)/float64(calls-skipCalls), calls-skipCalls
		}
		kinstr := ""
		if cgPid != "" {
			_ = exec.Command("callgrind_control", "-d", cgPid).Run()
			kinstr = callgrindKInstr(cgPid, calls)
		}
		fmt.Printf("PROFILE %-28s %8.1f us/call %s (%d calls)\n", name, u, kinstr, calls)
	}
	now := t0
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	newFunded := func(blocks int, meta engine.Metadata) engine.CustomerKey {
		c := newCustomer()
		ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}, t0)
		if err != nil || !ok {
			t.Fatal(err)
		}
		for i := 0; i < blocks; i++ {
			g := grantCmd(c, 1_000_000_000_000, now.Add(-time.Minute))
			g.Block.Priority = i % 5
			g.Block.Metadata = meta
			exp := now.Add(time.Duration(30*24+i) * time.Hour)
			g.Block.ExpiresAt = &exp
			_, err := s.Grant(ctx, g)
			must(err)
		}
		return c
	}
	terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 3}
	// PROFILE_CONTROLLED: consumes under each spend control alone, then
	// under all of them (the bench's consume-controlled customer: credit
	// scoped to the metric and to another besides unscoped credit, a credit
	// line, a day budget of every metric and a Berlin month budget of the
	// metric, a parent pool with a day draw limit, not drawn), against a
	// plain customer's with 3 blocks (PROFILE_CASES: names to run, e.g.
	// plain3,controlled). Issue 28's row in bench/ compares these two.
	if os.Getenv("PROFILE_CONTROLLED") != "" {
		parent := newFunded(1, nil)
		metric := "api.calls"
		since := t0.Add(-48 * time.Hour)
		const limit = 1_000_000_000_000 // the bench's: far above what a run spends
		budgets := []engine.Budget{{Period: engine.BudgetDay, TimeZone: "UTC", LimitMC: limit, Since: since},
			{BillableMetricKey: &metric, Period: engine.BudgetMonth, TimeZone: "Europe/Berlin", LimitMC: limit, Since: since}}
		// Each control alone on a customer of its own (scoped credit, the
		// line, the budgets, the pool), then all together.
		type controls struct{ scoped, line, budgets, pool bool }
		customerOf := func(k controls) engine.CustomerKey {
			c := sameSlotCustomer(parent)
			ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}, t0)
			if err != nil || !ok {
				t.Fatal(err)
			}
			for j, scope := range [][]string{{"api.calls"}, {"events"}, nil} {
				if !k.scoped {
					scope = nil
				}
				_, err := s.Grant(ctx, scopedGrant(c, 1_000_000_000_000, j, scope...))
				must(err)
			}
			return c
		}
		cases := []struct {
			name string
			k    controls
		}{{"plain3", controls{}}, {"scoped", controls{scoped: true}}, {"line", controls{line: true}},
			{"budgets", controls{budgets: true}}, {"pool", controls{pool: true}}, {"controlled", controls{true, true, true, true}}}
		for round := 0; round < 2; round++ {
			for _, cs := range cases {
				if only := os.Getenv("PROFILE_CASES"); only != "" && !strings.Contains(","+only+",", ","+cs.name+",") {
					continue
				}
				c := customerOf(cs.k)
				measure("consume-"+cs.name, func(i int) {
					cmd := consumeCmd(c, 5, terms, engine.OveragePolicyBlock, now)
					cmd.Context = engine.MutationContext{ExternalID: "child", Policy: engine.OveragePolicyBlock}
					if cs.k.line {
						cmd.Context.LimitMC = 1_000_000
					}
					if cs.k.budgets {
						cmd.Context.Budgets = budgets
					}
					if cs.k.pool {
						cmd.Pool = &engine.PoolDraw{Parent: parent, OpID: engine.PoolOpID(cmd.OpID),
							Limit:         &engine.DrawLimit{Period: engine.BudgetDay, TimeZone: "UTC", LimitMC: limit, Since: since},
							ParentContext: engine.MutationContext{ExternalID: "parent", Policy: engine.OveragePolicyBlock}}
					}
					cmd.IdempotencyKey = "k-" + uuid.NewString()
					cmd.RequestHash = "rh"
					_, err := s.Consume(ctx, cmd)
					must(err)
				})
			}
		}
		return
	}
	for _, shape := range []struct {
		name   string
		blocks int
		meta   engine.Metadata
	}{{"1block", 1, nil}, {"worst32", 32, bigMeta()}} {
		c := newFunded(shape.blocks, shape.meta)
		// A multi-metric consume of 5 items (consume_multi.lua): its figure
		// over 5 is the Redis CPU per item (bench scenario consume-multi).
		multi := func(i int) {
			cmd := multiCmd(c, engine.OveragePolicyBlock, line("api.calls", 5, terms), line("events", 1, terms),
				line("tokens", 2, terms), line("storage_1", 3, terms), line("storage_2", 4, terms))
			cmd.Now = now
			cmd.IdempotencyKey = "m-" + uuid.NewString()
			cmd.RequestHash = "rh"
			_, err := s.Consume(ctx, cmd)
			must(err)
		}
		if os.Getenv("PROFILE_ONLY_CONSUME") != "" {
			measure("consume/"+shape.name, func(i int) {
				cmd := consumeCmd(c, 5, terms, engine.OveragePolicyBlock, now)
				cmd.IdempotencyKey = "k-" + uuid.NewString()
				cmd.RequestHash = "rh"
				_, err := s.Consume(ctx, cmd)
				must(err)
			})
			measure("consume-multi5/"+shape.name, multi)
			continue
		}
		measure("consume-multi5/"+shape.name, multi)
		measure("consume/"+shape.name, func(i int) {
			cmd := consumeCmd(c, 5, terms, engine.OveragePolicyBlock, now)
			cmd.IdempotencyKey = "k-" + uuid.NewString()
			cmd.RequestHash = "rh"
			_, err := s.Consume(ctx, cmd)
			must(err)
		})
		// A drain over every block: a charge as large as the blocks hold
		// but the last one.
		measure("debit-many/"+shape.name, func(i int) {
			if i >= 50 {
				return
			}
			cmd := debitCmd(c, 1_000_000_000_000*int64(shape.blocks-1)/100+1, now)
			cmd.IdempotencyKey = "d-" + uuid.NewString()
			_, err := s.Debit(ctx, cmd)
			must(err)
		})
		measure("gauge/"+shape.name, func(i int) {
			_, err := s.Gauge(ctx, engine.GaugeCommand{CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: now}, Metric: "seats", Delta: 1, Cap: 1 << 40})
			must(err)
		})
		hc := newFunded(shape.blocks, shape.meta)
		if shape.blocks > 1 {
			for h := 0; h < 31; h++ {
				cmd := reserveCmd(hc, 1, terms, time.Hour, now)
				cmd.Metadata = bigMeta()
				_, err := s.Reserve(ctx, cmd)
				must(err)
			}
		}
		var pending uuid.UUID // the last measured reserve's reservation, released before the next call
		releasePending := func() {
			if pending != uuid.Nil {
				_, err := s.Release(ctx, releaseCmd(hc, pending, false, now))
				must(err)
				pending = uuid.Nil
			}
		}
		measure("reserve/"+shape.name, func(i int) {
			releasePending()
			cmd := reserveCmd(hc, 2, terms, time.Hour, now)
			cmd.IdempotencyKey = "r-" + uuid.NewString()
			_, err := s.Reserve(ctx, cmd)
			must(err)
			pending = cmd.ReservationID
		})
		// Each script of a reservation alone: the other calls of the case untimed.
		only := measure
		if cgPid != "" {
			only = func(string, func(int)) {}
		}
		only("reserve-only/"+shape.name, func(i int) {
			untimed(releasePending)
			cmd := reserveCmd(hc, 2, terms, time.Hour, now)
			cmd.IdempotencyKey = "r-" + uuid.NewString()
			_, err := s.Reserve(ctx, cmd)
			must(err)
			pending = cmd.ReservationID
		})
		only("commit-only/"+shape.name, func(i int) {
			releasePending()
			cmd := reserveCmd(hc, 2, terms, time.Hour, now)
			untimed(func() {
				_, err := s.Reserve(ctx, cmd)
				must(err)
			})
			cc := commitCmd(hc, cmd.ReservationID, 2, terms, now)
			cc.IdempotencyKey = "c-" + uuid.NewString()
			_, err := s.Commit(ctx, cc)
			must(err)
		})
		only("release-only/"+shape.name, func(i int) {
			cmd := reserveCmd(hc, 2, terms, time.Hour, now)
			untimed(func() {
				_, err := s.Reserve(ctx, cmd)
				must(err)
			})
			_, err := s.Release(ctx, releaseCmd(hc, cmd.ReservationID, false, now))
			must(err)
		})
		measure("reserve+commit/"+shape.name, func(i int) {
			releasePending()
			cmd := reserveCmd(hc, 2, terms, time.Hour, now)
			_, err := s.Reserve(ctx, cmd)
			must(err)
			cc := commitCmd(hc, cmd.ReservationID, 2, terms, now)
			cc.IdempotencyKey = "c-" + uuid.NewString()
			_, err = s.Commit(ctx, cc)
			must(err)
		})
		// A multi-metric reservation of 5 items and its commit (reserve_multi.lua,
		// commit_multi.lua): over 5, the Redis CPU per item of the pair.
		measure("reserve-multi5+commit/"+shape.name, func(i int) {
			releasePending()
			rc := multiReserveCmd(hc)
			rc.Now, rc.ExpiresAt = now, now.Add(time.Hour)
			for _, m := range []string{"api.calls", "events", "tokens", "storage_1", "storage_2"} {
				rc.Items = append(rc.Items, engine.ReserveLine{Metric: m, EstimatedUnits: 2, Terms: terms})
			}
			res, err := s.Reserve(ctx, rc)
			must(err)
			cc := multiCommitCmd(hc, *res.Mutation.Reservation, []int64{2, 1, 3, 0, 2},
				[]engine.RuleTerms{terms, terms, terms, terms, terms})
			cc.Now = now
			cc.IdempotencyKey = "c-" + uuid.NewString()
			_, err = s.Commit(ctx, cc)
			must(err)
		})
		gc := newCustomer()
		ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: gc.TenantID, CustomerID: gc.CustomerID, Environment: gc.Environment}, t0)
		if err != nil || !ok {
			t.Fatal(err)
		}
		measure("grant/"+shape.name, func(i int) {
			if i >= 30 {
				return
			}
			g := grantCmd(gc, 1000, now)
			g.IdempotencyKey = "g-" + uuid.NewString()
			g.Block.Metadata = shape.meta
			_, err := s.Grant(ctx, g)
			must(err)
		})
	}
	// Op key memory of a consume.
	c := newFunded(1, nil)
	cmd := consumeCmd(c, 5, terms, engine.OveragePolicyBlock, now)
	cmd.IdempotencyKey = "mem-key-0123456789"
	cmd.RequestHash = strings.Repeat("f", 64)
	_, err := s.Consume(ctx, cmd)
	must(err)
	key := s.opKeyOf(c.CustomerID, cmd.IdempotencyKey)
	mem, _ := rdb.MemoryUsage(ctx, key).Result()
	ttl, _ := rdb.PTTL(ctx, key).Result()
	fmt.Printf("PROFILE op key %s: %d bytes, ttl %s\n", key, mem, ttl)
}

// callgrindKInstr reads the newest callgrind dump of pid, named
// $PROFILE_CALLGRIND_OUT<pid>.<n> (valgrind --callgrind-out-file=<that>%p;
// default /tmp/cg.): thousands of instructions per script call (the count
// also covers reading the commands and writing the replies).
func callgrindKInstr(pid string, calls int64) string {
	prefix := os.Getenv("PROFILE_CALLGRIND_OUT")
	if prefix == "" {
		prefix = "/tmp/cg."
	}
	files, _ := filepath.Glob(prefix + pid + ".*")
	// By the dump's number, not its text: out.10 comes after out.9.
	dumpNumber := func(f string) int {
		n, _ := strconv.Atoi(f[strings.LastIndexByte(f, '.')+1:])
		return n
	}
	sort.Slice(files, func(i, j int) bool { return dumpNumber(files[i]) < dumpNumber(files[j]) })
	if len(files) == 0 || calls == 0 {
		return ""
	}
	defer func() {
		for _, f := range files {
			if os.Getenv("PROFILE_KEEP") == "" {
				_ = os.Remove(f)
			}
		}
	}()
	body, err := os.ReadFile(files[len(files)-1])
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "summary:") || strings.HasPrefix(line, "totals:") {
			v, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return fmt.Sprintf("%6d kinstr/call", v/calls/1000)
		}
	}
	return ""
}

// profileRedis is a client of the private Redis named by PROFILE_REDIS
// (host:port), flushed: the profiles time every call on it, so it must not
// be the suite's shared Redis. The test is skipped when it is not set.
func profileRedis(t *testing.T) *redis.Client {
	addr := os.Getenv("PROFILE_REDIS")
	if addr == "" {
		t.Skip("PROFILE_REDIS not set")
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	rdb.FlushAll(context.Background())
	return rdb
}

func bigMeta() engine.Metadata {
	m := engine.Metadata{}
	for i := 0; i < 80; i++ {
		m[fmt.Sprintf("k%07d", i)] = json.RawMessage(`"` + strings.Repeat("x", 200) + `"`)
	}
	return m
}
