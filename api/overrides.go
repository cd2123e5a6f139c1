package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerOverrides adds the override routes (interface.md Overrides). The
// DELETE is idempotent too (Common rules 1: "and on override DELETE").
func (s *Server) registerOverrides() {
	s.handle("GET", "/v1/subscriptions/{id}/overrides", optTenant, s.listOverrides)
	s.handle("POST", "/v1/subscriptions/{id}/overrides", optTenant|optIdem, s.createOverride)
	s.handle("PATCH", "/v1/subscriptions/{id}/overrides/{billable_metric_key}", optTenant|optIdem, s.patchOverride)
	s.handle("DELETE", "/v1/subscriptions/{id}/overrides/{billable_metric_key}", optTenant|optIdem, s.deleteOverride)
}

// overrideList is the body of GET /v1/subscriptions/{id}/overrides: no paging.
type overrideList struct {
	Overrides []engine.Override `json:"overrides"`
}

// overrideKey reads the {billable_metric_key} path parameter; a malformed
// one names no override.
func (c *call) overrideKey() (string, error) {
	v, ok := c.pathParam("billable_metric_key")
	if !ok || v == "" {
		return "", engine.NotFound("override not found")
	}
	return v, nil
}

// decodeOverrideBody decodes an override body; the spec lists only 400s
// for override bodies, so a member of the wrong JSON type is one too.
func decodeOverrideBody(body []byte, v any) error {
	err := decodeBody(body, v)
	if e, ok := engine.AsError(err); ok && e.Kind == engine.KindValidation {
		return engine.BadRequest(e.Field, e.Detail)
	}
	return err
}

// listOverrides answers GET /v1/subscriptions/{id}/overrides.
func (s *Server) listOverrides(c *call) error {
	id, err := c.idParam("id", "subscription")
	if err != nil {
		return err
	}
	list, err := s.overrides.List(c.reqContext(), c.scope, id)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, overrideList{Overrides: list})
}

// createOverride answers POST /v1/subscriptions/{id}/overrides with 201.
func (s *Server) createOverride(c *call) error {
	id, err := c.idParam("id", "subscription")
	if err != nil {
		return err
	}
	var in engine.CreateOverrideInput
	if err := decodeOverrideBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	o, err := s.overrides.Create(c.reqContext(), c.scope, id, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, o)
}

// patchOverride answers PATCH /v1/subscriptions/{id}/overrides/{key} with 200.
func (s *Server) patchOverride(c *call) error {
	id, err := c.idParam("id", "subscription")
	if err != nil {
		return err
	}
	key, err := c.overrideKey()
	if err != nil {
		return err
	}
	var in engine.UpdateOverrideInput
	if err := decodeOverrideBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	o, err := s.overrides.Update(c.reqContext(), c.scope, id, key, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, o)
}

// deleteOverride answers DELETE /v1/subscriptions/{id}/overrides/{key} with 204.
func (s *Server) deleteOverride(c *call) error {
	id, err := c.idParam("id", "subscription")
	if err != nil {
		return err
	}
	key, err := c.overrideKey()
	if err != nil {
		return err
	}
	if err := s.overrides.Delete(c.reqContext(), c.scope, id, key); err != nil {
		return err
	}
	return c.noContent()
}
