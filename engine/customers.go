package engine

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
)

// MaxDisplayNameChars is the longest display_name (docs/spec/interface.md Limits).
const MaxDisplayNameChars = 200

// MaxExternalIDChars bounds external ids (our limit; docs/spec/addendum.md leaves it open).
const MaxExternalIDChars = 255

// Customers creates, reads, changes and deletes a tenant's customers, and
// resolves the customer a request names (docs/spec/interface.md Common rules 3-5).
type Customers struct {
	dir   Directory
	clock Clock
	// slotOf is the Redis slot (outbox partition) of a customer's credit
	// state; nil: one slot for all (a store without slots).
	slotOf func(uuid.UUID) int
}

// WithSlots makes the service mint a child customer's id in its parent's
// slot (slotOf, lua.Partition): a charge drawing on a parent runs as one
// script on both hashes (docs/decisions.md "Shared pools").
func (s *Customers) WithSlots(slotOf func(uuid.UUID) int) *Customers {
	s.slotOf = slotOf
	return s
}

var _ CustomerLookup = (*Customers)(nil)

// NewCustomers returns the customer service; it reads the directory afresh
// on every call (the hot path resolves through a CachedCustomers).
func NewCustomers(dir Directory, clock Clock) *Customers {
	return &Customers{dir: dir, clock: clock}
}

// CustomerByKey is the customer of key (its id, tenant and environment);
// ErrNotFound when the directory has no live customer there.
func (s *Customers) CustomerByKey(ctx context.Context, key CustomerKey) (Customer, error) {
	c, err := s.dir.CustomerByID(ctx, key.CustomerID)
	if err != nil {
		return Customer{}, err
	}
	if c.TenantID != key.TenantID || c.Environment != key.Environment {
		return Customer{}, ErrNotFound
	}
	return c, nil
}

// CustomerRef is how a request names a customer: a lenient own-or-external id,
// or (Strict) an external id only.
type CustomerRef struct {
	Value  string
	Strict bool
}

// MaxCreditLimitMC bounds a customer's credit line: 10^15 millicredits (a
// trillion credits) keeps the debt, and the effective balance less every
// reservation, far inside int64 (invariant 7) whatever the blocks hold.
const MaxCreditLimitMC int64 = 1_000_000_000_000_000

// CreateCustomer is a checked request to add a customer: api builds it from
// the body of POST /v1/customers (or an import row) once every field has
// passed its shape checks.
type CreateCustomer struct {
	ExternalID            string
	DisplayName           *string        // nil: none
	OveragePolicy         *OveragePolicy // nil: the tenant's default
	LowBalanceThresholdMC *int64         // nil: none
	CreditLimitMC         int64          // >= 0, at most MaxCreditLimitMC; 0: no credit line
	Budgets               []Budget       // checked (CheckBudgets); nil: none
	Parent                *string        // the parent's own or external id; nil: none
	ParentDrawLimit       *DrawLimit     // checked (CheckDrawLimit); nil: no cap
	Metadata              Metadata       // canonical; nil: none
}

// UpdateCustomer is a checked PATCH of a customer: a nil field keeps its
// value, an empty DisplayName or OveragePolicy clears it, and Metadata
// merges key by key.
type UpdateCustomer struct {
	DisplayName           *string
	OveragePolicy         *OveragePolicy
	LowBalanceThresholdMC *int64
	CreditLimitMC         *int64    // nil: unchanged; 0 removes the line
	Budgets               *[]Budget // checked; nil: unchanged; empty removes every budget
	// ParentSet changes the parent to Parent (an own or external id; nil
	// removes it); DrawLimitSet the draw limit to ParentDrawLimit (nil
	// removes it).
	ParentSet       bool
	Parent          *string
	DrawLimitSet    bool
	ParentDrawLimit *DrawLimit
	Metadata        Metadata // canonical
}

