// Package openfeature is an OpenFeature provider (issue 27 item 4) over an
// edge.Evaluator, so code that reads feature flags through the OpenFeature
// Go SDK reads creditd entitlements without a creditd-specific call.
//
// A flag key is a billable metric key, and the evaluation context's
// targeting key is the customer (creditd id or external id):
//   - a boolean flag is a boolean entitlement's enabled, or whether a
//     metered or gauge metric allows one unit now;
//   - an object flag is a static entitlement's config;
//   - a string, integer or float flag is one member of a static
//     entitlement's config, named after a slash: "theme/color" reads
//     config["color"] of metric "theme" (a metric key has no slash, engine
//     metricKeyPattern, so the split is never ambiguous).
//
// Every resolution carries, as flag metadata, where the answer came from
// and how old its figures were (MetadataSource, MetadataAgeMS), so a flag
// read from memory is as visible as the evaluator's own Check.
package openfeature

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	of "github.com/open-feature/go-sdk/openfeature"

	"github.com/creditd/creditd/client"
	"github.com/creditd/creditd/client/edge"
)

// Name is the provider's name in OpenFeature's metadata and events.
const Name = "creditd"

// Flag metadata keys every resolution that reached creditd carries.
const (
	// MetadataSource is edge.Source: "memory", "http" or "policy".
	MetadataSource = "source"
	// MetadataAgeMS is the answer's age in milliseconds (int): how long
	// before the read its figures were known current.
	MetadataAgeMS = "age_ms"
	// MetadataEntitlementType is the metric's type: "boolean", "static",
	// "metered" or "gauge".
	MetadataEntitlementType = "entitlement_type"
	// MetadataCustomerID is the customer's creditd id (the targeting key
	// may be an external id).
	MetadataCustomerID = "customer_id"
	// MetadataEffectiveBalance is the metered balance (millicredits)
	// against which a metered boolean was answered.
	MetadataEffectiveBalance = "effective_balance"
)

// configSeparator splits a flag key into a metric key and a config member.
const configSeparator = "/"

// Checker answers entitlement checks; *edge.Evaluator is the one meant.
// Tests and callers with their own cache may give another.
type Checker interface {
	Check(ctx context.Context, customer, metric string, units int64) (edge.Answer, error)
}

// Provider is an OpenFeature FeatureProvider over a Checker. Safe for
// concurrent use as far as the Checker is. It does not start or close the
// evaluator: its owner does, so one evaluator can serve the provider and
// the code that calls Check itself.
type Provider struct {
	checker Checker
}

var _ of.FeatureProvider = (*Provider)(nil)

// New builds a Provider over checker (an *edge.Evaluator, started).
func New(checker Checker) *Provider { return &Provider{checker: checker} }

// Metadata names the provider.
func (p *Provider) Metadata() of.Metadata { return of.Metadata{Name: Name} }

// Hooks are none: the evaluator needs no per-evaluation setup.
func (p *Provider) Hooks() []of.Hook { return nil }

// BooleanEvaluation resolves flag for the targeting key: a boolean
// entitlement's enabled, or whether a metered or gauge metric allows one
// unit. A static metric is a TYPE_MISMATCH: its value is its config.
func (p *Provider) BooleanEvaluation(ctx context.Context, flag string, defaultValue bool, flatCtx of.FlattenedContext) of.BoolResolutionDetail {
	ans, detail, ok := p.check(ctx, flag, flatCtx)
	if !ok {
		return of.BoolResolutionDetail{Value: defaultValue, ProviderResolutionDetail: detail}
	}
	switch ans.Type {
	case "":
		// The Fallback policy answered with no figures (creditd could not
		// be asked): its verdict is the flag, as for any check.
		if ans.Source == edge.SourcePolicy {
			return of.BoolResolutionDetail{Value: ans.Allowed, ProviderResolutionDetail: detail}
		}
	case "boolean":
		// enabled is what the plan says; allowed also folds in the
		// subscription. A flag read should agree with the HTTP check's
		// verdict, so allowed decides, as it does for the metered types.
		return of.BoolResolutionDetail{Value: ans.Allowed, ProviderResolutionDetail: detail}
	case "metered", "gauge":
		if ans.EffectiveBalance != nil {
			detail.FlagMetadata[MetadataEffectiveBalance] = *ans.EffectiveBalance
		}
		return of.BoolResolutionDetail{Value: ans.Allowed, ProviderResolutionDetail: detail}
	}
	return of.BoolResolutionDetail{Value: defaultValue, ProviderResolutionDetail: mismatch(detail, flag, ans.Type, "boolean")}
}

