package api

import (
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerAlerts adds the credit alert routes (issue 15 item 4): a
// customer's thresholds and top-up rule, and the tenant default of the
// key's environment. PUT replaces the whole configuration, so a retry has
// the same effect and needs no Idempotency-Key.
func (s *Server) registerAlerts() {
	ref := refParam(false)
	s.handle("GET", "/v1/customers/{id}/credits/alerts", optTenant, s.getCustomerAlerts(ref))
	s.handle("PUT", "/v1/customers/{id}/credits/alerts", optTenant, s.putCustomerAlerts(ref))
	s.handle("DELETE", "/v1/customers/{id}/credits/alerts", optTenant, s.deleteCustomerAlerts(ref))
	s.handle("GET", "/v1/credit-alerts/default", optTenant, s.getDefaultAlerts)
	s.handle("PUT", "/v1/credit-alerts/default", optTenant, s.putDefaultAlerts)
}

// getCustomerAlerts answers GET /v1/customers/{id}/credits/alerts: the
// settings that apply to the customer and where they come from.
func (s *Server) getCustomerAlerts(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		out, err := s.alerts.Customer(c.reqContext(), c.scope, r)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, out)
	}
}

// putCustomerAlerts answers PUT /v1/customers/{id}/credits/alerts with 200.
func (s *Server) putCustomerAlerts(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		var in alertSettingsPayload
		if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
			return err
		}
		settings, err := in.toCommand()
		if err != nil {
			return err
		}
		out, err := s.alerts.PutCustomer(c.reqContext(), c.scope, r, settings)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, out)
	}
}

// deleteCustomerAlerts answers DELETE /v1/customers/{id}/credits/alerts
// with 204: the tenant default applies again.
func (s *Server) deleteCustomerAlerts(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		if err := s.alerts.DeleteCustomer(c.reqContext(), c.scope, r); err != nil {
			return err
		}
		return c.noContent()
	}
}

// getDefaultAlerts answers GET /v1/credit-alerts/default.
func (s *Server) getDefaultAlerts(c *call) error {
	out, err := s.alerts.Default(c.reqContext(), c.scope)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, out)
}

// putDefaultAlerts answers PUT /v1/credit-alerts/default with 200.
func (s *Server) putDefaultAlerts(c *call) error {
	var in alertSettingsPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	settings, err := in.toCommand()
	if err != nil {
		return err
	}
	out, err := s.alerts.PutDefault(c.reqContext(), c.scope, settings)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, out)
}

// alertSettingsPayload is the body of the PUT alert routes; pointers tell a
// missing member from a zero.
type alertSettingsPayload struct {
	Thresholds *[]alertThresholdPayload `json:"thresholds"`
	Topup      *topupRulePayload        `json:"topup"`
}

// alertThresholdPayload is one threshold of the body.
type alertThresholdPayload struct {
	Type     *string `json:"type"`
	AmountMC *int64  `json:"amount_mc"`
	Percent  *int64  `json:"percent"`
}

// topupRulePayload is the top-up rule of the body.
type topupRulePayload struct {
	BelowMC             *int64 `json:"below_mc"`
	AmountMC            *int64 `json:"amount_mc"`
	DedupeWindowSeconds *int64 `json:"dedupe_window_seconds"`
}

// toCommand checks the body (422 naming the first wrong member) and returns
// the settings it asks for.
func (in alertSettingsPayload) toCommand() (engine.AlertSettings, error) {
	var out engine.AlertSettings
	if in.Thresholds == nil {
		return out, engine.Invalid("thresholds", "thresholds is required (an empty array for none)")
	}
	ths := *in.Thresholds
	if len(ths) > engine.MaxAlertThresholds {
		return out, engine.Invalid("thresholds", fmt.Sprintf("at most %d thresholds", engine.MaxAlertThresholds))
	}
	out.Thresholds = make([]engine.AlertThreshold, 0, len(ths))
	for i, t := range ths {
		field := fmt.Sprintf("thresholds[%d]", i)
		th, err := t.threshold(field)
		if err != nil {
			return out, err
		}
		for j, prev := range out.Thresholds {
			if sameThreshold(prev, th) {
				return out, engine.Invalid(field, fmt.Sprintf("%s repeats thresholds[%d]", field, j))
			}
		}
		out.Thresholds = append(out.Thresholds, th)
	}
	if in.Topup != nil {
		r, err := in.Topup.rule()
		if err != nil {
			return out, err
		}
		out.Topup = &r
	}
	return out, nil
}