// Create adds a customer. Errors: 409 when the external id is taken in this
// tenant and environment.
func (s *Customers) Create(ctx context.Context, scope Scope, in CreateCustomer) (Customer, error) {
	now := s.clock.Now()
	var parent *Customer
	if in.Parent != nil {
		p, err := s.parentOf(ctx, scope, *in.Parent, nil)
		if err != nil {
			return Customer{}, err
		}
		parent = &p
	}
	c := Customer{
		ID:          s.newID(parent),
		TenantID:    scope.TenantID,
		Environment: scope.Environment,
		ExternalID:  in.ExternalID,
		Metadata:    in.Metadata,
		CreatedAt:   now,
		UpdatedAt:   now,
	}
	if c.Metadata == nil {
		c.Metadata = Metadata{}
	}
	if in.DisplayName != nil && *in.DisplayName != "" {
		c.DisplayName = in.DisplayName
	}
	c.OveragePolicy = in.OveragePolicy
	c.LowBalanceThresholdMC = in.LowBalanceThresholdMC
	c.CreditLimitMC = in.CreditLimitMC
	c.Budgets = mergeBudgets(nil, in.Budgets, now)
	if parent != nil {
		c.ParentID = &parent.ID
		c.ParentDrawLimit = mergeDrawLimit(nil, in.ParentDrawLimit, now)
	}
	if err := s.dir.CreateCustomer(ctx, c); err != nil {
		if errors.Is(err, ErrExternalIDTaken) {
			return Customer{}, &Error{Kind: KindConflict, Field: "external_id", Detail: "a customer with this external_id already exists"}
		}
		return Customer{}, err
	}
	return c, nil
}

// newID is a fresh customer id; under parent, one in the parent's slot.
// Ids are UUIDv7 and a slot is one of lua.Partitions (32) by a hash of
// the id, so about 32 draws find one.
func (s *Customers) newID(parent *Customer) uuid.UUID {
	for {
		id := uuid.Must(uuid.NewV7())
		if parent == nil || s.slotOf == nil || s.slotOf(id) == s.slotOf(parent.ID) {
			return id
		}
	}
}

// parentOf resolves ref, the parent named for child (nil: a customer being
// created), and checks the pool rules: one level (the parent has no
// parent, the child no children), not the child itself. Errors: 422 on
// parent_id naming no live customer of scope, or breaking a rule.
func (s *Customers) parentOf(ctx context.Context, scope Scope, ref string, child *Customer) (Customer, error) {
	p, err := s.Resolve(ctx, scope, CustomerRef{Value: ref}, false)
	if e, ok := AsError(err); errors.Is(err, ErrNotFound) || (ok && e.Kind == KindNotFound) {
		return Customer{}, Invalid("parent_id", "parent_id names no customer of this tenant and environment")
	}
	if err != nil {
		return Customer{}, refield(err, "customer_id", "parent_id")
	}
	if p.ParentID != nil {
		return Customer{}, Invalid("parent_id", "the parent has a parent itself: pools are one level deep")
	}
	if child == nil {
		return p, nil
	}
	if p.ID == child.ID {
		return Customer{}, Invalid("parent_id", "a customer cannot be its own parent")
	}
	kids, err := s.dir.HasChildren(ctx, scope, child.ID)
	if err != nil {
		return Customer{}, err
	}
	if kids {
		return Customer{}, Invalid("parent_id", "the customer is a parent itself: pools are one level deep")
	}
	return p, nil
}

