package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerTopups adds the topup routes (addendum 7).
func (s *Server) registerTopups() {
	s.handle("POST", "/v1/customers/{id}/topups", optTenant|optIdem, s.createTopup)
	s.handle("GET", "/v1/customers/{id}/topups", optTenant, s.listTopups)
}

// createTopup answers POST /v1/customers/{id}/topups with 201
// {transaction, block, account}.
func (s *Server) createTopup(c *call) error {
	r, err := refParam(false)(c)
	if err != nil {
		return err
	}
	var in engine.TopupInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	res, err := s.topups.Create(c.reqContext(), c.scope, c.tenant, r, c.idem, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, res)
}

// listTopups answers GET /v1/customers/{id}/topups, newest first.
func (s *Server) listTopups(c *call) error {
	r, err := refParam(false)(c)
	if err != nil {
		return err
	}
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	page, err := s.topups.List(c.reqContext(), c.scope, r, c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}
