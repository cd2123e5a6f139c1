package engine

import (
	"regexp"
	"strconv"
	"time"
)

// Grant interval keywords (docs/spec/addendum.md §6).
const (
	// IntervalOnActivation fires once, when the subscription becomes active.
	IntervalOnActivation = "on_activation"
	// IntervalBillingPeriod fires at every period start.
	IntervalBillingPeriod = "billing_period"
	// IntervalDaily, IntervalWeekly and IntervalMonthly fire every calendar
	// day, week or month from activation.
	IntervalDaily   = "daily"
	IntervalWeekly  = "weekly"
	IntervalMonthly = "monthly"
)

// GrantInterval is a parsed grant_interval: a keyword, or (Keyword empty) a
// fixed Every on the grant's own clock from activation.
type GrantInterval struct {
	Keyword string
	Every   time.Duration
}

// Custom reports whether the interval is an ISO 8601 duration.
func (iv GrantInterval) Custom() bool { return iv.Keyword == "" }

// isoDuration is the ISO 8601 duration subset a grant_interval may use:
// weeks alone (PnW), or days and a time part (PnDTnHnMnS), integers only.
// Years and months are refused: their length varies, and the keyword
// monthly already says "every calendar month".
var isoDuration = regexp.MustCompile(`^P(?:(\d{1,10})W|(?:(\d{1,10})D)?(?:T(?:(\d{1,10})H)?(?:(\d{1,10})M)?(?:(\d{1,10})S)?)?)$`)

// calendarDuration spots a duration whose date part has years or months.
var calendarDuration = regexp.MustCompile(`^P\d+[YM]`)

// ParseGrantInterval reads a grant_interval: one of the five keywords, or an
// ISO 8601 duration between 5 minutes and 10 years. Errors are 422 naming
// grant_interval.
func ParseGrantInterval(s string) (GrantInterval, error) {
	switch s {
	case IntervalOnActivation, IntervalBillingPeriod, IntervalDaily, IntervalWeekly, IntervalMonthly:
		return GrantInterval{Keyword: s}, nil
	}
	m := isoDuration.FindStringSubmatch(s)
	// "P" and "PT" alone match the pattern with every part empty.
	if m == nil || s == "P" || s[len(s)-1] == 'T' {
		if calendarDuration.MatchString(s) {
			return GrantInterval{}, Invalid("grant_interval", "grant_interval durations may not use years or months; use the keyword monthly, or days (P30D)")
		}
		return GrantInterval{}, Invalid("grant_interval",
			"grant_interval must be on_activation, billing_period, daily, weekly, monthly or an ISO 8601 duration such as PT5H (weeks, days, hours, minutes, seconds)")
	}
	units := [...]int64{7 * 86400, 86400, 3600, 60, 1}
	var secs int64
	for i, u := range units {
		if m[i+1] == "" {
			continue
		}
		n, _ := strconv.ParseInt(m[i+1], 10, 64) // at most 10 digits: fits
		if n > MaxGrantSeconds/u {
			return GrantInterval{}, Invalid("grant_interval", "grant_interval must not be longer than 10 years")
		}
		secs += n * u
	}
	if secs > MaxGrantSeconds {
		return GrantInterval{}, Invalid("grant_interval", "grant_interval must not be longer than 10 years")
	}
	every := time.Duration(secs) * time.Second
	if every < MinGrantInterval {
		return GrantInterval{}, Invalid("grant_interval", "a custom grant_interval must be at least 5 minutes (PT5M)")
	}
	return GrantInterval{Every: every}, nil
}
