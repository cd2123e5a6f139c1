package api

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerUsageReports adds the usage analytics reads (issue 15 item 5);
// POST /v1/usage, the usage events, shares the tenant-wide path.
func (s *Server) registerUsageReports() {
	s.handle("GET", "/v1/customers/{id}/usage", optTenant, s.customerUsage)
	s.handle("GET", "/v1/usage", optTenant, s.tenantUsage)
}

// usageParams is the query both usage reports take, as sent.
type usageParams struct {
	BillableMetricKey string
	From, To          string
	Granularity       string
}

// usageParamsOf reads the query of a usage report.
func usageParamsOf(c *call) usageParams {
	return usageParams{BillableMetricKey: c.query("billable_metric_key"), From: c.query("from"),
		To: c.query("to"), Granularity: c.query("granularity")}
}

// toQuery checks the query: from and to required RFC 3339 instants on the
// granularity's UTC bucket boundaries, to after from, at most MaxBuckets
// buckets; granularity hour, day or month (default day). Errors: 400 naming
// the parameter.
func (in usageParams) toQuery() (engine.UsageQuery, error) {
	var q engine.UsageQuery
	switch g := engine.UsageGranularity(in.Granularity); g {
	case "":
		q.Granularity = engine.UsageGranularityDay
	case engine.UsageGranularityHour, engine.UsageGranularityDay, engine.UsageGranularityMonth:
		q.Granularity = g
	default:
		return q, engine.BadRequest("granularity", "granularity must be hour, day or month")
	}
	if in.From == "" {
		return q, engine.BadRequest("from", "from is required")
	}
	if in.To == "" {
		return q, engine.BadRequest("to", "to is required")
	}
	var err error
	if q.From, err = engine.ParseInstant("from", in.From, engine.KindBadRequest); err != nil {
		return q, err
	}
	if q.To, err = engine.ParseInstant("to", in.To, engine.KindBadRequest); err != nil {
		return q, err
	}
	q.From, q.To = q.From.UTC(), q.To.UTC()
	for _, b := range []struct {
		field string
		t     time.Time
	}{{"from", q.From}, {"to", q.To}} {
		if !q.Granularity.Truncate(b.t).Equal(b.t) {
			return q, engine.BadRequest(b.field, b.field+" must start a UTC "+string(q.Granularity)+" for granularity "+string(q.Granularity))
		}
	}
	if !q.To.After(q.From) {
		return q, engine.BadRequest("to", "to must be after from")
	}
	if n, most := q.Granularity.Buckets(q.From, q.To), q.Granularity.MaxBuckets(); n > most {
		return q, engine.BadRequest("to", "the range spans more than the "+strconv.FormatInt(most, 10)+" "+string(q.Granularity)+" buckets one report may hold")
	}
	if in.BillableMetricKey != "" {
		k := in.BillableMetricKey
		if !engine.ValidMetricKey(k) {
			return q, engine.BadRequest("billable_metric_key", "billable_metric_key must be 1-128 letters, digits, '_', '.', ':' or '-'")
		}
		q.BillableMetricKey = &k
	}
	return q, nil
}

// customerUsage answers GET /v1/customers/{id}/usage with one customer's
// buckets per metric.
func (s *Server) customerUsage(c *call) error {
	r, err := refParam(false)(c)
	if err != nil {
		return err
	}
	q, err := usageParamsOf(c).toQuery()
	if err != nil {
		return err
	}
	rep, err := s.usageReports.CustomerUsage(c.reqContext(), c.scope, r, q)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, rep)
}

// tenantUsage answers GET /v1/usage with the buckets of every customer of
// the key's tenant and environment, per metric.
func (s *Server) tenantUsage(c *call) error {
	q, err := usageParamsOf(c).toQuery()
	if err != nil {
		return err
	}
	rep, err := s.usageReports.TenantUsage(c.reqContext(), c.scope, q)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, rep)
}
