package api

import (
	"encoding/json"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// metricKeyParam reads the {key} of a billable-metric path; a bad escape or
// an empty key names no metric (404).
func (c *call) metricKeyParam(name string) (string, error) {
	v, ok := c.pathParam(name)
	if !ok || v == "" {
		return "", engine.NotFound("billable metric not found")
	}
	return v, nil
}

// listMetrics answers GET /v1/billable-metrics, oldest first (docs/spec/addendum.md §4).
func (s *Server) listMetrics(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	page, err := s.metering.ListMetrics(c.reqContext(), c.scope, c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// createMetric answers POST /v1/billable-metrics with 201.
func (s *Server) createMetric(c *call) error {
	var in metricPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCreate()
	if err != nil {
		return err
	}
	m, err := s.metering.CreateMetric(c.reqContext(), c.scope, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, m)
}

// getMetric answers GET /v1/billable-metrics/{key}.
func (s *Server) getMetric(c *call) error {
	key, err := c.metricKeyParam("key")
	if err != nil {
		return err
	}
	m, err := s.metering.GetMetric(c.reqContext(), c.scope, key)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, m)
}

// patchMetric answers PATCH /v1/billable-metrics/{key} with 200; the type
// and key are immutable (422 when another value is sent).
func (s *Server) patchMetric(c *call) error {
	key, err := c.metricKeyParam("key")
	if err != nil {
		return err
	}
	var in metricPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	m, err := s.metering.UpdateMetric(c.reqContext(), c.scope, key, in.toUpdate())
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, m)
}

// listRules answers GET /v1/metering-rules, oldest first.
func (s *Server) listRules(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	activeOnly, err := c.queryBool("active_only")
	if err != nil {
		return err
	}
	page, err := s.metering.ListRules(c.reqContext(), c.scope, c.query("billable_metric_key"), activeOnly, c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// createRule answers POST /v1/metering-rules with 201: the new rule is
// active at once and ends the previous one.
func (s *Server) createRule(c *call) error {
	var in rulePayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	r, err := s.metering.CreateRule(c.reqContext(), c.scope, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, r)
}

// registerPricing adds the routes of pricing and the hot path: billable
// metrics, metering rules, entitlement checks, consume, usage, gauges and
// reservations.
func (s *Server) registerPricing() {
	s.handle("GET", "/v1/billable-metrics", optTenant, s.listMetrics)
	s.handle("POST", "/v1/billable-metrics", optTenant|optIdem, s.createMetric)
	s.handle("GET", "/v1/billable-metrics/{key}", optTenant, s.getMetric)
	s.handle("PATCH", "/v1/billable-metrics/{key}", optTenant|optIdem, s.patchMetric)
	s.handle("GET", "/v1/metering-rules", optTenant, s.listRules)
	s.handle("POST", "/v1/metering-rules", optTenant|optIdem, s.createRule)

	s.handle("GET", "/v1/entitlements/check", optTenant|optFusedRead, s.checkQuery)
	s.handle("POST", "/v1/entitlements/consume", optTenant|optIdem|optDryRun|optRerun|optFused, s.consume)
	s.handle("POST", "/v1/usage", optTenant|optIdem|optStored, s.usage)
	for _, form := range []struct {
		prefix string
		strict bool
	}{{"/v1/customers/{id}", false}, {"/v1/customer-by-external-id/{external_id}", true}} {
		ref := refParam(form.strict)
		s.handle("GET", form.prefix+"/entitlements/{metric}", optTenant|optFusedRead, s.checkPath(ref))
		s.handle("POST", form.prefix+"/entitlements/{billable_metric_key}/increment", optTenant|optIdem|optRerun|optFused, s.moveGauge(ref, true))
		s.handle("POST", form.prefix+"/entitlements/{billable_metric_key}/decrement", optTenant|optIdem|optRerun|optFused, s.moveGauge(ref, false))
	}
	s.registerLeases()

	s.handle("POST", "/v1/reservations", optTenant|optIdem|optDryRun|optRerun|optFused, s.createReservation)
	s.handle("GET", "/v1/reservations/{id}", optTenant, s.getReservation)
	s.handle("POST", "/v1/reservations/{id}/commit", optTenant|optIdem|optRerun|optFused, s.commitReservation)
	s.handle("POST", "/v1/reservations/{id}/release", optTenant|optIdem|optRerun|optFused, s.releaseReservation)
	s.handle("POST", "/v1/reservations/{id}/extend", optTenant|optIdem|optStored, s.extendReservation)
	s.handle("GET", "/v1/customers/{customer_id}/reservations", optTenant, s.listReservations(customerIDParam))
	s.handle("GET", "/v1/customer-by-external-id/{external_id}/reservations", optTenant, s.listReservations(refParam(true)))
}

// metricPayload is the body of POST and PATCH /v1/billable-metrics.
type metricPayload struct {
	Key          *string         `json:"key"`
	Name         *string         `json:"name"`
	Type         *string         `json:"type"`
	DefaultValue json.RawMessage `json:"default_value"`
	Metadata     engine.Metadata `json:"metadata"`
}

// toCreate checks a POST body, naming the first wrong member.
func (in *metricPayload) toCreate() (engine.CreateMetric, error) {
	if in.Key == nil || *in.Key == "" {
		return engine.CreateMetric{}, engine.Invalid("key", "key is required")
	}
	if !engine.ValidMetricKey(*in.Key) {
		return engine.CreateMetric{}, engine.Invalid("key", "key must be 1-128 letters, digits, '_', '.', ':' or '-'")
	}
	if in.Type == nil || *in.Type == "" {
		return engine.CreateMetric{}, engine.Invalid("type", "type is required")
	}
	t := engine.MetricType(*in.Type)
	if !t.Valid() {
		return engine.CreateMetric{}, engine.Invalid("type", "type must be metered, boolean, gauge or static")
	}
	def, err := engine.NormalizeDefault(t, in.DefaultValue)
	if err != nil {
		return engine.CreateMetric{}, err
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.CreateMetric{}, err
	}
	name := *in.Key
	if in.Name != nil {
		if strings.TrimSpace(*in.Name) == "" {
			return engine.CreateMetric{}, engine.Invalid("name", "name must not be empty")
		}
		name = *in.Name
	}
	return engine.CreateMetric{Key: *in.Key, Name: name, Type: t, DefaultValue: def, Metadata: meta}, nil
}

// toUpdate is a PATCH body as the engine's command; the engine checks its
// members after the stored metric's, in the order the answer names them.
func (in *metricPayload) toUpdate() engine.UpdateMetric {
	up := engine.UpdateMetric{Key: in.Key, Name: in.Name, DefaultValue: in.DefaultValue, Metadata: in.Metadata}
	if in.Type != nil {
		t := engine.MetricType(*in.Type)
		up.Type = &t
	}
	return up
}

// rulePayload is the body of POST /v1/metering-rules.
type rulePayload struct {
	BillableMetricKey *string            `json:"billable_metric_key"`
	CostType          *string            `json:"cost_type"`
	BaseCost          *int64             `json:"base_cost"`
	UnitCost          *int64             `json:"unit_cost"`
	TierConfig        *engine.TierConfig `json:"tier_config"`
	Metadata          engine.Metadata    `json:"metadata"`
}

// toCommand checks the body, naming the first wrong member; the rule
// itself passes engine.ValidateRule, the rule the Lua pricing twin shares.
func (in *rulePayload) toCommand() (engine.CreateRule, error) {
	if in.BillableMetricKey == nil || *in.BillableMetricKey == "" {
		return engine.CreateRule{}, engine.Invalid("billable_metric_key", "billable_metric_key is required")
	}
	if !engine.ValidMetricKey(*in.BillableMetricKey) {
		return engine.CreateRule{}, engine.Invalid("billable_metric_key", "billable_metric_key must be 1-128 letters, digits, '_', '.', ':' or '-'")
	}
	if in.CostType == nil || *in.CostType == "" {
		return engine.CreateRule{}, engine.Invalid("cost_type", "cost_type is required")
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.CreateRule{}, err
	}
	r := engine.MeteringRule{BillableMetricKey: *in.BillableMetricKey, CostType: engine.CostType(*in.CostType), TierConfig: in.TierConfig}
	if in.BaseCost != nil {
		r.BaseCost = *in.BaseCost
	} else if r.CostType == engine.CostFlat {
		return engine.CreateRule{}, engine.Invalid("base_cost", "base_cost is required for flat")
	}
	if in.UnitCost != nil {
		r.UnitCost = *in.UnitCost
	}
	if r.CostType != engine.CostTiered {
		r.TierConfig = nil
	}
	if err := engine.ValidateRule(r); err != nil {
		return engine.CreateRule{}, err
	}
	return engine.CreateRule{BillableMetricKey: r.BillableMetricKey, CostType: r.CostType, BaseCost: r.BaseCost,
		UnitCost: r.UnitCost, TierConfig: r.TierConfig, Metadata: meta}, nil
}
