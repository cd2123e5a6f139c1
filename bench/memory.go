package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The memory scenario: consume at a fixed rate for minutes and watch what
// the run's keys hold in Redis, by kind, to tell whether Redis memory is
// bounded by customers and the idempotency window or grows with history.

// MemoryResult is the memory scenario's measurements.
type MemoryResult struct {
	Rate      float64          `json:"offered_rate"`
	Seconds   float64          `json:"seconds"`
	Run       RunResult        `json:"run"`
	Customers int              `json:"customers"`
	Ops       int64            `json:"acknowledged_consumes"`
	Samples   []MemorySample   `json:"samples"`
	Classes   []MemoryClass    `json:"classes_at_end"`
	Growth    MemoryGrowth     `json:"growth"`
	Project   MemoryProjection `json:"projection_24h_at_1000_per_s"`
	Error     string           `json:"error,omitempty"`
}

// MemorySample is one look at Redis during the run.
type MemorySample struct {
	At         float64          `json:"seconds"`
	Ops        int64            `json:"acknowledged_consumes"`
	UsedMemory int64            `json:"redis_used_memory"`
	Keys       map[string]int64 `json:"keys_by_kind"`
	Bytes      int64            `json:"run_key_bytes"` // sum over kinds, MEMORY USAGE (sampled per kind)
}

// MemoryClass is one kind of key at the end of the run.
type MemoryClass struct {
	Kind        string  `json:"kind"`
	Keys        int64   `json:"keys"`
	Sampled     int     `json:"sampled"`
	BytesPerKey float64 `json:"bytes_per_key"` // mean MEMORY USAGE of the sampled keys
	Bytes       float64 `json:"bytes"`         // keys x bytes per key
	PerOp       bool    `json:"per_op"`        // one more key per op (TTL'd), not per customer or partition
	MaxTTLSec   float64 `json:"max_ttl_seconds"`
	// P90TTLSec is the TTL 90 % of the sampled keys with one are at or
	// under: what most keys of the kind are given when a few (those not
	// committed yet) still carry a longer one.
	P90TTLSec   float64 `json:"p90_ttl_seconds"`
	NoTTL       int     `json:"sampled_without_ttl"`
	GrowthPerOp float64 `json:"bytes_growth_per_op"` // (bytes at end - at start) / ops of the run
	// LifeSec is how long a per-op key lives: its mean life when keys left
	// during the run (op keys let go after their commit), else its TTL.
	LifeSec float64 `json:"life_seconds"`
}

// MemoryGrowth is the run's derived figures.
type MemoryGrowth struct {
	BytesPerOp          float64 `json:"redis_bytes_per_op"`             // growth of the run's keys (outbox streams aside) per op
	UsedMemoryPerOp     float64 `json:"used_memory_growth_per_op"`      // INFO used_memory growth per op (shared Redis: noisy)
	BytesPerRemembered  float64 `json:"bytes_per_remembered_key"`       // per-op kinds' bytes per op + growth of the others
	BytesPerCustomer    float64 `json:"bytes_per_customer"`             // account hashes and per-partition zsets, per customer
	AccountHashBytes    float64 `json:"account_hash_bytes"`             // mean MEMORY USAGE of an account hash
	WindowSeconds       float64 `json:"longest_per_op_ttl_seconds"`     // how long a per-op key lives
	UnboundedPerOpBytes float64 `json:"growth_per_op_in_untimed_kinds"` // bytes per op landing in keys without a TTL
	SeenPerOpBytes      float64 `json:"seen_filter_bytes_per_op"`       // the seen filter's growth per op, kept its horizon
	SeenLifeSeconds     float64 `json:"seen_filter_life_seconds"`       // the seen filter's longest TTL
	Flat                bool    `json:"flat_once_window_full"`
	FlatWhy             string  `json:"flat_reason"`
}

// MemoryProjection is Redis memory after 24 h (and later) at 1,000
// consumes/s: customers x per-customer bytes + keys in the window x
// per-key bytes.
type MemoryProjection struct {
	Rate          float64 `json:"rate"`
	Customers     int64   `json:"customers"`
	CustomerBytes float64 `json:"customer_bytes"`
	KeysInWindow  float64 `json:"keys_in_24h_window"`
	KeyBytes      float64 `json:"remembered_key_bytes_24h"`
	Total24h      float64 `json:"total_bytes_24h"`
	Total7d       float64 `json:"total_bytes_7d"`
	Total30d      float64 `json:"total_bytes_30d"`
}

