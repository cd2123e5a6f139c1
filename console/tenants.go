package console

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/creditd/creditd/api"
	"github.com/creditd/creditd/engine"
)

// tenantsView is the operator's tenant list.
type tenantsView struct {
	Tenants    []engine.Tenant
	NextCursor string
}

// tenantsPage lists every tenant, newest first, with the create form.
func (c *Console) tenantsPage(w http.ResponseWriter, r *http.Request) {
	page, err := c.cfg.Directory.TenantsNewestFirst(r.Context(), r.URL.Query().Get("cursor"), pageSize)
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "tenants", "Tenants", tenantsView{Tenants: page.Data, NextCursor: page.NextCursor}, 0)
}

// createTenant creates a tenant and shows its two keys once.
func (c *Console) createTenant(w http.ResponseWriter, r *http.Request) {
	res, err := c.cfg.Tenants.Create(r.Context(), strings.TrimSpace(r.PostFormValue("name")))
	if err != nil {
		c.backErr(w, r, Prefix+"/tenants", err)
		return
	}
	c.back(w, r, Prefix+"/tenants/"+res.Tenant.ID.String(), flash{
		Message: "Tenant created. Copy its keys now: they are shown only once.",
		Secret:  "live: " + res.APIKeys.Live + "\nsandbox: " + res.APIKeys.Sandbox,
	})
}

// tenantView is one tenant's configuration page.
type tenantView struct {
	Tenant engine.Tenant
	Keys   []engine.APIKey
}

// tenantPage shows a tenant's configuration, keys, rate limit and webhook.
func (c *Console) tenantPage(w http.ResponseWriter, r *http.Request) {
	id, ok := c.tenantID(w, r)
	if !ok {
		return
	}
	t, err := c.cfg.Tenants.Get(r.Context(), id)
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	keys, err := c.cfg.Directory.ListAPIKeys(r.Context(), id)
	if err != nil {
		c.engineError(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "tenant", t.Name, tenantView{Tenant: t, Keys: keys}, 0)
}

// tenantID is the {tenant} path value; a malformed one is a 404.
func (c *Console) tenantID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("tenant"))
	if err != nil {
		c.notFound(w, r)
		return uuid.UUID{}, false
	}
	return id, true
}

func tenantURL(id uuid.UUID) string { return Prefix + "/tenants/" + id.String() }

// createKey makes a key in the posted environment and shows it once.
func (c *Console) createKey(w http.ResponseWriter, r *http.Request) {
	id, ok := c.tenantID(w, r)
	if !ok {
		return
	}
	k, err := c.cfg.Tenants.CreateKey(r.Context(), id, engine.Environment(r.PostFormValue("environment")))
	if err != nil {
		c.backErr(w, r, tenantURL(id), err)
		return
	}
	c.back(w, r, tenantURL(id), flash{Message: "Key created. Copy it now: it is shown only once.", Secret: k.Key})
}

// revokeKey revokes a key; requests with it get 401 at once.
func (c *Console) revokeKey(w http.ResponseWriter, r *http.Request) {
	id, ok := c.tenantID(w, r)
	if !ok {
		return
	}
	kid, err := uuid.Parse(r.PathValue("key"))
	if err != nil {
		c.notFound(w, r)
		return
	}
	if err := c.cfg.Tenants.RevokeKey(r.Context(), id, kid); err != nil {
		c.backErr(w, r, tenantURL(id), err)
		return
	}
	c.back(w, r, tenantURL(id), flash{Message: "Key revoked."})
}

// setRateLimit sets the tenant's per-key rate limit and burst.
func (c *Console) setRateLimit(w http.ResponseWriter, r *http.Request) {
	id, ok := c.tenantID(w, r)
	if !ok {
		return
	}
	var in api.RateLimitPayload
	for field, dst := range map[string]**int{"rate_limit_per_second": &in.PerSecond, "rate_limit_burst": &in.Burst} {
		v := strings.TrimSpace(r.PostFormValue(field))
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			c.back(w, r, tenantURL(id), flash{Message: field + ": a whole number is required", Error: true})
			return
		}
		*dst = &n
	}
	cmd, err := in.ToCommand()
	if err != nil {
		c.backErr(w, r, tenantURL(id), err)
		return
	}
	if _, err := c.cfg.Tenants.SetRateLimit(r.Context(), id, cmd); err != nil {
		c.backErr(w, r, tenantURL(id), err)
		return
	}
	c.back(w, r, tenantURL(id), flash{Message: "Rate limit saved."})
}

// setWebhook sets (or, when empty, removes) the webhook URL; a new URL
// gets a new signing secret, shown once.
func (c *Console) setWebhook(w http.ResponseWriter, r *http.Request) {
	id, ok := c.tenantID(w, r)
	if !ok {
		return
	}
	to := returnTo(r, tenantURL(id))
	raw := strings.TrimSpace(r.PostFormValue("url"))
	if raw == "" {
		if err := c.cfg.Tenants.DeleteWebhook(r.Context(), id); err != nil {
			c.backErr(w, r, to, err)
			return
		}
		c.back(w, r, to, flash{Message: "Webhook removed."})
		return
	}
	hadSecret := false
	if t, err := c.cfg.Tenants.Get(r.Context(), id); err == nil {
		hadSecret = t.WebhookSecret != nil && *t.WebhookSecret != ""
	}
	target, err := (&api.WebhookPayload{URL: &raw}).ToCommand()
	if err != nil {
		c.backErr(w, r, to, err)
		return
	}
	wh, err := c.cfg.Tenants.SetWebhook(r.Context(), id, target)
	if err != nil {
		c.backErr(w, r, to, err)
		return
	}
	f := flash{Message: "Webhook URL saved."}
	if !hadSecret && wh.Secret != nil {
		f = flash{Message: "Webhook URL saved. Copy the signing secret now: it is shown only once.", Secret: *wh.Secret}
	}
	c.back(w, r, to, f)
}

// rotateSecret replaces the webhook signing secret and shows it once.
func (c *Console) rotateSecret(w http.ResponseWriter, r *http.Request) {
	id, ok := c.tenantID(w, r)
	if !ok {
		return
	}
	to := returnTo(r, tenantURL(id))
	wh, err := c.cfg.Tenants.RotateSecret(r.Context(), id)
	if err != nil {
		c.backErr(w, r, to, err)
		return
	}
	secret := ""
	if wh.Secret != nil {
		secret = *wh.Secret
	}
	c.back(w, r, to, flash{Message: "Signing secret rotated. Copy it now: it is shown only once.", Secret: secret})
}

// returnTo is the form's "back" field when it is a console path, else def:
// only a path under the console is followed, never another site.
func returnTo(r *http.Request, def string) string {
	b := r.PostFormValue("back")
	if strings.HasPrefix(b, Prefix+"/") && !strings.ContainsAny(b, "\\\r\n") && !strings.HasPrefix(b, Prefix+"//") && !strings.Contains(b, "/../") {
		return b
	}
	return def
}
