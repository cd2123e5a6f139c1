package api

import (
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerTopups adds the topup routes (docs/spec/addendum.md §7).
func (s *Server) registerTopups() {
	s.handle("POST", "/v1/customers/{id}/topups", optTenant|optIdem, s.createTopup)
	s.handle("GET", "/v1/customers/{id}/topups", optTenant, s.listTopups)
}

// createTopup answers POST /v1/customers/{id}/topups with 201
// {transaction, block, account}.
func (s *Server) createTopup(c *call) error {
	r, err := refParam(false)(c)
	if err != nil {
		return err
	}
	var in topupPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	res, err := s.topups.Create(c.reqContext(), c.scope, c.tenant, r, c.idem, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, res)
}

// listTopups answers GET /v1/customers/{id}/topups, newest first.
func (s *Server) listTopups(c *call) error {
	r, err := refParam(false)(c)
	if err != nil {
		return err
	}
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	page, err := s.topups.List(c.reqContext(), c.scope, r, c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// topupPayload is the body of POST /v1/customers/{id}/topups.
type topupPayload struct {
	Credits          *int64            `json:"credits"`
	PaymentReference *string           `json:"payment_reference"`
	ExpiresAt        *string           `json:"expires_at"`
	Priority         *int64            `json:"priority"`
	Metadata         engine.Metadata   `json:"metadata"`
	AppliesTo        *engine.AppliesTo `json:"applies_to"`
}

// toCommand checks the body, naming the first wrong member; an expiry in
// the past is the engine's to refuse, after every other member.
func (in *topupPayload) toCommand() (engine.CreateTopup, error) {
	if in.Credits == nil {
		return engine.CreateTopup{}, engine.Invalid("credits", "credits is required")
	}
	if err := engine.GrantAmount.Check("", *in.Credits); err != nil {
		return engine.CreateTopup{}, err
	}
	if in.PaymentReference != nil && utf8.RuneCountInString(*in.PaymentReference) > engine.MaxPaymentReferenceChars {
		return engine.CreateTopup{}, engine.Invalid("payment_reference", "payment_reference is longer than 255 characters")
	}
	if in.PaymentReference != nil {
		if err := engine.CheckLine("payment_reference", *in.PaymentReference); err != nil {
			return engine.CreateTopup{}, err
		}
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.CreateTopup{}, err
	}
	if in.Priority != nil && (*in.Priority < 0 || *in.Priority > engine.MaxPriority) {
		return engine.CreateTopup{}, engine.Invalid("priority", "priority must be between 0 and 255")
	}
	scope, err := engine.ScopeKeys("applies_to", in.AppliesTo)
	if err != nil {
		return engine.CreateTopup{}, err
	}
	cmd := engine.CreateTopup{Credits: *in.Credits, Metadata: meta, Scope: scope}
	if in.PaymentReference != nil && *in.PaymentReference != "" {
		cmd.PaymentReference = in.PaymentReference
	}
	if in.Priority != nil {
		cmd.Priority = int(*in.Priority)
	}
	if in.ExpiresAt != nil {
		t, err := engine.ParseInstant("expires_at", *in.ExpiresAt, engine.KindValidation)
		if err != nil {
			return engine.CreateTopup{}, err
		}
		t = t.UTC().Truncate(time.Millisecond)
		cmd.ExpiresAt = &t
	}
	return cmd, nil
}
