package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// UsageGranularity is the bucket size of a usage report.
type UsageGranularity string

// Usage report granularities; buckets are UTC hours, days and months.
const (
	UsageGranularityHour  UsageGranularity = "hour"
	UsageGranularityDay   UsageGranularity = "day"
	UsageGranularityMonth UsageGranularity = "month"
)

// Bucket limits of a usage report (docs/limits.md): a month of hours, a
// leap year of days, ten years of months. They bound the rows one read
// returns per metric.
const (
	MaxUsageHourBuckets  = 744
	MaxUsageDayBuckets   = 366
	MaxUsageMonthBuckets = 120
)

// UsageQuery is a checked usage read: customer (nil for the whole tenant
// and environment), an optional metric, and [From, To) on bucket
// boundaries. api builds it from the query string; the service sets the
// tenant, environment and customer.
type UsageQuery struct {
	TenantID          uuid.UUID
	Environment       Environment
	CustomerID        *uuid.UUID
	BillableMetricKey *string
	Granularity       UsageGranularity
	From, To          time.Time
}

// UsageRow is one metric's sums in one bucket, as the rollup returns them.
type UsageRow struct {
	BillableMetricKey string
	Start             time.Time
	Units, Cost       int64
	Count             int64
}

// UsageBucket is one bucket of a usage report: the half-open [start, end),
// units consumed, their priced cost in millicredits (charged plus
// overage) and the number of consumptions.
type UsageBucket struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Units int64     `json:"units"`
	Cost  int64     `json:"cost"`
	Count int64     `json:"count"`
}

// MetricUsageSeries is one metric's buckets and their totals.
type MetricUsageSeries struct {
	BillableMetricKey string        `json:"billable_metric_key"`
	Units             int64         `json:"units"`
	Cost              int64         `json:"cost"`
	Count             int64         `json:"count"`
	Buckets           []UsageBucket `json:"buckets"`
}

// UsageBucketsReport is the 200 body of the usage endpoints; CustomerID is null
// for the tenant-wide report.
type UsageBucketsReport struct {
	CustomerID  *uuid.UUID          `json:"customer_id"`
	Granularity UsageGranularity    `json:"granularity"`
	From        time.Time           `json:"from"`
	To          time.Time           `json:"to"`
	Data        []MetricUsageSeries `json:"data"`
}

// UsageAnalytics answers usage reports from the rollup the persister
// keeps. It is safe for concurrent use.
type UsageAnalytics struct {
	credits *Credits
	reader  UsageReader
}

// NewUsageAnalytics returns the usage service; credits resolves customers
// and gives the customer report read-your-writes.
func NewUsageAnalytics(credits *Credits, reader UsageReader) *UsageAnalytics {
	return &UsageAnalytics{credits: credits, reader: reader}
}

// CustomerUsage reports one customer's usage over q. Errors: 404 unknown
// customer (never creates one).
func (u *UsageAnalytics) CustomerUsage(ctx context.Context, scope Scope, ref CustomerRef, q UsageQuery) (UsageBucketsReport, error) {
	q.TenantID, q.Environment = scope.TenantID, scope.Environment
	c, err := u.credits.resolve(ctx, scope, ref)
	if err != nil {
		return UsageBucketsReport{}, err
	}
	q.CustomerID = &c.ID
	// A report right after a consume shows it (as history does).
	u.credits.awaitPersisted(ctx, CustomerKeyOf(c))
	return u.report(ctx, q)
}

// TenantUsage reports the usage of every customer of scope's tenant and
// environment, per metric, with every write acknowledged before it (on any
// node) counted: it waits for the whole outbox (WrittenBehind.All).
func (u *UsageAnalytics) TenantUsage(ctx context.Context, scope Scope, q UsageQuery) (UsageBucketsReport, error) {
	q.TenantID, q.Environment, q.CustomerID = scope.TenantID, scope.Environment, nil
	u.credits.behind.All(ctx)
	return u.report(ctx, q)
}

func (u *UsageAnalytics) report(ctx context.Context, q UsageQuery) (UsageBucketsReport, error) {
	rows, err := u.reader.UsageRows(ctx, q)
	if err != nil {
		return UsageBucketsReport{}, err
	}
	return UsageBucketsReport{CustomerID: q.CustomerID, Granularity: q.Granularity, From: q.From, To: q.To,
		Data: usageSeries(rows, q.Granularity)}, nil
}

// usageSeries groups rows (sorted by metric, then start) into one series
// per metric with its totals; totals saturate at the int64 bounds like the
// rollup's sums.
func usageSeries(rows []UsageRow, g UsageGranularity) []MetricUsageSeries {
	out := []MetricUsageSeries{}
	for _, r := range rows {
		if len(out) == 0 || out[len(out)-1].BillableMetricKey != r.BillableMetricKey {
			out = append(out, MetricUsageSeries{BillableMetricKey: r.BillableMetricKey, Buckets: []UsageBucket{}})
		}
		s := &out[len(out)-1]
		start := r.Start.UTC()
		s.Buckets = append(s.Buckets, UsageBucket{Start: start, End: g.next(start), Units: r.Units, Cost: r.Cost, Count: r.Count})
		s.Units, s.Cost, s.Count = addSaturated(s.Units, r.Units), addSaturated(s.Cost, r.Cost), addSaturated(s.Count, r.Count)
	}
	return out
}

// addSaturated is a + b held at the int64 bounds.
func addSaturated(a, b int64) int64 {
	if s, ok := AddChecked(a, b); ok {
		return s
	}
	if a > 0 {
		return 1<<63 - 1
	}
	return minInt64
}

// next is the start of the bucket after the one starting at t (UTC).
func (g UsageGranularity) next(t time.Time) time.Time {
	switch g {
	case UsageGranularityHour:
		return t.Add(time.Hour)
	case UsageGranularityDay:
		return t.AddDate(0, 0, 1)
	default:
		return t.AddDate(0, 1, 0)
	}
}

// Truncate is the start of t's bucket (UTC).
func (g UsageGranularity) Truncate(t time.Time) time.Time {
	t = t.UTC()
	switch g {
	case UsageGranularityHour:
		return t.Truncate(time.Hour)
	case UsageGranularityDay:
		return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	default:
		return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	}
}

// Buckets is how many buckets [from, to) spans; from and to are bucket
// starts.
func (g UsageGranularity) Buckets(from, to time.Time) int64 {
	switch g {
	case UsageGranularityHour:
		return int64(to.Sub(from) / time.Hour)
	case UsageGranularityDay:
		return int64(to.Sub(from) / (24 * time.Hour))
	default:
		return int64(to.Year()-from.Year())*12 + int64(to.Month()-from.Month())
	}
}

// MaxBuckets is the most buckets one report of g may span.
func (g UsageGranularity) MaxBuckets() int64 {
	switch g {
	case UsageGranularityHour:
		return MaxUsageHourBuckets
	case UsageGranularityDay:
		return MaxUsageDayBuckets
	default:
		return MaxUsageMonthBuckets
	}
}
