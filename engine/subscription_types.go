package engine

import (
	"encoding/json"
	"time"

	"github.com/google/uuid"
)

// SubscriptionStatus is a subscription's state (docs/spec/addendum.md §6).
type SubscriptionStatus string

// Subscription states; the first four are live (at most one per customer).
const (
	SubscriptionTrialing SubscriptionStatus = "trialing"
	SubscriptionActive   SubscriptionStatus = "active"
	SubscriptionPastDue  SubscriptionStatus = "past_due"
	SubscriptionPaused   SubscriptionStatus = "paused"
	SubscriptionCanceled SubscriptionStatus = "canceled"
	SubscriptionExpired  SubscriptionStatus = "expired"
)

// Live reports whether s is a non-terminal status.
func (s SubscriptionStatus) Live() bool {
	return s == SubscriptionTrialing || s == SubscriptionActive || s == SubscriptionPastDue || s == SubscriptionPaused
}

// Subscription puts a customer on a plan variant (docs/spec/addendum.md §6 fields).
type Subscription struct {
	ID                 uuid.UUID          `json:"id"`
	TenantID           uuid.UUID          `json:"tenant_id"`
	Environment        Environment        `json:"environment"`
	CustomerID         uuid.UUID          `json:"customer_id"`
	PlanID             uuid.UUID          `json:"plan_id"`
	PlanVariantID      uuid.UUID          `json:"plan_variant_id"`
	Status             SubscriptionStatus `json:"status"`
	BillingMode        BillingMode        `json:"billing_mode"`
	CurrentPeriodStart time.Time          `json:"current_period_start"`
	CurrentPeriodEnd   *time.Time         `json:"current_period_end"`
	TrialEndsAt        *time.Time         `json:"trial_ends_at"`
	RenewalDueAt       *time.Time         `json:"renewal_due_at"`
	GraceEndsAt        *time.Time         `json:"grace_ends_at"`
	CancelAtPeriodEnd  bool               `json:"cancel_at_period_end"`
	CanceledAt         *time.Time         `json:"canceled_at"`
	Metadata           Metadata           `json:"metadata"`
	CreatedAt          time.Time          `json:"created_at"`
	UpdatedAt          time.Time          `json:"updated_at"`
}

// Override changes one entitlement for one subscription (docs/spec/interface.md
// "Override").
type Override struct {
	ID                uuid.UUID       `json:"id"`
	TenantID          uuid.UUID       `json:"tenant_id"`
	SubscriptionID    uuid.UUID       `json:"subscription_id"`
	BillableMetricID  uuid.UUID       `json:"billable_metric_id"`
	BillableMetricKey string          `json:"billable_metric_key"`
	Value             json.RawMessage `json:"value"`
	ExpiresAt         *time.Time      `json:"expires_at"`
	Reason            string          `json:"reason"`
	CreatedAt         time.Time       `json:"created_at"`
	UpdatedAt         time.Time       `json:"updated_at"`
}
