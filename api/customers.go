package api

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/creditd/creditd/engine"
)

// refFunc reads the customer a path names.
type refFunc func(c *call) (engine.CustomerRef, error)

// refParam reads {id} (own or external id) or, strict, {external_id}.
func refParam(strict bool) refFunc {
	name := "id"
	if strict {
		name = "external_id"
	}
	return func(c *call) (engine.CustomerRef, error) {
		v, ok := c.pathParam(name)
		if !ok || v == "" {
			return engine.CustomerRef{}, engine.NotFound("customer not found")
		}
		return engine.CustomerRef{Value: v, Strict: strict}, nil
	}
}

// listCustomers answers GET /v1/customers.
func (s *Server) listCustomers(c *call) error {
	limit, err := c.queryLimit()
	if err != nil {
		return err
	}
	page, err := s.customers.List(c.reqContext(), c.scope, c.query("search"), c.query("cursor"), limit)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusOK, pageOf(page))
}

// createCustomer answers POST /v1/customers with 201.
func (s *Server) createCustomer(c *call) error {
	var in createCustomerPayload
	if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
		return err
	}
	cmd, err := in.toCommand()
	if err != nil {
		return err
	}
	cust, err := s.customers.Create(c.reqContext(), c.scope, cmd)
	if err != nil {
		return err
	}
	return c.json(fasthttp.StatusCreated, cust)
}

// getCustomer answers GET of one customer.
func (s *Server) getCustomer(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		cust, err := s.customers.Get(c.reqContext(), c.scope, r)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, cust)
	}
}

// patchCustomer answers PATCH of one customer with 200.
func (s *Server) patchCustomer(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		var in updateCustomerPayload
		if err := decodeBody(c.ctx.Request.Body(), &in); err != nil {
			return err
		}
		in.noteNullBudgets(c.ctx.Request.Body())
		in.noteNulls(c.ctx.Request.Body())
		cmd, err := in.toCommand()
		if err != nil {
			return err
		}
		cust, err := s.customers.Update(c.reqContext(), c.scope, r, cmd)
		if err != nil {
			return err
		}
		return c.json(fasthttp.StatusOK, cust)
	}
}

// deleteCustomer answers DELETE of one customer with 204 and no body, like
// every other delete here (docs/spec/interface.md leaves the status open).
func (s *Server) deleteCustomer(ref refFunc) endpoint {
	return func(c *call) error {
		r, err := ref(c)
		if err != nil {
			return err
		}
		if err := s.customers.Delete(c.reqContext(), c.scope, r); err != nil {
			return err
		}
		return c.noContent()
	}
}

// createCustomerPayload is the body of POST /v1/customers.
type createCustomerPayload struct {
	ExternalID            *string          `json:"external_id"`
	DisplayName           *string          `json:"display_name"`
	OveragePolicy         *string          `json:"overage_policy"`
	LowBalanceThresholdMC *int64           `json:"low_balance_threshold_mc"`
	CreditLimitMC         *int64           `json:"credit_limit_mc"`
	Budgets               *[]budgetPayload `json:"budgets"`
	// ParentID names the parent (own or external id) whose credit the
	// customer spends once its own is gone (docs/rules.md "Shared pools").
	ParentID        *string           `json:"parent_id"`
	ParentDrawLimit *drawLimitPayload `json:"parent_draw_limit"`
	Metadata        engine.Metadata   `json:"metadata"`
}

// drawLimitPayload is a customer's cap on what it draws from its parent
// per period.
type drawLimitPayload struct {
	Period   *string `json:"period"`
	TimeZone *string `json:"time_zone"`
	LimitMC  *int64  `json:"limit_mc"`
}

