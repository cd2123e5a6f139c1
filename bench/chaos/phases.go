package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/lua"
)

// ShardAvail is one shard's availability during a failover's promotion.
type ShardAvail struct {
	Shard     string `json:"shard"`
	Dead      bool   `json:"killed"`
	Customers int    `json:"customers"`
	// Checks and Money are the answers for the shard's customers; Clear
	// the first attempts of money operations of its customers whose
	// idempotency record is not on the killed shard either (nothing of
	// theirs was there).
	Checks Avail  `json:"checks"`
	Money  Avail  `json:"money_attempts"`
	Clear  *Avail `json:"money_attempts_clear_of_the_killed_shard,omitempty"`
}

// verifySlots checks the harness's copies of creditd's key names against
// Redis: every seeded customer's account hash must exist under its
// partition's hash tag (customerSlot), and the first seed grants'
// idempotency records where idemRecordKey names them. It returns whether
// the customers' keys were found, and the record-slot function when the
// records were (else nil: the money figures count customers' slots only).
func verifySlots(ctx context.Context, f *Fleet, tenant uuid.UUID, ids map[string]uuid.UUID, keys []string) (bool, func(key string) int) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: f.Seeds, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
	defer c.Close()
	customersOK := len(ids) > 0
	for _, id := range ids {
		key := fmt.Sprintf("{%s:p%02d}:a:%s", keyPrefix, lua.Partition(id), id)
		if n, err := c.Exists(ctx, key).Result(); err != nil || n != 1 {
			customersOK = false
			break
		}
	}
	keys = keys[:min(len(keys), 5)]
	recordsOK := len(keys) > 0 && waitFor(ctx, 3*time.Second, func() bool {
		for _, k := range keys {
			if n, err := c.Exists(ctx, idemRecordKey(tenant, k)).Result(); err != nil || n != 1 {
				return false
			}
		}
		return true
	})
	if !recordsOK {
		return customersOK, nil
	}
	return customersOK, func(key string) int { return keySlot(idemRecordKey(tenant, key)) }
}

// analyseFailover is each shard's availability from the kill to the
// promotion; recordSlot (nil: unknown) names a money attempt's record slot.
func analyseFailover(fo *Failover, samples []Sample, slotOf map[string]int, recordSlot func(string) int) {
	fo.Avail = nil
	if !fo.PromotedOK || len(fo.Shards) == 0 {
		return
	}
	win := window(samples, fo.Killed, fo.Promoted)
	for i, sh := range fo.Shards {
		on := func(s Sample) bool { slot, ok := slotOf[s.Customer]; return ok && sh.has(slot) }
		sa := ShardAvail{Shard: sh.String(), Dead: i == fo.Dead}
		for _, slot := range slotOf {
			if sh.has(slot) {
				sa.Customers++
			}
		}
		sa.Checks = tally(filter(win, func(s Sample) bool { return s.Check && on(s) }))
		sa.Money = tally(filter(win, func(s Sample) bool { return !s.Check && on(s) }))
		if recordSlot != nil && !sa.Dead && fo.Dead >= 0 {
			dead := fo.Shards[fo.Dead]
			// First attempts only: a retry carries what an earlier fault did
			// to its operation (a claim held since a node kill or an earlier
			// failover answers 409 "still in progress" until it lapses).
			clear := tally(filter(win, func(s Sample) bool {
				return !s.Check && s.Attempt == 1 && on(s) && !dead.has(recordSlot(s.Key))
			}))
			sa.Clear = &clear
		}
		fo.Avail = append(fo.Avail, sa)
	}
}

