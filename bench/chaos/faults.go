package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// PostgresOutage is the run's Postgres outage (issue 25): the private
// server stopped as `pg_ctl stop -m immediate` under the money load and
// started again.
type PostgresOutage struct {
	Stopped time.Time `json:"stopped"`
	Started time.Time `json:"started_again"`
	Seconds float64   `json:"seconds"`
	// Checks and Money are the answers to requests sent while it was down.
	Checks Avail `json:"checks"`
	Money  Avail `json:"money_attempts"`
	// Readiness is every /readyz polled while it was down.
	Readiness []ReadyPoll `json:"readiness"`
	// FirstMoneyOKS and FirstCheckOKS: seconds from the start again to the
	// first 2xx of a money call and of a check sent after it (-1: none).
	FirstMoneyOKS float64 `json:"first_money_2xx_after_s"`
	FirstCheckOKS float64 `json:"first_check_2xx_after_s"`
}

// postgresOutage stops the run's Postgres for d and starts it again,
// polling every node's /readyz and the balancer's meanwhile.
func postgresOutage(ctx context.Context, f *Fleet, d time.Duration, tl *Timeline) (*PostgresOutage, error) {
	po := &PostgresOutage{}
	poll := pollReady(ctx, f, 0)
	f.PG.Stop()
	po.Stopped = time.Now()
	tl.add("postgres (private, port %d) stopped: SIGQUIT, as pg_ctl stop -m immediate; down for %s", f.PG.Port, d)
	sleepCtx(ctx, d)
	po.Readiness = poll.stop()
	err := f.PG.Start(ctx)
	po.Started = time.Now()
	po.Seconds = po.Started.Sub(po.Stopped).Seconds()
	if err != nil {
		tl.add("postgres did NOT start again: %v", err)
		return po, fmt.Errorf("postgres did not start again: %w", err)
	}
	tl.add("postgres started again after %.1f s down (crash recovery done, answering)", po.Seconds)
	return po, nil
}

// WriteRefusal is the run's Redis write refusal (issue 25): one master's
// maxmemory set below its memory in use under noeviction, so it answers
// every write that may grow memory with OOM, then set back.
type WriteRefusal struct {
	Shard     Shard     `json:"shard"`
	Customers []string  `json:"customers"` // the load's customers on it
	UsedBytes int64     `json:"used_memory_counted"`
	Maxmemory int64     `json:"maxmemory_set"`
	Previous  string    `json:"previous"` // maxmemory and policy before
	Set       time.Time `json:"set"`
	Restored  time.Time `json:"restored"`
	Seconds   float64   `json:"seconds"`
	// Touching are the money attempts that needed the shard (their
	// customer's keys or their idempotency record live there); Others
	// the rest; Checks every check of the shard's customers.
	Touching  Avail       `json:"money_attempts_touching_the_shard"`
	Others    Avail       `json:"money_attempts_elsewhere"`
	Checks    Avail       `json:"checks_of_its_customers"`
	Readiness []ReadyPoll `json:"readiness"`
}

// infoInt is field name of an INFO section's text (0 when absent).
func infoInt(info, name string) int64 {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// refusalLimit is the maxmemory that makes a master refuse writes at once:
// below the memory Redis counts against maxmemory (used_memory less the
// replication and AOF buffers, mem_not_counted_for_evict) by 1 MiB or
// half of it, whichever is less, and at least 1 byte. "Just above" the use
// would refuse only once the load grew it, and the persister's trims shrink
// it: a refusal that may never start proves nothing.
func refusalLimit(used, notCounted int64) int64 {
	counted := used - notCounted
	return max(1, counted-min(1<<20, counted/2))
}

// refuseWrites makes the master of the shard holding most of the load's
// customers refuse writes for d (CONFIG SET maxmemory-policy noeviction
// and maxmemory under its use), then restores both settings as they were.
func refuseWrites(ctx context.Context, f *Fleet, slotOf map[string]int, d time.Duration, tl *Timeline) (*WriteRefusal, error) {
	wr := &WriteRefusal{}
	nodes, _, err := f.clusterView(ctx, "")
	if err != nil {
		return wr, err
	}
	shards := shardsOf(nodes)
	count := make([]int, len(shards))
	for _, slot := range slotOf {
		if i := shardIndex(shards, slot); i >= 0 {
			count[i]++
		}
	}
	best := 0
	for i := range shards {
		if count[i] > count[best] {
			best = i
		}
	}
	if len(shards) == 0 {
		return wr, fmt.Errorf("no serving master in the cluster view")
	}
	wr.Shard = shards[best]
	for c, slot := range slotOf {
		if wr.Shard.has(slot) {
			wr.Customers = append(wr.Customers, c)
		}
	}
	c := redisAt(wr.Shard.Master)
	defer c.Close()
	prev, err := c.ConfigGet(ctx, "maxmemory*").Result()
	if err != nil {
		return wr, fmt.Errorf("CONFIG GET maxmemory on %s: %w", wr.Shard.Master, err)
	}
	wr.Previous = fmt.Sprintf("maxmemory %s, maxmemory-policy %s", prev["maxmemory"], prev["maxmemory-policy"])
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return wr, err
	}
	wr.UsedBytes = infoInt(info, "used_memory") - infoInt(info, "mem_not_counted_for_evict")
	wr.Maxmemory = refusalLimit(infoInt(info, "used_memory"), infoInt(info, "mem_not_counted_for_evict"))
	restore := func() error {
		// Restored with a fresh context: a cancelled run must not leave a
		// master refusing writes for the checks that follow.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.ConfigSet(rctx, "maxmemory", prev["maxmemory"]).Err(); err != nil {
			return err
		}
		return c.ConfigSet(rctx, "maxmemory-policy", prev["maxmemory-policy"]).Err()
	}
	if err := c.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		return wr, fmt.Errorf("CONFIG SET maxmemory-policy on %s: %w", wr.Shard.Master, err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(wr.Maxmemory, 10)).Err(); err != nil {
		_ = restore()
		return wr, fmt.Errorf("CONFIG SET maxmemory on %s: %w", wr.Shard.Master, err)
	}
	wr.Set = time.Now()
	poll := pollReady(ctx, f, 0)
	tl.add("redis master %s refuses writes: maxmemory %d under %d bytes in use, noeviction (%d of the load's customers on it; was %s)",
		wr.Shard, wr.Maxmemory, wr.UsedBytes, len(wr.Customers), wr.Previous)
	sleepCtx(ctx, d)
	err = restore()
	wr.Restored = time.Now()
	wr.Readiness = poll.stop()
	wr.Seconds = wr.Restored.Sub(wr.Set).Seconds()
	if err != nil {
		tl.add("redis master %s: settings NOT restored: %v", wr.Shard.Master, err)
		return wr, fmt.Errorf("restore maxmemory on %s: %w", wr.Shard.Master, err)
	}
	tl.add("redis master %s takes writes again (%s restored after %.1f s)", wr.Shard.Master, wr.Previous, wr.Seconds)
	return wr, nil
}
