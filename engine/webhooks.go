package engine

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// Delivery limits (docs/spec/interface.md Delivery and Limits; invariant 11).
const (
	// MaxDeliveryAttempts is how many failures turn an event into a dead letter.
	MaxDeliveryAttempts = 7
	// DeliveryTimeout bounds one attempt, connect to last byte.
	DeliveryTimeout = 5 * time.Second
	// MaxStoredResponseBytes is how much of a response body an attempt keeps.
	MaxStoredResponseBytes = 4096
	// DeliveryLease is how long a claimed event stays with its worker; a
	// worker that dies leaves it to be claimed again once the lease lapses,
	// so it is the takeover bound of a dead node's deliveries (Webhooks.Lease
	// changes it).
	DeliveryLease = 30 * time.Second
	// DefaultDeliveryWorkers is the worker pool size of a process.
	DefaultDeliveryWorkers = 8
	// DefaultTenantInFlight caps one tenant's attempts in flight per
	// process, so a slow endpoint holds at most that many workers.
	DefaultTenantInFlight = 2
	// DefaultDeliveryPoll is how often idle workers look for due events.
	DefaultDeliveryPoll = 200 * time.Millisecond
	// DeliverySlotLease is how long a fleet-wide delivery slot (Slots)
	// stays taken without its release: twice an attempt's timeout, so only
	// a node that died mid-attempt leaves it to lapse.
	DeliverySlotLease = 2 * DeliveryTimeout
	// ErrNoWebhookURL is the last_error of an attempt made while the tenant
	// has no URL or secret: it counts as a failed attempt.
	ErrNoWebhookURL = "no webhook URL configured"
)

// RetryDelays are the delays before attempts 2..7, after the previous
// attempt (docs/spec/interface.md Delivery 3); the first attempt is immediate.
var RetryDelays = [MaxDeliveryAttempts - 1]time.Duration{
	30 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 8 * time.Hour, 24 * time.Hour,
}

// ErrNotDeadLetter: redeliver of an event that is not a dead letter.
var ErrNotDeadLetter = &Error{Kind: KindConflict, Detail: "only a dead_letter event can be redelivered"}

// Claim is one leased event.
type Claim struct {
	Event Event
	Lease uuid.UUID
}

// Attempt is the outcome of one delivery attempt and the state it leads to.
type Attempt struct {
	At           time.Time
	StatusCode   *int
	ResponseBody string
	Error        *string
	DurationMS   int64
	// Status, NextRetryAt, LastError, DeliveredAt are the event's new state;
	// Attempts is its new attempt count.
	Status      EventStatus
	Attempts    int
	NextRetryAt *time.Time
	LastError   *string
	DeliveredAt *time.Time
}

// EventQuery filters the events list.
type EventQuery struct {
	Status    string
	EventType string
	Cursor    string
	Limit     int
}

// SendResult is what an endpoint answered.
type SendResult struct {
	StatusCode int // 0 when no response arrived
	Body       []byte
	// Err is the transport error, for the log only: its text can name
	// addresses, ports and what listens there, so it never reaches a tenant.
	Err error
	// Failure is Err's category, what last_error shows (FailureOther when unset).
	Failure DeliveryFailure
}

// DeliveryFailure is why an attempt got no HTTP answer, as last_error and a
// delivery's error show it: a fixed category, never transport error text
// (raw dial errors would turn deliveries into a port scanner).
type DeliveryFailure string

// Delivery failure categories. An attempt that got an answer other than 2xx
// shows "HTTP <status>" instead (a redirect is not followed: "HTTP 302").
const (
	FailureTimeout DeliveryFailure = "timeout"
	FailureDNS     DeliveryFailure = "dns"
	// FailureRefused: nothing listens at the address (connection refused).
	FailureRefused DeliveryFailure = "connection_refused"
	// FailureReset: the endpoint closed or reset the connection before answering.
	FailureReset DeliveryFailure = "connection_reset"
	// FailureUnreachable: no route to the network or host.
	FailureUnreachable DeliveryFailure = "unreachable"
	FailureTLS         DeliveryFailure = "tls"
	// FailureBlocked: the host resolved to a special-purpose address
	// (SpecialPurposeRanges) at connect time; no connection was made.
	FailureBlocked DeliveryFailure = "blocked_address"
	// FailureOther: any other transport failure (a malformed response, ...).
	FailureOther DeliveryFailure = "other"
	// FailureInternal: creditd itself failed before sending (tenant look-up,
	// signing); the cause is in the log.
	FailureInternal DeliveryFailure = "internal"
)