// memoryKind classifies a key of the run's prefix; perOp kinds gain a key
// per operation.
func memoryKind(k string) (kind string, perOp bool) {
	switch {
	case strings.Contains(k, ":a:"):
		return "account hash", false
	case strings.Contains(k, ":op:"):
		return "op key (:op:)", true
	case strings.Contains(k, ":i:"):
		return "HTTP idempotency record (:i:)", true
	case strings.HasSuffix(k, ":outbox"):
		return "outbox stream", false
	case strings.HasSuffix(k, ":rexp"):
		return "reservation-expiry zset", false
	case strings.HasSuffix(k, ":exp"):
		return "expiry zset of an earlier version", false
	case strings.Contains(k, ":seen:"):
		return seenKind, false
	}
	return "other", false
}

// seenKind is the seen filter's period hashes and marks (lua/seen.go): a few bytes per
// committed key, kept for the filter's horizon (its TTL), not one key per op.
const seenKind = "seen filter (:seen:)"

// seedingSuffix marks the kind of per-op keys written before the run.
const seedingSuffix = " of the seeding"

// projectCustomers is the customer count of the projection.
const projectCustomers = 1_000_000

// memory runs the memory scenario on the seeded customers.
func (b *Bench) memory(ctx context.Context) {
	o := b.o
	mr := &MemoryResult{Rate: o.MemoryRate, Seconds: o.MemoryDuration.Seconds(), Customers: len(b.target.Customers)}
	b.res.Memory = mr
	logf("memory: consume at %.0f/s for %s, sampling Redis every %s", o.MemoryRate, o.MemoryDuration, o.MemoryEvery)
	sc := b.target.scenarios()["consume"](false)
	g := NewGenerator(strings.TrimPrefix(b.target.Base, "http://"), b.o.Workers)
	acks := &b.target.Acks.Consumes
	ops0 := acks.Load()
	start := time.Now()
	// Per-op keys already there at the first look (the seeding's, some with
	// stored bodies) are a kind of their own, so the per-op kinds measure
	// the scenario's consumes alone.
	seeded := map[string]bool{}
	sample := func() ([]MemoryClass, error) {
		used, err := redisUsedMemory(ctx, b.rdb)
		if err != nil {
			return nil, err
		}
		classes, err := memoryClasses(ctx, b.rdb, b.prefix, 200, seeded, len(mr.Samples) == 0)
		if err != nil {
			return nil, err
		}
		s := MemorySample{At: time.Since(start).Seconds(), Ops: acks.Load() - ops0, UsedMemory: used, Keys: map[string]int64{}}
		for _, c := range classes {
			s.Keys[c.Kind] = c.Keys
			s.Bytes += int64(c.Bytes)
		}
		mr.Samples = append(mr.Samples, s)
		logf("  memory: %.0fs %d consumes, used_memory %d, run keys %d bytes", s.At, s.Ops, used, s.Bytes)
		return classes, nil
	}
	first, err := sample()
	if err != nil {
		mr.Error = err.Error()
		return
	}
	done := make(chan RunResult, 1)
	go func() { done <- g.Run(ctx, o.MemoryRate, o.MemoryDuration, sc.op) }()
	tick := time.NewTicker(o.MemoryEvery)
	defer tick.Stop()
loop:
	for {
		select {
		case mr.Run = <-done:
			break loop
		case <-tick.C:
			if _, err := sample(); err != nil {
				mr.Error = err.Error()
			}
		}
	}
	last, err := sample()
	if err != nil {
		mr.Error = err.Error()
		return
	}
	mr.Ops = acks.Load() - ops0
	mr.Classes = last
	mr.Growth, mr.Project = memoryFigures(first, last, mr.Ops, mr.Customers, mr.Samples)
	logf("memory: %.0f bytes per op, %.0f per remembered key, %.0f per customer; 24 h at 1,000/s: %.1f GB (%s)",
		mr.Growth.BytesPerOp, mr.Growth.BytesPerRemembered, mr.Growth.BytesPerCustomer, mr.Project.Total24h/1e9, mr.Growth.FlatWhy)
}