// reparent sets (ref non-nil) or removes c's parent. An existing customer
// can only join a parent in its own slot (its id, which names its state
// everywhere, cannot change): otherwise 409, and the way out is a new
// customer created with parent_id (docs/decisions.md "Shared pools").
func (s *Customers) reparent(ctx context.Context, scope Scope, c *Customer, ref *string) error {
	if ref == nil {
		c.ParentID, c.ParentDrawLimit = nil, nil
		return nil
	}
	p, err := s.parentOf(ctx, scope, *ref, c)
	if err != nil {
		return err
	}
	if c.ParentID != nil && *c.ParentID == p.ID {
		return nil
	}
	if s.slotOf != nil && s.slotOf(c.ID) != s.slotOf(p.ID) {
		return &Error{Kind: KindConflict, Field: "parent_id",
			Detail: "this customer's credit lives in another slot than the parent's: create the child with parent_id set instead (its id is then minted in the parent's slot)"}
	}
	c.ParentID = &p.ID
	return nil
}

// ByID reads a live customer by id in any tenant, uncached, so a caller
// can tell "other tenant" from "unknown" (the directory's ErrNotFound).
func (s *Customers) ByID(ctx context.Context, id uuid.UUID) (Customer, error) {
	return s.dir.CustomerByID(ctx, id)
}

// ByExternalID reads a live customer of scope by external id, uncached
// (the directory's ErrNotFound).
func (s *Customers) ByExternalID(ctx context.Context, scope Scope, externalID string) (Customer, error) {
	return s.dir.CustomerByExternalID(ctx, scope, externalID)
}

// Get reads one live customer. Errors: 404.
func (s *Customers) Get(ctx context.Context, scope Scope, ref CustomerRef) (Customer, error) {
	return s.Resolve(ctx, scope, ref, false)
}

// Update changes the given fields; metadata merges key by key. Errors: 404,
// 422 when the merged metadata passes a limit.
func (s *Customers) Update(ctx context.Context, scope Scope, ref CustomerRef, in UpdateCustomer) (Customer, error) {
	c, err := s.Resolve(ctx, scope, ref, false)
	if err != nil {
		return Customer{}, err
	}
	if in.DisplayName != nil {
		if *in.DisplayName == "" {
			c.DisplayName = nil
		} else {
			c.DisplayName = in.DisplayName
		}
	}
	if in.OveragePolicy != nil {
		if *in.OveragePolicy == "" {
			c.OveragePolicy = nil
		} else {
			p := *in.OveragePolicy
			c.OveragePolicy = &p
		}
	}
	if in.LowBalanceThresholdMC != nil {
		c.LowBalanceThresholdMC = in.LowBalanceThresholdMC
	}
	if in.CreditLimitMC != nil {
		c.CreditLimitMC = *in.CreditLimitMC
	}
	now := s.clock.Now()
	if in.Budgets != nil {
		// The whole list is replaced; a budget counting the same spend as
		// one before keeps its Since, so its counter carries on.
		c.Budgets = mergeBudgets(c.Budgets, *in.Budgets, now)
	}
	if c.Budgets == nil {
		c.Budgets = []Budget{} // the answer's budgets is an array
	}
	if in.ParentSet {
		if err := s.reparent(ctx, scope, &c, in.Parent); err != nil {
			return Customer{}, err
		}
	}
	if in.DrawLimitSet {
		c.ParentDrawLimit = mergeDrawLimit(c.ParentDrawLimit, in.ParentDrawLimit, now)
	}
	if c.ParentID == nil && c.ParentDrawLimit != nil {
		return Customer{}, Invalid("parent_draw_limit", "a customer without a parent_id has no draw limit")
	}
	if c.Metadata == nil {
		c.Metadata = Metadata{}
	}
	merged := make(Metadata, len(c.Metadata)+len(in.Metadata))
	for k, v := range c.Metadata {
		merged[k] = v
	}
	for k, v := range in.Metadata {
		merged[k] = v
	}
	// The merge may pass a limit neither half did.
	if c.Metadata, err = merged.Canonical("metadata"); err != nil {
		return Customer{}, err
	}
	c.UpdatedAt = now
	if err := s.dir.UpdateCustomer(ctx, c); err != nil {
		return Customer{}, err
	}
	return c, nil
}

