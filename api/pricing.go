package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// metricKeyParam reads the {key} of a billable-metric path; a bad escape or
// an empty key names no metric (404).
func (c *call) metricKeyParam(name string) (string, error) {
	v, ok := c.pathParam(name)
	if !ok || v == "" {
		return "", engine.NotFound("billable metric not found")
	}
	return v, nil
}

// listMetrics answers GET /v1/billable-metrics, oldest first (addendum 4).
func (s *Server) listMetrics(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	page, err := s.metering.ListMetrics(c.reqContext(), c.scope, c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// createMetric answers POST /v1/billable-metrics with 201.
func (s *Server) createMetric(c *call) error {
	var in engine.MetricInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	m, err := s.metering.CreateMetric(c.reqContext(), c.scope, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, m)
}

// getMetric answers GET /v1/billable-metrics/{key}.
func (s *Server) getMetric(c *call) error {
	key, err := c.metricKeyParam("key")
	if err != nil {
		return err
	}
	m, err := s.metering.GetMetric(c.reqContext(), c.scope, key)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, m)
}

// patchMetric answers PATCH /v1/billable-metrics/{key} with 200; the type
// and key are immutable (422 when another value is sent).
func (s *Server) patchMetric(c *call) error {
	key, err := c.metricKeyParam("key")
	if err != nil {
		return err
	}
	var in engine.MetricInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	m, err := s.metering.UpdateMetric(c.reqContext(), c.scope, key, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, m)
}

// listRules answers GET /v1/metering-rules, oldest first.
func (s *Server) listRules(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	activeOnly, err := c.queryBool("active_only")
	if err != nil {
		return err
	}
	page, err := s.metering.ListRules(c.reqContext(), c.scope, c.query("billable_metric_key"), activeOnly, c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// createRule answers POST /v1/metering-rules with 201: the new rule is
// active at once and ends the previous one.
func (s *Server) createRule(c *call) error {
	var in engine.RuleInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	r, err := s.metering.CreateRule(c.reqContext(), c.scope, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, r)
}

// registerPricing adds the routes of pricing and the hot path: billable
// metrics, metering rules, entitlement checks, consume, usage, gauges and
// reservations.
func (s *Server) registerPricing() {
	s.handle("GET", "/v1/billable-metrics", optTenant, s.listMetrics)
	s.handle("POST", "/v1/billable-metrics", optTenant|optIdem, s.createMetric)
	s.handle("GET", "/v1/billable-metrics/{key}", optTenant, s.getMetric)
	s.handle("PATCH", "/v1/billable-metrics/{key}", optTenant|optIdem, s.patchMetric)
	s.handle("GET", "/v1/metering-rules", optTenant, s.listRules)
	s.handle("POST", "/v1/metering-rules", optTenant|optIdem, s.createRule)

	s.handle("GET", "/v1/entitlements/check", optTenant, s.checkQuery)
	s.handle("POST", "/v1/entitlements/consume", optTenant|optIdem, s.consume)
	s.handle("POST", "/v1/usage", optTenant|optIdem, s.usage)
	for _, form := range []struct {
		prefix string
		strict bool
	}{{"/v1/customers/{id}", false}, {"/v1/customer-by-external-id/{external_id}", true}} {
		ref := refParam(form.strict)
		s.handle("GET", form.prefix+"/entitlements/{metric}", optTenant, s.checkPath(ref))
		s.handle("POST", form.prefix+"/entitlements/{billable_metric_key}/increment", optTenant|optIdem, s.moveGauge(ref, true))
		s.handle("POST", form.prefix+"/entitlements/{billable_metric_key}/decrement", optTenant|optIdem, s.moveGauge(ref, false))
	}
	s.registerLeases()

	s.handle("POST", "/v1/reservations", optTenant|optIdem, s.createReservation)
	s.handle("GET", "/v1/reservations/{id}", optTenant, s.getReservation)
	s.handle("POST", "/v1/reservations/{id}/commit", optTenant|optIdem, s.commitReservation)
	s.handle("POST", "/v1/reservations/{id}/release", optTenant|optIdem, s.releaseReservation)
	s.handle("GET", "/v1/customers/{customer_id}/reservations", optTenant, s.listReservations(customerIDParam))
	s.handle("GET", "/v1/customer-by-external-id/{external_id}/reservations", optTenant, s.listReservations(refParam(true)))
}
