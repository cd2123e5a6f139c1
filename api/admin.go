package api

import (
	"time"

	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// errTenantNotFound answers an admin path whose tenant id is not a UUID.
var errTenantNotFound = engine.NotFound("tenant not found")

// tenantID reads {id} of an admin path; a non-UUID is a 404 like an unknown one.
func (c *call) tenantID() (uuid.UUID, error) {
	return c.uuidParam("id", errTenantNotFound)
}

func (c *call) uuidParam(name string, notFound error) (uuid.UUID, error) {
	v, ok := c.pathParam(name)
	if !ok {
		return uuid.Nil, notFound
	}
	id, err := uuid.Parse(v)
	if err != nil {
		return uuid.Nil, notFound
	}
	return id, nil
}

// newTenantInput is the body of POST /admin/v1/tenants.
type newTenantInput struct {
	Name *string `json:"name"`
}

// adminCreateTenant answers POST /admin/v1/tenants with 201 and both keys.
func (s *Server) adminCreateTenant(c *call) error {
	var in newTenantInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	name := ""
	if in.Name != nil {
		name = *in.Name
	}
	res, err := s.tenants.Create(c.reqContext(), name)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, res)
}

// adminGetTenant answers GET /admin/v1/tenants/{id}.
func (s *Server) adminGetTenant(c *call) error {
	id, err := c.tenantID()
	if err != nil {
		return err
	}
	t, err := s.tenants.Get(c.reqContext(), id)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, engine.ConfigOf(t))
}

// adminListTenants answers GET /admin/v1/tenants: every tenant with its
// configuration, oldest first, paged as the tenant API's lists.
func (s *Server) adminListTenants(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	page, err := s.tenants.List(c.reqContext(), c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// adminListKeys answers GET /admin/v1/tenants/{id}/api-keys: the tenant's
// keys without their text, revoked ones with revoked_at.
func (s *Server) adminListKeys(c *call) error {
	id, err := c.tenantID()
	if err != nil {
		return err
	}
	keys, err := s.tenants.Keys(c.reqContext(), id)
	if err != nil {
		return err
	}
	if keys == nil {
		keys = []engine.APIKey{}
	}
	return c.json(fasthttp.StatusOK, map[string]any{"data": keys})
}

// adminPatchTenant answers PATCH /admin/v1/tenants/{id}: the rate limit.
func (s *Server) adminPatchTenant(c *call) error {
	id, err := c.tenantID()
	if err != nil {
		return err
	}
	var in RateLimitPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.ToCommand()
	if err != nil {
		return err
	}
	cfg, err := s.tenants.SetRateLimit(c.reqContext(), id, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, cfg)
}

// newKeyInput is the body of POST /admin/v1/tenants/{id}/api-keys.
type newKeyInput struct {
	Environment *string `json:"environment"`
}

// newKeyBody is the 201 body: the plain key appears here and nowhere else.
type newKeyBody struct {
	ID          uuid.UUID          `json:"id"`
	Key         string             `json:"key"`
	Environment engine.Environment `json:"environment"`
	CreatedAt   time.Time          `json:"created_at"`
}

// adminCreateKey answers POST /admin/v1/tenants/{id}/api-keys with 201.
func (s *Server) adminCreateKey(c *call) error {
	id, err := c.tenantID()
	if err != nil {
		return err
	}
	var in newKeyInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	if in.Environment == nil {
		return engine.Invalid("environment", "environment is required: live or sandbox")
	}
	k, err := s.tenants.CreateKey(c.reqContext(), id, engine.Environment(*in.Environment))
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, newKeyBody{ID: k.ID, Key: k.Key, Environment: k.Environment, CreatedAt: k.CreatedAt})
}

// adminRevokeKey answers DELETE /admin/v1/tenants/{id}/api-keys/{key_id} with 204.
func (s *Server) adminRevokeKey(c *call) error {
	id, err := c.tenantID()
	if err != nil {
		return err
	}
	keyID, err := c.uuidParam("key_id", engine.NotFound("api key not found"))
	if err != nil {
		return err
	}
	if err := s.tenants.RevokeKey(c.reqContext(), id, keyID); err != nil {
		return err
	}
	return c.noContent()
}

// adminSetWebhook answers PUT .../webhook with the URL and signing secret.
func (s *Server) adminSetWebhook(c *call) error {
	id, err := c.tenantID()
	if err != nil {
		return err
	}
	var in WebhookPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	target, err := in.ToCommand()
	if err != nil {
		return err
	}
	wh, err := s.tenants.SetWebhook(c.reqContext(), id, target)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, wh)
}

// adminRotateSecret answers POST .../webhook/rotate-secret with the new secret.
func (s *Server) adminRotateSecret(c *call) error {
	id, err := c.tenantID()
	if err != nil {
		return err
	}
	wh, err := s.tenants.RotateSecret(c.reqContext(), id)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, wh)
}

// adminDeleteWebhook answers DELETE .../webhook with 204.
func (s *Server) adminDeleteWebhook(c *call) error {
	id, err := c.tenantID()
	if err != nil {
		return err
	}
	if err := s.tenants.DeleteWebhook(c.reqContext(), id); err != nil {
		return err
	}
	return c.noContent()
}
