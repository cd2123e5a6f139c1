package main

import (
	"math"
	"strings"
	"testing"
)

// TestMemoryFigures: the projection is customers x per-customer bytes +
// each per-op kind's keys over its own TTL, and it is flat only when every
// per-op key expires within the 24 h window and nothing else grows per op.
func TestMemoryFigures(t *testing.T) {
	const day = 86400.0
	acct := func(bytes float64) MemoryClass {
		return MemoryClass{Kind: "account hash", Keys: 1000, BytesPerKey: bytes / 1000, Bytes: bytes}
	}
	perOp := func(kind string, keys int64, per, ttl float64, noTTL int) MemoryClass {
		return MemoryClass{Kind: kind, Keys: keys, BytesPerKey: per, Bytes: float64(keys) * per, PerOp: true, MaxTTLSec: ttl, NoTTL: noTTL, Sampled: 10}
	}
	for _, tc := range []struct {
		name        string
		first, last []MemoryClass
		ops         int64
		perKey      float64
		flat        bool
		why         string
		total24h    float64 // bytes
		total7d     float64
		run         float64 // seconds of the run; 0: no samples
	}{
		{
			name:  "today: idempotency records 24 h, op keys 7 days",
			first: []MemoryClass{acct(500_000), perOp("idem", 4000, 860, day, 0), perOp("op", 3000, 870, 7*day, 0)},
			last:  []MemoryClass{acct(500_000), perOp("idem", 14000, 860, day, 0), perOp("op", 13000, 870, 7*day, 0)},
			ops:   10000, perKey: 1730, flat: false, why: "7.0 days",
			total24h: 1e6*500 + 1000*day*1730,
			total7d:  1e6*500 + 1000*day*860 + 1000*7*day*870,
		},
		{
			name:  "compact records kept exactly 24 h",
			first: []MemoryClass{acct(400_000), perOp("rec", 0, 90, day, 0)},
			last:  []MemoryClass{acct(400_000), perOp("rec", 10000, 90, day, 0)},
			ops:   10000, perKey: 90, flat: true, why: "yes",
			total24h: 1e6*400 + 1000*day*90,
			total7d:  1e6*400 + 1000*day*90,
		},
		{
			// 10,000 consumes in 100 s: the HTTP records stay (24 h), the op
			// keys leave after their commit plus the grace, so only 600 of
			// them (6 s of ops) are alive at the end, whatever their TTL.
			name:  "op keys let go after commit",
			first: []MemoryClass{acct(400_000), perOp("rec", 0, 88, day, 0), perOp("op", 0, 300, day, 0)},
			last:  []MemoryClass{acct(400_000), perOp("rec", 10000, 88, day, 0), perOp("op", 600, 300, day, 0)},
			ops:   10000, perKey: 88 + 300*6/day, flat: true, why: "yes", run: 100,
			total24h: 1e6*400 + 1000*day*88 + 1000*6*300,
			total7d:  1e6*400 + 1000*day*88 + 1000*6*300,
		},
		{
			// The seeding's records (stored bodies) leave or stay: they count
			// neither for nor against the run's per-op bytes.
			name: "seeding's records apart",
			first: []MemoryClass{acct(400_000), {Kind: "rec" + seedingSuffix, Keys: 4000, BytesPerKey: 500, Bytes: 2e6},
				{Kind: "op" + seedingSuffix, Keys: 3000, BytesPerKey: 300, Bytes: 9e5}},
			last: []MemoryClass{acct(400_000), {Kind: "rec" + seedingSuffix, Keys: 4000, BytesPerKey: 500, Bytes: 2e6},
				perOp("rec", 10000, 88, day, 0), perOp("op", 600, 300, day, 0)},
			ops: 10000, perKey: 88 + 300*6/day, flat: true, why: "yes", run: 100,
			total24h: 1e6*400 + 1000*day*88 + 1000*6*300,
			total7d:  1e6*400 + 1000*day*88 + 1000*6*300,
		},
		{
			// A -quick run of 30 s: the op keys cut to a 60 s grace after
			// their commit have not left yet, and the few not committed at
			// the last look still carry 35 days: they live about the grace.
			name:  "op keys cut to the grace, run shorter than it",
			first: []MemoryClass{acct(400_000), perOp("rec", 0, 88, day, 0), perOp("op", 0, 264, 35*day, 0)},
			last: []MemoryClass{acct(400_000), perOp("rec", 10000, 88, day, 0),
				{Kind: "op", Keys: 10000, BytesPerKey: 264, Bytes: 10000 * 264, PerOp: true, MaxTTLSec: 35 * day, P90TTLSec: 59, Sampled: 10}},
			ops: 10000, perKey: 88 + 264*59/day, flat: true, why: "yes", run: 30,
			total24h: 1e6*400 + 1000*day*88 + 1000*59*264,
			total7d:  1e6*400 + 1000*day*88 + 1000*59*264,
		},
		{
			name:  "records without a TTL",
			first: []MemoryClass{acct(400_000), perOp("rec", 0, 90, 0, 10)},
			last:  []MemoryClass{acct(400_000), perOp("rec", 10000, 90, 0, 10)},
			ops:   10000, perKey: 90, flat: false, why: "without a TTL",
			total24h: 1e6*400 + 1000*day*90,
			total7d:  1e6*400 + 1000*7*day*90,
		},
		{
			// The seen filter gains ~5 B per committed key and keeps it for
			// its horizon (TTL ~38.6 days): growth bounded by that, not by
			// the 24 h window, and not "without a TTL".
			name:  "seen filter kept for its horizon",
			first: []MemoryClass{acct(400_000), perOp("rec", 0, 88, day, 0), {Kind: seenKind, Keys: 32, BytesPerKey: 1000, Bytes: 32000, MaxTTLSec: 38.6 * day}},
			last: []MemoryClass{acct(400_000), perOp("rec", 10000, 88, day, 0),
				{Kind: seenKind, Keys: 32, BytesPerKey: 2500, Bytes: 32000 + 50000, MaxTTLSec: 38.6 * day, Sampled: 32}},
			ops: 10000, perKey: 88 + 5, flat: false, why: "seen filter keeps 5.0 B per op for 38.6 days",
			total24h: 1e6*400 + 1000*day*88 + 1000*day*5,
			total7d:  1e6*400 + 1000*day*88 + 1000*7*day*5,
		},
		{
			name:  "history piling up in the account hash",
			first: []MemoryClass{acct(400_000)},
			last:  []MemoryClass{acct(1_400_000)},
			ops:   10000, perKey: 100, flat: false, why: "without a TTL",
			total24h: 1e6*1400 + 1000*day*100,
			total7d:  1e6*1400 + 1000*7*day*100,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var samples []MemorySample
			if tc.run > 0 {
				samples = []MemorySample{{At: 0}, {At: tc.run}}
			}
			g, p := memoryFigures(tc.first, tc.last, tc.ops, 1000, samples)
			if math.Abs(g.BytesPerRemembered-tc.perKey) > 0.5 {
				t.Errorf("bytes per remembered key %.1f, want %.1f", g.BytesPerRemembered, tc.perKey)
			}
			if g.Flat != tc.flat || !strings.Contains(g.FlatWhy, tc.why) {
				t.Errorf("flat %v (%s), want %v (%q)", g.Flat, g.FlatWhy, tc.flat, tc.why)
			}
			if math.Abs(p.Total24h-tc.total24h) > 1e3 || math.Abs(p.Total7d-tc.total7d) > 1e3 {
				t.Errorf("projection 24 h %.4g B, 7 d %.4g B; want %.4g, %.4g", p.Total24h, p.Total7d, tc.total24h, tc.total7d)
			}
		})
	}
}
