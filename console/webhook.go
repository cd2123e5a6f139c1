package console

import (
	"net/http"

	"github.com/creditd/creditd/engine"
)

// webhookView is the webhook endpoint and its event log.
type webhookView struct {
	URL        string
	HasSecret  bool
	Events     []engine.Event
	NextCursor string
	Status     string
	EventType  string
	// Statuses are the event log's status filters.
	Statuses []engine.EventStatus
	// TenantURL is the operator's tenant page (URL changes go there).
	TenantURL string
	// Back is this page's path, for forms that return here.
	Back string
}

// webhookPage shows the endpoint, the test ping and the event log with
// every delivery attempt (newest events first, cursor paged).
func (c *Console) webhookPage(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	status, typ := r.URL.Query().Get("status"), r.URL.Query().Get("event_type")
	page, err := c.cfg.Webhooks.List(r.Context(), p.scope, engine.ListEventsInput{
		Status: status, EventType: typ, Cursor: r.URL.Query().Get("cursor"), Limit: pageSize,
	})
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	v := webhookView{
		Events: page.Data, NextCursor: page.NextCursor, Status: status, EventType: typ,
		Statuses:  []engine.EventStatus{engine.EventPending, engine.EventDelivered, engine.EventFailed, engine.EventDeadLetter},
		TenantURL: tenantURL(p.scope.TenantID), Back: scopeBase(p) + "/webhook",
	}
	t := p.tenant
	if t.WebhookURL != nil {
		v.URL = *t.WebhookURL
	}
	v.HasSecret = t.WebhookSecret != nil && *t.WebhookSecret != ""
	c.render(w, r, http.StatusOK, "webhook", "Webhook", v, 0)
}

// testPing queues a test.ping event; its deliveries show in the log.
func (c *Console) testPing(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	to := scopeBase(p) + "/webhook"
	res, err := c.cfg.Webhooks.Test(r.Context(), p.scope, engine.Idempotency{Key: "console-ping-" + randomToken()})
	if err != nil {
		c.backErr(w, r, to, err)
		return
	}
	c.back(w, r, to, flash{Message: "Test ping " + res.EventID.String() + " queued."})
}

// redeliver sends a dead-lettered event again, from a fresh attempt count.
func (c *Console) redeliver(w http.ResponseWriter, r *http.Request) {
	p := principalOf(r)
	to := scopeBase(p) + "/webhook"
	e, err := c.cfg.Webhooks.Redeliver(r.Context(), p.scope, r.PathValue("event"))
	if err != nil {
		c.backErr(w, r, to, err)
		return
	}
	c.back(w, r, to, flash{Message: "Event " + e.ID.String() + " queued for redelivery."})
}
