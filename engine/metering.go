// Metering: the service that creates and reads billable metrics and
// metering rules per tenant (the catalogue a consume prices against).

package engine

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"strings"

	"github.com/google/uuid"
)

// metricKeyPattern is what a billable metric key may look like: it appears
// in URL paths and Redis field names.
var metricKeyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)

// ValidMetricKey reports whether key may name a billable metric.
func ValidMetricKey(key string) bool { return metricKeyPattern.MatchString(key) }

// Metering manages billable metrics and metering rules, and serves the hot
// path's look-ups of them through a CatalogLookup (a CachedCatalog in a
// running creditd).
type Metering struct {
	store  Catalog
	lookup CatalogLookup
	clock  Clock
}

// NewMetering returns the metering service; lookup nil reads store afresh
// on every look-up.
func NewMetering(store Catalog, lookup CatalogLookup, clock Clock) *Metering {
	if lookup == nil {
		lookup = NewCatalogLookup(store)
	}
	return &Metering{store: store, lookup: lookup, clock: clock}
}

// CreateMetric is a checked POST /v1/billable-metrics.
type CreateMetric struct {
	Key          string
	Name         string // the key when the body names none
	Type         MetricType
	DefaultValue json.RawMessage // normalized (NormalizeDefault)
	Metadata     Metadata        // canonical; nil: none
}

// UpdateMetric is a PATCH /v1/billable-metrics/{key}; a nil field keeps
// its value. Its members are checked here, not in api: the answer names a
// missing metric and a changed type or key before any other member.
type UpdateMetric struct {
	Key          *string
	Name         *string
	Type         *MetricType
	DefaultValue json.RawMessage
	Metadata     Metadata
}

// CreateMetric adds a metric. Errors: 409 key taken.
func (s *Metering) CreateMetric(ctx context.Context, scope Scope, in CreateMetric) (BillableMetric, error) {
	now := s.clock.Now()
	m := BillableMetric{ID: uuid.Must(uuid.NewV7()), TenantID: scope.TenantID, Environment: scope.Environment,
		Key: in.Key, Name: in.Name, Type: in.Type, DefaultValue: in.DefaultValue, Metadata: orEmpty(in.Metadata), CreatedAt: now, UpdatedAt: now}
	if err := s.store.CreateMetric(ctx, m); err != nil {
		return BillableMetric{}, err
	}
	return m, nil
}

// UpdateMetric changes name, default_value and metadata (replaced); the type
// is immutable (422 when a different one is sent). Errors: 404, 422.
func (s *Metering) UpdateMetric(ctx context.Context, scope Scope, key string, in UpdateMetric) (BillableMetric, error) {
	m, err := s.store.GetMetric(ctx, scope, key)
	if errors.Is(err, ErrNotFound) {
		return BillableMetric{}, NotFound("billable metric not found")
	}
	if err != nil {
		return BillableMetric{}, err
	}
	if in.Type != nil && *in.Type != m.Type {
		return BillableMetric{}, Invalid("type", "type cannot be changed")
	}
	if in.Key != nil && *in.Key != m.Key {
		return BillableMetric{}, Invalid("key", "key cannot be changed")
	}
	if in.Name != nil {
		if strings.TrimSpace(*in.Name) == "" {
			return BillableMetric{}, Invalid("name", "name must not be empty")
		}
		m.Name = *in.Name
	}
	if in.DefaultValue != nil {
		if m.DefaultValue, err = NormalizeDefault(m.Type, in.DefaultValue); err != nil {
			return BillableMetric{}, err
		}
	}
	if in.Metadata != nil {
		if m.Metadata, err = in.Metadata.Canonical("metadata"); err != nil {
			return BillableMetric{}, err
		}
	}
	m.UpdatedAt = s.clock.Now()
	if err := s.store.UpdateMetric(ctx, m); err != nil {
		return BillableMetric{}, err
	}
	return m, nil
}

// GetMetric reads one metric. Errors: 404.
func (s *Metering) GetMetric(ctx context.Context, scope Scope, key string) (BillableMetric, error) {
	m, ok, err := s.Metric(ctx, scope, key)
	if err != nil {
		return BillableMetric{}, err
	}
	if !ok {
		return BillableMetric{}, NotFound("billable metric not found")
	}
	return m, nil
}

// ListMetrics pages metrics oldest first.
func (s *Metering) ListMetrics(ctx context.Context, scope Scope, cursor string, limit int) (Page[BillableMetric], error) {
	return s.store.ListMetrics(ctx, scope, cursor, limit)
}

