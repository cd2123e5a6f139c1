package engine

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Budgets (issue 28 item 3): spend caps per period on a customer, for every
// metric or one. The money scripts enforce them atomically (lua/prelude/budgets.lua
// budget_take): each budget's counter lives in the customer's account hash
// (field "u:<period letter>:<metric key>"), the rules are docs/rules.md
// "Budgets" and the choices docs/decisions.md "Budgets".

// BudgetPeriod is the window a budget caps spend over.
type BudgetPeriod string

// Budget periods: a calendar day or a calendar month of the budget's time
// zone.
const (
	BudgetDay   BudgetPeriod = "day"
	BudgetMonth BudgetPeriod = "month"
)

// Valid reports whether p is a known period.
func (p BudgetPeriod) Valid() bool { return p == BudgetDay || p == BudgetMonth }

// MaxBudgets bounds the budgets of one customer: every consume of a
// customer with budgets reads and writes each applicable counter.
const MaxBudgets = 10

// MaxBudgetLimitMC bounds a budget's limit, as MaxCreditLimitMC bounds a
// line: a counter plus one more cost stays far inside int64.
const MaxBudgetLimitMC int64 = 1_000_000_000_000_000

// Budget is one spend cap: at most LimitMC millicredits of consumption
// (what consumes and commits cost, whoever pays: blocks, the credit line
// or overage) per Period of TimeZone, counted for BillableMetricKey alone
// or, when nil, for every metric.
type Budget struct {
	BillableMetricKey *string      `json:"billable_metric_key"`
	Period            BudgetPeriod `json:"period"`
	TimeZone          string       `json:"time_zone"`
	LimitMC           int64        `json:"limit_mc"`
	// Since is when the budget (its metric, period and time zone) was set:
	// its counter counts spend from the later of Since and the period's
	// start, so a budget set mid-period does not count what came before it
	// (docs/decisions.md "Budgets"). A change of the limit alone keeps it.
	Since time.Time `json:"since"`
}

// Metric is the budget's metric key, "" for every metric.
func (b Budget) Metric() string {
	if b.BillableMetricKey == nil {
		return ""
	}
	return *b.BillableMetricKey
}

// Field is the account hash field of the budget's counter.
func (b Budget) Field() string {
	return "u:" + string(b.Period[:1]) + ":" + b.Metric()
}

// sameCounter reports whether b and o count the same spend (metric,
// period and time zone): a replacement list keeps such a budget's Since.
func (b Budget) sameCounter(o Budget) bool {
	return b.Metric() == o.Metric() && b.Period == o.Period && b.TimeZone == o.TimeZone
}

var budgetZones sync.Map // time zone name -> *time.Location

// BudgetLocation loads zone (an IANA name or "UTC") once per process.
func BudgetLocation(zone string) (*time.Location, error) {
	if l, ok := budgetZones.Load(zone); ok {
		return l.(*time.Location), nil
	}
	if zone == "" || zone == "Local" {
		return nil, fmt.Errorf("engine: time zone %q is not an IANA name", zone)
	}
	l, err := time.LoadLocation(zone)
	if err != nil {
		return nil, err
	}
	budgetZones.Store(zone, l)
	return l, nil
}

// Window is the period of b that holds now: [start, end). A day runs from
// local midnight to the next local midnight, so it lasts 23 or 25 hours
// across a DST change; a month from the 1st's local midnight. Where a
// midnight does not exist (a zone whose DST starts at 00:00) the start is
// the instant time.Date normalizes it to, the same on every node with the
// same tz database.
func (b Budget) Window(now time.Time) (start, end time.Time) {
	loc, err := BudgetLocation(b.TimeZone)
	if err != nil {
		loc = time.UTC // validated at the edge; a stored unknown zone counts in UTC
	}
	t := now.In(loc)
	y, m, d := t.Date()
	if b.Period == BudgetMonth {
		return time.Date(y, m, 1, 0, 0, 0, 0, loc), time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	}
	return time.Date(y, m, d, 0, 0, 0, 0, loc), time.Date(y, m, d+1, 0, 0, 0, 0, loc)
}

