package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/api"
	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/persist"
)

// operator is what the tenant, key, webhook and rate-limit commands do:
// over the /admin/v1 API of a running creditd (adminAPI) or straight on
// the database (directOperator, --direct). Each result is printed as JSON,
// the same shape either way.
type operator interface {
	CreateTenant(ctx context.Context, name string) (any, error)
	GetTenant(ctx context.Context, tenant uuid.UUID) (any, error)
	CreateKey(ctx context.Context, tenant uuid.UUID, env engine.Environment) (any, error)
	RevokeKey(ctx context.Context, tenant, key uuid.UUID) (any, error)
	SetWebhook(ctx context.Context, tenant uuid.UUID, rawURL string) (any, error)
	RotateSecret(ctx context.Context, tenant uuid.UUID) (any, error)
	DeleteWebhook(ctx context.Context, tenant uuid.UUID) (any, error)
	SetRateLimit(ctx context.Context, tenant uuid.UUID, perSecond, burst int) (any, error)
}

// lister is what tenant list and key list read: the admin API's list
// routes (adminAPI) or the database (directLister, --direct).
type lister interface {
	ListTenants(ctx context.Context, after uuid.UUID, limit int) ([]engine.TenantConfig, error)
	ListAPIKeys(ctx context.Context, tenant uuid.UUID) ([]engine.APIKey, error)
}

// directLister lists from the database.
type directLister struct{ store *persist.Store }

func (d directLister) ListTenants(ctx context.Context, after uuid.UUID, limit int) ([]engine.TenantConfig, error) {
	ts, err := d.store.ListTenants(ctx, after, limit)
	if err != nil {
		return nil, err
	}
	out := make([]engine.TenantConfig, len(ts))
	for i, t := range ts {
		out[i] = engine.ConfigOf(t)
	}
	return out, nil
}

func (d directLister) ListAPIKeys(ctx context.Context, tenant uuid.UUID) ([]engine.APIKey, error) {
	return d.store.ListAPIKeys(ctx, tenant)
}

// revoked and deleted are what the CLI prints for the API's 204s.
type revoked struct {
	Revoked uuid.UUID `json:"revoked"`
}
type deleted struct {
	Deleted string `json:"deleted"`
}

// directOperator runs the operations with the engine on the database. It
// moves no change stamps (it has no Redis), so a running creditd sees a
// revoked key within its key cache's TTL and stale limit (7 s), not at once
// as through the admin API (docs/decisions.md, issue 25).
type directOperator struct {
	tenants *engine.Tenants
}

func newDirectOperator(store *persist.Store, allowPrivate bool) directOperator {
	return directOperator{tenants: engine.NewTenants(store, nil, engine.SystemClock{}, allowPrivate)}
}

func (d directOperator) CreateTenant(ctx context.Context, name string) (any, error) {
	return d.tenants.Create(ctx, name)
}

func (d directOperator) GetTenant(ctx context.Context, tenant uuid.UUID) (any, error) {
	t, err := d.tenants.Get(ctx, tenant)
	if err != nil {
		return nil, err
	}
	return engine.ConfigOf(t), nil
}

// newKey is the admin API's 201 body of a key: the text appears only here.
type newKey struct {
	ID          uuid.UUID          `json:"id"`
	Key         string             `json:"key"`
	Environment engine.Environment `json:"environment"`
	CreatedAt   time.Time          `json:"created_at"`
}

func (d directOperator) CreateKey(ctx context.Context, tenant uuid.UUID, env engine.Environment) (any, error) {
	k, err := d.tenants.CreateKey(ctx, tenant, env)
	if err != nil {
		return nil, err
	}
	return newKey{ID: k.ID, Key: k.Key, Environment: k.Environment, CreatedAt: k.CreatedAt}, nil
}

func (d directOperator) RevokeKey(ctx context.Context, tenant, key uuid.UUID) (any, error) {
	if err := d.tenants.RevokeKey(ctx, tenant, key); err != nil {
		return nil, err
	}
	return revoked{Revoked: key}, nil
}

func (d directOperator) SetWebhook(ctx context.Context, tenant uuid.UUID, rawURL string) (any, error) {
	target, err := (&api.WebhookPayload{URL: &rawURL}).ToCommand()
	if err != nil {
		return nil, err
	}
	return d.tenants.SetWebhook(ctx, tenant, target)
}

func (d directOperator) RotateSecret(ctx context.Context, tenant uuid.UUID) (any, error) {
	return d.tenants.RotateSecret(ctx, tenant)
}

func (d directOperator) DeleteWebhook(ctx context.Context, tenant uuid.UUID) (any, error) {
	if err := d.tenants.DeleteWebhook(ctx, tenant); err != nil {
		return nil, err
	}
	return deleted{Deleted: "webhook"}, nil
}

func (d directOperator) SetRateLimit(ctx context.Context, tenant uuid.UUID, perSecond, burst int) (any, error) {
	cmd, err := (&api.RateLimitPayload{PerSecond: &perSecond, Burst: &burst}).ToCommand()
	if err != nil {
		return nil, err
	}
	return d.tenants.SetRateLimit(ctx, tenant, cmd)
}

// adminAPI runs the operations through /admin/v1 of the creditd at base
// (CREDITD_URL) with the operator token.
type adminAPI struct {
	base   string
	token  string
	client *http.Client
}

// adminTimeout bounds one admin API call.
const adminTimeout = 30 * time.Second

