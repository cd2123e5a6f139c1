package main

import (
	"fmt"
	"strings"
	"testing"
)

// TestHistoryFlat: the filtered history counts as flat while each type's
// p50 at the largest ledger stays within 2x + 1 ms of the smallest's, in
// whatever order the sizes come.
func TestHistoryFlat(t *testing.T) {
	t.Parallel()
	line := func(n int64, typ string, p50 float64) HistoryFilterLatency {
		return HistoryFilterLatency{Entries: n, Type: typ, P50Ms: p50}
	}
	for _, tc := range []struct {
		name  string
		lines []HistoryFilterLatency
		ok    bool
		has   string
	}{
		{"none", nil, false, ""},
		{"flat", []HistoryFilterLatency{line(1_000, "consumption", 0.8), line(1_000, "adjustment", 0.7),
			line(10_000, "consumption", 0.9), line(10_000, "adjustment", 0.8)}, true, "type=adjustment p50 0.70 ms at 1000 entries, 0.80 ms at 10000 (flat)"},
		{"noise under 1 ms", []HistoryFilterLatency{line(1_000, "expiry", 0.2), line(10_000, "expiry", 1.3)}, true, "(flat)"},
		{"grows", []HistoryFilterLatency{line(1_000, "consumption", 0.8), line(10_000, "consumption", 0.9),
			line(1_000, "adjustment", 3), line(10_000, "adjustment", 25)}, false, "type=adjustment p50 3.00 ms at 1000 entries, 25.00 ms at 10000 (grows)"},
		{"larger first", []HistoryFilterLatency{line(10_000, "adjustment", 25), line(1_000, "adjustment", 3)}, false, "(grows)"},
	} {
		summary, ok := historyFlat(tc.lines)
		if ok != tc.ok || !strings.Contains(summary, tc.has) {
			t.Errorf("%s: historyFlat = %q, %v; want %v and %q", tc.name, summary, ok, tc.ok, tc.has)
		}
	}
}

// TestHistoryFilterMarkdown: the report's section names the verdict and
// has one table row per size and type, or says why it has none.
func TestHistoryFilterMarkdown(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }
	historyFilterMarkdown(w, []HistoryFilterLatency{
		{Entries: 1_000, Type: "adjustment", Matching: 50, Queries: 200, P50Ms: 0.7, P99Ms: 1.2, MaxMs: 2},
		{Entries: 10_000, Type: "adjustment", Matching: 50, Queries: 200, P50Ms: 0.8, P99Ms: 1.3, MaxMs: 2.5},
	}, "")
	md := b.String()
	for _, want := range []string{"**true**", "| 1000 | adjustment | 50 | 200 | 0.70 | 1.20 | 2.00 |", "| 10000 | adjustment | 50 | 200 | 0.80 | 1.30 | 2.50 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	b.Reset()
	historyFilterMarkdown(w, nil, "seed history of 1000: boom")
	if !strings.Contains(b.String(), "Error: seed history of 1000: boom") {
		t.Errorf("markdown of a failure: %s", b.String())
	}
}
