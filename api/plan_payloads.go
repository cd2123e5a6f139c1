// The catalogue's request bodies (plans, variants, plan grants,
// entitlements), their checks and their conversion to engine commands; the
// routes that decode them are in plans.go.

package api

import (
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/creditd/creditd/engine"
)

// CreatePlanPayload is the body of POST /v1/plans; the console's plan form
// builds it too.
type CreatePlanPayload struct {
	Name      *string         `json:"name"`
	IsDefault *bool           `json:"is_default"`
	Metadata  engine.Metadata `json:"metadata"`
}

// ToCommand checks the body, naming the first wrong field, and returns the
// plan to create.
func (in *CreatePlanPayload) ToCommand() (engine.CreatePlan, error) {
	if in.Name == nil {
		return engine.CreatePlan{}, engine.Invalid("name", "name is required")
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.CreatePlan{}, err
	}
	if err := checkPlanName(*in.Name); err != nil {
		return engine.CreatePlan{}, err
	}
	return engine.CreatePlan{Name: *in.Name, IsDefault: in.IsDefault != nil && *in.IsDefault, Metadata: meta}, nil
}

// UpdatePlanPayload is the body of PATCH /v1/plans/{id}; the console's plan
// edit form builds it too. An absent member keeps its value.
type UpdatePlanPayload struct {
	Name      *string         `json:"name"`
	Status    *string         `json:"status"`
	IsDefault *bool           `json:"is_default"`
	Metadata  engine.Metadata `json:"metadata"`
}

// ToCommand checks the body, naming the first wrong field, and returns the
// change.
func (in *UpdatePlanPayload) ToCommand() (engine.UpdatePlan, error) {
	if in.Name != nil {
		if err := checkPlanName(*in.Name); err != nil {
			return engine.UpdatePlan{}, err
		}
	}
	status, err := planStatus(in.Status)
	if err != nil {
		return engine.UpdatePlan{}, err
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.UpdatePlan{}, err
	}
	return engine.UpdatePlan{Name: in.Name, Status: status, IsDefault: in.IsDefault, Metadata: meta}, nil
}

// checkPlanName checks a plan name sent on create or update.
func checkPlanName(name string) error {
	if strings.TrimSpace(name) == "" {
		return engine.Invalid("name", "name must not be empty")
	}
	if utf8.RuneCountInString(name) > engine.MaxPlanNameChars {
		return engine.Invalid("name", "name is longer than 200 characters")
	}
	return engine.CheckLine("name", name)
}

// planStatus checks a plan's or a variant's status when sent.
func planStatus(v *string) (*engine.PlanStatus, error) {
	if v == nil {
		return nil, nil
	}
	st := engine.PlanStatus(*v)
	if !st.Valid() {
		return nil, engine.Invalid("status", "status must be active or retired")
	}
	return &st, nil
}

// CreateVariantPayload is the body of POST /v1/plans/{id}/variants; the
// console's variant form builds it too.
type CreateVariantPayload struct {
	BillingCycle           *string         `json:"billing_cycle"`
	TrialDays              *int            `json:"trial_days"`
	BillingMode            *string         `json:"billing_mode"`
	RenewalDueDays         *int            `json:"renewal_due_days"`
	GracePeriodDays        *int            `json:"grace_period_days"`
	AllowUsageWhileOverdue *bool           `json:"allow_usage_while_overdue"`
	Metadata               engine.Metadata `json:"metadata"`
}

