package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// refFunc reads the customer a path names.
type refFunc func(c *call) (engine.CustomerRef, error)

// refParam reads {id} (own or external id) or, strict, {external_id}.
func refParam(strict bool) refFunc {
	name := "id"
	if strict {
		name = "external_id"
	}
	return func(c *call) (engine.CustomerRef, error) {
		v, ok := c.pathParam(name)
		if !ok || v == "" {
			return engine.CustomerRef{}, engine.NotFound("customer not found")
		}
		return engine.CustomerRef{Value: v, Strict: strict}, nil
	}
}

// listCustomers answers GET /v1/customers.
func (s *Server) listCustomers(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	page, err := s.customers.List(c.reqContext(), c.scope, c.query("search"), c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// createCustomer answers POST /v1/customers with 201.
func (s *Server) createCustomer(c *call) error {
	var in engine.CreateCustomerInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cust, err := s.customers.Create(c.reqContext(), c.scope, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, cust)
}

// getCustomer answers GET of one customer.
func (s *Server) getCustomer(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		cust, err := s.customers.Get(c.reqContext(), c.scope, r)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, cust)
	}
}

// patchCustomer answers PATCH of one customer with 200.
func (s *Server) patchCustomer(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		var in engine.UpdateCustomerInput
		if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
			return err
		}
		cust, err := s.customers.Update(c.reqContext(), c.scope, r, in)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, cust)
	}
}

// deleteCustomer answers DELETE of one customer with 204 and no body, like
// every other delete here (interface.md leaves the status open).
func (s *Server) deleteCustomer(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		if err := s.customers.Delete(c.reqContext(), c.scope, r); err != nil {
			return err
		}
		return c.noContent()
	}
}
