package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Credit alerts (issue 15 item 4): a customer's balance thresholds and its
// auto top-up rule, or its tenant's default for the environment. The
// persister evaluates them in the transaction that stores each Mutation
// (EvaluateAlerts), so credit.threshold_crossed and credit.topup_requested
// are stored exactly once, numbered with the tenant's other events and
// carrying the account version, like credit.low_balance. docs/decisions.md
// "Credit alerts and top-up signals" fixes the rules in words.

// Alert event kinds (issue 15 item 4).
const (
	EventCreditThresholdCrossed EventType = "credit.threshold_crossed"
	EventCreditTopupRequested   EventType = "credit.topup_requested"
)

// Alert limits (docs/limits.md).
const (
	// MaxAlertThresholds bounds the thresholds of one configuration: each
	// is evaluated for every Mutation of the customer in the persister.
	MaxAlertThresholds = 10
	// MaxAlertPercent is the largest percent threshold (100: the whole base).
	MaxAlertPercent = 100
	// DefaultTopupDedupeSeconds is the top-up rule's dedupe window when
	// the body leaves it out: an hour gives a payment integration time to
	// charge and answer with a topup before the balance dips again.
	DefaultTopupDedupeSeconds = 3600
	// MinTopupDedupeSeconds and MaxTopupDedupeSeconds bound the window.
	MinTopupDedupeSeconds = 60
	// MaxTopupDedupeSeconds is 30 days.
	MaxTopupDedupeSeconds = 30 * 24 * 3600
)

// ThresholdType says what a threshold's value is measured against.
type ThresholdType string

// Threshold types.
const (
	// ThresholdAbsolute is a fixed amount in millicredits.
	ThresholdAbsolute ThresholdType = "absolute"
	// ThresholdPercentOfLastGrant is a percent of the credits of the
	// customer's newest grant (grant, plan grant, topup or positive adjust).
	ThresholdPercentOfLastGrant ThresholdType = "percent_of_last_grant"
	// ThresholdPercentOfPeriodAllowance is a percent of the period
	// allowance: the summed credits of the recurring grants of the plan
	// variant of the customer's current subscription.
	ThresholdPercentOfPeriodAllowance ThresholdType = "percent_of_period_allowance"
)

// AlertThreshold is one threshold: AmountMC for an absolute one, Percent
// (1..100) for the others.
type AlertThreshold struct {
	Type     ThresholdType `json:"type"`
	AmountMC *int64        `json:"amount_mc"`
	Percent  *int64        `json:"percent"`
}

// TopupRule asks for AmountMC of credit when the effective balance drops
// below BelowMC, at most once per DedupeWindowSeconds.
type TopupRule struct {
	BelowMC             int64 `json:"below_mc"`
	AmountMC            int64 `json:"amount_mc"`
	DedupeWindowSeconds int64 `json:"dedupe_window_seconds"`
}

// AlertSettings is one stored configuration: a customer's or its tenant's
// default (per environment).
type AlertSettings struct {
	Thresholds []AlertThreshold `json:"thresholds"`
	Topup      *TopupRule       `json:"topup"`
}

// Empty reports whether s asks for nothing.
func (s AlertSettings) Empty() bool { return len(s.Thresholds) == 0 && s.Topup == nil }

// Alert configuration sources (CreditAlerts.Source).
const (
	AlertSourceCustomer = "customer"
	AlertSourceDefault  = "default"
	AlertSourceNone     = "none"
)

// CreditAlerts is the body of the alert routes: the settings that apply and
// where they come from (a customer's own, the tenant default, or none).
type CreditAlerts struct {
	CustomerID  *uuid.UUID       `json:"customer_id"`
	Environment Environment      `json:"environment"`
	Source      string           `json:"source"`
	Thresholds  []AlertThreshold `json:"thresholds"`
	Topup       *TopupRule       `json:"topup"`
	UpdatedAt   *time.Time       `json:"updated_at"`
}

// StoredAlerts is a stored configuration row.
type StoredAlerts struct {
	Settings  AlertSettings
	UpdatedAt time.Time
}

