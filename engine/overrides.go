package engine

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
)

// Overrides change one entitlement for one subscription (docs/spec/interface.md
// Override, Overrides, States "Override"). A live override beats the variant
// value, which beats the metric default, on every check and snapshot
// (docs/spec/addendum.md §5); the PlanView resolves that order, this service keeps the rows.

// MaxOverrideReasonChars bounds an override reason (docs/decisions.md).
const MaxOverrideReasonChars = 1000

// ErrOverrideExists: the subscription already has a live override for the
// metric (a store's answer; the service turns it into the 409).
var ErrOverrideExists = errors.New("a live override exists for this metric")

// Overrides serves the override endpoints.
type Overrides struct {
	store   OverrideStore
	subs    SubscriptionReader
	metrics MetricLookup
	ents    *Entitlements
	clock   Clock
}

// NewOverrides returns the override service; ents may be nil (no snapshot
// cache to refresh). A cached PlanView forgets the subscription's values
// when store is its ForgettingOverrides.
func NewOverrides(store OverrideStore, subs SubscriptionReader, metrics MetricLookup, ents *Entitlements, clock Clock) *Overrides {
	return &Overrides{store: store, subs: subs, metrics: metrics, ents: ents, clock: clock}
}

// CreateOverride is a checked request to add an override: api builds it
// from the body of POST /v1/subscriptions/{id}/overrides. Value is checked
// against the metric's type here, once the metric is read.
type CreateOverride struct {
	BillableMetricKey string
	Value             json.RawMessage // not empty, not null
	ExpiresAt         *time.Time      // parsed, UTC, to the millisecond; nil: permanent
	Reason            *string
}

// UpdateOverride is a checked PATCH of an override. SetExpiry with a nil
// ExpiresAt makes it permanent; a nil Value or Reason keeps its value.
// ValueErr is a value sent as null: it is named after the subscription is
// found, as the answer always named it.
type UpdateOverride struct {
	Value     json.RawMessage
	ValueErr  error
	SetExpiry bool
	ExpiresAt *time.Time // parsed, UTC, to the millisecond
	Reason    *string
}

// checkOverrideExpiry refuses an expiry that is not in the future. The spec
// lists only 400s for override bodies, so it is one.
func checkOverrideExpiry(t *time.Time, now time.Time) error {
	if t != nil && !t.After(now) {
		return BadRequest("expires_at", "expires_at must be in the future")
	}
	return nil
}

// subscription finds the subscription in scope; another environment's or
// tenant's is 404 (Authentication 5).
func (s *Overrides) subscription(ctx context.Context, scope Scope, id uuid.UUID) (Subscription, error) {
	sub, err := s.subs.GetSubscription(ctx, scope, id)
	if errors.Is(err, ErrNotFound) {
		return Subscription{}, NotFound("subscription not found")
	}
	if err != nil {
		return Subscription{}, err
	}
	if sub.TenantID != scope.TenantID || sub.Environment != scope.Environment {
		return Subscription{}, NotFound("subscription not found")
	}
	return sub, nil
}

// overridable finds the metric of key and refuses metered ones.
func (s *Overrides) overridable(ctx context.Context, scope Scope, key string) (BillableMetric, error) {
	m, ok, err := s.metrics.Metric(ctx, scope, key)
	if err != nil {
		return BillableMetric{}, err
	}
	if !ok {
		return BillableMetric{}, &Error{Kind: KindNotFound, Field: "billable_metric_key", Detail: "no billable metric has this key"}
	}
	if m.Type == MetricMetered {
		return BillableMetric{}, BadRequest("billable_metric_key", "metered metrics cannot be overridden")
	}
	return m, nil
}

// List is every live override of the subscription, oldest first. Errors: 404.
func (s *Overrides) List(ctx context.Context, scope Scope, subscription uuid.UUID) ([]Override, error) {
	sub, err := s.subscription(ctx, scope, subscription)
	if err != nil {
		return nil, err
	}
	list, err := s.store.LiveOverrides(ctx, sub.TenantID, sub.ID, s.clock.Now())
	if err != nil {
		return nil, err
	}
	if list == nil {
		list = []Override{}
	}
	return list, nil
}

