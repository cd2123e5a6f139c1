package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerSubscriptions adds the subscription routes (addendum 6).
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
	var in engine.CreateSubscriptionInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	sub, err := s.subscriptions.Create(c.reqContext(), c.scope, in)
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
	var in engine.CancelInput
	if body := c.ctx.Request.Body(); len(body) > 0 {
		if err := decodeBody(body, &in); err != nil {
			return err
		}
	}
	return s.subscriptionReply(c, func() (engine.Subscription, error) {
		return s.subscriptions.Cancel(c.reqContext(), c.scope, c.subscriptionID(), in)
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
	var in engine.UpgradeInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	return s.subscriptionReply(c, func() (engine.Subscription, error) {
		return s.subscriptions.Upgrade(c.reqContext(), c.scope, c.subscriptionID(), in)
	})
}

func (s *Server) subscriptionReply(c *call, fn func() (engine.Subscription, error)) error {
	sub, err := fn()
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, sub)
}