// NormalizeDefault checks a default_value against the metric type
// (docs/spec/addendum.md §4) and fills the documented defaults.
func NormalizeDefault(t MetricType, raw json.RawMessage) (json.RawMessage, error) {
	empty := len(raw) == 0 || string(raw) == "null"
	switch t {
	case MetricMetered:
		if !empty {
			return nil, Invalid("default_value", "a metered metric has no default_value")
		}
		return json.RawMessage("null"), nil
	case MetricBoolean:
		if empty {
			return json.RawMessage(`{"enabled":false}`), nil
		}
		var v struct {
			Enabled *bool `json:"enabled"`
		}
		if json.Unmarshal(raw, &v) != nil || v.Enabled == nil {
			return nil, Invalid("default_value.enabled", "a boolean default_value is {\"enabled\": true|false}")
		}
		return json.Marshal(map[string]bool{"enabled": *v.Enabled})
	case MetricGauge:
		if empty {
			return json.RawMessage(`{"cap":0}`), nil
		}
		var v struct {
			Cap *int64 `json:"cap"`
		}
		if json.Unmarshal(raw, &v) != nil || v.Cap == nil || *v.Cap < 0 {
			return nil, Invalid("default_value.cap", "a gauge default_value is {\"cap\": integer >= 0}")
		}
		return json.Marshal(map[string]int64{"cap": *v.Cap})
	case MetricStatic:
		if empty {
			return json.RawMessage(`{"config":{}}`), nil
		}
		var v struct {
			Config json.RawMessage `json:"config"`
		}
		if json.Unmarshal(raw, &v) != nil || len(v.Config) == 0 || v.Config[0] != '{' {
			return nil, Invalid("default_value.config", "a static default_value is {\"config\": object}")
		}
		return json.Marshal(map[string]json.RawMessage{"config": v.Config})
	}
	return nil, Invalid("type", "unknown type")
}

// CreateRule is a checked POST /v1/metering-rules: api has passed its rule
// through ValidateRule.
type CreateRule struct {
	BillableMetricKey string
	CostType          CostType
	BaseCost          int64
	UnitCost          int64
	TierConfig        *TierConfig // nil unless tiered
	Metadata          Metadata    // canonical; nil: none
}

// CreateRule makes the rule in asks for the active rule of its metric,
// ending the previous one, and creates a missing metric as metered. Errors:
// 400 when the key names a metric that is not metered.
func (s *Metering) CreateRule(ctx context.Context, scope Scope, in CreateRule) (MeteringRule, error) {
	now := s.clock.Now()
	r := MeteringRule{ID: uuid.Must(uuid.NewV7()), TenantID: scope.TenantID, Environment: scope.Environment,
		BillableMetricKey: in.BillableMetricKey, CostType: in.CostType, BaseCost: in.BaseCost, UnitCost: in.UnitCost,
		TierConfig: in.TierConfig, EffectiveFrom: now, Metadata: orEmpty(in.Metadata), CreatedAt: now, UpdatedAt: now}
	m, ok, err := s.Metric(ctx, scope, r.BillableMetricKey)
	if err != nil {
		return MeteringRule{}, err
	}
	if ok && m.Type != MetricMetered {
		return MeteringRule{}, BadRequest("billable_metric_key", "only metered metrics take metering rules")
	}
	missing := BillableMetric{ID: uuid.Must(uuid.NewV7()), TenantID: scope.TenantID, Environment: scope.Environment,
		Key: r.BillableMetricKey, Name: r.BillableMetricKey, Type: MetricMetered, DefaultValue: json.RawMessage("null"),
		Metadata: Metadata{}, CreatedAt: now, UpdatedAt: now}
	if err := s.store.CreateRule(ctx, r, missing); err != nil {
		return MeteringRule{}, err
	}
	return r, nil
}

// ListRules pages rules oldest first.
func (s *Metering) ListRules(ctx context.Context, scope Scope, metricKey string, activeOnly bool, cursor string, limit int) (Page[MeteringRule], error) {
	return s.store.ListRules(ctx, scope, metricKey, activeOnly, cursor, limit)
}

// Metric is the look-up of a metric; ok is false when none exists.
func (s *Metering) Metric(ctx context.Context, scope Scope, key string) (BillableMetric, bool, error) {
	return s.lookup.Metric(ctx, scope, key)
}

// ActiveRule is the look-up of a metric's active rule; ok is false when it
// has none.
func (s *Metering) ActiveRule(ctx context.Context, scope Scope, key string) (MeteringRule, bool, error) {
	return s.lookup.Rule(ctx, scope, key)
}

// AllMetrics lists every metric of the scope.
func (s *Metering) AllMetrics(ctx context.Context, scope Scope) ([]BillableMetric, error) {
	return s.store.AllMetrics(ctx, scope)
}
