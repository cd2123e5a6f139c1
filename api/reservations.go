package api

import (
	"github.com/google/uuid"
	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

var errReservationNotFound = engine.NotFound("reservation not found")

// reservationID reads the {id} of a reservation path; anything but a UUID
// names no reservation (404, like every malformed id in a path).
func (c *call) reservationID() (uuid.UUID, error) {
	raw, ok := c.pathParam("id")
	if !ok {
		return uuid.Nil, errReservationNotFound
	}
	id, err := uuid.Parse(raw)
	if err != nil {
		return uuid.Nil, errReservationNotFound
	}
	return id, nil
}

// createReservation answers POST /v1/reservations with 201.
func (s *Server) createReservation(c *call) error {
	var in reservePayload
	if err := decodeFlat(c.ctx.Request.Body(), &in, flatReserve); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	if cmd.Dry != c.dry {
		// The middleware read dry_run otherwise (a member spelled twice):
		// a reservation must never be taken without its idempotency.
		return engine.Invalid("dry_run", "dry_run must appear once, as true or false")
	}
	res, err := s.reservations.Create(c.reqContext(), c.scope, c.tenant, c.idem, cmd)
	if err != nil {
		return err
	}
	if res.Dry {
		return c.json(fasthttp.StatusOK, &reserveDryBody{ReserveResult: &res, DryRun: true, Events: res.Events})
	}
	return appended(c, fasthttp.StatusCreated, &res, len(res.Metadata) == 0 && len(res.Items) == 0, appendReserve)
}

// reserveDryBody is a dry run's answer: the reservation as it would be taken,
// with no id (it does not exist) and the events taking it would fire.
type reserveDryBody struct {
	*engine.ReserveResult
	ID     *uuid.UUID         `json:"id"`
	DryRun bool               `json:"dry_run"`
	Events []engine.EventType `json:"events"`
}

// reservePayload is the body of POST /v1/reservations.
type reservePayload struct {
	CustomerID         *string         `json:"customer_id"`
	ExternalCustomerID *string         `json:"external_customer_id"`
	BillableMetricKey  *string         `json:"billable_metric_key"`
	EstimatedUnits     *int64          `json:"estimated_units"`
	TTLSeconds         *int64          `json:"ttl_seconds"`
	Metadata           engine.Metadata `json:"metadata"`
	// Items is the multi-metric form: given instead of billable_metric_key
	// and estimated_units, the items' summed estimated cost is held, all or
	// none.
	Items []reserveItemPayload `json:"items"`
	// DryRun asks what the reservation would do without taking it.
	DryRun *bool `json:"dry_run"`
}

// reserveItemPayload is one metric of a multi-metric reservation request.
type reserveItemPayload struct {
	BillableMetricKey *string `json:"billable_metric_key"`
	EstimatedUnits    *int64  `json:"estimated_units"`
}

// toCommand checks the body in the order the API names its problems: the
// customer ids, then the single form's metric and units or the items, then
// ttl_seconds, the single form's metric key line and the metadata. The
// rules, their pricing and the customer are the engine's.
func (in *reservePayload) toCommand() (engine.CreateReservation, error) {
	hasID := in.CustomerID != nil && *in.CustomerID != ""
	hasExt := in.ExternalCustomerID != nil && *in.ExternalCustomerID != ""
	if hasID == hasExt {
		return engine.CreateReservation{}, engine.BadRequest("customer_id", "give exactly one of customer_id or external_customer_id")
	}
	var out engine.CreateReservation
	if hasExt {
		out.Customer = engine.CustomerRef{Value: *in.ExternalCustomerID, Strict: true}
	} else {
		out.Customer = engine.CustomerRef{Value: *in.CustomerID}
	}
	if in.Items != nil {
		if err := in.checkItems(&out); err != nil {
			return engine.CreateReservation{}, err
		}
	} else {
		if in.BillableMetricKey == nil || *in.BillableMetricKey == "" {
			return engine.CreateReservation{}, engine.Invalid("billable_metric_key", "billable_metric_key is required")
		}
		if in.EstimatedUnits == nil {
			return engine.CreateReservation{}, engine.Invalid("estimated_units", "estimated_units is required")
		}
		if err := engine.ReserveItemUnits.Check("", *in.EstimatedUnits); err != nil {
			return engine.CreateReservation{}, err
		}
		out.Metric, out.EstimatedUnits = *in.BillableMetricKey, *in.EstimatedUnits
	}
	out.TTLSeconds = engine.DefaultReservationTTLSeconds
	if in.TTLSeconds != nil {
		if err := engine.CheckReservationTTL(*in.TTLSeconds); err != nil {
			return engine.CreateReservation{}, err
		}
		out.TTLSeconds = *in.TTLSeconds
	}
	if in.Items == nil {
		if err := engine.CheckLine("billable_metric_key", out.Metric); err != nil {
			return engine.CreateReservation{}, err
		}
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.CreateReservation{}, err
	}
	out.Metadata = meta
	out.Dry = in.DryRun != nil && *in.DryRun
	return out, nil
}

// checkItems checks the multi-metric form's items into out.Items: not
// beside the single form's members, 1 to MaxReservationItems of them, each
// as engine.CheckItem says.
func (in *reservePayload) checkItems(out *engine.CreateReservation) error {
	if in.BillableMetricKey != nil || in.EstimatedUnits != nil {
		return engine.BadRequest("items", "give either items or billable_metric_key and estimated_units, not both")
	}
	if err := engine.CheckItemCount(len(in.Items)); err != nil {
		return err
	}
	out.Items = make([]engine.ReserveItem, len(in.Items))
	seen := make(map[string]bool, len(in.Items))
	for i, it := range in.Items {
		metric, units, err := engine.CheckItem(i, it.BillableMetricKey, it.EstimatedUnits, engine.ReserveItemUnits, seen)
		if err != nil {
			return err
		}
		out.Items[i] = engine.ReserveItem{Metric: metric, EstimatedUnits: units}
	}
	return nil
}

// getReservation answers GET /v1/reservations/{id}: any reservation of the tenant,
// whichever environment the key selects.
func (s *Server) getReservation(c *call) error {
	id, err := c.reservationID()
	if err != nil {
		return err
	}
	r, err := s.reservations.Get(c.reqContext(), c.scope, id)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, &r)
}