// StringEvaluation resolves a string member of a static entitlement's
// config ("metric/member").
func (p *Provider) StringEvaluation(ctx context.Context, flag string, defaultValue string, flatCtx of.FlattenedContext) of.StringResolutionDetail {
	v, detail := p.configMember(ctx, flag, flatCtx)
	if v == nil {
		return of.StringResolutionDetail{Value: defaultValue, ProviderResolutionDetail: detail}
	}
	s, isString := v.(string)
	if !isString {
		return of.StringResolutionDetail{Value: defaultValue, ProviderResolutionDetail: mismatch(detail, flag, fmt.Sprintf("%T", v), "string")}
	}
	return of.StringResolutionDetail{Value: s, ProviderResolutionDetail: detail}
}

// FloatEvaluation resolves a number member of a static entitlement's
// config ("metric/member").
func (p *Provider) FloatEvaluation(ctx context.Context, flag string, defaultValue float64, flatCtx of.FlattenedContext) of.FloatResolutionDetail {
	v, detail := p.configMember(ctx, flag, flatCtx)
	if v == nil {
		return of.FloatResolutionDetail{Value: defaultValue, ProviderResolutionDetail: detail}
	}
	f, isNumber := v.(float64)
	if !isNumber {
		return of.FloatResolutionDetail{Value: defaultValue, ProviderResolutionDetail: mismatch(detail, flag, fmt.Sprintf("%T", v), "float")}
	}
	return of.FloatResolutionDetail{Value: f, ProviderResolutionDetail: detail}
}

// IntEvaluation resolves an integral number member of a static
// entitlement's config ("metric/member"); a fraction, or a number past
// int64, is a TYPE_MISMATCH rather than a silent truncation.
func (p *Provider) IntEvaluation(ctx context.Context, flag string, defaultValue int64, flatCtx of.FlattenedContext) of.IntResolutionDetail {
	v, detail := p.configMember(ctx, flag, flatCtx)
	if v == nil {
		return of.IntResolutionDetail{Value: defaultValue, ProviderResolutionDetail: detail}
	}
	// JSON numbers decode as float64: integral ones up to 2^53 are exact.
	f, isNumber := v.(float64)
	if !isNumber || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return of.IntResolutionDetail{Value: defaultValue, ProviderResolutionDetail: mismatch(detail, flag, fmt.Sprintf("%v", v), "integer")}
	}
	return of.IntResolutionDetail{Value: int64(f), ProviderResolutionDetail: detail}
}

// ObjectEvaluation resolves a static entitlement's config (a
// map[string]any), or one member of it ("metric/member").
func (p *Provider) ObjectEvaluation(ctx context.Context, flag string, defaultValue any, flatCtx of.FlattenedContext) of.InterfaceResolutionDetail {
	if strings.Contains(flag, configSeparator) {
		v, detail := p.configMember(ctx, flag, flatCtx)
		if v == nil {
			return of.InterfaceResolutionDetail{Value: defaultValue, ProviderResolutionDetail: detail}
		}
		return of.InterfaceResolutionDetail{Value: v, ProviderResolutionDetail: detail}
	}
	ans, detail, ok := p.check(ctx, flag, flatCtx)
	if !ok || policyRefused(ans) {
		return of.InterfaceResolutionDetail{Value: defaultValue, ProviderResolutionDetail: detail}
	}
	if ans.Type != "static" {
		return of.InterfaceResolutionDetail{Value: defaultValue, ProviderResolutionDetail: mismatch(detail, flag, ans.Type, "object")}
	}
	cfg := ans.Config
	if cfg == nil {
		cfg = map[string]any{}
	}
	return of.InterfaceResolutionDetail{Value: cfg, ProviderResolutionDetail: detail}
}

// configMember reads "metric/member" of a static entitlement's config; a
// nil value means detail carries the error.
func (p *Provider) configMember(ctx context.Context, flag string, flatCtx of.FlattenedContext) (any, of.ProviderResolutionDetail) {
	metric, member, found := strings.Cut(flag, configSeparator)
	if !found || metric == "" || member == "" {
		return nil, errorDetail(of.NewFlagNotFoundResolutionError(fmt.Sprintf(
			"flag %q: a string or number flag names a static entitlement's config member as metric%smember", flag, configSeparator)), nil)
	}
	ans, detail, ok := p.check(ctx, metric, flatCtx)
	if !ok || policyRefused(ans) {
		return nil, detail
	}
	if ans.Type != "static" {
		return nil, mismatch(detail, flag, ans.Type, "static config member")
	}
	v, found := ans.Config[member]
	if !found || v == nil {
		// The metric exists but this member does not: the flag, as named,
		// is not there.
		return nil, errorDetail(of.NewFlagNotFoundResolutionError(fmt.Sprintf("flag %q: the config of %s has no member %q", flag, metric, member)), detail.FlagMetadata)
	}
	return v, detail
}

