// A tenant's webhook endpoint: its URL (checked against private addresses) and\nits signing secret.
package engine

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"net/url"
	"time"

	"github.com/google/uuid"
)

// Webhook is the tenant's webhook URL and signing secret.
type Webhook struct {
	URL    *string `json:"url"`
	Secret *string `json:"secret"`
}

// SetWebhook stores the URL and, when the tenant has none yet, a new secret.
// Errors: 404, 422 (bad URL, private address without dev mode).
func (s *Tenants) SetWebhook(ctx context.Context, tenant uuid.UUID, rawURL string) (Webhook, error) {
	if len(rawURL) > MaxWebhookURLBytes {
		return Webhook{}, Invalid("url", "url is longer than 2048 bytes")
	}
	if err := s.checkWebhookURL(ctx, rawURL); err != nil {
		return Webhook{}, err
	}
	t, err := s.Get(ctx, tenant)
	if err != nil {
		return Webhook{}, err
	}
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

// checkWebhookURL refuses a URL that is not absolute http(s) or whose host
// resolves to a special-purpose address. This is fast feedback only: DNS can
// change after it (rebinding), so the sender checks every connect again
// against the same table.
func (s *Tenants) checkWebhookURL(ctx context.Context, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Invalid("url", "url must be an absolute http or https URL")
	}
	if s.allowPrivate {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, webhookResolveTimeout)
	defer cancel()
	addrs, err := s.resolve(ctx, u.Hostname())
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
