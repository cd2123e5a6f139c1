package main

import (
	"bufio"
	"math"
	"net"
	"strings"
	"testing"
)

func TestRatioVerdict(t *testing.T) {
	tests := []struct {
		name                      string
		cpu, floor, requests, lim float64
		want                      float64
		met                       bool
	}{
		{"at the limit", 120, 60, 1, 2, 2, true},
		{"over", 397, 60, 1, 2, 6.6166, false},
		{"two requests", 1946, 60, 2, 2.5, 16.2166, false},
		{"under with two requests", 250, 60, 2, 2.5, 2.0833, true},
		{"no floor", 100, 0, 1, 2, 0, false},
		{"no figure", 0, 60, 1, 2, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, met := ratioVerdict(tc.cpu, tc.floor, tc.requests, tc.lim)
			if math.Abs(got-tc.want) > 0.001 || met != tc.met {
				t.Errorf("ratioVerdict = %.4f, %v; want %.4f, %v", got, met, tc.want, tc.met)
			}
		})
	}
}

func TestOutcomeOf(t *testing.T) {
	tests := []struct {
		name string
		run  RunResult
		want OutageCalls
	}{
		{"all 2xx", RunResult{OK: 100}, OutageCalls{Sent: 100, OK: 100}},
		{"issue 26's measure", RunResult{OK: 17, Errors: map[string]int64{"500": 4317, "503": 1419}},
			OutageCalls{Sent: 5753, OK: 17, S503: 1419, Other5xx: 4317}},
		{"timeouts, 4xx and never sent", RunResult{OK: 5, Errors: map[string]int64{"timeout": 2, "409": 1, "late": 7, "599": 1}},
			OutageCalls{Sent: 9, OK: 5, Other5xx: 1, Other: 3, NotSent: 7}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := outcomeOf(tc.run)
			got.Errors, got.P99MS = "", 0
			if got != tc.want {
				t.Errorf("outcomeOf = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestShareMedianOutage(t *testing.T) {
	if got := share(17, 5753); math.Abs(got-0.2955) > 0.001 {
		t.Errorf("share = %.4f", got)
	}
	if share(1, 0) != 0 {
		t.Error("share of nothing is not 0")
	}
	for _, tc := range []struct {
		xs   []int64
		want float64
	}{{nil, 0}, {[]int64{3}, 3}, {[]int64{2, 1, 9}, 2}, {[]int64{1, 2, 3, 10}, 2.5}} {
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %g, want %g", tc.xs, got, tc.want)
		}
	}
	for _, tc := range []struct{ headroom, entry, rate, want float64 }{
		{1 << 30, 256, 4096, 1024}, {1 << 30, 0, 4096, 0}, {1 << 30, 256, 0, 0},
	} {
		if got := outageSeconds(tc.headroom, tc.entry, tc.rate); got != tc.want {
			t.Errorf("outageSeconds(%g, %g, %g) = %g, want %g", tc.headroom, tc.entry, tc.rate, got, tc.want)
		}
	}
}

func TestIsBlockingRead(t *testing.T) {
	resp := func(args ...string) []byte {
		var b strings.Builder
		b.WriteString("*" + itoa(len(args)) + "\r\n")
		for _, a := range args {
			b.WriteString("$" + itoa(len(a)) + "\r\n" + a + "\r\n")
		}
		return []byte(b.String())
	}
	tests := []struct {
		name string
		in   []byte
		want bool
	}{
		{"persister read", resp("xreadgroup", "GROUP", "g", "c", "COUNT", "100", "BLOCK", "1000", "STREAMS", "{p:p1}:outbox", ">"), true},
		{"upper case XREAD", resp("XREAD", "BLOCK", "0", "STREAMS", "s", "$"), true},
		{"no BLOCK", resp("xreadgroup", "GROUP", "g", "c", "STREAMS", "s", ">"), false},
		{"a key named BLOCK is not the option", resp("xreadgroup", "GROUP", "g", "c", "STREAMS", "BLOCKED", ">"), false},
		{"other command", resp("fcall", "creditd_consume", "2", "a", "b"), false},
		{"inline command", []byte("PING\r\n"), false},
		{"short", []byte("*3\r\n$10\r\nXREAD"), false},
		{"empty", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := isBlockingRead(tc.in); got != tc.want {
				t.Errorf("isBlockingRead(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// TestRTProxyCountsTrips: a pipeline of two lines sent at once is one
// trip; each send after an answer is another.
func TestRTProxyCountsTrips(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			if _, err := c.Write([]byte(sc.Text() + "\n")); err != nil {
				return
			}
		}
	}()
	p, err := startRTProxy(ln.Addr().String(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rd := bufio.NewReader(c)
	send := func(lines ...string) {
		if _, err := c.Write([]byte(strings.Join(lines, "\n") + "\n")); err != nil {
			t.Fatal(err)
		}
		for range lines {
			if _, err := rd.ReadString('\n'); err != nil {
				t.Fatal(err)
			}
		}
	}
	send("a", "b")
	send("c")
	send("d")
	if got := p.Trips(); got != 3 {
		t.Errorf("trips = %d, want 3", got)
	}
}

// TestExactlyOnce judges ledger checks.
func TestExactlyOnce(t *testing.T) {
	n := func(v int64) *int64 { return &v }
	tests := []struct {
		name string
		lc   *LedgerCheck
		want bool
	}{
		{"equal", &LedgerCheck{Rows: []LedgerRow{{Metric: "api_calls", Rows: 10, Ops: 10, Acknowledged: n(10)}}}, true},
		{"an unanswered call applied", &LedgerCheck{Ambiguous: 2, Rows: []LedgerRow{{Metric: "api_calls", Rows: 11, Ops: 11, Acknowledged: n(10)}}}, true},
		{"missing", &LedgerCheck{Rows: []LedgerRow{{Metric: "api_calls", Rows: 9, Ops: 9, Acknowledged: n(10)}}}, false},
		{"twice", &LedgerCheck{Ambiguous: 5, Rows: []LedgerRow{{Metric: "api_calls", Rows: 11, Ops: 10, Acknowledged: n(10)}}}, false},
		{"more than answered", &LedgerCheck{Rows: []LedgerRow{{Metric: "api_calls", Rows: 11, Ops: 11, Acknowledged: n(10)}}}, false},
		{"check failed", &LedgerCheck{Error: "boom"}, false},
		{"nothing acknowledged", &LedgerCheck{Rows: []LedgerRow{{Metric: "x", Rows: 1, Ops: 1}}}, false},
		{"not checked", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got, note := exactlyOnce(tc.lc); got != tc.want {
				t.Errorf("exactlyOnce = %v (%s), want %v", got, note, tc.want)
			}
		})
	}
}

// TestGoals26 evaluates issue 26's rows from a fixture: each met or
// missed against its goal, nothing excused.
func TestGoals26(t *testing.T) {
	ack := int64(100)
	r := &Results{
		Ceiling:   &ScenarioResult{Run: &RunResult{OK: 1000, Achieved: 20000}, CPU: CPUSample{"ceiling server": 0.030, "redis-server": 0.015, "postgres": 0.001}},
		CopyFloor: &CopyFloorRun{Rows: 1000, GroupSize: 100, PostgresUSPerRow: 14},
		Scenarios: []ScenarioResult{
			{Name: "consume", Max: 6000, Run: &RunResult{OK: 1000}, CPU: CPUSample{"creditd": 0.05, "redis-server": 0.03, "postgres": 0.03},
				Lag: &LagResult{LagSeconds: 0.2}},
			{Name: "consume-hot", Max: 5000, Run: &RunResult{OK: 1000}},
			{Name: "reserve", Max: 1000, Run: &RunResult{OK: 1000}, CPU: CPUSample{"creditd": 0.9, "redis-server": 0.5, "postgres": 0.5}},
		},
		PGBench: []PGBench{{Name: "spread", TPS: 2000}, {Name: "hot", TPS: 1000}},
		HotPath: &HotPathResult{
			RoundTrips: []RoundTripRun{{Scenario: "consume", Requests: 100, RedisMedian: 1, PostgresMedian: 0}},
			Storage:    &PGStorage{Consumes: 20000, BytesPerConsume: 2605, RowsPerConsume: 2.4},
			Outage: &OutageResult{Planned: 60, Money: OutageCalls{Sent: 1000, OK: 995, S503: 5}, Checks: OutageCalls{Sent: 1000, OK: 999, Other5xx: 1},
				ExactlyOnce: true, Ledger: &LedgerCheck{Rows: []LedgerRow{{Rows: 100, Ops: 100, Acknowledged: &ack}}}},
		},
	}
	r.computeGoals26()
	want := map[string]string{
		"round trips":        "met",
		"consume CPU per op": "met", // 110 µs / (30+15+1+14) = 1.83x
		"reserve + commit":   "missed",
		"usage CPU":          "not measured",
		"gauge move":         "not measured",
		"(spread)":           "met", // 3.00x
		"(hot)":              "missed",
		"Postgres bytes":     "missed",
		"Postgres rows":      "met",
		"money calls":        "met",
		"checks":             "missed",
		"idempotency key":    "not measured",
	}
	if len(r.Goals26) != 12 {
		t.Fatalf("%d rows, want 12", len(r.Goals26))
	}
	for _, g := range r.Goals26 {
		got := "not measured"
		if g.Met != nil {
			got = map[bool]string{true: "met", false: "missed"}[*g.Met]
		}
		found := false
		for k, v := range want {
			if strings.Contains(g.Name, k) {
				found = true
				if got != v {
					t.Errorf("%q: %s (%s), want %s", g.Name, got, g.Now, v)
				}
			}
		}
		if !found {
			t.Errorf("unexpected row %q", g.Name)
		}
	}
	if !strings.HasPrefix(r.Goals26[1].Now, "1.86x") {
		t.Errorf("consume ratio: %s", r.Goals26[1].Now)
	}
}

func TestRedisHead(t *testing.T) {
	tests := []struct{ in, want string }{
		{"*5\r\n$5\r\nfcall\r\n$15\r\ncreditd_consume\r\n$1\r\n2\r\n$1\r\na\r\n$1\r\nb\r\n", "FCALL creditd_consume a"},
		{"*2\r\n$3\r\nget\r\n$1\r\nk\r\n*2\r\n$3\r\nget\r\n$1\r\nj\r\n", "GET +1"},
		{"*5\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n1\r\n$29\r\n{b1892055co}:rl:0a1b2c3d-99ff\r\n$1\r\n1\r\n", "EVALSHA {*o}:rl:*"},
		{"*4\r\n$5\r\nFCALL\r\n$5\r\nf_abc\r\n$1\r\n1\r\n$12\r\n{bo:p31}:a:x\r\n", "FCALL f_abc {bo:p*}:a:x"},
		{"*1\r\n$5\r\nMULTI\r\n*3\r\n$4\r\nXACK\r\n$1\r\ns\r\n$1\r\ng\r\n*1\r\n$4\r\nEXEC\r\n", "MULTI XACK +2"},
		{"PING\r\n", "?"},
	}
	for _, tc := range tests {
		if got := redisHead([]byte(tc.in)); got != tc.want {
			t.Errorf("redisHead(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestPGHead(t *testing.T) {
	msg := func(typ byte, parts ...string) []byte {
		body := []byte(strings.Join(parts, "\x00") + "\x00")
		n := len(body) + 4
		return append([]byte{typ, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}, body...)
	}
	cat := func(ms ...[]byte) []byte {
		var out []byte
		for _, m := range ms {
			out = append(out, m...)
		}
		return out
	}
	sync := []byte{'S', 0, 0, 0, 4}
	stmts := map[string]string{}
	sel := "SELECT customer_id FROM operations WHERE tenant_id = $1"
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"parse names the statement", cat(msg('P', "stmtcache_1", sel), msg('D', "Sstmtcache_1"), sync), "SELECT FROM operations"},
		{"a later bind of it", cat(msg('B', "", "stmtcache_1"), msg('E', ""), sync), "SELECT FROM operations"},
		{"simple query", msg('Q', "BEGIN"), "BEGIN"},
		{"unnamed parse and bind once", cat(msg('P', "", "UPDATE credit_accounts SET balance = 1"), msg('B', "", ""), sync), "UPDATE credit_accounts"},
		{"unknown statement", cat(msg('B', "", "stmtcache_9"), sync), "statement stmtcache_9"},
		{"bare sync", sync, "?"},
		{"startup packet", []byte{0, 0, 0, 8, 0, 3, 0, 0}, "?"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := pgHead(tc.in, stmts); got != tc.want {
				t.Errorf("pgHead = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestTripKinds(t *testing.T) {
	got := tripText(tripKinds([]string{"FCALL x", "SET", "FCALL x", "SET", "EVALSHA"}, 2))
	if want := "FCALL x x1.00; SET x1.00; EVALSHA x0.50"; got != want {
		t.Errorf("tripText = %q, want %q", got, want)
	}
	if got := tripText(tripKinds(nil, 0)); got != "none" {
		t.Errorf("no trips: %q", got)
	}
}

func TestRequestTrips(t *testing.T) {
	tests := []struct {
		postgres bool
		heads    []string
		want     int64
	}{
		{false, []string{"EVALSHA", "XREADGROUP", "HMGET", "FCALL creditd_consume_1", "SET", "XAUTOCLAIM", "INFO", "XACK +1", "MULTI XACK +3", "MULTI SET +2", "EVALSHA {*o:p*}:owner", "EVALSHA {*o:persisters}", "EVALSHA {*o:t:*}:rl:*"}, 6},
		{true, []string{"SELECT FROM operations", "--", "SELECT credit_outbox_fence + INSERT INTO ledger_entries", "UPDATE webhook_events", "SELECT FROM customers"}, 2},
		{true, nil, 0},
	}
	for _, tc := range tests {
		if got := requestTrips(tc.postgres, tc.heads); got != tc.want {
			t.Errorf("requestTrips(%v, %v) = %d, want %d", tc.postgres, tc.heads, got, tc.want)
		}
	}
}
