package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// getTenant answers GET /v1/tenant from a fresh read, not the auth cache,
// so a change made a moment ago shows.
func (s *Server) getTenant(c *call) error {
	t, err := s.tenants.Get(c.reqContext(), c.scope.TenantID)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, engine.ConfigOf(t))
}

// patchTenant answers PATCH /v1/tenant (addendum 2).
func (s *Server) patchTenant(c *call) error {
	var in engine.TenantConfigInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cfg, err := s.tenants.UpdateConfig(c.reqContext(), c.scope.TenantID, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, cfg)
}
