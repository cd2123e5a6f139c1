// Plan entitlements: the per-metric limits a variant gives, with their command
// and the value normalisation shared with overrides.

package engine

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
)

// VariantEntitlement is what a variant grants for one billable metric
// (docs/spec/addendum.md §5). Value is shaped by Type like an override value.
type VariantEntitlement struct {
	ID                uuid.UUID       `json:"id"`
	PlanVariantID     uuid.UUID       `json:"plan_variant_id"`
	TenantID          uuid.UUID       `json:"-"`
	Environment       Environment     `json:"-"`
	BillableMetricKey string          `json:"billable_metric_key"`
	Type              MetricType      `json:"type"`
	Value             json.RawMessage `json:"value"`
	CreatedAt         time.Time       `json:"created_at"`
}

// PutEntitlement is a checked request to set a variant's entitlement: api
// builds it from the body of POST /v1/plans/{id}/variants/{vid}/entitlements.
// Value is checked against the metric's type here, once the metric is read.
type PutEntitlement struct {
	BillableMetricKey string
	Value             json.RawMessage // not empty, not null
}

// PutEntitlement sets what a variant grants for one metric, replacing the
// previous entitlement of that metric (a new id). Errors: 404 (no such
// variant under that plan, or no such metric, naming billable_metric_key),
// 400 value not shaped for the metric's type.
func (s *Plans) PutEntitlement(ctx context.Context, scope Scope, planID, variantID uuid.UUID, in PutEntitlement) (VariantEntitlement, error) {
	m, ok, err := s.metrics.Metric(ctx, scope, in.BillableMetricKey)
	if err != nil {
		return VariantEntitlement{}, err
	}
	if !ok {
		return VariantEntitlement{}, &Error{Kind: KindNotFound, Field: "billable_metric_key", Detail: "no billable metric has this key"}
	}
	val, err := EntitlementValue(m.Type, in.Value)
	if err != nil {
		return VariantEntitlement{}, err
	}
	e := VariantEntitlement{ID: uuid.Must(uuid.NewV7()), PlanVariantID: variantID, TenantID: scope.TenantID,
		Environment: scope.Environment, BillableMetricKey: m.Key, Type: m.Type, Value: val, CreatedAt: s.clock.Now()}
	if err := s.store.PutEntitlement(ctx, planID, e); err != nil {
		if errors.Is(err, ErrNotFound) {
			return VariantEntitlement{}, NotFound("plan variant not found")
		}
		return VariantEntitlement{}, err
	}
	return e, nil
}

// EntitlementValue checks an entitlement or override value against the
// metric type and returns it in canonical form: boolean and metered
// {"enabled": bool}, gauge {"cap": integer >= 0}, static {"config": object}
// (docs/spec/addendum.md §5). A mismatch is a 400 naming the member, as for overrides.
// Overrides refuse metered metrics before calling this.
func EntitlementValue(t MetricType, raw json.RawMessage) (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil || obj == nil {
		return nil, BadRequest("value", "value must be an object shaped for the metric's type")
	}
	switch t {
	case MetricBoolean, MetricMetered:
		var on bool
		if v, ok := obj["enabled"]; !ok || json.Unmarshal(v, &on) != nil {
			return nil, BadRequest("value.enabled", "a "+string(t)+" value is {\"enabled\": true|false}")
		}
		return json.Marshal(map[string]bool{"enabled": on})
	case MetricGauge:
		var c int64
		if v, ok := obj["cap"]; !ok || json.Unmarshal(v, &c) != nil || c < 0 {
			return nil, BadRequest("value.cap", "a gauge value is {\"cap\": integer >= 0}")
		}
		return json.Marshal(map[string]int64{"cap": c})
	case MetricStatic:
		v, ok := obj["config"]
		var cfg map[string]json.RawMessage
		if !ok || json.Unmarshal(v, &cfg) != nil || cfg == nil {
			return nil, BadRequest("value.config", "a static value is {\"config\": object}")
		}
		return json.Marshal(map[string]json.RawMessage{"config": v})
	}
	return nil, BadRequest("value", "the metric has an unknown type")
}