// ToCommand checks the body, naming the first wrong field, and returns the
// variant to create.
func (in *CreateVariantPayload) ToCommand() (engine.CreateVariant, error) {
	if in.BillingCycle == nil || *in.BillingCycle == "" {
		return engine.CreateVariant{}, engine.Invalid("billing_cycle", "billing_cycle is required")
	}
	cycle := engine.BillingCycle(*in.BillingCycle)
	if !cycle.Valid() {
		return engine.CreateVariant{}, engine.Invalid("billing_cycle", "billing_cycle must be daily, weekly, monthly, yearly or one_time")
	}
	if err := checkDays("trial_days", in.TrialDays); err != nil {
		return engine.CreateVariant{}, err
	}
	var mode *engine.BillingMode
	if in.BillingMode != nil {
		m := engine.BillingMode(*in.BillingMode)
		if !m.Valid() {
			return engine.CreateVariant{}, engine.Invalid("billing_mode", "billing_mode must be prepaid or postpaid")
		}
		mode = &m
	}
	if err := checkDays("renewal_due_days", in.RenewalDueDays); err != nil {
		return engine.CreateVariant{}, err
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.CreateVariant{}, err
	}
	if err := checkDays("grace_period_days", in.GracePeriodDays); err != nil {
		return engine.CreateVariant{}, err
	}
	return engine.CreateVariant{BillingCycle: cycle, TrialDays: in.TrialDays, BillingMode: mode,
		RenewalDueDays: in.RenewalDueDays, GracePeriodDays: in.GracePeriodDays,
		AllowUsageWhileOverdue: in.AllowUsageWhileOverdue, Metadata: meta}, nil
}

// checkDays checks a variant's day count when sent.
func checkDays(field string, v *int) error {
	if v != nil && (*v < 0 || *v > engine.MaxVariantDays) {
		return engine.Invalid(field, field+" must be between 0 and 3650")
	}
	return nil
}

// UpdateVariantPayload is the body of PATCH /v1/plans/{id}/variants/{vid};
// the console's variant edit form builds it too. status, trial_days and
// metadata change; the other members are fixed at creation and are only
// compared with the stored variant, in the engine.
type UpdateVariantPayload struct {
	Status    *string         `json:"status"`
	TrialDays *int            `json:"trial_days"`
	Metadata  engine.Metadata `json:"metadata"`

	BillingCycle           *string `json:"billing_cycle"`
	BillingMode            *string `json:"billing_mode"`
	RenewalDueDays         *int    `json:"renewal_due_days"`
	GracePeriodDays        *int    `json:"grace_period_days"`
	AllowUsageWhileOverdue *bool   `json:"allow_usage_while_overdue"`
}

// ToCommand checks the mutable members, naming the first wrong one, and
// returns the change.
func (in *UpdateVariantPayload) ToCommand() (engine.UpdateVariant, error) {
	status, err := planStatus(in.Status)
	if err != nil {
		return engine.UpdateVariant{}, err
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.UpdateVariant{}, err
	}
	if err := checkDays("trial_days", in.TrialDays); err != nil {
		return engine.UpdateVariant{}, err
	}
	cmd := engine.UpdateVariant{Status: status, TrialDays: in.TrialDays, Metadata: meta,
		RenewalDueDays: in.RenewalDueDays, GracePeriodDays: in.GracePeriodDays,
		AllowUsageWhileOverdue: in.AllowUsageWhileOverdue}
	if in.BillingCycle != nil {
		c := engine.BillingCycle(*in.BillingCycle)
		cmd.BillingCycle = &c
	}
	if in.BillingMode != nil {
		m := engine.BillingMode(*in.BillingMode)
		cmd.BillingMode = &m
	}
	return cmd, nil
}

// PlanGrantPayload is the body of POST /v1/plans/{id}/variants/{vid}/grants;
// the console's grant form builds it too.
type PlanGrantPayload struct {
	Credits             *int64            `json:"credits"`
	GrantInterval       *string           `json:"grant_interval"`
	GrantType           *string           `json:"grant_type"`
	Source              *string           `json:"source"`
	ExpiresAfterSeconds *int64            `json:"expires_after_seconds"`
	AccumulationCap     *int64            `json:"accumulation_cap"`
	RolloverPercentage  *int              `json:"rollover_percentage"`
	MaxRolloverCycles   *int              `json:"max_rollover_cycles"`
	AppliesTo           *engine.AppliesTo `json:"applies_to"`
}