// threshold validates one threshold of the body.
func (t alertThresholdPayload) threshold(field string) (engine.AlertThreshold, error) {
	if t.Type == nil {
		return engine.AlertThreshold{}, engine.Invalid(field+".type", field+".type is required")
	}
	typ := engine.ThresholdType(*t.Type)
	switch typ {
	case engine.ThresholdAbsolute:
		if t.Percent != nil {
			return engine.AlertThreshold{}, engine.Invalid(field+".percent", "an absolute threshold takes amount_mc, not percent")
		}
		if t.AmountMC == nil {
			return engine.AlertThreshold{}, engine.Invalid(field+".amount_mc", field+".amount_mc is required for an absolute threshold")
		}
		if *t.AmountMC < 1 {
			return engine.AlertThreshold{}, engine.Invalid(field+".amount_mc", field+".amount_mc must be >= 1")
		}
		v := *t.AmountMC
		return engine.AlertThreshold{Type: typ, AmountMC: &v}, nil
	case engine.ThresholdPercentOfLastGrant, engine.ThresholdPercentOfPeriodAllowance:
		if t.AmountMC != nil {
			return engine.AlertThreshold{}, engine.Invalid(field+".amount_mc", "a percent threshold takes percent, not amount_mc")
		}
		if t.Percent == nil {
			return engine.AlertThreshold{}, engine.Invalid(field+".percent", field+".percent is required for a percent threshold")
		}
		if *t.Percent < 1 || *t.Percent > engine.MaxAlertPercent {
			return engine.AlertThreshold{}, engine.Invalid(field+".percent", field+".percent must be between 1 and 100")
		}
		v := *t.Percent
		return engine.AlertThreshold{Type: typ, Percent: &v}, nil
	}
	return engine.AlertThreshold{}, engine.Invalid(field+".type",
		field+".type must be absolute, percent_of_last_grant or percent_of_period_allowance")
}

// sameThreshold reports whether t and o are the same threshold.
func sameThreshold(t, o engine.AlertThreshold) bool {
	eq := func(a, b *int64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	return t.Type == o.Type && eq(t.AmountMC, o.AmountMC) && eq(t.Percent, o.Percent)
}

// rule validates the top-up rule of the body.
func (r topupRulePayload) rule() (engine.TopupRule, error) {
	if r.BelowMC == nil {
		return engine.TopupRule{}, engine.Invalid("topup.below_mc", "topup.below_mc is required")
	}
	if *r.BelowMC < 1 {
		return engine.TopupRule{}, engine.Invalid("topup.below_mc", "topup.below_mc must be >= 1")
	}
	if r.AmountMC == nil {
		return engine.TopupRule{}, engine.Invalid("topup.amount_mc", "topup.amount_mc is required")
	}
	if *r.AmountMC < 1 {
		return engine.TopupRule{}, engine.Invalid("topup.amount_mc", "topup.amount_mc must be >= 1")
	}
	window := int64(engine.DefaultTopupDedupeSeconds)
	if r.DedupeWindowSeconds != nil {
		window = *r.DedupeWindowSeconds
		if window < engine.MinTopupDedupeSeconds || window > engine.MaxTopupDedupeSeconds {
			return engine.TopupRule{}, engine.Invalid("topup.dedupe_window_seconds",
				fmt.Sprintf("topup.dedupe_window_seconds must be between %d and %d", engine.MinTopupDedupeSeconds, engine.MaxTopupDedupeSeconds))
		}
	}
	return engine.TopupRule{BelowMC: *r.BelowMC, AmountMC: *r.AmountMC, DedupeWindowSeconds: window}, nil
}