// analyse cuts each fault's window out of the run's answers and records
// issue 25's checks on r.
func analyse(r *RunResult, samples []Sample, slotOf map[string]int, recordSlot func(string) int) {
	// Shard failovers: readiness stays, other shards serve.
	var readyBad, otherBad, clearBad []string
	var deadFig []string
	for i := range r.Failovers {
		fo := &r.Failovers[i]
		analyseFailover(fo, samples, slotOf, recordSlot)
		for _, p := range fo.Readiness {
			if !p.Stayed() {
				readyBad = append(readyBad, fmt.Sprintf("failover %d: %s", i+1, p))
			}
		}
		if len(fo.Readiness) == 0 {
			readyBad = append(readyBad, fmt.Sprintf("failover %d: not polled", i+1))
		}
		for _, sa := range fo.Avail {
			if sa.Dead {
				deadFig = append(deadFig, fmt.Sprintf("failover %d: checks %.1f %% 2xx (longest 503 run %d, %.1f s), money %.1f %% 2xx (longest 503 run %d, %.1f s)",
					i+1, sa.Checks.Share(), sa.Checks.Longest503, sa.Checks.Longest503S, sa.Money.Share(), sa.Money.Longest503, sa.Money.Longest503S))
				continue
			}
			if sa.Checks.OK != sa.Checks.N {
				otherBad = append(otherBad, fmt.Sprintf("failover %d, %s: checks %s", i+1, sa.Shard, sa.Checks))
			}
			if sa.Clear != nil && sa.Clear.OK != sa.Clear.N {
				clearBad = append(clearBad, fmt.Sprintf("failover %d, %s: money %s", i+1, sa.Shard, sa.Clear))
			}
		}
	}
	if len(r.Failovers) > 0 {
		r.check("readiness through shard failovers", len(readyBad) == 0, true,
			"every live node's own /readyz and HAProxy's answered 200 at every poll (every %s) from each master kill until the old master rejoined: no node left the balancer%s",
			readyPollEvery, listed(readyBad))
		r.check("other shards' checks during promotion", len(otherBad) == 0, true,
			"checks of customers on the shards that kept their master: 100 %% 2xx from each kill to the promotion%s", listed(otherBad))
		if recordSlot != nil {
			r.check("other shards' money during promotion", len(clearBad) == 0, true,
				"first attempts of money operations whose customer and idempotency record both live on shards that kept their master: 100 %% 2xx from each kill to the promotion (an attempt whose record is on the killed shard needs that master too, see the table)%s", listed(clearBad))
		} else {
			r.check("other shards' money during promotion", false, false, "not checked: %s", r.RecordSlots)
		}
		r.check("killed shard during promotion", true, false, "its customers' answers, reported: %s", strings.Join(deadFig, "; "))
	}

	// Every check of the run, faults or not: never a 5xx other than 503,
	// and a 503 always with Retry-After (requests in flight when a fault
	// began are outside the windows above and below).
	all := tally(filter(samples, func(s Sample) bool { return s.Check }))
	r.check("checks: 503, never 500", all.Bad503 == 0 && all.Other5xx == 0 && all.Unexpected == 0, true,
		"every GET /v1/entitlements/check of the run (open loop; %d ticks skipped with %d in flight): %s", r.ChecksSkipped, maxChecksInFlight, all)

	if wr := r.WriteRefusal; wr != nil {
		win := window(samples, wr.Set, wr.Restored)
		onShard := func(s Sample) bool {
			if slot, ok := slotOf[s.Customer]; ok && wr.Shard.has(slot) {
				return true
			}
			return recordSlot != nil && s.Key != "" && wr.Shard.has(recordSlot(s.Key))
		}
		wr.Touching = tally(filter(win, func(s Sample) bool { return !s.Check && onShard(s) }))
		wr.Others = tally(filter(win, func(s Sample) bool { return !s.Check && !onShard(s) }))
		wr.Checks = tally(filter(win, func(s Sample) bool {
			slot, ok := slotOf[s.Customer]
			return s.Check && ok && wr.Shard.has(slot)
		}))
		r.check("redis write refusal: 503, never 500", wr.Touching.Clean() && wr.Touching.Unavailable > 0, true,
			"money attempts that needed %s while it refused writes (%.1f s): %s; want only 503 with Retry-After and a problem document besides 2xx, and at least one (else the refusal proved nothing)",
			wr.Shard.Master, wr.Seconds, wr.Touching)
		r.check("redis write refusal: the rest", allStayed(wr.Readiness), false,
			"reported: money attempts elsewhere %s; checks of its customers %s; readiness %s", wr.Others, wr.Checks, readyLine(wr.Readiness))
	}

	if po := r.PostgresOutage; po != nil {
		win := window(samples, po.Stopped, po.Started)
		po.Checks = tally(filter(win, func(s Sample) bool { return s.Check }))
		po.Money = tally(filter(win, func(s Sample) bool { return !s.Check }))
		po.FirstMoneyOKS, po.FirstCheckOKS = -1, -1
		for _, s := range samples {
			if s.At.Before(po.Started) || s.Status < 200 || s.Status >= 300 {
				continue
			}
			d := s.At.Sub(po.Started).Seconds()
			if s.Check && po.FirstCheckOKS < 0 {
				po.FirstCheckOKS = d
			}
			if !s.Check && po.FirstMoneyOKS < 0 {
				po.FirstMoneyOKS = d
			}
		}
		r.check("postgres outage: 503, never 500", po.Checks.Clean() && po.Money.Clean(), true,
			"answers to requests sent during the %.1f s outage: checks %s; money attempts %s; want only 2xx, 503 with Retry-After and a problem document, and the 4xx the load retries",
			po.Seconds, po.Checks, po.Money)
		r.check("postgres outage: readiness", allStayed(po.Readiness), true,
			"every node's /readyz and HAProxy's answered 200 throughout (Postgres is advisory in /readyz): %s", readyLine(po.Readiness))
		r.check("postgres outage: share of 2xx", true, false,
			"reported: checks %.1f %% 2xx, money attempts %.1f %% 2xx while Postgres was down (money calls wait for Postgres' idempotency look-up, so their 503s are expected); after it was back the first money 2xx came %.1f s and the first check 2xx %.1f s later",
			po.Checks.Share(), po.Money.Share(), po.FirstMoneyOKS, po.FirstCheckOKS)
		r.check("postgres outage: loops resume", po.FirstMoneyOKS >= 0 && r.Drain.OK, true,
			"money calls acknowledged again after Postgres came back (first %.1f s after) and the outbox drained with no dead letter (%s)", po.FirstMoneyOKS, r.Drain.Detail)
	}
}

// listed is ": a; b; c" (the first five, then a count), or "".
func listed(xs []string) string {
	if len(xs) == 0 {
		return ""
	}
	if len(xs) > 5 {
		return ": " + strings.Join(xs[:5], "; ") + fmt.Sprintf("; and %d more", len(xs)-5)
	}
	return ": " + strings.Join(xs, "; ")
}

// readyLine is every poll's figures in one line.
func readyLine(polls []ReadyPoll) string {
	var s []string
	for _, p := range polls {
		s = append(s, p.String())
	}
	return strings.Join(s, "; ")
}
