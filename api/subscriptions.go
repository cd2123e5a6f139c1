package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerSubscriptions adds the subscription routes (docs/spec/addendum.md §6).
func (s *Server) registerSubscriptions() {
	s.handle("POST", "/v1/subscriptions", optTenant|optIdem, s.createSubscription)
	s.handle("GET", "/v1/subscriptions/{id}", optTenant, s.getSubscription)
	s.handle("GET", "/v1/subscriptions/{id}/usage", optTenant, s.subscriptionUsage)
	s.handle("POST", "/v1/subscriptions/{id}/renew", optTenant|optIdem, s.renewSubscription)
	s.handle("POST", "/v1/subscriptions/{id}/cancel", optTenant|optIdem, s.cancelSubscription)
	s.handle("POST", "/v1/subscriptions/{id}/pause", optTenant|optIdem, s.pauseSubscription)
	s.handle("POST", "/v1/subscriptions/{id}/resume", optTenant|optIdem, s.resumeSubscription)
	s.handle("POST", "/v1/subscriptions/{id}/upgrade", optTenant|optIdem, s.upgradeSubscription)
	s.handle("GET", "/v1/customers/{id}/subscriptions", optTenant, s.listSubscriptions)
}

// subscriptionID reads {id} as text; the service answers 404 for anything
// that names no subscription of the scope.
func (c *call) subscriptionID() string {
	v, _ := c.pathParam("id")
	return v
}

// createSubscription answers POST /v1/subscriptions with 201.
func (s *Server) createSubscription(c *call) error {
	var in createSubscriptionPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	sub, err := s.subscriptions.Create(c.reqContext(), c.scope, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, sub)
}

// getSubscription answers GET /v1/subscriptions/{id}.
func (s *Server) getSubscription(c *call) error {
	sub, err := s.subscriptions.Get(c.reqContext(), c.scope, c.subscriptionID())
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, sub)
}

// subscriptionUsage answers GET /v1/subscriptions/{id}/usage?period_start=.
func (s *Server) subscriptionUsage(c *call) error {
	rep, err := s.subscriptions.Usage(c.reqContext(), c.scope, c.subscriptionID(), c.query("period_start"))
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, rep)
}

// listSubscriptions answers GET /v1/customers/{id}/subscriptions, newest first.
func (s *Server) listSubscriptions(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	ref, err := refParam(false)(c)
	if err != nil {
		return err
	}
	page, err := s.subscriptions.List(c.reqContext(), c.scope, ref, c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// renewSubscription answers POST /v1/subscriptions/{id}/renew.
func (s *Server) renewSubscription(c *call) error {
	return s.subscriptionReply(c, func() (engine.Subscription, error) {
		return s.subscriptions.Renew(c.reqContext(), c.scope, c.subscriptionID())
	})
}

// cancelSubscription answers POST /v1/subscriptions/{id}/cancel; the body
// {at_period_end} is optional.
func (s *Server) cancelSubscription(c *call) error {
	var in cancelPayload
	if body := c.ctx.Request.Body(); len(body) > 0 {
		if err := decodeBody(body, &in); err != nil {
			return err
		}
	}
	return s.subscriptionReply(c, func() (engine.Subscription, error) {
		return s.subscriptions.Cancel(c.reqContext(), c.scope, c.subscriptionID(), in.toCommand())
	})
}

// pauseSubscription answers POST /v1/subscriptions/{id}/pause.
func (s *Server) pauseSubscription(c *call) error {
	return s.subscriptionReply(c, func() (engine.Subscription, error) {
		return s.subscriptions.Pause(c.reqContext(), c.scope, c.subscriptionID())
	})
}

// resumeSubscription answers POST /v1/subscriptions/{id}/resume.
func (s *Server) resumeSubscription(c *call) error {
	return s.subscriptionReply(c, func() (engine.Subscription, error) {
		return s.subscriptions.Resume(c.reqContext(), c.scope, c.subscriptionID())
	})
}

// upgradeSubscription answers POST /v1/subscriptions/{id}/upgrade.
func (s *Server) upgradeSubscription(c *call) error {
	var in upgradePayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	return s.subscriptionReply(c, func() (engine.Subscription, error) {
		return s.subscriptions.Upgrade(c.reqContext(), c.scope, c.subscriptionID(), cmd)
	})
}

func (s *Server) subscriptionReply(c *call, fn func() (engine.Subscription, error)) error {
	sub, err := fn()
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, sub)
}

// createSubscriptionPayload is the body of POST /v1/subscriptions.
type createSubscriptionPayload struct {
	CustomerID    *string         `json:"customer_id"`
	PlanVariantID *string         `json:"plan_variant_id"`
	Metadata      engine.Metadata `json:"metadata"`
}

// toCommand checks the body, naming the first wrong member; the ids are
// resolved (or not found) by the engine.
func (in *createSubscriptionPayload) toCommand() (engine.CreateSubscription, error) {
	if in.CustomerID == nil || *in.CustomerID == "" {
		return engine.CreateSubscription{}, engine.Invalid("customer_id", "customer_id is required")
	}
	if in.PlanVariantID == nil || *in.PlanVariantID == "" {
		return engine.CreateSubscription{}, engine.Invalid("plan_variant_id", "plan_variant_id is required")
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.CreateSubscription{}, err
	}
	return engine.CreateSubscription{CustomerID: *in.CustomerID, PlanVariantID: *in.PlanVariantID, Metadata: meta}, nil
}

// cancelPayload is the optional body of POST /v1/subscriptions/{id}/cancel.
type cancelPayload struct {
	AtPeriodEnd *bool `json:"at_period_end"`
}

// toCommand reads the body; an absent at_period_end cancels now.
func (in *cancelPayload) toCommand() engine.CancelSubscription {
	return engine.CancelSubscription{AtPeriodEnd: in.AtPeriodEnd != nil && *in.AtPeriodEnd}
}

// upgradePayload is the body of POST /v1/subscriptions/{id}/upgrade.
type upgradePayload struct {
	PlanVariantID *string `json:"plan_variant_id"`
}

// toCommand checks the body; the variant is resolved by the engine.
func (in *upgradePayload) toCommand() (engine.UpgradeSubscription, error) {
	if in.PlanVariantID == nil || *in.PlanVariantID == "" {
		return engine.UpgradeSubscription{}, engine.Invalid("plan_variant_id", "plan_variant_id is required")
	}
	return engine.UpgradeSubscription{PlanVariantID: *in.PlanVariantID}, nil
}
