package api

import (
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// listWebhookEvents answers GET /v1/webhooks/events: the tenant's events in
// both environments, newest first, each with its attempts.
func (s *Server) listWebhookEvents(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	page, err := s.webhooks.List(c.reqContext(), c.scope, engine.ListEventsInput{
		Status: c.query("status"), EventType: c.query("event_type"), Cursor: c.query("cursor"), Limit: limit,
	})
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// redeliverWebhookEvent answers POST /v1/webhooks/events/{id}/redeliver.
func (s *Server) redeliverWebhookEvent(c *call) error {
	id, _ := c.pathParam("id")
	e, err := s.webhooks.Redeliver(c.reqContext(), c.scope, id)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, e)
}

// testWebhook answers POST /v1/webhooks/test with 202.
func (s *Server) testWebhook(c *call) error {
	res, err := s.webhooks.Test(c.reqContext(), c.scope, c.idem)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusAccepted, res)
}

// registerWebhooks adds the three webhook routes (docs/spec/interface.md Webhooks).
func (s *Server) registerWebhooks() {
	s.handle("GET", "/v1/webhooks/events", optTenant, s.listWebhookEvents)
	s.handle("POST", "/v1/webhooks/events/{id}/redeliver", optTenant|optIdem, s.redeliverWebhookEvent)
	s.handle("POST", "/v1/webhooks/test", optTenant|optIdem, s.testWebhook)
}