// checkDrawLimit is the checked draw limit of in (nil: absent).
func checkDrawLimit(in *drawLimitPayload) (*engine.DrawLimit, error) {
	if in == nil {
		return nil, nil
	}
	if in.Period == nil {
		return nil, engine.Invalid("parent_draw_limit.period", `period is required: "day" or "month"`)
	}
	if in.LimitMC == nil {
		return nil, engine.Invalid("parent_draw_limit.limit_mc", "limit_mc is required")
	}
	d := engine.DrawLimit{Period: engine.BudgetPeriod(*in.Period), LimitMC: *in.LimitMC}
	if in.TimeZone != nil {
		d.TimeZone = *in.TimeZone
	}
	if err := engine.CheckDrawLimit("parent_draw_limit", &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// budgetPayload is one member of a customer's budgets (docs/rules.md
// "Budgets").
type budgetPayload struct {
	BillableMetricKey *string `json:"billable_metric_key"`
	Period            *string `json:"period"`
	TimeZone          *string `json:"time_zone"`
	LimitMC           *int64  `json:"limit_mc"`
}

// checkBudgets is the checked budget list of in (nil: absent), its
// errors naming "budgets[i].<member>".
func checkBudgets(in *[]budgetPayload) (*[]engine.Budget, error) {
	if in == nil {
		return nil, nil
	}
	out := make([]engine.Budget, len(*in))
	for i, p := range *in {
		if p.Period == nil {
			return nil, engine.Invalid(fmt.Sprintf("budgets[%d].period", i), `period is required: "day" or "month"`)
		}
		if p.LimitMC == nil {
			return nil, engine.Invalid(fmt.Sprintf("budgets[%d].limit_mc", i), "limit_mc is required")
		}
		b := engine.Budget{BillableMetricKey: p.BillableMetricKey, Period: engine.BudgetPeriod(*p.Period), LimitMC: *p.LimitMC}
		if p.TimeZone != nil {
			b.TimeZone = *p.TimeZone
		}
		out[i] = b
	}
	if err := engine.CheckBudgets("budgets", out); err != nil {
		return nil, err
	}
	return &out, nil
}

// toCommand checks the body, naming the first wrong field, and returns the
// customer to create.
func (in *createCustomerPayload) toCommand() (engine.CreateCustomer, error) {
	if in.ExternalID == nil || strings.TrimSpace(*in.ExternalID) == "" {
		return engine.CreateCustomer{}, engine.Invalid("external_id", "external_id is required")
	}
	if utf8.RuneCountInString(*in.ExternalID) > engine.MaxExternalIDChars {
		return engine.CreateCustomer{}, engine.Invalid("external_id", "external_id is longer than 255 characters")
	}
	if err := engine.CheckLine("external_id", *in.ExternalID); err != nil {
		return engine.CreateCustomer{}, err
	}
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.CreateCustomer{}, err
	}
	f, err := checkCustomerFields(in.DisplayName, in.OveragePolicy, in.LowBalanceThresholdMC, in.CreditLimitMC)
	if err != nil {
		return engine.CreateCustomer{}, err
	}
	budgets, err := checkBudgets(in.Budgets)
	if err != nil {
		return engine.CreateCustomer{}, err
	}
	limit, err := checkDrawLimit(in.ParentDrawLimit)
	if err != nil {
		return engine.CreateCustomer{}, err
	}
	if limit != nil && in.ParentID == nil {
		return engine.CreateCustomer{}, engine.Invalid("parent_draw_limit", "parent_draw_limit needs a parent_id")
	}
	if in.ParentID != nil {
		if err := engine.CheckLine("parent_id", *in.ParentID); err != nil {
			return engine.CreateCustomer{}, err
		}
	}
	cmd := engine.CreateCustomer{ExternalID: *in.ExternalID, LowBalanceThresholdMC: f.threshold, Metadata: meta,
		Parent: in.ParentID, ParentDrawLimit: limit}
	if budgets != nil {
		cmd.Budgets = *budgets
	}
	if f.limit != nil {
		cmd.CreditLimitMC = *f.limit
	}
	if f.displayName != nil && *f.displayName != "" {
		cmd.DisplayName = f.displayName
	}
	if f.policy != nil && *f.policy != "" {
		cmd.OveragePolicy = f.policy
	}
	return cmd, nil
}

// updateCustomerPayload is the body of PATCH /v1/customers/{id}; an absent
// member keeps its value.
type updateCustomerPayload struct {
	DisplayName           *string `json:"display_name"`
	OveragePolicy         *string `json:"overage_policy"`
	LowBalanceThresholdMC *int64  `json:"low_balance_threshold_mc"`
	CreditLimitMC         *int64  `json:"credit_limit_mc"`
	// Budgets replaces the whole list ([] removes every budget).
	Budgets *[]budgetPayload `json:"budgets"`
	// ParentID sets the parent; null removes it (and the draw limit).
	ParentID *string `json:"parent_id"`
	// ParentDrawLimit sets the draw limit; null removes it.
	ParentDrawLimit *drawLimitPayload `json:"parent_draw_limit"`
	Metadata        engine.Metadata   `json:"metadata"`
	// parentNull and limitNull note a member sent as null (noteNulls).
	parentNull, limitNull bool
}

// noteNullBudgets makes "budgets": null remove every budget, as [] does
// (encoding/json leaves a nil pointer for both null and absent; the Go
// client sends null for an empty list).
func (in *updateCustomerPayload) noteNullBudgets(body []byte) {
	if in.Budgets != nil {
		return
	}
	var probe struct {
		Budgets json.RawMessage `json:"budgets"`
	}
	if json.Unmarshal(body, &probe) == nil && string(probe.Budgets) == "null" {
		in.Budgets = &[]budgetPayload{}
	}
}

// noteNulls tells a parent_id or parent_draw_limit sent as null (remove
// it) from one left out (keep it): encoding/json leaves nil for both.
func (in *updateCustomerPayload) noteNulls(body []byte) {
	var probe struct {
		ParentID        json.RawMessage `json:"parent_id"`
		ParentDrawLimit json.RawMessage `json:"parent_draw_limit"`
	}
	if json.Unmarshal(body, &probe) != nil {
		return
	}
	in.parentNull = string(probe.ParentID) == "null"
	in.limitNull = string(probe.ParentDrawLimit) == "null"
}

// toCommand checks the body, naming the first wrong field, and returns the
// change.
func (in *updateCustomerPayload) toCommand() (engine.UpdateCustomer, error) {
	meta, err := in.Metadata.Canonical("metadata")
	if err != nil {
		return engine.UpdateCustomer{}, err
	}
	f, err := checkCustomerFields(in.DisplayName, in.OveragePolicy, in.LowBalanceThresholdMC, in.CreditLimitMC)
	if err != nil {
		return engine.UpdateCustomer{}, err
	}
	budgets, err := checkBudgets(in.Budgets)
	if err != nil {
		return engine.UpdateCustomer{}, err
	}
	limit, err := checkDrawLimit(in.ParentDrawLimit)
	if err != nil {
		return engine.UpdateCustomer{}, err
	}
	if in.ParentID != nil {
		if err := engine.CheckLine("parent_id", *in.ParentID); err != nil {
			return engine.UpdateCustomer{}, err
		}
	}
	return engine.UpdateCustomer{DisplayName: f.displayName, OveragePolicy: f.policy, LowBalanceThresholdMC: f.threshold,
		CreditLimitMC: f.limit, Budgets: budgets, Metadata: meta,
		ParentSet: in.ParentID != nil || in.parentNull, Parent: in.ParentID,
		DrawLimitSet: limit != nil || in.limitNull, ParentDrawLimit: limit}, nil
}

// customerFields are the checked members create and update share.
type customerFields struct {
	displayName *string
	policy      *engine.OveragePolicy
	threshold   *int64
	limit       *int64
}

// checkCustomerFields checks the members create and update share, in the
// order their errors are named.
func checkCustomerFields(displayName, policy *string, threshold, limit *int64) (customerFields, error) {
	if displayName != nil && utf8.RuneCountInString(*displayName) > engine.MaxDisplayNameChars {
		return customerFields{}, engine.Invalid("display_name", "display_name is longer than 200 characters")
	}
	if displayName != nil {
		if err := engine.CheckText("display_name", *displayName); err != nil {
			return customerFields{}, err
		}
	}
	if policy != nil && *policy != "" && !engine.OveragePolicy(*policy).Valid() {
		return customerFields{}, engine.Invalid("overage_policy", "overage_policy must be block, allow or notify")
	}
	if threshold != nil && *threshold < 0 {
		return customerFields{}, engine.Invalid("low_balance_threshold_mc", "low_balance_threshold_mc must be >= 0")
	}
	if limit != nil && (*limit < 0 || *limit > engine.MaxCreditLimitMC) {
		return customerFields{}, engine.Invalid("credit_limit_mc",
			fmt.Sprintf("credit_limit_mc must be between 0 and %d", engine.MaxCreditLimitMC))
	}
	f := customerFields{displayName: displayName, threshold: threshold, limit: limit}
	if policy != nil {
		p := engine.OveragePolicy(*policy)
		f.policy = &p
	}
	return f, nil
}
