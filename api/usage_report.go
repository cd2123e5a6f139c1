package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerUsageReports adds the usage analytics reads (issue 15 item 5);
// POST /v1/usage, the usage events, shares the tenant-wide path.
func (s *Server) registerUsageReports() {
	s.handle("GET", "/v1/customers/{id}/usage", optTenant, s.customerUsage)
	s.handle("GET", "/v1/usage", optTenant, s.tenantUsage)
}

// usageBucketsInput is the query both usage reports take.
func usageBucketsInput(c *call) engine.UsageBucketsInput {
	return engine.UsageBucketsInput{BillableMetricKey: c.query("billable_metric_key"), From: c.query("from"),
		To: c.query("to"), Granularity: c.query("granularity")}
}

// customerUsage answers GET /v1/customers/{id}/usage with one customer's
// buckets per metric.
func (s *Server) customerUsage(c *call) error {
	r, err := refParam(false)(c)
	if err != nil {
		return err
	}
	rep, err := s.usageReports.CustomerUsage(c.reqContext(), c.scope, r, usageBucketsInput(c))
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, rep)
}

// tenantUsage answers GET /v1/usage with the buckets of every customer of
// the key's tenant and environment, per metric.
func (s *Server) tenantUsage(c *call) error {
	rep, err := s.usageReports.TenantUsage(c.reqContext(), c.scope, usageBucketsInput(c))
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, rep)
}