// CountingFrom is the instant b's counter counts from in the period that
// reservations now: the later of the period's start and Since.
func (b Budget) CountingFrom(now time.Time) (from, end time.Time) {
	start, end := b.Window(now)
	if b.Since.After(start) {
		start = b.Since
	}
	return start, end
}

// BudgetArg is the "bud" member of the money scripts' context for budgets
// at now (lua/prelude/budgets.lua budgets_of): per budget "field|from|end|limit"
// (instants in Unix ms), joined by ";". Metric keys never hold "|", ";" or
// a quote (metricKeyPattern), so the text needs no escaping.
func BudgetArg(bs []Budget, now time.Time) string {
	if len(bs) == 0 {
		return ""
	}
	var sb strings.Builder
	for i, b := range bs {
		from, end := b.CountingFrom(now)
		if i > 0 {
			sb.WriteByte(';')
		}
		sb.WriteString(b.Field())
		sb.WriteByte('|')
		sb.WriteString(strconv.FormatInt(from.UnixMilli(), 10))
		sb.WriteByte('|')
		sb.WriteString(strconv.FormatInt(end.UnixMilli(), 10))
		sb.WriteByte('|')
		sb.WriteString(strconv.FormatInt(b.LimitMC, 10))
	}
	return sb.String()
}

// BudgetCounter is a budget counter as the account hash holds it: the
// value "<from ms> <spent>" and " r" once credit.budget_reached fired for
// the period.
type BudgetCounter struct {
	FromMS  int64
	SpentMC int64
	Reached bool
}

// ParseBudgetCounter reads a counter field's value.
func ParseBudgetCounter(v string) (BudgetCounter, bool) {
	f := strings.Fields(v)
	if len(f) < 2 || len(f) > 3 {
		return BudgetCounter{}, false
	}
	from, err1 := strconv.ParseInt(f[0], 10, 64)
	spent, err2 := strconv.ParseInt(f[1], 10, 64)
	if err1 != nil || err2 != nil {
		return BudgetCounter{}, false
	}
	return BudgetCounter{FromMS: from, SpentMC: spent, Reached: len(f) == 3 && f[2] == "r"}, true
}

// String is the counter's field value.
func (c BudgetCounter) String() string {
	s := strconv.FormatInt(c.FromMS, 10) + " " + strconv.FormatInt(c.SpentMC, 10)
	if c.Reached {
		s += " r"
	}
	return s
}

// CheckBudgets validates a customer's budget list (the API's field path is
// prefix, e.g. "budgets"); it fills the default time zone.
func CheckBudgets(prefix string, bs []Budget) error {
	if len(bs) > MaxBudgets {
		return Invalid(prefix, fmt.Sprintf("at most %d budgets per customer", MaxBudgets))
	}
	for i := range bs {
		b := &bs[i]
		at := fmt.Sprintf("%s[%d].", prefix, i)
		if b.BillableMetricKey != nil && !metricKeyPattern.MatchString(*b.BillableMetricKey) {
			return Invalid(at+"billable_metric_key", "must be a billable metric key or null")
		}
		if !b.Period.Valid() {
			return Invalid(at+"period", `must be "day" or "month"`)
		}
		if b.TimeZone == "" {
			b.TimeZone = "UTC"
		}
		if _, err := BudgetLocation(b.TimeZone); err != nil {
			return Invalid(at+"time_zone", "must be UTC or an IANA time zone name")
		}
		if b.LimitMC < 0 || b.LimitMC > MaxBudgetLimitMC {
			return Invalid(at+"limit_mc", fmt.Sprintf("must be between 0 and %d", MaxBudgetLimitMC))
		}
		for j := 0; j < i; j++ {
			if bs[j].Metric() == b.Metric() && bs[j].Period == b.Period {
				return Invalid(at+"period", "a customer has one budget per metric (or none) and period")
			}
		}
	}
	return nil
}