// Delete soft-deletes a customer; a second delete is a 404.
func (s *Customers) Delete(ctx context.Context, scope Scope, ref CustomerRef) error {
	c, err := s.Resolve(ctx, scope, ref, false)
	if err != nil {
		return err
	}
	if err := s.dir.DeleteCustomer(ctx, scope, c.ID, s.clock.Now()); err != nil {
		if errors.Is(err, ErrNotFound) {
			return NotFound("customer not found")
		}
		return err
	}
	return nil
}

// List pages customers newest first.
func (s *Customers) List(ctx context.Context, scope Scope, search, cursor string, limit int) (Page[Customer], error) {
	if err := CheckLine("search", search); err != nil {
		return Page[Customer]{}, err
	}
	return s.dir.ListCustomers(ctx, scope, search, cursor, limit)
}

// Resolve finds the customer ref names in scope. A lenient ref tries the
// external id first, then the UUID. With create, an unknown lenient value
// becomes a new customer whose external id is the value (Common rules 4), and
// a UUID of a customer outside scope is a 400 (Common rules 5); without it
// both are 404, so nothing about other tenants leaks.
func (s *Customers) Resolve(ctx context.Context, scope Scope, ref CustomerRef, create bool) (Customer, error) {
	if ref.Value == "" {
		return Customer{}, NotFound("customer not found")
	}
	if err := CheckLine("customer_id", ref.Value); err != nil {
		return Customer{}, err
	}
	c, err := s.dir.CustomerByExternalID(ctx, scope, ref.Value)
	if err == nil {
		return c, nil
	}
	if !errors.Is(err, ErrNotFound) {
		return Customer{}, err
	}
	if ref.Strict {
		return Customer{}, NotFound("no customer with this external_id")
	}
	if id, perr := uuid.Parse(ref.Value); perr == nil {
		c, err := s.dir.CustomerByID(ctx, id)
		switch {
		case err == nil && c.TenantID == scope.TenantID && c.Environment == scope.Environment:
			return c, nil
		case err == nil && create:
			return Customer{}, BadRequest("customer_id", "customer_id belongs to another tenant or environment")
		case err != nil && !errors.Is(err, ErrNotFound):
			return Customer{}, err
		}
	}
	if !create {
		return Customer{}, NotFound("customer not found")
	}
	if strings.TrimSpace(ref.Value) == "" {
		// It could only become a blank external_id; name what the caller sent.
		return Customer{}, BadRequest("customer_id", "customer_id must not be blank")
	}
	if utf8.RuneCountInString(ref.Value) > MaxExternalIDChars {
		return Customer{}, Invalid("customer_id", "customer_id is longer than 255 characters")
	}
	if d := FusedDoorOf(ctx); d.Open() || d.ReadOpen() {
		// A fused door claims the key only in the money script, after this:
		// the usual path claims first, so a key already used never creates.
		// A read door has not checked the stamps yet: a key revoked
		// elsewhere must not create.
		return Customer{}, ErrFusedStale
	}
	// The checks above are all CreateCustomer's shape checks ask of a bare
	// external id.
	ext := ref.Value
	created, err := s.Create(ctx, scope, CreateCustomer{ExternalID: ext})
	if err != nil {
		// A concurrent auto-create of the same value won; use its customer.
		if e, ok := AsError(err); ok && e.Kind == KindConflict {
			return s.dir.CustomerByExternalID(ctx, scope, ref.Value)
		}
		return Customer{}, err
	}
	return created, nil
}

// CustomerKeyOf is the credit-state key of c.
func CustomerKeyOf(c Customer) CustomerKey {
	return CustomerKey{TenantID: c.TenantID, Environment: c.Environment, CustomerID: c.ID}
}

// rawJSON encodes v for splicing into a Mutation, "null" for nil.
func rawJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		return json.RawMessage("null")
	}
	return b
}

// CustomerKey names one customer's credit state.
type CustomerKey struct {
	TenantID    uuid.UUID
	Environment Environment
	CustomerID  uuid.UUID
}
