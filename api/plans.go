package api

import (
	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerPlans adds the product catalogue routes (docs/spec/interface.md Plans,
// docs/spec/addendum.md §5).
func (s *Server) registerPlans() {
	s.handle("GET", "/v1/plans", optTenant, s.listPlans)
	s.handle("POST", "/v1/plans", optTenant|optIdem, s.createPlan)
	s.handle("GET", "/v1/plans/{id}", optTenant, s.getPlan)
	s.handle("PATCH", "/v1/plans/{id}", optTenant|optIdem, s.patchPlan)
	s.handle("GET", "/v1/plans/{id}/variants", optTenant, s.listVariants)
	s.handle("POST", "/v1/plans/{id}/variants", optTenant|optIdem, s.createVariant)
	s.handle("PATCH", "/v1/plans/{id}/variants/{vid}", optTenant|optIdem, s.patchVariant)
	s.handle("POST", "/v1/plans/{id}/variants/{vid}/grants", optTenant|optIdem, s.createPlanGrant)
	s.handle("POST", "/v1/plans/{id}/variants/{vid}/entitlements", optTenant|optIdem, s.putVariantEntitlement)
	s.handle("GET", "/v1/plan-variants/{id}", optTenant, s.getVariant)
}

// idParam reads a UUID path parameter; anything else names nothing that
// exists, so it is the 404 of what.
func (c *call) idParam(name, what string) (uuid.UUID, error) {
	v, ok := c.pathParam(name)
	if !ok {
		return uuid.UUID{}, engine.NotFound(what + " not found")
	}
	id, err := uuid.Parse(v)
	if err != nil {
		return uuid.UUID{}, engine.NotFound(what + " not found")
	}
	return id, nil
}

// variantList is the body of GET /v1/plans/{id}/variants: no paging.
type variantList struct {
	Data []engine.PlanVariant `json:"data"`
}

// listPlans answers GET /v1/plans: active plans, retired ones too with
// status=retired, newest first, variants nested with include_variants=true.
func (s *Server) listPlans(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	withRetired := false
	switch c.query("status") {
	case "", string(engine.PlanActive):
	case string(engine.PlanRetired):
		withRetired = true
	default:
		return engine.BadRequest("status", "status must be active or retired")
	}
	withVariants, err := c.queryBool("include_variants")
	if err != nil {
		return err
	}
	page, err := s.plans.ListPlans(c.reqContext(), c.scope, withRetired, withVariants, c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// createPlan answers POST /v1/plans with 201.
func (s *Server) createPlan(c *call) error {
	var in CreatePlanPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.ToCommand()
	if err != nil {
		return err
	}
	p, err := s.plans.CreatePlan(c.reqContext(), c.scope, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, p)
}

// getPlan answers GET /v1/plans/{id}, never with variants.
func (s *Server) getPlan(c *call) error {
	id, err := c.idParam("id", "plan")
	if err != nil {
		return err
	}
	p, err := s.plans.GetPlan(c.reqContext(), c.scope, id)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, p)
}

// patchPlan answers PATCH /v1/plans/{id} with 200.
func (s *Server) patchPlan(c *call) error {
	id, err := c.idParam("id", "plan")
	if err != nil {
		return err
	}
	var in UpdatePlanPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.ToCommand()
	if err != nil {
		return err
	}
	p, err := s.plans.UpdatePlan(c.reqContext(), c.scope, id, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, p)
}

// listVariants answers GET /v1/plans/{id}/variants: oldest first, both
// statuses, no grants; an unknown (or malformed) plan id has no variants.
func (s *Server) listVariants(c *call) error {
	out := variantList{Data: []engine.PlanVariant{}}
	id, err := c.idParam("id", "plan")
	if err != nil {
		return c.json(fasthttp.StatusOK, out)
	}
	if out.Data, err = s.plans.ListVariants(c.reqContext(), c.scope, id); err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, out)
}

// createVariant answers POST /v1/plans/{id}/variants with 201.
func (s *Server) createVariant(c *call) error {
	id, err := c.idParam("id", "plan")
	if err != nil {
		return err
	}
	var in CreateVariantPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.ToCommand()
	if err != nil {
		return err
	}
	v, err := s.plans.CreateVariant(c.reqContext(), c.scope, id, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, v)
}

// planAndVariant reads {id} and {vid}; either malformed is the variant's 404.
func (c *call) planAndVariant() (planID, variantID uuid.UUID, err error) {
	if planID, err = c.idParam("id", "plan variant"); err != nil {
		return
	}
	variantID, err = c.idParam("vid", "plan variant")
	return
}

// patchVariant answers PATCH /v1/plans/{id}/variants/{vid} with 200.
func (s *Server) patchVariant(c *call) error {
	planID, variantID, err := c.planAndVariant()
	if err != nil {
		return err
	}
	var in UpdateVariantPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.ToCommand()
	if err != nil {
		return err
	}
	v, err := s.plans.UpdateVariant(c.reqContext(), c.scope, planID, variantID, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, v)
}

// createPlanGrant answers POST /v1/plans/{id}/variants/{vid}/grants with 201.
func (s *Server) createPlanGrant(c *call) error {
	planID, variantID, err := c.planAndVariant()
	if err != nil {
		return err
	}
	var in PlanGrantPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.ToCommand()
	if err != nil {
		return err
	}
	g, err := s.plans.CreateGrant(c.reqContext(), c.scope, planID, variantID, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, g)
}

// putVariantEntitlement answers POST /v1/plans/{id}/variants/{vid}/entitlements
// with 201, replacing the metric's previous entitlement on the variant.
func (s *Server) putVariantEntitlement(c *call) error {
	planID, variantID, err := c.planAndVariant()
	if err != nil {
		return err
	}
	var in entitlementPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	e, err := s.plans.PutEntitlement(c.reqContext(), c.scope, planID, variantID, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, e)
}

// getVariant answers GET /v1/plan-variants/{id}: the variant with its
// grants and entitlements.
func (s *Server) getVariant(c *call) error {
	id, err := c.idParam("id", "plan variant")
	if err != nil {
		return err
	}
	v, err := s.plans.Variant(c.reqContext(), c.scope, id)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, v)
}
