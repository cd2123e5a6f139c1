// A tenant's webhook endpoint: its URL (checked against private addresses) and
// its signing secret.

package engine

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"time"

	"github.com/google/uuid"
)

// Webhook is the tenant's webhook URL and signing secret.
type Webhook struct {
	URL    *string `json:"url"`
	Secret *string `json:"secret"`
}

// WebhookTarget is a checked webhook URL: absolute http or https, at most
// MaxWebhookURLBytes; Host is its host name, which SetWebhook resolves.
type WebhookTarget struct {
	URL  string
	Host string
}

// SetWebhook stores the URL and, when the tenant has none yet, a new secret.
// Errors: 404, 422 (a host that does not resolve, or a private address
// without dev mode).
func (s *Tenants) SetWebhook(ctx context.Context, tenant uuid.UUID, in WebhookTarget) (Webhook, error) {
	if err := s.checkWebhookHost(ctx, in.Host); err != nil {
		return Webhook{}, err
	}
	t, err := s.Get(ctx, tenant)
	if err != nil {
		return Webhook{}, err
	}
	rawURL := in.URL
	t.WebhookURL = &rawURL
	if t.WebhookSecret == nil {
		sec := newWebhookSecret()
		t.WebhookSecret = &sec
	}
	return s.saveWebhook(ctx, t)
}

// RotateSecret replaces the signing secret. Errors: 404.
func (s *Tenants) RotateSecret(ctx context.Context, tenant uuid.UUID) (Webhook, error) {
	t, err := s.Get(ctx, tenant)
	if err != nil {
		return Webhook{}, err
	}
	sec := newWebhookSecret()
	t.WebhookSecret = &sec
	return s.saveWebhook(ctx, t)
}

// DeleteWebhook removes URL and secret. Errors: 404.
func (s *Tenants) DeleteWebhook(ctx context.Context, tenant uuid.UUID) error {
	t, err := s.Get(ctx, tenant)
	if err != nil {
		return err
	}
	t.WebhookURL, t.WebhookSecret = nil, nil
	_, err = s.saveWebhook(ctx, t)
	return err
}

func (s *Tenants) saveWebhook(ctx context.Context, t Tenant) (Webhook, error) {
	t.UpdatedAt = s.clock.Now()
	if err := s.dir.UpdateTenant(ctx, t); err != nil {
		return Webhook{}, err
	}
	return Webhook{URL: t.WebhookURL, Secret: t.WebhookSecret}, nil
}

// webhookResolveTimeout bounds the DNS look-up of a webhook URL being set.
const webhookResolveTimeout = 5 * time.Second

// checkWebhookHost refuses a webhook host that resolves to a
// special-purpose address. This is fast feedback only: DNS can change after
// it (rebinding), so the sender checks every connect again against the same
// table.
func (s *Tenants) checkWebhookHost(ctx context.Context, host string) error {
	if s.allowPrivate {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, webhookResolveTimeout)
	defer cancel()
	addrs, err := s.resolve(ctx, host)
	if err != nil || len(addrs) == 0 {
		return Invalid("url", "url host does not resolve")
	}
	for _, a := range addrs {
		if _, special := SpecialPurpose(a); special {
			return Invalid("url", "url resolves to a loopback, private, link-local or other special-purpose address")
		}
	}
	return nil
}

func newWebhookSecret() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return "whsec_" + base64.StdEncoding.EncodeToString(b[:])
}