// memoryFigures derives the per-op, per-key and per-customer figures and
// the projection from the first and last look.
func memoryFigures(first, last []MemoryClass, ops int64, customers int, samples []MemorySample) (MemoryGrowth, MemoryProjection) {
	var g MemoryGrowth
	before := map[string]MemoryClass{}
	for _, c := range first {
		before[c.Kind] = c
	}
	day := 24 * time.Hour.Seconds()
	var run float64 // seconds between the first and the last look
	if n := len(samples); n >= 2 {
		run = samples[n-1].At - samples[0].At
	}
	// keyBytes is what a per-op kind holds per op over its life: the
	// growth per op for keys that outlive the run, else the bytes of a key
	// (only rate x life of them are alive at a time).
	keyBytes, lives := map[string]float64{}, map[string]float64{}
	var remembered, growth float64
	for i := range last {
		c := &last[i]
		if ops > 0 {
			c.GrowthPerOp = (c.Bytes - before[c.Kind].Bytes) / float64(ops)
		}
		if c.Kind != "outbox stream" {
			growth += c.GrowthPerOp
		}
		switch {
		case c.PerOp:
			// A remembered key costs its kinds' bytes per op once the window
			// holds one key of each kind per op; a kind whose keys leave
			// during the run (op keys let go after their commit) holds only
			// its keys of the last life-time.
			life := c.MaxTTLSec
			keyBytes[c.Kind] = c.GrowthPerOp
			kept := float64(c.Keys-before[c.Kind].Keys) / float64(max(ops, 1))
			switch {
			case run > 0 && ops > 0 && kept < 0.9:
				life, keyBytes[c.Kind] = max(kept, 0)*run, c.BytesPerKey
			case run > 0 && c.P90TTLSec > 0 && c.P90TTLSec < c.MaxTTLSec && c.P90TTLSec > run:
				// A run shorter than the keys' shortened life (op keys cut
				// to the grace after their commit: a -quick run) sees none
				// leave, and the few not committed yet at the last look
				// still carry their first TTL: the keys live what most of
				// them are given.
				life, keyBytes[c.Kind] = c.P90TTLSec, c.BytesPerKey
			}
			c.LifeSec = life
			if c.NoTTL > 0 {
				life, c.LifeSec = math.Inf(1), 0 // none; JSON has no infinity
				g.UnboundedPerOpBytes += c.GrowthPerOp
			} else {
				g.WindowSeconds = max(g.WindowSeconds, life)
			}
			lives[c.Kind] = life
			remembered += keyBytes[c.Kind] * min(life, day) / day
		case c.Kind == seenKind && c.NoTTL == 0 && c.MaxTTLSec > 0:
			// Bounded by its TTL, not by the 24 h window: flat only once
			// its horizon is full.
			g.SeenPerOpBytes, g.SeenLifeSeconds = c.GrowthPerOp, c.MaxTTLSec
			lives[c.Kind] = c.MaxTTLSec
		case c.Kind == "account hash":
			g.AccountHashBytes = c.BytesPerKey
			g.BytesPerCustomer += c.Bytes / float64(customers)
		case c.Kind == "expiry zset" || c.Kind == "reservation-expiry zset":
			g.BytesPerCustomer += c.Bytes / float64(customers)
		case c.Kind != "outbox stream" && c.GrowthPerOp > 1 && !strings.HasSuffix(c.Kind, seedingSuffix):
			// Growth in a kind without one key per op: history piling up in
			// a per-customer or per-partition structure.
			g.UnboundedPerOpBytes += c.GrowthPerOp
		}
		if c.Kind == "account hash" && c.GrowthPerOp > 1 {
			g.UnboundedPerOpBytes += c.GrowthPerOp
		}
		if !c.PerOp && c.Kind != "outbox stream" && !strings.HasSuffix(c.Kind, seedingSuffix) {
			remembered += c.GrowthPerOp
		}
	}
	g.BytesPerOp = growth
	g.BytesPerRemembered = remembered
	if n := len(samples); n >= 2 && ops > 0 {
		g.UsedMemoryPerOp = float64(samples[n-1].UsedMemory-samples[0].UsedMemory) / float64(ops)
	}
	switch {
	case g.UnboundedPerOpBytes > 0:
		g.FlatWhy = fmt.Sprintf("no: %.0f bytes per op land in keys without a TTL (grows with history)", g.UnboundedPerOpBytes)
	case g.SeenPerOpBytes > 1 && g.SeenLifeSeconds > day*1.01:
		g.FlatWhy = fmt.Sprintf("no: the seen filter keeps %.1f B per op for %.1f days, its horizon (flat from then on)", g.SeenPerOpBytes, g.SeenLifeSeconds/day)
	case g.WindowSeconds > day*1.01:
		g.FlatWhy = fmt.Sprintf("no: per-op keys live %.1f days, past the 24 h window (grows until day %.0f)", g.WindowSeconds/day, g.WindowSeconds/day)
	default:
		g.Flat = true
		g.FlatWhy = fmt.Sprintf("yes: every per-op key expires within %.1f h; memory is customers x per-customer bytes + the window's keys", g.WindowSeconds/3600)
	}
	p := MemoryProjection{Rate: 1000, Customers: projectCustomers, CustomerBytes: projectCustomers * g.BytesPerCustomer}
	p.KeysInWindow = p.Rate * day
	p.KeyBytes = p.KeysInWindow * g.BytesPerRemembered
	// After d seconds, each per-op kind holds rate x min(d, its TTL) keys;
	// growth without a TTL never leaves.
	at := func(d float64) float64 {
		total := p.CustomerBytes
		for _, c := range last {
			if !c.PerOp {
				continue
			}
			total += p.Rate * min(d, lives[c.Kind]) * keyBytes[c.Kind]
		}
		for _, c := range last {
			if !c.PerOp && c.Kind != "outbox stream" && c.GrowthPerOp > 0 && c.Kind != "expiry zset" && c.Kind != "reservation-expiry zset" {
				life, ok := lives[c.Kind]
				if !ok {
					life = d // no TTL: it keeps growing
				}
				total += p.Rate * min(d, life) * c.GrowthPerOp
			}
		}
		return total
	}
	p.Total24h, p.Total7d, p.Total30d = at(day), at(7*day), at(30*day)
	return g, p
}