// Alerts serves the credit alert routes.
type Alerts struct {
	store     AlertStore
	customers CustomerResolver
	clock     Clock
}

// NewAlerts returns the alert service.
func NewAlerts(store AlertStore, customers CustomerResolver, clock Clock) *Alerts {
	return &Alerts{store: store, customers: customers, clock: clock}
}

// view renders stored settings as the route's body.
func view(env Environment, customer *uuid.UUID, source string, st StoredAlerts) CreditAlerts {
	out := CreditAlerts{CustomerID: customer, Environment: env, Source: source,
		Thresholds: st.Settings.Thresholds, Topup: st.Settings.Topup}
	if out.Thresholds == nil {
		out.Thresholds = []AlertThreshold{}
	}
	if source != AlertSourceNone {
		at := st.UpdatedAt.UTC()
		out.UpdatedAt = &at
	}
	return out
}

// Default returns the tenant default of the scope's environment (source
// none and no thresholds when it has none).
func (a *Alerts) Default(ctx context.Context, scope Scope) (CreditAlerts, error) {
	st, ok, err := a.store.AlertSettingsGet(ctx, scope, nil)
	if err != nil {
		return CreditAlerts{}, err
	}
	if !ok {
		return view(scope.Environment, nil, AlertSourceNone, StoredAlerts{}), nil
	}
	return view(scope.Environment, nil, AlertSourceDefault, st), nil
}

// PutDefault replaces the tenant default with settings, which api has
// checked.
func (a *Alerts) PutDefault(ctx context.Context, scope Scope, settings AlertSettings) (CreditAlerts, error) {
	now := a.clock.Now().UTC().Truncate(time.Microsecond)
	if err := a.store.AlertSettingsPut(ctx, scope, nil, settings, now); err != nil {
		return CreditAlerts{}, err
	}
	return view(scope.Environment, nil, AlertSourceDefault, StoredAlerts{Settings: settings, UpdatedAt: now}), nil
}

// Customer returns the settings that apply to the customer: its own, else
// the tenant default, else none (404 for an unknown customer).
func (a *Alerts) Customer(ctx context.Context, scope Scope, ref CustomerRef) (CreditAlerts, error) {
	c, err := a.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return CreditAlerts{}, err
	}
	id := c.ID
	st, ok, err := a.store.AlertSettingsGet(ctx, scope, &id)
	if err != nil {
		return CreditAlerts{}, err
	}
	if ok {
		return view(scope.Environment, &id, AlertSourceCustomer, st), nil
	}
	st, ok, err = a.store.AlertSettingsGet(ctx, scope, nil)
	if err != nil {
		return CreditAlerts{}, err
	}
	if ok {
		return view(scope.Environment, &id, AlertSourceDefault, st), nil
	}
	return view(scope.Environment, &id, AlertSourceNone, StoredAlerts{}), nil
}

// PutCustomer replaces the customer's own settings, which then apply
// instead of the tenant default (an empty list and no rule silence it).
// Errors: 404 for an unknown customer.
func (a *Alerts) PutCustomer(ctx context.Context, scope Scope, ref CustomerRef, settings AlertSettings) (CreditAlerts, error) {
	c, err := a.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return CreditAlerts{}, err
	}
	id := c.ID
	now := a.clock.Now().UTC().Truncate(time.Microsecond)
	if err := a.store.AlertSettingsPut(ctx, scope, &id, settings, now); err != nil {
		return CreditAlerts{}, err
	}
	return view(scope.Environment, &id, AlertSourceCustomer, StoredAlerts{Settings: settings, UpdatedAt: now}), nil
}

// DeleteCustomer removes the customer's own settings so the tenant default
// applies again (404 when the customer is unknown or had none).
func (a *Alerts) DeleteCustomer(ctx context.Context, scope Scope, ref CustomerRef) error {
	c, err := a.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return err
	}
	ok, err := a.store.AlertSettingsDelete(ctx, scope, c.ID)
	if err != nil {
		return err
	}
	if !ok {
		return NotFound("the customer has no alert settings of its own")
	}
	return nil
}
