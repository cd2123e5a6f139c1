package api

import (
	"encoding/json"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// The handlers here are the hot path: tenants call checks and consumes from
// their own request paths thousands of times a second. They decode, call the
// engine once and encode; nothing else.

// checkQuery answers GET /v1/entitlements/check?customer_id=&billable_metric_key=&units=.
// customer_id is own or external id (auto-created); a missing parameter is a
// 400 naming it.
func (s *Server) checkQuery(c *call) error {
	args := c.ctx.QueryArgs()
	cust := args.Peek("customer_id")
	if len(cust) == 0 {
		return errCheckCustomerMissing
	}
	metric := args.Peek("billable_metric_key")
	if len(metric) == 0 {
		return errCheckMetricMissing
	}
	units, err := parseUnits(string(args.Peek("units")))
	if err != nil {
		return err
	}
	res, err := s.entitlements.Check(c.reqContext(), c.scope, c.tenant,
		engine.CustomerRef{Value: string(cust)}, string(metric), units)
	if err != nil {
		return err
	}
	return c.check(&res)
}

var (
	errCheckCustomerMissing = engine.BadRequest("customer_id", "the customer_id query parameter is required")
	errCheckMetricMissing   = engine.BadRequest("billable_metric_key", "the billable_metric_key query parameter is required")
)

// parseUnits reads a check's optional units query value: default 1;
// anything but an integer >= 1 is a 400 naming units.
func parseUnits(raw string) (int64, error) {
	if raw == "" {
		return 1, nil
	}
	var n int64
	for i, ch := range raw {
		if ch < '0' || ch > '9' || i > 18 {
			return 0, errCheckUnits
		}
		n = n*10 + int64(ch-'0')
	}
	if n < 1 {
		return 0, errCheckUnits
	}
	return n, nil
}

var errCheckUnits = engine.BadRequest("units", "units must be an integer >= 1")

// checkPath answers GET .../entitlements/{metric}: the check with the
// customer and metric in the path.
func (s *Server) checkPath(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		metric, ok := c.pathParam("metric")
		if !ok || metric == "" {
			return engine.NotFound("billable metric not found")
		}
		units, err := parseUnits(string(c.ctx.QueryArgs().Peek("units")))
		if err != nil {
			return err
		}
		res, err := s.entitlements.Check(c.reqContext(), c.scope, c.tenant, r, metric, units)
		if err != nil {
			return err
		}
		return c.check(&res)
	}
}

// consume answers POST /v1/entitlements/consume with 200 (docs/spec/addendum.md §7).
func (s *Server) consume(c *call) error {
	var body consumePayload
	if err := decodeConsume(c.ctx.Request.Body(), &body); err != nil {
		return err
	}
	if body.dry() != c.dry {
		// The middleware read dry_run otherwise (a member spelled twice):
		// a charge must never run without its idempotency.
		return engine.Invalid("dry_run", "dry_run must appear once, as true or false")
	}
	in, err := body.toCommand()
	if err != nil {
		return err
	}
	if in.Dry {
		res, err := s.entitlements.ConsumeDry(c.reqContext(), c.scope, c.tenant, in)
		if err != nil {
			return err
		}
		return c.consumed(&res)
	}
	res, err := s.entitlements.Consume(c.reqContext(), c.scope, c.tenant, c.idem, in)
	if err != nil {
		return err
	}
	return c.consumed(&res)
}

// usageBody is the 200 body of POST /v1/usage.
type usageBody struct {
	Results []engine.UsageEventResult `json:"results"`
}

// usage answers POST /v1/usage: each event is charged as its own consume,
// so one bad event never fails the others.
func (s *Server) usage(c *call) error {
	var body usagePayload
	if err := decodeFlat(c.ctx.Request.Body(), &body, flatUsage); err != nil {
		return err
	}
	in, err := body.toCommand()
	if err != nil {
		return err
	}
	res, err := s.entitlements.Usage(c.reqContext(), c.scope, c.tenant, in)
	if err != nil {
		return err
	}
	if res == nil {
		res = []engine.UsageEventResult{}
	}
	for i := range res {
		if res[i].Cause == nil {
			continue
		}
		// Like a 500: the cause goes to the log, the body gets the request
		// id to quote (an event's error is no place for SQL states).
		s.log.Error().Bytes("request_id", c.reqID).Str("event_id", res[i].EventID).Err(res[i].Cause).
			Msg("usage event: internal error")
		msg := engine.UsageInternalError + "; quote request_id " + string(c.reqID) + " when reporting it"
		res[i].Error = &msg
	}
	return c.json(fasthttp.StatusOK, usageBody{Results: res})
}

// moveGauge answers POST .../entitlements/{billable_metric_key}/increment
// (up) and /decrement with 200; a cap refusal is a 409 whose problem body
// carries current, cap and shortfall.
func (s *Server) moveGauge(ref refFunc, up bool) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		metric, ok := c.pathParam("billable_metric_key")
		if !ok || metric == "" {
			return engine.NotFound("billable metric not found")
		}
		var in gaugePayload
		if err := decodeFlat(c.ctx.Request.Body(), &in, flatGauge); err != nil {
			return err
		}
		move, err := in.toCommand(up)
		if err != nil {
			return err
		}
		res, err := s.entitlements.MoveGauge(c.reqContext(), c.scope, c.tenant, r, metric, up, c.idem, move)
		if err != nil {
			return err
		}
		return appended(c, fasthttp.StatusOK, &res, res.Lease == nil, appendGauge)
	}
}

// gaugePayload is the body of a gauge increment or decrement.
type gaugePayload struct {
	Amount *int64  `json:"amount"`
	Policy *string `json:"policy"`
	// Meta is accepted and not kept.
	Meta json.RawMessage `json:"metadata"`
	// LeaseSeconds takes a lease on an increment's slots (engine/leases.go).
	LeaseSeconds *int64 `json:"lease_seconds"`
}

// toCommand checks the body of an increment (up) or a decrement: amount,
// then policy (an increment's only), then lease_seconds.
func (in *gaugePayload) toCommand(up bool) (engine.GaugeMove, error) {
	if in.Amount == nil {
		return engine.GaugeMove{}, engine.BadRequest("amount", "amount must be an integer >= 1")
	}
	if err := engine.GaugeAmount.Check("", *in.Amount); err != nil {
		return engine.GaugeMove{}, err
	}
	out := engine.GaugeMove{Amount: *in.Amount}
	if up && in.Policy != nil {
		switch *in.Policy {
		case "block":
		case "allow":
			out.Allow = true
		default:
			return engine.GaugeMove{}, engine.BadRequest("policy", "policy must be block or allow")
		}
	}
	if in.LeaseSeconds != nil {
		if !up {
			return engine.GaugeMove{}, engine.Invalid("lease_seconds", "only an increment takes a lease")
		}
		if err := engine.CheckLeaseSeconds(*in.LeaseSeconds); err != nil {
			return engine.GaugeMove{}, err
		}
		out.LeaseSeconds = *in.LeaseSeconds
	}
	return out, nil
}
