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
	var in engine.ReserveInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	res, err := s.reservations.Create(c.reqContext(), c.scope, c.tenant, c.idem, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, &res)
}

// getReservation answers GET /v1/reservations/{id}: any hold of the tenant,
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
	var in engine.CommitInput
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	res, err := s.reservations.Commit(c.reqContext(), c.scope, c.tenant, id, c.idem, in)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, &res)
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