// ToCommand checks the body, naming the first wrong field, and returns the
// schedule to add.
func (in *PlanGrantPayload) ToCommand() (engine.CreatePlanGrant, error) {
	if in.Credits == nil {
		return engine.CreatePlanGrant{}, engine.Invalid("credits", "credits is required")
	}
	if err := engine.GrantAmount.Check("", *in.Credits); err != nil {
		return engine.CreatePlanGrant{}, err
	}
	if in.GrantInterval == nil || *in.GrantInterval == "" {
		return engine.CreatePlanGrant{}, engine.Invalid("grant_interval", "grant_interval is required")
	}
	iv, err := engine.ParseGrantInterval(*in.GrantInterval)
	if err != nil {
		return engine.CreatePlanGrant{}, err
	}
	if in.GrantType == nil || *in.GrantType == "" {
		return engine.CreatePlanGrant{}, engine.Invalid("grant_type", "grant_type is required")
	}
	typ := engine.GrantType(*in.GrantType)
	if !typ.Valid() {
		return engine.CreatePlanGrant{}, engine.Invalid("grant_type", "grant_type must be recurring, one_time or trial")
	}
	if typ == engine.GrantRecurring && iv.Keyword == engine.IntervalOnActivation {
		return engine.CreatePlanGrant{}, engine.Invalid("grant_type", "a recurring grant cannot fire on_activation; use grant_type one_time")
	}
	var source *engine.Source
	if in.Source != nil {
		src := engine.Source(*in.Source)
		if src != engine.SourcePlanGrant && !src.ValidGrantSource() {
			return engine.CreatePlanGrant{}, engine.Invalid("source", "source must be plan_grant, promotional, compensation, referral, manual or migration")
		}
		source = &src
	}
	if v := in.ExpiresAfterSeconds; v != nil && (*v < 1 || *v > engine.MaxGrantSeconds) {
		return engine.CreatePlanGrant{}, engine.Invalid("expires_after_seconds", "expires_after_seconds must be between 1 and 315360000, or null")
	}
	if v := in.AccumulationCap; v != nil {
		if err := engine.AccumulationCap.Check("", *v); err != nil {
			return engine.CreatePlanGrant{}, err
		}
	}
	if v := in.RolloverPercentage; v != nil {
		if err := engine.CheckRolloverPercentage(int64(*v)); err != nil {
			return engine.CreatePlanGrant{}, err
		}
	}
	if v := in.MaxRolloverCycles; v != nil && (*v < 0 || *v > 1_000_000) {
		return engine.CreatePlanGrant{}, engine.Invalid("max_rollover_cycles", "max_rollover_cycles must be between 0 and 1000000, or null")
	}
	scope, err := engine.ScopeKeys("applies_to", in.AppliesTo)
	if err != nil {
		return engine.CreatePlanGrant{}, err
	}
	return engine.CreatePlanGrant{Credits: *in.Credits, GrantInterval: *in.GrantInterval, GrantType: typ, Source: source, Scope: scope,
		ExpiresAfterSeconds: in.ExpiresAfterSeconds, AccumulationCap: in.AccumulationCap,
		RolloverPercentage: in.RolloverPercentage, MaxRolloverCycles: in.MaxRolloverCycles}, nil
}

// entitlementPayload is the body of POST
// /v1/plans/{id}/variants/{vid}/entitlements.
type entitlementPayload struct {
	BillableMetricKey *string         `json:"billable_metric_key"`
	Value             json.RawMessage `json:"value"`
}

// toCommand names the first missing member; the value's shape depends on
// the metric, which the engine reads.
func (in *entitlementPayload) toCommand() (engine.PutEntitlement, error) {
	if in.BillableMetricKey == nil || *in.BillableMetricKey == "" {
		return engine.PutEntitlement{}, engine.Invalid("billable_metric_key", "billable_metric_key is required")
	}
	if len(in.Value) == 0 || string(in.Value) == "null" {
		return engine.PutEntitlement{}, engine.Invalid("value", "value is required")
	}
	return engine.PutEntitlement{BillableMetricKey: *in.BillableMetricKey, Value: in.Value}, nil
}
