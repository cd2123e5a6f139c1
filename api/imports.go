package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerImports adds POST /v1/import (addendum 7).
func (s *Server) registerImports() {
	s.handle("POST", "/v1/import", optTenant|optIdem, s.importCustomers)
}

// importCustomers answers POST /v1/import with 200 {created, skipped, errors}.
func (s *Server) importCustomers(c *call) error {
	var in engine.ImportInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	res, err := s.imports.Import(c.reqContext(), c.scope, c.tenant, c.idem, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, res)
}
