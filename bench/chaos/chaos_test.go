package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/lua"
)

func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		name       string
		a          Answer
		definitive bool
	}{
		{"no answer", Answer{Status: 0}, false},
		{"200", Answer{Status: 200}, true},
		{"201", Answer{Status: 201}, true},
		{"503 replica ack timeout", Answer{Status: 503}, false},
		{"500", Answer{Status: 500}, false},
		{"502 from the balancer", Answer{Status: 502}, false},
		{"429", Answer{Status: 429}, false},
		{"409 in progress", Answer{Status: 409, Body: []byte(`{"detail":"a request with this Idempotency-Key is still in progress; retry with the same key later"}`)}, false},
		{"409 insufficient credits", Answer{Status: 409, Body: []byte(`{"type":"insufficient-credits"}`)}, true},
		{"422", Answer{Status: 422}, true},
	} {
		if got := outcome(tc.a); got != tc.definitive {
			t.Errorf("%s: definitive %v, want %v", tc.name, got, tc.definitive)
		}
	}
}

// nodes is CLUSTER NODES after one failover: 17008 (slots 10923-16383)
// died and its replica 19860 serves them.
const nodes = `a1 127.0.0.1:18213@28213 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:20331@30331 master - 0 0 2 connected 5461-10922
c3 127.0.0.1:17008@27008 master,fail - 0 0 3 disconnected
d4 127.0.0.1:17696@27696 slave b2 0 0 2 connected
e5 127.0.0.1:19860@29860 master - 0 0 7 connected 10923-16383
f6 127.0.0.1:17239@27239 slave a1 0 0 1 connected
`

func TestPickMaster(t *testing.T) {
	view := parseClusterNodes(nodes)
	if len(view) != 6 {
		t.Fatalf("parsed %d nodes, want 6", len(view))
	}
	for _, tc := range []struct {
		cycle           int
		master, replica string
		wantOK          bool
	}{
		// Shard of slot 0, then of 5461; the third shard's master has no
		// live replica, so cycle 2 moves on to the next shard.
		{0, "127.0.0.1:18213", "127.0.0.1:17239", true},
		{1, "127.0.0.1:20331", "127.0.0.1:17696", true},
		{2, "127.0.0.1:18213", "127.0.0.1:17239", true},
	} {
		m, r, ok := pickMaster(view, tc.cycle)
		if ok != tc.wantOK || m.Addr != tc.master || r.Addr != tc.replica {
			t.Errorf("cycle %d: %s -> %s (%v), want %s -> %s", tc.cycle, m.Addr, r.Addr, ok, tc.master, tc.replica)
		}
	}
}

func TestProcState(t *testing.T) {
	for _, tc := range []struct{ stat, want string }{
		{"123 (creditd) S 1 123 123 0", "S"},
		{"123 (redis-server 127.0.0.1:1) Z 1 123", "Z"},
		{"garbage", ""},
	} {
		if got := procState(tc.stat); got != tc.want {
			t.Errorf("procState(%q) = %q, want %q", tc.stat, got, tc.want)
		}
	}
}

func TestCompareKeys(t *testing.T) {
	pg := &pgState{
		opsByKey: map[string][]string{"ok": {"o1"}, "dup": {"o2", "o3"}, "wrong": {"o4"}, "phantom": {"o5"}},
		opDelta:  map[string]int64{"o1": -30, "o2": 100, "o3": 100, "o4": 7},
	}
	ops := []*Op{
		{Key: "ok", Status: 200, Delta: -30},
		{Key: "lost", Status: 201, Delta: 5},
		{Key: "dup", Status: 201, Delta: 100},
		{Key: "wrong", Status: 200, Delta: 8},
		{Key: "phantom", Status: 409},
		{Key: "refused", Status: 422},
		{Key: "open", Status: 0},
	}
	k := compareKeys(ops, pg)
	for name, got := range map[string][]string{"lost": k.lost, "duplicated": k.duplicated, "wrong amount": k.wrongAmount,
		"phantom": k.phantom, "unresolved": k.unresolved} {
		if len(got) != 1 {
			t.Errorf("%s: %d findings %q, want 1", name, len(got), got)
		}
	}
}