// Sign is the Standard Webhooks signature header value of body
// (docs/spec/addendum.md §9): "v1," + base64 HMAC-SHA256 keyed by the base64-decoded part of a
// whsec_ secret, over "{id}.{timestamp}.{body}".
func Sign(secret, id string, timestamp int64, body []byte) (string, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return "", fmt.Errorf("engine: webhook secret is not base64: %w", err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(timestamp, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
}

// Webhooks is the webhook service: the events list, redelivery, test pings
// and the delivery worker pool.
type Webhooks struct {
	store   EventStore
	tenants TenantReader
	sender  Sender
	clock   Clock
	log     zerolog.Logger

	// Workers is the pool size (DefaultDeliveryWorkers when 0).
	Workers int
	// TenantInFlight caps one tenant's attempts in flight (DefaultTenantInFlight when 0):
	// per process, and with Slots across every node that shares them.
	TenantInFlight int
	// Slots, when set, makes TenantInFlight one cap for the fleet
	// (lua.Store in Redis); nil, or an error from it, caps per process.
	Slots DeliverySlots
	// WrittenBehind, when set, makes List wait for the events of the
	// writes acknowledged before it (on any node).
	WrittenBehind *WrittenBehind
	// Poll is how often the pool looks for due events (DefaultDeliveryPoll when 0).
	Poll time.Duration
	// Lease is how long a claimed event stays with this node's worker
	// (DeliveryLease when 0): a node that dies mid-attempt leaves its
	// events to the other nodes once it lapses. It must exceed
	// DeliveryTimeout plus the slot wait (Lease/2) for an attempt to be
	// recorded in time; tests whose endpoints answer at once shorten it.
	Lease time.Duration
	// Loop runs the delivery pool (webhook_delivery.go).
	Loop
}

// lease is Lease or its default.
func (w *Webhooks) lease() time.Duration {
	if w.Lease > 0 {
		return w.Lease
	}
	return DeliveryLease
}

// NewWebhooks returns the webhook service.
func NewWebhooks(store EventStore, tenants TenantReader, sender Sender, clock Clock, log zerolog.Logger) *Webhooks {
	return &Webhooks{store: store, tenants: tenants, sender: sender, clock: clock, log: log}
}

// ListEventsInput is the query of GET /v1/webhooks/events.
type ListEventsInput = EventQuery

// List pages the tenant's events newest first, both environments. An
// unknown status matches nothing. Errors: 400 bad cursor.
func (w *Webhooks) List(ctx context.Context, scope Scope, in ListEventsInput) (Page[Event], error) {
	w.WrittenBehind.All(ctx)
	return w.store.ListEvents(ctx, scope.TenantID, in)
}

// Redeliver requeues a dead letter for a fresh 7-attempt schedule. Errors:
// 422 id not a UUID, 404, 409 not a dead letter.
func (w *Webhooks) Redeliver(ctx context.Context, scope Scope, rawID string) (Event, error) {
	id, err := uuid.Parse(rawID)
	if err != nil {
		return Event{}, Invalid("id", "id must be a UUID")
	}
	e, err := w.store.Redeliver(ctx, scope.TenantID, id, w.clock.Now())
	if errors.Is(err, ErrNotFound) {
		return Event{}, NotFound("webhook event not found")
	}
	return e, err
}

// TestResult is the 202 body of POST /v1/webhooks/test.
type TestResult struct {
	EventID   uuid.UUID   `json:"event_id"`
	EventType EventType   `json:"event_type"`
	Status    EventStatus `json:"status"`
}

// Test queues a test.ping. Errors: 409 without a URL or secret.
func (w *Webhooks) Test(ctx context.Context, scope Scope, idem Idempotency) (TestResult, error) {
	t, err := w.tenants.GetTenant(ctx, scope.TenantID)
	if err != nil {
		return TestResult{}, err
	}
	if t.WebhookURL == nil || *t.WebhookURL == "" || t.WebhookSecret == nil || *t.WebhookSecret == "" {
		return TestResult{}, Conflict("no webhook URL or signing secret is configured")
	}
	e := NewEvent(uuid.Must(uuid.NewV7()), EventTestPing, scope.TenantID, scope.Environment, nil, nil,
		w.clock.Now(), idem.Key, PingData{Message: "ping"})
	if err := w.store.InsertEvent(ctx, e); err != nil {
		return TestResult{}, err
	}
	return TestResult{EventID: e.ID, EventType: e.EventType, Status: e.Status}, nil
}