// commitReservation answers POST /v1/reservations/{id}/commit with 200.
func (s *Server) commitReservation(c *call) error {
	id, err := c.reservationID()
	if err != nil {
		return err
	}
	var in commitPayload
	if err := decodeFlat(c.ctx.Request.Body(), &in, flatCommit); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	res, err := s.reservations.Commit(c.reqContext(), c.scope, c.tenant, id, c.idem, cmd)
	if err != nil {
		return err
	}
	return appended(c, fasthttp.StatusOK, &res, len(res.Items) == 0, appendCommit)
}

// commitPayload is the body of POST /v1/reservations/{id}/commit.
type commitPayload struct {
	ActualUnits *int64          `json:"actual_units"`
	Metadata    engine.Metadata `json:"metadata"`
	// Final false makes a partial commit: actual_units (>= 1) are charged
	// and the rest of the reservation stays open (Stripe's final_capture).
	Final *bool `json:"final"`
	// Items is the commit of a multi-metric reservation: each of its metrics'
	// actual units, given instead of actual_units.
	Items []commitItemPayload `json:"items"`
}

// commitItemPayload is one metric's actual units in the commit of a
// multi-metric reservation.
type commitItemPayload struct {
	BillableMetricKey *string `json:"billable_metric_key"`
	ActualUnits       *int64  `json:"actual_units"`
}