func TestFloodHeld(t *testing.T) {
	for _, tc := range []struct {
		ok, limited int64
		want        float64
		held        bool
	}{
		{510, 1500, 510, true},
		{560, 1500, 510, true},
		{562, 1500, 510, false},
		{458, 1500, 510, false},
		{1530, 400, 510, false}, // three per-node budgets
		{510, 0, 510, false},    // never limited: proves nothing
	} {
		r := FloodResult{OK: tc.ok, Limited: tc.limited, Want: tc.want}
		if r.Held() != tc.held {
			t.Errorf("%d ok, %d limited, want %.0f: held %v, want %v", tc.ok, tc.limited, tc.want, r.Held(), tc.held)
		}
	}
}

func TestBlankDigits(t *testing.T) {
	if got := blankDigits("500 x: slot 12182 on 127.0.0.1:17008"); got != "N x: slot N on N.N.N.N:N" {
		t.Errorf("blankDigits = %q", got)
	}
}

func TestKeySlot(t *testing.T) {
	if got := crc16([]byte("123456789")); got != 0x31c3 {
		t.Fatalf("crc16(123456789) = %#x, want 0x31c3 (CRC-16/XMODEM)", got)
	}
	// CLUSTER KEYSLOT's own examples (redis.io) and the hash tag rules.
	for _, tc := range []struct {
		key  string
		slot int
	}{
		{"foo", 12182},
		{"somekey", 11058},
		{"foo{hash_tag}", 2515},
		{"bar{hash_tag}", 2515},
		{"{hash_tag}:a:whatever", 2515},
		{"{}foo", keySlot("{}foo")}, // empty tag: the whole key
		{"foo{}{bar}", int(crc16([]byte("foo{}{bar}")) % clusterSlots)},
		{"{cd:i:abc", int(crc16([]byte("{cd:i:abc")) % clusterSlots)}, // no closing brace: the whole key
	} {
		if got := keySlot(tc.key); got != tc.slot {
			t.Errorf("keySlot(%q) = %d, want %d", tc.key, got, tc.slot)
		}
	}
}

func TestCustomerSlotIsItsPartitionTag(t *testing.T) {
	id := uuid.MustParse("0b7c8a52-3f3e-4d6b-9a43-6b1c2e1f9a10")
	tag := fmt.Sprintf("{cd:p%02d}", lua.Partition(id))
	if got, want := customerSlot(id), keySlot(tag+":a:"+id.String()); got != want {
		t.Errorf("customerSlot = %d, want the slot of its account key %d", got, want)
	}
}

func TestIdemRecordKey(t *testing.T) {
	k := idemRecordKey(uuid.MustParse("00000000-0000-0000-0000-000000000001"), "chaos-key-1")
	// "{cd:i:" and 16 base64url characters (12 bytes), no closing brace.
	if !strings.HasPrefix(k, "{cd:i:") || len(k) != len("{cd:i:")+16 || strings.Contains(k, "}") {
		t.Errorf("idemRecordKey = %q", k)
	}
}

func TestShardsOf(t *testing.T) {
	// e5's range split: part of it, a single slot and a slot being
	// migrated moved to g7.
	view := parseClusterNodes(strings.Replace(nodes, "10923-16383", "10923-15999 16101-16199 16201-16383", 1) +
		"g7 127.0.0.1:17001@27001 master - 0 0 8 connected [100->-x] 16000-16100 16200\n")
	shards := shardsOf(view)
	// The failed master (no slots) is left out; g7's migrating slot is.
	if len(shards) != 4 {
		t.Fatalf("%d shards %v, want 4", len(shards), shards)
	}
	for _, tc := range []struct {
		slot   int
		master string
	}{
		{0, "127.0.0.1:18213"}, {5460, "127.0.0.1:18213"}, {5461, "127.0.0.1:20331"}, {12182, "127.0.0.1:19860"},
		{16050, "127.0.0.1:17001"}, {16200, "127.0.0.1:17001"}, {16199, "127.0.0.1:19860"},
	} {
		i := shardIndex(shards, tc.slot)
		if i < 0 || shards[i].Master != tc.master {
			t.Errorf("slot %d: shard %d, want master %s", tc.slot, i, tc.master)
		}
	}
	if shardIndex(shards, 100) != 0 || shardIndex(shards, 16384) != -1 {
		t.Errorf("slot 100 is a1's (g7 only imports it), 16384 nobody's")
	}
	if got := shards[0].String(); got != "127.0.0.1:18213 (slots 0-5460)" {
		t.Errorf("String = %q", got)
	}
}