// check asks the Checker about metric for the targeting key's customer,
// one unit; ok is false when detail carries an error instead.
func (p *Provider) check(ctx context.Context, metric string, flatCtx of.FlattenedContext) (edge.Answer, of.ProviderResolutionDetail, bool) {
	customer, _ := flatCtx[of.TargetingKey].(string)
	if customer == "" {
		return edge.Answer{}, errorDetail(of.NewTargetingKeyMissingResolutionError(
			"the targeting key names the creditd customer (id or external id)"), nil), false
	}
	if metric == "" {
		return edge.Answer{}, errorDetail(of.NewFlagNotFoundResolutionError("empty flag key"), nil), false
	}
	ans, err := p.checker.Check(ctx, customer, metric, 1)
	if err != nil {
		return edge.Answer{}, errorDetail(resolutionError(metric, err), nil), false
	}
	md := of.FlagMetadata{
		MetadataSource:          string(ans.Source),
		MetadataAgeMS:           ans.Age.Milliseconds(),
		MetadataEntitlementType: ans.Type,
		MetadataCustomerID:      ans.CustomerID,
	}
	return ans, of.ProviderResolutionDetail{Reason: reason(ans.Source), FlagMetadata: md}, true
}

// policyRefused reports whether ans is the Fallback policy's verdict with
// no config to give: fail-closed, or no figures at all. A config flag then
// resolves to the caller's default, reason DEFAULT, source "policy": the
// policy's "refuse" means "not entitled", and a config read under
// fail-open with figures kept from before is the best there is.
func policyRefused(ans edge.Answer) bool {
	return ans.Source == edge.SourcePolicy && (!ans.Allowed || ans.Type == "")
}

// reason is OpenFeature's reason for an answer from src: figures kept in
// memory are CACHED, a check creditd just answered for this customer is
// TARGETING_MATCH, and the fail-open or fail-closed verdict is the
// configured DEFAULT.
func reason(src edge.Source) of.Reason {
	switch src {
	case edge.SourceMemory:
		return of.CachedReason
	case edge.SourceHTTP:
		return of.TargetingMatchReason
	case edge.SourcePolicy:
		return of.DefaultReason
	}
	return of.UnknownReason
}

// resolutionError maps a check's error to OpenFeature's codes: a 404 for
// the metric (no such metric, no active metering rule) is FLAG_NOT_FOUND,
// a 404 for the customer (a strict external id) or a 400 naming the
// customer is INVALID_CONTEXT, anything else GENERAL.
func resolutionError(metric string, err error) of.ResolutionError {
	var prob *client.Problem
	if errors.As(err, &prob) {
		detail := strings.ToLower(prob.Detail)
		switch {
		case prob.Status == http.StatusNotFound && strings.Contains(detail, "customer"):
			return of.NewInvalidContextResolutionError("the targeting key names no customer: " + prob.Detail)
		case prob.Status == http.StatusNotFound:
			return of.NewFlagNotFoundResolutionError(fmt.Sprintf("%s: %s", metric, prob.Detail))
		case prob.Status == http.StatusBadRequest && prob.Field == "billable_metric_key":
			return of.NewFlagNotFoundResolutionError(fmt.Sprintf("%s: %s", metric, prob.Detail))
		case prob.Status == http.StatusBadRequest:
			return of.NewInvalidContextResolutionError(prob.Detail)
		}
	}
	return of.NewGeneralResolutionError("creditd check of "+metric+" failed", err)
}

func errorDetail(re of.ResolutionError, md of.FlagMetadata) of.ProviderResolutionDetail {
	return of.ProviderResolutionDetail{ResolutionError: re, Reason: of.ErrorReason, FlagMetadata: md}
}

// mismatch turns detail (of a check that answered) into a TYPE_MISMATCH,
// keeping its metadata so the caller still sees what the metric is.
func mismatch(detail of.ProviderResolutionDetail, flag, got, want string) of.ProviderResolutionDetail {
	return errorDetail(of.NewTypeMismatchResolutionError(fmt.Sprintf("flag %q is %s, read as %s", flag, got, want)), detail.FlagMetadata)
}