func newAdminAPI(base, token string) (adminAPI, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return adminAPI{}, fmt.Errorf("CREDITD_URL=%q: want an http:// or https:// URL such as http://127.0.0.1:8080", base)
	}
	if token == "" {
		return adminAPI{}, errors.New("CREDITD_ADMIN_TOKEN is not set: the admin API needs the operator token (or use --direct to work on DATABASE_URL)")
	}
	return adminAPI{base: strings.TrimRight(base, "/"), token: token, client: &http.Client{Timeout: adminTimeout}}, nil
}

// problem is an RFC 9457 answer of the API.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Field  string `json:"field"`
}

// call sends one request; a 2xx body comes back as raw JSON (nil for 204),
// anything else as an error carrying the problem's status, type and detail.
func (a adminAPI) call(ctx context.Context, method, path string, body any) (json.RawMessage, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+"/admin/v1"+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := a.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API at %s: %w", a.base, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("admin API at %s: %w", a.base, err)
	}
	if res.StatusCode >= 200 && res.StatusCode < 300 {
		if len(b) == 0 {
			return nil, nil
		}
		return json.RawMessage(b), nil
	}
	var p problem
	if json.Unmarshal(b, &p) != nil || p.Type == "" {
		return nil, fmt.Errorf("admin API: %s %s: %s", method, path, res.Status)
	}
	msg := fmt.Sprintf("admin API: %d %s: %s", res.StatusCode, p.Type, p.Detail)
	if p.Field != "" {
		msg += " (field " + p.Field + ")"
	}
	return nil, errors.New(msg)
}

func tenantPath(tenant uuid.UUID) string { return "/tenants/" + tenant.String() }

// adminPageLimit is the admin API's largest page (the tenant API's).
const adminPageLimit = 100

// ListTenants pages GET /admin/v1/tenants until limit tenants or the end.
func (a adminAPI) ListTenants(ctx context.Context, after uuid.UUID, limit int) ([]engine.TenantConfig, error) {
	var out []engine.TenantConfig
	cursor := ""
	if after != uuid.Nil {
		cursor = after.String()
	}
	for len(out) < limit {
		q := url.Values{"limit": {strconv.Itoa(min(adminPageLimit, limit-len(out)))}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		raw, err := a.call(ctx, http.MethodGet, "/tenants?"+q.Encode(), nil)
		if err != nil {
			return nil, err
		}
		var page struct {
			Data       []engine.TenantConfig `json:"data"`
			Pagination struct {
				HasMore    bool    `json:"has_more"`
				NextCursor *string `json:"next_cursor"`
			} `json:"pagination"`
		}
		if err := json.Unmarshal(raw, &page); err != nil {
			return nil, fmt.Errorf("admin API: tenant list: %w", err)
		}
		out = append(out, page.Data...)
		if !page.Pagination.HasMore || page.Pagination.NextCursor == nil {
			break
		}
		cursor = *page.Pagination.NextCursor
	}
	return out, nil
}

// ListAPIKeys reads GET /admin/v1/tenants/{id}/api-keys.
func (a adminAPI) ListAPIKeys(ctx context.Context, tenant uuid.UUID) ([]engine.APIKey, error) {
	raw, err := a.call(ctx, http.MethodGet, tenantPath(tenant)+"/api-keys", nil)
	if err != nil {
		return nil, err
	}
	var list struct {
		Data []engine.APIKey `json:"data"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("admin API: key list: %w", err)
	}
	return list.Data, nil
}

func (a adminAPI) CreateTenant(ctx context.Context, name string) (any, error) {
	return a.call(ctx, http.MethodPost, "/tenants", map[string]string{"name": name})
}

func (a adminAPI) GetTenant(ctx context.Context, tenant uuid.UUID) (any, error) {
	return a.call(ctx, http.MethodGet, tenantPath(tenant), nil)
}

func (a adminAPI) CreateKey(ctx context.Context, tenant uuid.UUID, env engine.Environment) (any, error) {
	return a.call(ctx, http.MethodPost, tenantPath(tenant)+"/api-keys", map[string]string{"environment": string(env)})
}

func (a adminAPI) RevokeKey(ctx context.Context, tenant, key uuid.UUID) (any, error) {
	if _, err := a.call(ctx, http.MethodDelete, tenantPath(tenant)+"/api-keys/"+key.String(), nil); err != nil {
		return nil, err
	}
	return revoked{Revoked: key}, nil
}

func (a adminAPI) SetWebhook(ctx context.Context, tenant uuid.UUID, rawURL string) (any, error) {
	return a.call(ctx, http.MethodPut, tenantPath(tenant)+"/webhook", map[string]string{"url": rawURL})
}

func (a adminAPI) RotateSecret(ctx context.Context, tenant uuid.UUID) (any, error) {
	return a.call(ctx, http.MethodPost, tenantPath(tenant)+"/webhook/rotate-secret", nil)
}

func (a adminAPI) DeleteWebhook(ctx context.Context, tenant uuid.UUID) (any, error) {
	if _, err := a.call(ctx, http.MethodDelete, tenantPath(tenant)+"/webhook", nil); err != nil {
		return nil, err
	}
	return deleted{Deleted: "webhook"}, nil
}

func (a adminAPI) SetRateLimit(ctx context.Context, tenant uuid.UUID, perSecond, burst int) (any, error) {
	return a.call(ctx, http.MethodPatch, tenantPath(tenant), api.RateLimitPayload{PerSecond: &perSecond, Burst: &burst})
}