func TestTally(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 17, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ok := Sample{Status: 200}
	u := Sample{Status: 503, RetryAfter: true, Problem: true}
	bare := Sample{Status: 503}
	lb := Sample{Status: 503, Balancer: true}
	var ss []Sample
	for i, s := range []Sample{ok, u, u, ok, u, u, bare, u, ok, {Status: 500}, lb, {Status: 409, InProgress: true}, {Status: 422}, {}} {
		s.At = at(100 * i)
		s.Took = time.Duration(i+1) * time.Millisecond // the 2xx took 1, 4 and 9 ms
		ss = append(ss, s)
	}
	a := tally(ss)
	want := Avail{N: 14, OK: 3, Unavailable: 5, Bad503: 1, Other5xx: 1, Balancer: 1, Retryable: 1, Unexpected: 1, Transport: 1,
		Longest503: 4, Longest503S: 0.3, OKP50Ms: 4, OKP99Ms: 9, OKMaxMs: 9}
	if a != want {
		t.Errorf("tally = %+v\nwant    %+v", a, want)
	}
	if a.Clean() {
		t.Error("Clean with a 500 in it")
	}
	if c := tally([]Sample{ok, u, {Status: 429}}); !c.Clean() || c.Share() < 33.3 || c.Share() > 33.4 {
		t.Errorf("2xx, 503+Retry-After, 429: Clean %v, share %.1f", c.Clean(), c.Share())
	}
	if (Avail{}).Share() != 100 {
		t.Error("no answers should count as fully available")
	}
	if got := window(ss, at(100), at(300)); len(got) != 2 || got[0].At != at(100) {
		t.Errorf("window [100 ms, 300 ms) = %d samples", len(got))
	}
}

func TestRefusalLimit(t *testing.T) {
	for _, tc := range []struct{ used, notCounted, want int64 }{
		{10 << 20, 2 << 20, 7 << 20}, // 8 MiB counted, 1 MiB under
		{1 << 20, 0, 1 << 19},        // 1 MiB counted: half of it
		{100, 100, 1},                // nothing counted: 1 byte
	} {
		if got := refusalLimit(tc.used, tc.notCounted); got != tc.want {
			t.Errorf("refusalLimit(%d, %d) = %d, want %d", tc.used, tc.notCounted, got, tc.want)
		}
	}
	info := "# Memory\r\nused_memory:2345678\r\nused_memory_human:2.24M\r\nmem_not_counted_for_evict:1024\r\n"
	if infoInt(info, "used_memory") != 2345678 || infoInt(info, "mem_not_counted_for_evict") != 1024 || infoInt(info, "absent") != 0 {
		t.Error("infoInt misread INFO memory")
	}
}

func TestReadyPollStayed(t *testing.T) {
	if (ReadyPoll{}).Stayed() {
		t.Error("never polled counts as stayed")
	}
	polls := []ReadyPoll{{Polls: 4, OK: 4}, {Polls: 4, OK: 3, Not200: map[string]int{"503": 1}}}
	if !polls[0].Stayed() || polls[1].Stayed() || allStayed(polls) || !allStayed(polls[:1]) || allStayed(nil) {
		t.Error("Stayed/allStayed wrong")
	}
}