// Create adds a live override. Errors: 400 (metered metric, value not
// shaped for the type, expires_at not in the future), 404 (subscription,
// metric), 409 (a live override exists for the metric).
func (s *Overrides) Create(ctx context.Context, scope Scope, subscription uuid.UUID, in CreateOverride) (Override, error) {
	now := s.clock.Now()
	if err := checkOverrideExpiry(in.ExpiresAt, now); err != nil {
		return Override{}, err
	}
	sub, err := s.subscription(ctx, scope, subscription)
	if err != nil {
		return Override{}, err
	}
	m, err := s.overridable(ctx, scope, in.BillableMetricKey)
	if err != nil {
		return Override{}, err
	}
	val, err := EntitlementValue(m.Type, in.Value)
	if err != nil {
		return Override{}, err
	}
	o := Override{ID: uuid.Must(uuid.NewV7()), TenantID: scope.TenantID, SubscriptionID: sub.ID,
		BillableMetricID: m.ID, BillableMetricKey: m.Key, Value: val, ExpiresAt: in.ExpiresAt,
		CreatedAt: now, UpdatedAt: now}
	if in.Reason != nil {
		o.Reason = *in.Reason
	}
	if err := s.store.CreateOverride(ctx, scope.Environment, o, now); err != nil {
		if errors.Is(err, ErrOverrideExists) {
			return Override{}, &Error{Kind: KindConflict, Field: "billable_metric_key", Detail: "a live override already exists for this metric"}
		}
		return Override{}, err
	}
	s.changed(sub)
	return o, nil
}

// Update changes the live override of key: value (shaped by the type),
// expires_at (null: permanent, omitted: kept), reason. Errors: 400, 404.
func (s *Overrides) Update(ctx context.Context, scope Scope, subscription uuid.UUID, key string, in UpdateOverride) (Override, error) {
	now := s.clock.Now()
	if err := checkOverrideExpiry(in.ExpiresAt, now); err != nil {
		return Override{}, err
	}
	sub, err := s.subscription(ctx, scope, subscription)
	if err != nil {
		return Override{}, err
	}
	if in.ValueErr != nil {
		return Override{}, in.ValueErr
	}
	var val json.RawMessage
	if len(in.Value) > 0 {
		m, err := s.overridable(ctx, scope, key)
		if err != nil {
			if e, ok := AsError(err); ok && e.Kind == KindNotFound {
				return Override{}, NotFound("override not found")
			}
			return Override{}, err
		}
		if val, err = EntitlementValue(m.Type, in.Value); err != nil {
			return Override{}, err
		}
	}
	o, err := s.store.UpdateOverride(ctx, scope, sub.ID, key, now, func(o *Override) error {
		if val != nil {
			o.Value = val
		}
		if in.SetExpiry {
			o.ExpiresAt = in.ExpiresAt
		}
		if in.Reason != nil {
			o.Reason = *in.Reason
		}
		o.UpdatedAt = now
		return nil
	})
	if errors.Is(err, ErrNotFound) {
		return Override{}, NotFound("override not found")
	}
	if err != nil {
		return Override{}, err
	}
	s.changed(sub)
	return o, nil
}

// Delete marks the live override of key deleted; it moves no credit.
// Errors: 404.
func (s *Overrides) Delete(ctx context.Context, scope Scope, subscription uuid.UUID, key string) error {
	sub, err := s.subscription(ctx, scope, subscription)
	if err != nil {
		return err
	}
	err = s.store.DeleteOverride(ctx, scope, sub.ID, key, s.clock.Now())
	if errors.Is(err, ErrNotFound) {
		return NotFound("override not found")
	}
	if err != nil {
		return err
	}
	s.changed(sub)
	return nil
}

// changed refreshes the entitlement snapshot this process caches of the
// subscription's customer (the store's decorator forgets its plan view).
func (s *Overrides) changed(sub Subscription) {
	if s.ents != nil {
		s.ents.ForgetSnapshot(sub.CustomerID)
	}
}
