package lua

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestProfileWorst times each script call of the bench's worst allowed
// input (issue 9: 100 live blocks and 100 active reservations with 8 KiB of
// metadata each) from SLOWLOG of a private Redis named by PROFILE_REDIS
// (host:port; it is flushed). The minimum over the trials is what the
// script costs; the maximum is what a loaded box added to it. It asserts
// nothing: the bound lives in bench/. PROFILE_SEQ prints the kept-reservation
// loop's calls in order ("SEQ reserve 166"), to tell a periodic slow path
// (one call in N) from noise; PROFILE_PACE pauses before each timed call.
func TestProfileWorst(t *testing.T) {
	ctx := context.Background()
	rdb := profileRedis(t)
	rdb.ConfigSet(ctx, "slowlog-max-len", "100000")
	rdb.ConfigSet(ctx, "slowlog-log-slower-than", "0")
	s := NewStore(rdb, "worst")
	scriptNames := map[string]string{grantScript.Hash(): "grant", commitScript.Hash(): "commit",
		reserveScript.Hash(): "reserve", releaseScript.Hash(): "release", consumeScript.Hash(): "consume"}
	// FCALL names the library function: creditd_<script>_<version>.
	scriptOf := func(args []string) (string, bool) {
		if len(args) < 2 {
			return "", false
		}
		switch strings.ToLower(args[0]) {
		case "evalsha":
			return scriptNames[args[1]], true
		case "fcall":
			name := strings.TrimPrefix(args[1], "creditd_")
			if i := strings.LastIndexByte(name, '_'); i > 0 {
				name = name[:i]
			}
			return name, true
		}
		return "", false
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	meta := func(tag string) engine.Metadata {
		m := engine.Metadata{"tag": json.RawMessage(`"` + tag + `"`)}
		for i := 0; i < 18; i++ { // about engine.MaxMetadataBytes
			m[fmt.Sprintf("k%07d", i)] = json.RawMessage(`"` + strings.Repeat("x", 210) + `"`)
		}
		return m
	}
	terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 3}
	now := t0
	times := map[string][]int64{}
	// PROFILE_CALLGRIND (the pid of a redis-server under callgrind) adds
	// instructions per script call of each phase, which a busy box does
	// not move.
	cgPid := os.Getenv("PROFILE_CALLGRIND")
	timed := func(name string, f func()) {
		rdb.SlowLogReset(ctx)
		if cgPid != "" {
			_ = exec.Command("callgrind_control", "-z", cgPid).Run()
		}
		f()
		if cgPid != "" {
			_ = exec.Command("callgrind_control", "-d", cgPid).Run()
		}
		logs, err := rdb.SlowLogGet(ctx, -1).Result()
		must(err)
		if os.Getenv("PROFILE_SEQ") != "" && strings.Contains(name, "kept") {
			for i := len(logs) - 1; i >= 0; i-- {
				l := logs[i]
				if name, ok := scriptOf(l.Args); ok {
					fmt.Printf("SEQ %s %d\n", name, l.Duration.Microseconds())
				}
			}
		}
		var calls int64
		for _, l := range logs {
			if script, ok := scriptOf(l.Args); ok {
				k := name + " " + script
				times[k] = append(times[k], l.Duration.Microseconds())
				calls++
			}
		}
		if cgPid != "" {
			fmt.Printf("PROFILE worst %-34s %s (every command, per script call; %d calls)\n", name, callgrindKInstr(cgPid, calls), calls)
		}
	}
	// PROFILE_PACE (a duration) sleeps before each timed call, as the
	// bench's worst scenario does (-worst-pace): a call after an idle
	// pause finds its caches cold and costs more than one in a tight loop.
	paceFor, _ := time.ParseDuration(os.Getenv("PROFILE_PACE"))
	pace := func() {
		if paceFor > 0 {
			time.Sleep(paceFor)
		}
	}
	trials := 5
	if n, err := strconv.Atoi(os.Getenv("PROFILE_TRIALS")); err == nil && n > 0 {
		trials = n
	}
	for trial := 0; trial < trials; trial++ {
		c := newCustomer()
		ok, err := s.LoadAt(ctx, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}, t0)
		if err != nil || !ok {
			t.Fatal(err)
		}
		for i := 1; i < engine.MaxLiveBlocks-1; i++ {
			g := grantCmd(c, 1_000_000_000, now)
			g.Block.Priority = i % 5
			g.Block.Metadata = meta(fmt.Sprintf("b%d", i))
			exp := now.Add(time.Duration(30*24+i) * time.Hour)
			g.Block.ExpiresAt = &exp
			_, err := s.Grant(ctx, g)
			must(err)
		}
		var reservations []uuid.UUID
		for i := 0; i < engine.MaxActiveReservations-1; i++ {
			cmd := reserveCmd(c, 10, terms, time.Hour, now)
			cmd.Metadata = meta(fmt.Sprintf("h%d", i))
			_, err := s.Reserve(ctx, cmd)
			must(err)
			reservations = append(reservations, cmd.ReservationID)
		}
		now = now.Add(time.Millisecond)
		timed("grant stack_after", func() {
			g := grantCmd(c, 1_000_000_000, now)
			g.Block.Metadata = meta("last")
			g.IdempotencyKey = "g-" + uuid.NewString()
			g.DurationSeconds = 3600
			g.StackAfter = &engine.StackAfter{MetadataMatch: engine.Metadata{"tag": json.RawMessage(`"none"`)}, Fallback: "now"}
			_, err := s.Grant(ctx, g)
			must(err)
		})
		timed("commit with metadata", func() {
			for i := 0; i < 5; i++ {
				now = now.Add(time.Millisecond)
				pace()
				cc := commitCmd(c, reservations[0], 7, terms, now)
				cc.Metadata = meta("commit")
				cc.IdempotencyKey = "c-" + uuid.NewString()
				_, err := s.Commit(ctx, cc)
				must(err)
				reservations = reservations[1:]
			}
		})
		timed("reserve/release kept cap", func() {
			for i := 0; i < 40; i++ {
				now = now.Add(time.Millisecond)
				pace()
				if len(reservations) >= engine.MaxActiveReservations {
					_, err := s.Release(ctx, releaseCmd(c, reservations[0], false, now))
					must(err)
					reservations = reservations[1:]
				}
				cmd := reserveCmd(c, 10, terms, time.Hour, now)
				cmd.Metadata = meta("cycle")
				cmd.IdempotencyKey = "r-" + uuid.NewString()
				_, err := s.Reserve(ctx, cmd)
				must(err)
				reservations = append(reservations, cmd.ReservationID)
			}
		})
		if os.Getenv("PROFILE_PROBE") != "" {
			// Refused before any write: a taken reservation id (after the
			// account read and the replay look-up) and a bad argument
			// (before them): what reading the account costs.
			timed("probe taken id", func() {
				for i := 0; i < 20; i++ {
					cmd := reserveCmd(c, 10, terms, time.Hour, now)
					cmd.ReservationID = reservations[0]
					_, _ = s.Reserve(ctx, cmd)
				}
			})
			timed("probe bad args", func() {
				for i := 0; i < 20; i++ {
					cmd := reserveCmd(c, 10, terms, time.Hour, now)
					cmd.Metric = ""
					_, _ = s.Reserve(ctx, cmd)
				}
			})
		}
		// The bench's "consume through every tier" (bench/worst.go): a
		// graduated rule of engine.MaxTiers tiers, units past the last,
		// with the largest metadata; then each apart.
		tiers := make([]engine.Tier, engine.MaxTiers)
		for i := range tiers {
			tiers[i] = engine.Tier{UnitCost: int64(1 + i%7), FlatCost: int64(i % 3)}
			if i < len(tiers)-1 {
				up := int64(i + 1)
				tiers[i].UpTo = &up
			}
		}
		tiered := engine.RuleTerms{CostType: engine.CostTiered, TierConfig: &engine.TierConfig{Mode: engine.TierGraduated, Tiers: tiers}}
		for _, v := range []struct {
			name  string
			terms engine.RuleTerms
			meta  bool
		}{{"consume tiered with metadata", tiered, true}, {"consume tiered", tiered, false}, {"consume with metadata", terms, true}} {
			timed(v.name, func() {
				for i := 0; i < 5; i++ {
					now = now.Add(time.Millisecond)
					pace()
					cmd := consumeCmd(c, engine.MaxTiers+50, v.terms, engine.OveragePolicyBlock, now)
					cmd.IdempotencyKey = "k-" + uuid.NewString()
					cmd.RequestHash = "rh"
					if v.meta {
						cmd.EntryMetadata = meta("c")
					}
					_, err := s.Consume(ctx, cmd)
					must(err)
				}
			})
		}
		timed("consume", func() {
			for i := 0; i < 5; i++ {
				now = now.Add(time.Millisecond)
				pace()
				cmd := consumeCmd(c, 150, terms, engine.OveragePolicyBlock, now)
				cmd.IdempotencyKey = "k-" + uuid.NewString()
				cmd.RequestHash = "rh"
				_, err := s.Consume(ctx, cmd)
				must(err)
			}
		})
	}
	names := make([]string, 0, len(times))
	for n := range times {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d := times[n]
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		fmt.Printf("PROFILE worst %-34s calls %3d  min %5d  p50 %5d  max %5d us\n", n, len(d), d[0], d[len(d)/2], d[len(d)-1])
	}
}
