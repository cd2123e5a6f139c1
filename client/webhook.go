package client

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultWebhookTolerance is how far a delivery's webhook-timestamp may be
// from the receiver's clock, either way (the Standard Webhooks default):
// an older signed request replayed by someone who captured it is refused.
const DefaultWebhookTolerance = 5 * time.Minute

// Errors of webhook verification.
var (
	// ErrWebhookHeaders: webhook-id, webhook-timestamp or webhook-signature
	// is missing or malformed.
	ErrWebhookHeaders = errors.New("creditd: webhook headers missing or malformed")
	// ErrWebhookTimestamp: the timestamp is outside the tolerance.
	ErrWebhookTimestamp = errors.New("creditd: webhook timestamp outside the tolerance")
	// ErrWebhookSignature: no signature matches the secret.
	ErrWebhookSignature = errors.New("creditd: webhook signature does not match")
)

// WebhookVerifier checks the signatures creditd puts on its webhook
// deliveries (Standard Webhooks): webhook-signature reservations
// "v1,<base64 HMAC-SHA256>" of "{webhook-id}.{webhook-timestamp}.{body}",
// keyed by the base64-decoded part of the tenant's whsec_ secret. It is
// safe for concurrent use.
type WebhookVerifier struct {
	key []byte
	// Tolerance bounds the timestamp's distance from now (default
	// DefaultWebhookTolerance).
	Tolerance time.Duration
}

// NewWebhookVerifier returns a verifier for a whsec_ signing secret (the
// prefix is optional).
func NewWebhookVerifier(secret string) (*WebhookVerifier, error) {
	key, err := webhookKey(secret)
	if err != nil {
		return nil, err
	}
	return &WebhookVerifier{key: key, Tolerance: DefaultWebhookTolerance}, nil
}

func webhookKey(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return nil, fmt.Errorf("creditd: the webhook secret is not whsec_ and base64: %w", err)
	}
	if len(key) == 0 {
		return nil, errors.New("creditd: the webhook secret is empty")
	}
	return key, nil
}

// Verify checks a delivery's headers and raw body against the secret at
// the current time. Pass the body exactly as received, before any JSON
// decoding. Several space-separated signatures (a secret rotation) pass
// when one matches.
func (v *WebhookVerifier) Verify(header http.Header, body []byte) error {
	return v.VerifyAt(header, body, time.Now())
}

// VerifyAt is Verify with the receiver's clock at now.
func (v *WebhookVerifier) VerifyAt(header http.Header, body []byte, now time.Time) error {
	id := header.Get("webhook-id")
	ts := header.Get("webhook-timestamp")
	sigs := header.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return ErrWebhookHeaders
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrWebhookHeaders
	}
	tol := v.Tolerance
	if tol <= 0 {
		tol = DefaultWebhookTolerance
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tol || d < -tol {
		return ErrWebhookTimestamp
	}
	want := sign(v.key, id, sec, body)
	for _, s := range strings.Fields(sigs) {
		version, sig, ok := strings.Cut(s, ",")
		if !ok || version != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return ErrWebhookSignature
}

// Parse verifies a delivery and decodes its body.
func (v *WebhookVerifier) Parse(header http.Header, body []byte) (*WebhookPayload, error) {
	if err := v.Verify(header, body); err != nil {
		return nil, err
	}
	var p WebhookPayload
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, fmt.Errorf("creditd: decode the webhook body: %w", err)
	}
	return &p, nil
}

// WebhookPayload is the body of a webhook delivery. Dedupe on EventID (also
// the webhook-id header): delivery is at least once.
type WebhookPayload struct {
	// EventID is the event's id, also the webhook-id header.
	EventID string `json:"event_id"`
	// EventType is credit.granted, credit.consumed, credit.low_balance,
	// credit.exhausted, credit.expired, subscription.renewed, test.ping and
	// the others the API reference lists.
	EventType string `json:"event_type"`
	// TenantID is the tenant the event belongs to.
	TenantID string `json:"tenant_id"`
	// Environment is live or sandbox.
	Environment string `json:"environment"`
	// CustomerID is the customer's id; null for tenant-wide events
	// (test.ping).
	CustomerID *string `json:"customer_id"`
	// ExternalCustomerID is the customer's external_id; null as CustomerID.
	ExternalCustomerID *string `json:"external_customer_id"`
	// CreatedAt is when the event was raised.
	CreatedAt time.Time `json:"created_at"`
	// IdempotencyKey is the key of the request that raised the event.
	IdempotencyKey string `json:"idempotency_key"`
	// Data is the event's own members, decoded by the receiver per
	// EventType.
	Data json.RawMessage `json:"data"`
}

// SignWebhook is the webhook-signature value creditd sends for a delivery
// of body with id at timestamp, for testing a receiver.
func SignWebhook(secret, id string, timestamp time.Time, body []byte) (string, error) {
	key, err := webhookKey(secret)
	if err != nil {
		return "", err
	}
	return "v1," + base64.StdEncoding.EncodeToString(sign(key, id, timestamp.Unix(), body)), nil
}

func sign(key []byte, id string, ts int64, body []byte) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(ts, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return mac.Sum(nil)
}
