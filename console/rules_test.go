package console

import (
	"encoding/json"
	"math"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

func TestFormatCredits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mc   int64
		want string
	}{
		{0, "0.000"}, {1, "0.001"}, {1500, "1.500"}, {-700, "-0.700"}, {1234567890, "1,234,567.890"},
		{math.MinInt64, "-9,223,372,036,854,775.808"}, {math.MaxInt64, "9,223,372,036,854,775.807"},
	} {
		if got := formatCredits(tc.mc); got != tc.want {
			t.Errorf("formatCredits(%d) = %q, want %q", tc.mc, got, tc.want)
		}
	}
}

func TestParseCredits(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"10", 10000, true}, {"1.5", 1500, true}, {"0.001", 1, true}, {"1,000.25", 1000250, true}, {" 2 ", 2000, true},
		{"0", 0, false}, {"0.0004", 0, false}, {"-1", 0, false}, {"1.-5", 0, false}, {"abc", 0, false}, {"", 0, false},
		{".5", 0, false}, {"9999999999999999", 0, false},
	} {
		got, ok := parseCredits(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseCredits(%q) = %d, %v; want %d, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

// TestBalanceChart checks that walking back from the balance now through
// the entries' deltas gives the balance before each entry.
func TestBalanceChart(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	entries := []engine.LedgerEntry{ // newest first, as History returns them
		{Delta: -300, CreatedAt: t0.Add(2 * time.Hour)},
		{Delta: 1000, CreatedAt: t0.Add(time.Hour)},
	}
	c := balanceChart(entries, 700, t0.Add(3*time.Hour))
	if c.Empty || c.FirstValue != 0 || c.LastValue != 700 || c.Min != 0 || c.Max != 1000 {
		t.Fatalf("chart = %+v", c)
	}
	if c.Samples != 5 {
		t.Errorf("samples = %d, want 5 (now plus two points per entry)", c.Samples)
	}
	pts := strings.Fields(c.Points)
	// Oldest point: balance 0 at the bottom-left; the 1000 peak at the top.
	if pts[0] != "4.0,156.0" || !strings.HasSuffix(pts[2], ",4.0") {
		t.Errorf("points = %v", pts)
	}
	if e := balanceChart(nil, 0, t0); !e.Empty {
		t.Error("no entries should give an empty chart")
	}
}

func TestLineAllZeroLiesOnTheAxis(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	d := line([]time.Time{t0, t0.Add(time.Second)}, []float64{0, 0})
	for _, p := range strings.Fields(d.Points) {
		if !strings.HasSuffix(p, ",156.0") {
			t.Errorf("zero point %s is not at the bottom", p)
		}
	}
}

const metricsText = `# HELP creditd_http_requests_total x
creditd_http_requests_total{route="/v1/entitlements/check",method="GET",status="200"} 90
creditd_http_requests_total{route="/v1/entitlements/check",method="GET",status="429"} 10
creditd_http_requests_total{route="/v1/entitlements/consume",method="POST",status="200"} 40
creditd_http_requests_total{route="/healthz",method="GET",status="200"} 5
creditd_http_request_duration_seconds_bucket{route="/healthz",method="GET",le="0.001"} 100
creditd_http_request_duration_seconds_bucket{route="/healthz",method="GET",le="0.01"} 144
creditd_http_request_duration_seconds_bucket{route="/healthz",method="GET",le="+Inf"} 145
creditd_persister_lag_seconds 0.25
creditd_persister_backlog 3
creditd_webhook_backlog 7
creditd_webhook_events{status="pending"} 4
`

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	s := parseMetrics([]byte(metricsText), time.Unix(10, 0))
	if s.checks != 100 || s.cons != 40 || s.requests != 145 {
		t.Errorf("counters = checks %v, consumes %v, requests %v", s.checks, s.cons, s.requests)
	}
	if s.gauges["creditd_persister_lag_seconds"] != 0.25 || s.gauges["creditd_webhook_backlog"] != 7 ||
		s.gauges[`creditd_webhook_events{status="pending"}`] != 4 {
		t.Errorf("gauges = %v", s.gauges)
	}
	a := sample{buckets: map[float64]float64{0.001: 0, 0.01: 0, math.Inf(1): 0}}
	if q := p99(a, s); q != 0.01 {
		t.Errorf("p99 = %v, want 0.01", q)
	}
	tail := sample{buckets: map[float64]float64{0.001: 100, 0.01: 100, math.Inf(1): 145}}
	if q := p99(a, tail); q != 0.01 {
		t.Errorf("p99 past the last bound = %v, want that bound 0.01", q)
	}
	if q := p99(s, s); q != 0 {
		t.Errorf("p99 with no requests between = %v, want 0", q)
	}
}

func TestOverviewRates(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(100, 0)
	ring := []sample{
		{at: t0, checks: 100, buckets: map[float64]float64{}, gauges: map[string]float64{}},
		{at: t0.Add(2 * time.Second), checks: 300, buckets: map[float64]float64{}, gauges: map[string]float64{"creditd_persister_lag_seconds": 1},
			webhookBacklog: maxBacklogCounted},
	}
	v := overviewOf(ring)
	if v.Charts[0].Title != "Checks" || v.Charts[0].Last != "100.0" {
		t.Errorf("checks chart = %+v", v.Charts[0])
	}
	if last := v.Charts[len(v.Charts)-1]; last.Title != "Webhook backlog" || last.Last != "10000 or more" {
		t.Errorf("backlog chart = %+v", last)
	}
	if len(v.Gauges) != 1 || v.Gauges[0].Value != "1" {
		t.Errorf("gauges = %+v", v.Gauges)
	}
}

func TestSamplerKeepsOneASecondAndAtMostMax(t *testing.T) {
	t.Parallel()
	sm := newSampler()
	t0 := time.Unix(0, 0)
	sm.add(sample{at: t0})
	if got := sm.add(sample{at: t0.Add(500 * time.Millisecond)}); len(got) != 1 {
		t.Errorf("a sample within a second was kept: %d", len(got))
	}
	var got []sample
	for i := 1; i <= maxSamples+10; i++ {
		got = sm.add(sample{at: t0.Add(time.Duration(i) * time.Second)})
	}
	if len(got) != maxSamples || !got[len(got)-1].at.Equal(t0.Add((maxSamples+10)*time.Second)) {
		t.Errorf("ring holds %d, last %v", len(got), got[len(got)-1].at)
	}
}

func TestReturnTo(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ back, want string }{
		{"/console/t/x/live/webhook", "/console/t/x/live/webhook"},
		{"https://evil.example/", "/def"},
		{"//evil.example/console/", "/def"},
		{"/console//evil.example", "/def"},
		{"/console/../admin", "/def"},
		{"/console/a\\b", "/def"},
		{"", "/def"},
	} {
		r := httptest.NewRequest("POST", "/console/x", strings.NewReader(url.Values{"back": {tc.back}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if got := returnTo(r, "/def"); got != tc.want {
			t.Errorf("returnTo(%q) = %q, want %q", tc.back, got, tc.want)
		}
	}
}

func TestSigninLimiter(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	l := newSigninLimiter()
	l.clock = func() time.Time { return now }
	for range signinFailures {
		if !l.allowed("10.0.0.1:5000") {
			t.Fatal("refused before the limit")
		}
		l.failed("10.0.0.1:5000")
	}
	if l.allowed("10.0.0.1:6000") {
		t.Error("allowed past the limit (same address, other port)")
	}
	if !l.allowed("10.0.0.2:5000") {
		t.Error("another address was refused")
	}
	now = now.Add(signinWindow + time.Second)
	if !l.allowed("10.0.0.1:5000") {
		t.Error("still refused after the window")
	}
}

// TestSealer checks that a sealed session opens only under the same key
// and cookie name, and not once changed.
func TestSealer(t *testing.T) {
	t.Parallel()
	a, b := newSealer("token-a-of-at-least-32-characters-long"), newSealer("token-b-of-at-least-32-characters-long")
	again := newSealer("token-a-of-at-least-32-characters-long")
	in := session{APIKey: "ck_live_x", CSRF: "c", ExpiresUnix: 42}
	text := a.seal(sessionCookie, in)
	var out session
	if !again.open(sessionCookie, text, &out) || out != in {
		t.Fatalf("another node with the same token opened %+v, want %+v", out, in)
	}
	if strings.Contains(text, "ck_live_x") {
		t.Error("the sealed cookie shows the key")
	}
	raw := []byte(text)
	raw[len(raw)/2] ^= 1
	for name, ok := range map[string]bool{
		"other key":         b.open(sessionCookie, text, &out),
		"other cookie name": a.open(flashCookie, text, &out),
		"changed":           a.open(sessionCookie, string(raw), &out),
		"not base64":        a.open(sessionCookie, "!!", &out),
		"short":             a.open(sessionCookie, "AAAA", &out),
	} {
		if ok {
			t.Errorf("%s: opened", name)
		}
	}
	if r1, r2 := newSealer(""), newSealer(""); r2.open(sessionCookie, r1.seal(sessionCookie, in), &out) {
		t.Error("two processes without an admin token share a key")
	}
}

// TestConsumptionChart checks the per-day, per-metric sums: only
// consumption debits of the last seven days count, the biggest metrics
// keep their own series and the rest fold into "other".
func TestConsumptionChart(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 10, 12, 0, 0, 0, time.UTC)
	key := func(s string) *string { return &s }
	e := func(metric string, delta int64, daysAgo int, typ engine.EntryType) engine.LedgerEntry {
		return engine.LedgerEntry{Type: typ, BillableMetricKey: key(metric), Delta: delta, CreatedAt: now.AddDate(0, 0, -daysAgo)}
	}
	entries := []engine.LedgerEntry{
		e("a", -500, 0, engine.EntryConsumption), e("a", -500, 0, engine.EntryConsumption), e("a", -200, 1, engine.EntryConsumption),
		e("b", -300, 0, engine.EntryConsumption), e("c", -20, 2, engine.EntryConsumption), e("d", -10, 2, engine.EntryConsumption),
		e("e", -5, 3, engine.EntryConsumption),
		e("a", -9999, 7, engine.EntryConsumption), // older than seven days
		e("a", 5000, 0, engine.EntryAdjustment),   // not consumption
	}
	c := consumptionChart(entries, now)
	if c.Empty || c.Max != 1000 || len(c.Days) != usageDays {
		t.Fatalf("chart = %+v", c)
	}
	var legend []string
	for _, s := range c.Legend {
		legend = append(legend, s.Key+"="+s.Total)
	}
	if got := strings.Join(legend, " "); got != "a=1.200 b=0.300 c=0.020 other=0.015" {
		t.Errorf("legend = %s", got)
	}
	today := c.Days[usageDays-1]
	if len(today.Bars) != 2 || today.Bars[0].Title != "a: 1.000 credits" || today.Bars[0].Y != "4.0" {
		t.Errorf("today's bars = %+v", today.Bars)
	}
	if got := consumptionChart(entries[7:], now); !got.Empty {
		t.Error("a chart with no recent consumption is not empty")
	}
	// A multi-metric consume's one entry (no metric, its items in
	// metadata.items) counts under each item's metric with the credits that
	// item paid: of a charge of 50 for items a 30 and b 40, a paid 30 and b
	// 20, the rest being overage (issue 31 item 1).
	multi := engine.LedgerEntry{Type: engine.EntryConsumption, Delta: -50, CreatedAt: now,
		Metadata: engine.Metadata{"items": json.RawMessage(`[{"billable_metric_key":"a","units":3,"cost":30},{"billable_metric_key":"b","units":4,"cost":40}]`)}}
	c = consumptionChart([]engine.LedgerEntry{e("a", -20, 0, engine.EntryConsumption), multi}, now)
	legend = legend[:0]
	for _, s := range c.Legend {
		legend = append(legend, s.Key+"="+s.Total)
	}
	if got := strings.Join(legend, " "); got != "a=0.050 b=0.020" {
		t.Errorf("legend with a multi-metric entry = %s, want a=0.050 b=0.020", got)
	}
}
