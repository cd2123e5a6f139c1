package main

import (
	"testing"
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
