package api

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// Gauge leases (engine/leases.go): a leased increment goes through
// moveGauge; renew and release are routes of their own under the gauge,
// POST like the reservation release, so both take an Idempotency-Key.

// registerLeases adds the lease renew and release routes under both
// customer forms.
func (s *Server) registerLeases() {
	for _, form := range []struct {
		prefix string
		strict bool
	}{{"/v1/customers/{id}", false}, {"/v1/customer-by-external-id/{external_id}", true}} {
		ref := refParam(form.strict)
		base := form.prefix + "/entitlements/{billable_metric_key}/leases/{lease_id}"
		s.handle("POST", base+"/renew", optTenant|optIdem|optStored, s.leaseOp(ref, true))
		s.handle("POST", base+"/release", optTenant|optIdem|optStored, s.leaseOp(ref, false))
	}
}

// errLeaseNotFound answers a lease id that is not a UUID.
var errLeaseNotFound = engine.NotFound("lease not found")

// leaseOp answers POST .../leases/{lease_id}/renew (renew) and /release
// with 200 and the gauge with the lease. The renew body is optional
// ({lease_seconds}); the release takes none.
func (s *Server) leaseOp(ref refFunc, renew bool) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		metric, ok := c.pathParam("billable_metric_key")
		if !ok || metric == "" {
			return engine.NotFound("billable metric not found")
		}
		id, err := c.uuidParam("lease_id", errLeaseNotFound)
		if err != nil {
			return err
		}
		var res engine.GaugeResult
		if renew {
			var in leaseRenewPayload
			if body := c.ctx.Request.Body(); len(bytes.TrimSpace(body)) > 0 {
				if err := decodeBody(body, &in); err != nil {
					return err
				}
			}
			renewal, cerr := in.toCommand()
			if cerr != nil {
				return cerr
			}
			res, err = s.entitlements.RenewLease(c.reqContext(), c.scope, c.tenant, r, metric, id, c.idem, renewal)
		} else {
			res, err = s.entitlements.ReleaseLease(c.reqContext(), c.scope, c.tenant, r, metric, id, c.idem)
		}
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, &res)
	}
}

// leaseRenewPayload is the body of a lease renew (release takes none).
type leaseRenewPayload struct {
	LeaseSeconds *int64 `json:"lease_seconds"`
}

// toCommand checks lease_seconds; absent keeps the lease's own length.
func (in *leaseRenewPayload) toCommand() (engine.LeaseRenewal, error) {
	if in.LeaseSeconds == nil {
		return engine.LeaseRenewal{}, nil
	}
	if err := engine.CheckLeaseSeconds(*in.LeaseSeconds); err != nil {
		return engine.LeaseRenewal{}, err
	}
	return engine.LeaseRenewal{Seconds: *in.LeaseSeconds}, nil
}
