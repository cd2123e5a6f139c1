package engine

import (
	"testing"
	"time"
)

func day(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 9, 30, 0, 0, time.UTC) }

func TestAddCycles(t *testing.T) {
	tests := []struct {
		name   string
		cycle  BillingCycle
		anchor time.Time
		n      int
		want   time.Time
	}{
		{"monthly clamps Jan 31 to Feb 28", CycleMonthly, day(2026, 1, 31), 1, day(2026, 2, 28)},
		{"monthly returns to the 31st", CycleMonthly, day(2026, 1, 31), 2, day(2026, 3, 31)},
		{"monthly clamps to Apr 30", CycleMonthly, day(2026, 1, 31), 3, day(2026, 4, 30)},
		{"monthly leap year", CycleMonthly, day(2028, 1, 31), 1, day(2028, 2, 29)},
		{"monthly across the year", CycleMonthly, day(2026, 11, 15), 3, day(2027, 2, 15)},
		{"yearly Feb 29 clamps", CycleYearly, day(2028, 2, 29), 1, day(2029, 2, 28)},
		{"yearly Feb 29 again in 4 years", CycleYearly, day(2028, 2, 29), 4, day(2032, 2, 29)},
		{"daily", CycleDaily, day(2026, 2, 27), 3, day(2026, 3, 2)},
		{"weekly", CycleWeekly, day(2026, 12, 28), 1, day(2027, 1, 4)},
		{"one_time never moves", CycleOneTime, day(2026, 1, 1), 5, day(2026, 1, 1)},
	}
	for _, tc := range tests {
		if got := AddCycles(tc.cycle, tc.anchor, tc.n); !got.Equal(tc.want) {
			t.Errorf("%s: AddCycles = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestPeriodEndAfter(t *testing.T) {
	anchor := day(2026, 1, 31)
	tests := []struct {
		name  string
		cycle BillingCycle
		at    time.Time
		want  time.Time
	}{
		{"start of the first period", CycleMonthly, anchor, day(2026, 2, 28)},
		{"inside the first period", CycleMonthly, day(2026, 2, 10), day(2026, 2, 28)},
		{"exactly at a boundary: the next one", CycleMonthly, day(2026, 2, 28), day(2026, 3, 31)},
		{"years later", CycleMonthly, day(2027, 6, 1), day(2027, 6, 30)},
		{"yearly", CycleYearly, day(2026, 5, 1), day(2027, 1, 31)},
		{"daily boundary", CycleDaily, anchor.AddDate(0, 0, 10), anchor.AddDate(0, 0, 11)},
		{"daily inside", CycleDaily, anchor.AddDate(0, 0, 10).Add(time.Hour), anchor.AddDate(0, 0, 11)},
		{"weekly", CycleWeekly, anchor.AddDate(0, 0, 15), anchor.AddDate(0, 0, 21)},
	}
	for _, tc := range tests {
		got := PeriodEndAfter(tc.cycle, anchor, tc.at)
		if got == nil || !got.Equal(tc.want) {
			t.Errorf("%s: PeriodEndAfter = %v, want %v", tc.name, got, tc.want)
		}
	}
	if PeriodEndAfter(CycleOneTime, anchor, anchor) != nil {
		t.Error("one_time has a period end")
	}
}

func TestGrantCadence(t *testing.T) {
	anchor := day(2026, 1, 31)
	must := func(s string) GrantInterval {
		iv, err := ParseGrantInterval(s)
		if err != nil {
			t.Fatal(err)
		}
		return iv
	}
	tests := []struct {
		interval string
		n        int64
		want     time.Time
	}{
		{"daily", 0, anchor},
		{"daily", 29, day(2026, 3, 1)},
		{"weekly", 2, anchor.AddDate(0, 0, 14)},
		{"monthly", 1, day(2026, 2, 28)},
		{"monthly", 2, day(2026, 3, 31)},
		{"PT12H", 3, anchor.Add(36 * time.Hour)},
		{"P1DT6H", 2, anchor.Add(60 * time.Hour)},
	}
	for _, tc := range tests {
		if got := must(tc.interval).FireAt(anchor, tc.n); !got.Equal(tc.want) {
			t.Errorf("%s #%d = %v, want %v", tc.interval, tc.n, got, tc.want)
		}
	}
	// FiringsThrough counts the firings at or before t, the anchor's included.
	for _, tc := range []struct {
		interval string
		at       time.Time
		want     int64
	}{
		{"PT12H", anchor, 1},
		{"PT12H", anchor.Add(12 * time.Hour), 2},
		{"PT12H", anchor.Add(12*time.Hour - time.Millisecond), 1},
		{"daily", anchor.AddDate(0, 0, 10).Add(time.Minute), 11},
		{"monthly", day(2026, 3, 30), 2},
		{"monthly", day(2026, 3, 31), 3},
		{"weekly", anchor.Add(-time.Hour), 0},
	} {
		if got := must(tc.interval).FiringsThrough(anchor, tc.at); got != tc.want {
			t.Errorf("%s FiringsThrough(%v) = %d, want %d", tc.interval, tc.at, got, tc.want)
		}
	}
}

func TestPeriodBound(t *testing.T) {
	for _, tc := range []struct {
		interval string
		cycle    BillingCycle
		want     bool
	}{
		{"billing_period", CycleYearly, true},
		{"monthly", CycleMonthly, true},
		{"monthly", CycleYearly, false},
		{"daily", CycleDaily, true},
		{"weekly", CycleMonthly, false},
		{"P7D", CycleWeekly, false},
	} {
		if got := PeriodBound(PlanGrant{GrantInterval: tc.interval}, tc.cycle); got != tc.want {
			t.Errorf("PeriodBound(%s, %s) = %v", tc.interval, tc.cycle, got)
		}
	}
}

func TestRolloverAndCapArithmetic(t *testing.T) {
	for _, tc := range []struct {
		unused int64
		pct    int
		want   int64
	}{
		{600, 50, 300},
		{999, 33, 329},
		{1, 99, 0},
		{0, 100, 0},
		{-5, 50, 0},
		{1000, 0, 0},
		{1000, 100, 1000},
		{9_223_372_036_854_775_807, 100, 9_223_372_036_854_775_807},
		{9_000_000_000_000_000_001, 99, 8_910_000_000_000_000_000},
	} {
		if got := RolloverCarry(tc.unused, tc.pct); got != tc.want {
			t.Errorf("RolloverCarry(%d, %d) = %d, want %d", tc.unused, tc.pct, got, tc.want)
		}
	}
	cap := int64(1500)
	for _, tc := range []struct {
		credits, balance, want int64
		cap                    *int64
	}{
		{1000, 0, 1000, nil},
		{1000, 100, 1000, &cap},
		{1000, 800, 700, &cap},
		{1000, 1500, 0, &cap},
		{1000, 2000, 0, &cap},
		{1000, -300, 1000, &cap},
	} {
		if got := CappedGrant(tc.credits, tc.cap, tc.balance); got != tc.want {
			t.Errorf("CappedGrant(%d, %v, %d) = %d, want %d", tc.credits, tc.cap, tc.balance, got, tc.want)
		}
	}
}