// toCommand checks the body: the items (not beside actual_units, 1 to
// MaxReservationItems, each as engine.CheckItem says) or actual_units,
// then the metadata. Without either, the reservation decides which member the
// problem names, so the command carries UnitsMissing and nothing else.
func (in *commitPayload) toCommand() (engine.CommitReservation, error) {
	var out engine.CommitReservation
	out.Partial = in.Final != nil && !*in.Final
	if out.Partial && in.Items != nil {
		return engine.CommitReservation{}, engine.Invalid("final", "a partial commit (final: false) settles a single-metric reservation: give actual_units, not items")
	}
	if in.Items != nil {
		if in.ActualUnits != nil {
			return engine.CommitReservation{}, engine.BadRequest("items", "give either items or actual_units, not both")
		}
		if err := engine.CheckItemCount(len(in.Items)); err != nil {
			return engine.CommitReservation{}, err
		}
		out.Items = make([]engine.CommitItem, len(in.Items))
		seen := make(map[string]bool, len(in.Items))
		for i, it := range in.Items {
			metric, units, err := engine.CheckItem(i, it.BillableMetricKey, it.ActualUnits, engine.CommitItemUnits, seen)
			if err != nil {
				return engine.CommitReservation{}, err
			}
			out.Items[i] = engine.CommitItem{Metric: metric, ActualUnits: units}
		}
	} else {
		if in.ActualUnits == nil {
			return engine.CommitReservation{UnitsMissing: true, Partial: out.Partial}, nil
		}
		if err := engine.CommitItemUnits.Check("", *in.ActualUnits); err != nil {
			return engine.CommitReservation{}, err
		}
		if out.Partial {
			if err := engine.PartialCommitUnits.Check("", *in.ActualUnits); err != nil {
				return engine.CommitReservation{}, err
			}
		}
		out.ActualUnits = *in.ActualUnits
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.CommitReservation{}, err
	}
	out.Metadata = meta
	return out, nil
}

// extendReservation answers POST /v1/reservations/{id}/extend with 200.
func (s *Server) extendReservation(c *call) error {
	id, err := c.reservationID()
	if err != nil {
		return err
	}
	var in extendPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	res, err := s.reservations.Extend(c.reqContext(), c.scope, c.tenant, id, c.idem, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, &res)
}

// extendPayload is the body of POST /v1/reservations/{id}/extend: the
// create's ttl_seconds, and additional_units beside its estimated_units
// (docs/decisions.md "Extending and partially committing a reservation").
type extendPayload struct {
	AdditionalUnits *int64 `json:"additional_units"`
	TTLSeconds      *int64 `json:"ttl_seconds"`
}

// toCommand checks the body: at least one member, additional_units >= 1,
// ttl_seconds within the create's bounds.
func (in *extendPayload) toCommand() (engine.ExtendReservation, error) {
	var out engine.ExtendReservation
	if in.AdditionalUnits == nil && in.TTLSeconds == nil {
		return out, engine.Invalid("additional_units", "give additional_units, ttl_seconds or both")
	}
	if in.AdditionalUnits != nil {
		if err := engine.ExtendUnits.Check("", *in.AdditionalUnits); err != nil {
			return out, err
		}
		out.AdditionalUnits = *in.AdditionalUnits
	}
	if in.TTLSeconds != nil {
		if err := engine.CheckReservationTTL(*in.TTLSeconds); err != nil {
			return out, err
		}
		out.TTLSeconds = *in.TTLSeconds
	}
	return out, nil
}

// releaseReservation answers POST /v1/reservations/{id}/release with 200.
// The operation takes no body; one sent anyway is ignored.
func (s *Server) releaseReservation(c *call) error {
	id, err := c.reservationID()
	if err != nil {
		return err
	}
	res, err := s.reservations.Release(c.reqContext(), c.scope, c.tenant, id, c.idem)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, &res)
}

// listReservations answers GET .../reservations of one customer, newest
// first; an unrecognized status is the 500 the spec documents.
func (s *Server) listReservations(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		limit, err := c.queryLimit()
		if err != nil {
			return err
		}
		page, err := s.reservations.List(c.reqContext(), c.scope, r, c.query("status"), c.query("cursor"), limit)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, pageOf(page))
	}
}

// customerIDParam reads {customer_id} (own or external id) of the
// reservation list path.
func customerIDParam(c *call) (engine.CustomerRef, error) {
	v, ok := c.pathParam("customer_id")
	if !ok || v == "" {
		return engine.CustomerRef{}, engine.NotFound("customer not found")
	}
	return engine.CustomerRef{Value: v}, nil
}