// memoryClasses counts the prefix's keys by kind and samples up to perKind
// of each for MEMORY USAGE and PTTL. A per-op key in seeded (the keys of the
// first look, which records them all) counts in a kind of its own, "... of
// the seeding", not one per op.
func memoryClasses(ctx context.Context, rdb *redis.Client, prefix string, perKind int, seeded map[string]bool, record bool) ([]MemoryClass, error) {
	byKind := map[string][]string{}
	counts := map[string]int64{}
	perOp := map[string]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, pat := range []string{"{" + prefix + ":*", "{" + prefix + "}*"} {
		iter := rdb.Scan(ctx, 0, pat, 5000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			kind, po := memoryKind(k)
			if record {
				seeded[k] = true
			}
			if po && seeded[k] {
				kind, po = kind+seedingSuffix, false
			}
			perOp[kind] = po
			counts[kind]++
			// Reservoir sample of perKind keys per kind.
			if s := byKind[kind]; len(s) < perKind {
				byKind[kind] = append(s, k)
			} else if j := rng.Int64N(counts[kind]); j < int64(perKind) {
				s[j] = k
			}
		}
		if err := iter.Err(); err != nil {
			return nil, err
		}
	}
	var out []MemoryClass
	for kind, keys := range byKind {
		pipe := rdb.Pipeline()
		mem := make([]*redis.IntCmd, len(keys))
		ttl := make([]*redis.DurationCmd, len(keys))
		for i, k := range keys {
			mem[i] = pipe.MemoryUsage(ctx, k)
			ttl[i] = pipe.PTTL(ctx, k)
		}
		_, _ = pipe.Exec(ctx)
		c := MemoryClass{Kind: kind, Keys: counts[kind], PerOp: perOp[kind]}
		var sum int64
		var ttls []float64
		for i := range keys {
			v, err := mem[i].Result()
			d := ttl[i].Val()
			if err != nil || d == -2 {
				// Expired between SCAN and now, or between MEMORY USAGE and
				// PTTL (-2: no such key; go-redis keeps -1 and -2 as they are).
				continue
			}
			sum += v
			c.Sampled++
			if d == -1 {
				c.NoTTL++
			} else {
				c.MaxTTLSec = max(c.MaxTTLSec, d.Seconds())
				ttls = append(ttls, d.Seconds())
			}
		}
		if len(ttls) > 0 {
			sort.Float64s(ttls)
			c.P90TTLSec = ttls[(len(ttls)*9)/10]
		}
		if c.Sampled > 0 {
			c.BytesPerKey = float64(sum) / float64(c.Sampled)
		}
		c.Bytes = c.BytesPerKey * float64(c.Keys)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Bytes > out[j].Bytes })
	return out, nil
}

