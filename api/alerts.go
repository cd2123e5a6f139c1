package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerAlerts adds the credit alert routes (issue 15 item 4): a
// customer's thresholds and top-up rule, and the tenant default of the
// key's environment. PUT replaces the whole configuration, so a retry has
// the same effect and needs no Idempotency-Key.
func (s *Server) registerAlerts() {
	ref := refParam(false)
	s.handle("GET", "/v1/customers/{id}/credits/alerts", optTenant, s.getCustomerAlerts(ref))
	s.handle("PUT", "/v1/customers/{id}/credits/alerts", optTenant, s.putCustomerAlerts(ref))
	s.handle("DELETE", "/v1/customers/{id}/credits/alerts", optTenant, s.deleteCustomerAlerts(ref))
	s.handle("GET", "/v1/credit-alerts/default", optTenant, s.getDefaultAlerts)
	s.handle("PUT", "/v1/credit-alerts/default", optTenant, s.putDefaultAlerts)
}

// getCustomerAlerts answers GET /v1/customers/{id}/credits/alerts: the
// settings that apply to the customer and where they come from.
func (s *Server) getCustomerAlerts(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		out, err := s.alerts.Customer(c.reqContext(), c.scope, r)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, out)
	}
}

// putCustomerAlerts answers PUT /v1/customers/{id}/credits/alerts with 200.
func (s *Server) putCustomerAlerts(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		var in engine.AlertSettingsInput
		if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
			return err
		}
		out, err := s.alerts.PutCustomer(c.reqContext(), c.scope, r, in)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, out)
	}
}

// deleteCustomerAlerts answers DELETE /v1/customers/{id}/credits/alerts
// with 204: the tenant default applies again.
func (s *Server) deleteCustomerAlerts(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		if err := s.alerts.DeleteCustomer(c.reqContext(), c.scope, r); err != nil {
			return err
		}
		return c.noContent()
	}
}

// getDefaultAlerts answers GET /v1/credit-alerts/default.
func (s *Server) getDefaultAlerts(c *call) error {
	out, err := s.alerts.Default(c.reqContext(), c.scope)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, out)
}

// putDefaultAlerts answers PUT /v1/credit-alerts/default with 200.
func (s *Server) putDefaultAlerts(c *call) error {
	var in engine.AlertSettingsInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	out, err := s.alerts.PutDefault(c.reqContext(), c.scope, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, out)
}