// mergeBudgets is next with each budget's Since: kept from prev for a
// budget counting the same spend, else now.
func mergeBudgets(prev, next []Budget, now time.Time) []Budget {
	out := make([]Budget, len(next))
	for i, b := range next {
		b.Since = now
		for _, p := range prev {
			if p.sameCounter(b) {
				b.Since = p.Since
			}
		}
		out[i] = b
	}
	return out
}

// BudgetStatus is a budget with its counter at an instant: the API's
// answer for each budget of a customer.
type BudgetStatus struct {
	Budget
	SpentMC     int64     `json:"spent_mc"`
	PeriodStart time.Time `json:"period_start"`
	ResetsAt    time.Time `json:"resets_at"`
}

// BudgetCounterReader reads the values of budget counter fields of a
// customer's account hash (lua.Store): "" where a field is missing;
// ErrStateMissing when the store holds no state for the customer.
type BudgetCounterReader interface {
	BudgetCounters(ctx context.Context, c CustomerKey, fields []string) ([]string, error)
}

// budgetStatuses is each of bs at now, its spend read through r.
func budgetStatuses(ctx context.Context, r BudgetCounterReader, c CustomerKey, bs []Budget, now time.Time) ([]BudgetStatus, error) {
	fields := make([]string, len(bs))
	for i, b := range bs {
		fields[i] = b.Field()
	}
	vals, err := r.BudgetCounters(ctx, c, fields)
	if err != nil {
		return nil, err
	}
	out := make([]BudgetStatus, len(bs))
	for i, b := range bs {
		cnt, ok := ParseBudgetCounter(vals[i])
		out[i] = BudgetStatusOf(b, cnt, ok, now)
	}
	return out, nil
}

// BudgetStatusOf is b at now given its stored counter (ok false: none).
func BudgetStatusOf(b Budget, c BudgetCounter, ok bool, now time.Time) BudgetStatus {
	start, end := b.Window(now)
	from, _ := b.CountingFrom(now)
	st := BudgetStatus{Budget: b, PeriodStart: start.UTC(), ResetsAt: end.UTC()}
	if ok && c.FromMS >= from.UnixMilli() {
		st.SpentMC = c.SpentMC
	}
	return st
}

// BudgetExceededError is the 409 of a charge a budget refused, from the
// refusing counter's field (Budget.Field), limit, spend in the period and
// the instant the period ends: it names the cap and when it resets.
func BudgetExceededError(field string, limit, spent int64, resets time.Time) *Error {
	period, metric := BudgetOfField(field)
	var key *string
	if metric != "" {
		key = &metric
	}
	scope := "every metric"
	if key != nil {
		scope = "metric " + metric
	}
	return &Error{Kind: KindBudgetExceeded,
		Detail: fmt.Sprintf("the charge would take the customer's %s budget for %s past its limit of %d millicredits; it resets at %s",
			period, scope, limit, resets.UTC().Format(time.RFC3339)),
		Extra: map[string]any{"budget": map[string]any{
			"billable_metric_key": key, "period": period, "limit_mc": limit,
			"spent_mc": spent, "resets_at": resets.UTC().Format(time.RFC3339Nano),
		}}}
}

// BudgetOfField is the period and metric key ("" every metric) of a
// counter field (Budget.Field).
func BudgetOfField(field string) (BudgetPeriod, string) {
	if len(field) < 4 || !strings.HasPrefix(field, "u:") || field[3] != ':' {
		return "", ""
	}
	p := BudgetDay
	if field[2] == 'm' {
		p = BudgetMonth
	}
	return p, field[4:]
}

// ErrBudgetExceeded matches every BudgetExceededError under errors.Is.
var ErrBudgetExceeded = &Error{Kind: KindBudgetExceeded}