// memoryMarkdown is the memory scenario's section of the report.
func memoryMarkdown(w func(string, ...any), m *MemoryResult) {
	w("\n## Redis memory over time (memory scenario)\n\n")
	w("Consume at %.0f/s offered for %.0f s on the %d seeded customers (achieved %.0f/s, p99 %.2f ms, errors %s), before any other scenario, so the run's keys are the seeding's and this scenario's. ",
		m.Rate, m.Seconds, m.Customers, m.Run.Achieved, m.Run.Latency.P99, m.Run.ErrorSummary())
	w("Keys by kind from SCAN of the run's prefix; bytes from MEMORY USAGE of up to 200 sampled keys per kind (x the kind's key count); TTL from PTTL of the same sample. Run alone: `go run ./bench -scenario memory [-memory-rate 500 -memory-duration 3m]`.\n\n")
	if m.Error != "" {
		w("**Error:** %s\n\n", m.Error)
	}
	if len(m.Samples) > 0 {
		var kinds []string
		seen := map[string]bool{}
		for _, c := range m.Classes {
			if !seen[c.Kind] {
				seen[c.Kind] = true
				kinds = append(kinds, c.Kind)
			}
		}
		w("| s | consumes | INFO used_memory | run's keys, bytes |")
		for _, k := range kinds {
			w(" %s keys |", k)
		}
		w("\n|---|---|---|---|%s\n", strings.Repeat("---|", len(kinds)))
		for _, s := range m.Samples {
			w("| %.0f | %d | %d | %d |", s.At, s.Ops, s.UsedMemory, s.Bytes)
			for _, k := range kinds {
				w(" %d |", s.Keys[k])
			}
			w("\n")
		}
	}
	if len(m.Classes) > 0 {
		w("\n| kind at the end | keys | bytes per key | bytes | growth per consume | one per op | longest TTL | life of a key | sampled without TTL |\n|---|---|---|---|---|---|---|---|---|\n")
		for _, c := range m.Classes {
			ttl := "none"
			if c.MaxTTLSec > 0 {
				ttl = fmt.Sprintf("%.1f h", c.MaxTTLSec/3600)
			}
			life := "-"
			switch {
			case c.PerOp && c.NoTTL > 0:
				life = "unbounded"
			case c.PerOp:
				life = fmt.Sprintf("%.0f s", c.LifeSec)
			}
			w("| %s | %d | %.0f | %.0f | %.1f B | %v | %s | %s | %d of %d |\n", c.Kind, c.Keys, c.BytesPerKey, c.Bytes, c.GrowthPerOp, c.PerOp, ttl, life, c.NoTTL, c.Sampled)
		}
	}
	g, p := m.Growth, m.Project
	w("\n- Redis bytes per consume: **%.0f B** (growth of the run's keys, outbox streams aside; INFO used_memory grew %.0f B per consume, shared Redis, so others' keys move it too).\n", g.BytesPerOp, g.UsedMemoryPerOp)
	w("- Bytes per remembered idempotency key (every per-op record over its own life in the 24 h window: HTTP record, op key until its commit plus the grace, and any growth elsewhere per op): **%.0f B**; per-op keys live up to %.1f h.\n", g.BytesPerRemembered, g.WindowSeconds/3600)
	w("- Bytes per customer with 3 blocks (account hash %.0f B, plus its share of the expiry zsets): **%.0f B**.\n", g.AccountHashBytes, g.BytesPerCustomer)
	w("- Projection at %.0f consumes/s for %d customers: customers x per-customer bytes (%.2f GB) + keys in the window x per-key bytes (%.0f keys in 24 h x %.0f B = %.2f GB): **%.2f GB after 24 h**, %.2f GB after 7 days, %.2f GB after 30 days (each per-op kind holds rate x its own TTL).\n",
		p.Rate, p.Customers, p.CustomerBytes/1e9, p.KeysInWindow, g.BytesPerRemembered, p.KeyBytes/1e9, p.Total24h/1e9, p.Total7d/1e9, p.Total30d/1e9)
	w("- Flat once the 24 h window is full (bounded by customers x keys, not by history): **%s**.\n", g.FlatWhy)
}
