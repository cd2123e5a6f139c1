package api

import (
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerOverrides adds the override routes (docs/spec/interface.md Overrides). The
// DELETE is idempotent too (Common rules 1: "and on override DELETE").
func (s *Server) registerOverrides() {
	s.handle("GET", "/v1/subscriptions/{id}/overrides", optTenant, s.listOverrides)
	s.handle("POST", "/v1/subscriptions/{id}/overrides", optTenant|optIdem, s.createOverride)
	s.handle("PATCH", "/v1/subscriptions/{id}/overrides/{billable_metric_key}", optTenant|optIdem, s.patchOverride)
	s.handle("DELETE", "/v1/subscriptions/{id}/overrides/{billable_metric_key}", optTenant|optIdem, s.deleteOverride)
}

// overrideList is the body of GET /v1/subscriptions/{id}/overrides: no paging.
type overrideList struct {
	Overrides []engine.Override `json:"overrides"`
}

// overrideKey reads the {billable_metric_key} path parameter; a malformed
// one names no override.
func (c *call) overrideKey() (string, error) {
	v, ok := c.pathParam("billable_metric_key")
	if !ok || v == "" {
		return "", engine.NotFound("override not found")
	}
	return v, nil
}

// decodeOverrideBody decodes an override body; the spec lists only 400s
// for override bodies, so a member of the wrong JSON type is one too.
func decodeOverrideBody(body []byte, v any) error {
	err := decodeBody(body, v)
	if e, ok := engine.AsError(err); ok && e.Kind == engine.KindValidation {
		return engine.BadRequest(e.Field, e.Detail)
	}
	return err
}

// listOverrides answers GET /v1/subscriptions/{id}/overrides.
func (s *Server) listOverrides(c *call) error {
	id, err := c.idParam("id", "subscription")
	if err != nil {
		return err
	}
	list, err := s.overrides.List(c.reqContext(), c.scope, id)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, overrideList{Overrides: list})
}

// createOverride answers POST /v1/subscriptions/{id}/overrides with 201.
func (s *Server) createOverride(c *call) error {
	id, err := c.idParam("id", "subscription")
	if err != nil {
		return err
	}
	var in createOverridePayload
	if err := decodeOverrideBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	o, err := s.overrides.Create(c.reqContext(), c.scope, id, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, o)
}

// patchOverride answers PATCH /v1/subscriptions/{id}/overrides/{key} with 200.
func (s *Server) patchOverride(c *call) error {
	id, err := c.idParam("id", "subscription")
	if err != nil {
		return err
	}
	key, err := c.overrideKey()
	if err != nil {
		return err
	}
	var in updateOverridePayload
	if err := decodeOverrideBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	o, err := s.overrides.Update(c.reqContext(), c.scope, id, key, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, o)
}

// deleteOverride answers DELETE /v1/subscriptions/{id}/overrides/{key} with 204.
func (s *Server) deleteOverride(c *call) error {
	id, err := c.idParam("id", "subscription")
	if err != nil {
		return err
	}
	key, err := c.overrideKey()
	if err != nil {
		return err
	}
	if err := s.overrides.Delete(c.reqContext(), c.scope, id, key); err != nil {
		return err
	}
	return c.noContent()
}

// createOverridePayload is the body of POST /v1/subscriptions/{id}/overrides.
type createOverridePayload struct {
	BillableMetricKey *string         `json:"billable_metric_key"`
	Value             json.RawMessage `json:"value"`
	ExpiresAt         *string         `json:"expires_at"`
	Reason            *string         `json:"reason"`
}

// toCommand checks the body, naming the first wrong member (every one a
// 400: the spec lists no 422 for override bodies); the value's shape and an
// expiry in the past are the engine's, which reads the metric and the clock.
func (in *createOverridePayload) toCommand() (engine.CreateOverride, error) {
	if in.BillableMetricKey == nil || *in.BillableMetricKey == "" {
		return engine.CreateOverride{}, engine.BadRequest("billable_metric_key", "billable_metric_key is required")
	}
	if len(in.Value) == 0 || string(in.Value) == "null" {
		return engine.CreateOverride{}, engine.BadRequest("value", "value is required")
	}
	if err := checkOverrideReason(in.Reason); err != nil {
		return engine.CreateOverride{}, err
	}
	cmd := engine.CreateOverride{BillableMetricKey: *in.BillableMetricKey, Value: in.Value, Reason: in.Reason}
	if in.ExpiresAt != nil {
		t, err := overrideExpiry(*in.ExpiresAt)
		if err != nil {
			return engine.CreateOverride{}, err
		}
		cmd.ExpiresAt = &t
	}
	return cmd, nil
}

// updateOverridePayload is the body of PATCH .../overrides/{key}. ExpiresAt
// is raw so an explicit null (permanent) differs from an omitted member
// (keep).
type updateOverridePayload struct {
	Value     json.RawMessage `json:"value"`
	ExpiresAt json.RawMessage `json:"expires_at"`
	Reason    *string         `json:"reason"`
}

// toCommand checks the body, naming the first wrong member. A null value
// is carried to the engine, which names it after finding the subscription.
func (in *updateOverridePayload) toCommand() (engine.UpdateOverride, error) {
	if err := checkOverrideReason(in.Reason); err != nil {
		return engine.UpdateOverride{}, err
	}
	cmd := engine.UpdateOverride{Reason: in.Reason}
	switch {
	case len(in.ExpiresAt) == 0:
	case string(in.ExpiresAt) == "null":
		cmd.SetExpiry = true
	default:
		var raw string
		if json.Unmarshal(in.ExpiresAt, &raw) != nil {
			return engine.UpdateOverride{}, engine.BadRequest("expires_at", "expires_at must be an RFC 3339 date-time or null")
		}
		t, err := overrideExpiry(raw)
		if err != nil {
			return engine.UpdateOverride{}, err
		}
		cmd.SetExpiry, cmd.ExpiresAt = true, &t
	}
	switch {
	case string(in.Value) == "null":
		cmd.ValueErr = engine.BadRequest("value", "value cannot be null; omit it to keep the value")
	case len(in.Value) > 0:
		cmd.Value = in.Value
	}
	return cmd, nil
}

// overrideExpiry reads an override's expires_at: an RFC 3339 instant, a
// 400 otherwise, kept to the millisecond in UTC.
func overrideExpiry(raw string) (time.Time, error) {
	t, err := engine.ParseInstant("expires_at", raw, engine.KindBadRequest)
	if err != nil {
		return time.Time{}, err
	}
	return t.UTC().Truncate(time.Millisecond), nil
}

// checkOverrideReason bounds an override's reason.
func checkOverrideReason(r *string) error {
	if r != nil && utf8.RuneCountInString(*r) > engine.MaxOverrideReasonChars {
		return engine.BadRequest("reason", "reason is longer than 1000 characters")
	}
	return nil
}
