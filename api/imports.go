package api

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// registerImports adds POST /v1/import (docs/spec/addendum.md §7).
func (s *Server) registerImports() {
	s.handle("POST", "/v1/import", optTenant|optIdem, s.importCustomers)
}

// importCustomers answers POST /v1/import with 200 {created, skipped, errors}.
func (s *Server) importCustomers(c *call) error {
	var in importPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	res, err := s.imports.Import(c.reqContext(), c.scope, c.tenant, c.idem, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, res)
}

// importPayload is the body of POST /v1/import.
type importPayload struct {
	Customers []importCustomerPayload `json:"customers"`
	Options   importOptionsPayload    `json:"options"`
}

// importCustomerPayload is one customer to bring over with its credit.
type importCustomerPayload struct {
	ExternalID  *string               `json:"external_id"`
	DisplayName *string               `json:"display_name"`
	Metadata    engine.Metadata       `json:"metadata"`
	Credits     []importCreditPayload `json:"credits"`
}

// importCreditPayload is one block of an imported customer.
type importCreditPayload struct {
	Credits   *int64            `json:"credits"`
	ExpiresAt *string           `json:"expires_at"`
	Priority  *int64            `json:"priority"`
	AppliesTo *engine.AppliesTo `json:"applies_to"`
}

// importOptionsPayload tunes an import. EmitWebhooks is accepted and has no
// effect: an import never emits credit.granted (docs/spec/interface.md Events).
type importOptionsPayload struct {
	EmitWebhooks bool `json:"emit_webhooks"`
	DryRun       bool `json:"dry_run"`
}

// toCommand checks the call's limits (a 422 for the whole call) and each
// row's shape (an error of that row alone).
func (in *importPayload) toCommand() (engine.ImportCustomers, error) {
	if in.Customers == nil {
		return engine.ImportCustomers{}, engine.Invalid("customers", "customers is required")
	}
	if len(in.Customers) > engine.MaxImportCustomers {
		return engine.ImportCustomers{}, engine.Invalid("customers", "at most 1000 customers per call")
	}
	total := 0
	for i := range in.Customers {
		total += len(in.Customers[i].Credits)
	}
	if total > engine.MaxImportTotalBlocks {
		return engine.ImportCustomers{}, engine.Invalid("customers", "at most 10000 credit blocks per call, over all customers")
	}
	cmd := engine.ImportCustomers{Rows: make([]engine.ImportRow, len(in.Customers)), DryRun: in.Options.DryRun}
	for i := range in.Customers {
		cmd.Rows[i] = in.Customers[i].toRow()
	}
	return cmd, nil
}

// toRow checks one customer entry; the row's error names the member
// (credits[2].priority).
func (c *importCustomerPayload) toRow() engine.ImportRow {
	cust, err := (&createCustomerPayload{ExternalID: c.ExternalID, DisplayName: c.DisplayName, Metadata: c.Metadata}).toCommand()
	if err != nil {
		return engine.ImportRow{Err: err}
	}
	row := engine.ImportRow{Customer: cust}
	if len(c.Credits) > engine.MaxImportBlocks {
		row.Err = engine.Invalid("credits", "at most "+strconv.Itoa(engine.MaxImportBlocks)+" credit blocks per customer")
		return row
	}
	row.Blocks = make([]engine.ImportBlock, 0, len(c.Credits))
	var total int64
	for j, cr := range c.Credits {
		b, sum, err := cr.toBlock("credits["+strconv.Itoa(j)+"]", total)
		if err != nil {
			row.Err = err
			return row
		}
		total = sum
		row.Blocks = append(row.Blocks, b)
	}
	return row
}

// toBlock checks one block; total is the customer's credits before it and
// sum after.
func (cr *importCreditPayload) toBlock(field string, total int64) (engine.ImportBlock, int64, error) {
	if cr.Credits == nil || *cr.Credits < 1 {
		return engine.ImportBlock{}, 0, engine.Invalid(field+".credits", "credits is required and must be >= 1")
	}
	sum, ok := engine.AddChecked(total, *cr.Credits)
	if !ok {
		return engine.ImportBlock{}, 0, engine.Invalid(field+".credits", "the customer's credits would overflow a 64-bit balance")
	}
	b := engine.ImportBlock{Credits: *cr.Credits}
	scope, err := engine.ScopeKeys(field+".applies_to", cr.AppliesTo)
	if err != nil {
		return engine.ImportBlock{}, 0, err
	}
	b.Scope = scope
	if cr.Priority != nil {
		if *cr.Priority < 0 || *cr.Priority > engine.MaxPriority {
			return engine.ImportBlock{}, 0, engine.Invalid(field+".priority", "priority must be between 0 and 255")
		}
		b.Priority = int(*cr.Priority)
	}
	if cr.ExpiresAt != nil {
		t, err := engine.ParseInstant(field+".expires_at", *cr.ExpiresAt, engine.KindValidation)
		if err != nil {
			return engine.ImportBlock{}, 0, err
		}
		t = t.UTC().Truncate(time.Millisecond)
		b.ExpiresAt = &t
	}
	return b, sum, nil
}
