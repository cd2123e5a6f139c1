package engine

import "time"

// Period and grant-cadence arithmetic. Every boundary is computed from an
// anchor (anchor + n cycles), never by chaining, so a subscription that
// starts on January 31 renews on February 28 (29) and then March 31 again.
// Instants are UTC; a day is a calendar day.

// addMonths moves t by n calendar months, clamping the day to the end of the
// target month.
func addMonths(t time.Time, n int) time.Time {
	t = t.UTC()
	y, m, d := t.Date()
	first := time.Date(y, m+time.Month(n), 1, t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
	if last := daysIn(first); d > last {
		d = last
	}
	return first.AddDate(0, 0, d-1)
}

// daysIn is the number of days of t's month.
func daysIn(t time.Time) int {
	return time.Date(t.Year(), t.Month()+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// AddCycles is anchor moved n billing cycles; a one_time cycle never moves.
func AddCycles(c BillingCycle, anchor time.Time, n int) time.Time {
	switch c {
	case CycleDaily:
		return anchor.UTC().AddDate(0, 0, n)
	case CycleWeekly:
		return anchor.UTC().AddDate(0, 0, 7*n)
	case CycleMonthly:
		return addMonths(anchor, n)
	case CycleYearly:
		return addMonths(anchor, 12*n)
	}
	return anchor.UTC()
}

// PeriodEndAfter is the first boundary anchor + k cycles (k >= 1) strictly
// after t: the end of the period that contains t. Nil for one_time.
func PeriodEndAfter(c BillingCycle, anchor, t time.Time) *time.Time {
	if c == CycleOneTime || !c.Valid() {
		return nil
	}
	k := 1
	// A close first guess, then step: cycles are at least a day long.
	switch c {
	case CycleDaily:
		k = int(t.Sub(anchor)/(24*time.Hour)) + 1
	case CycleWeekly:
		k = int(t.Sub(anchor)/(7*24*time.Hour)) + 1
	case CycleMonthly:
		k = (t.Year()-anchor.Year())*12 + int(t.Month()-anchor.Month())
	case CycleYearly:
		k = t.Year() - anchor.Year()
	}
	if k < 1 {
		k = 1
	}
	for k > 1 && AddCycles(c, anchor, k-1).After(t) {
		k--
	}
	end := AddCycles(c, anchor, k)
	for !end.After(t) {
		k++
		end = AddCycles(c, anchor, k)
	}
	return &end
}

// FireAt is the n-th firing (n = 0 at the anchor) of a grant's own cadence:
// daily, weekly and monthly on the calendar, ISO durations on a fixed clock.
func (iv GrantInterval) FireAt(anchor time.Time, n int64) time.Time {
	switch iv.Keyword {
	case IntervalDaily:
		return anchor.UTC().AddDate(0, 0, int(n))
	case IntervalWeekly:
		return anchor.UTC().AddDate(0, 0, 7*int(n))
	case IntervalMonthly:
		return addMonths(anchor, int(n))
	}
	return anchor.UTC().Add(time.Duration(n) * iv.Every)
}

// FiringsThrough is the number of firings of the cadence at or before t
// (at least 1: the anchor's own firing), so FireAt(anchor, FiringsThrough)
// is the first one after t.
func (iv GrantInterval) FiringsThrough(anchor, t time.Time) int64 {
	if t.Before(anchor) {
		return 0
	}
	var n int64
	if iv.Custom() && iv.Every > 0 {
		n = int64(t.Sub(anchor)/iv.Every) + 1
	} else {
		// Calendar cadences: at most ~3650 days a decade, cheap to step from a guess.
		n = 1
		if iv.Keyword == IntervalDaily {
			n = int64(t.Sub(anchor)/(24*time.Hour)) + 1
		}
	}
	for n > 1 && iv.FireAt(anchor, n-1).After(t) {
		n--
	}
	for !iv.FireAt(anchor, n).After(t) {
		n++
	}
	return n
}

// PeriodBound reports whether a recurring grant fires at period starts
// rather than on its own clock: billing_period, or the keyword that equals
// the variant's cycle (a monthly grant on a monthly plan).
func PeriodBound(g PlanGrant, c BillingCycle) bool {
	iv := g.Interval()
	switch iv.Keyword {
	case IntervalBillingPeriod:
		return true
	case IntervalDaily:
		return c == CycleDaily
	case IntervalWeekly:
		return c == CycleWeekly
	case IntervalMonthly:
		return c == CycleMonthly
	}
	return false
}

// RolloverCarry is floor(unused * percent / 100) without overflow, the
// figure rollover.lua computes on limbs.
func RolloverCarry(unused int64, percent int) int64 {
	if unused <= 0 || percent <= 0 {
		return 0
	}
	return unused/100*int64(percent) + unused%100*int64(percent)/100
}

// CappedGrant is what a firing of credits grants under an accumulation cap
// at balance (grant.lua's rule): min(credits, cap - balance), 0 at or above.
func CappedGrant(credits int64, cap *int64, balance int64) int64 {
	if cap == nil {
		return credits
	}
	room := *cap - balance
	if room <= 0 {
		return 0
	}
	return min(credits, room)
}
