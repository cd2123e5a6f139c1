package engine

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// MaxDisplayNameChars is the longest display_name (interface.md Limits).
const MaxDisplayNameChars = 200

// MaxExternalIDChars bounds external ids (our limit; addendum leaves it open).
const MaxExternalIDChars = 255

// Customers creates, reads, changes and deletes a tenant's customers, and
// resolves the customer a request names (interface.md Common rules 3-5).
type Customers struct {
	dir   Directory
	clock Clock

	cache *swrCache[resolveKey, Customer]
	ttl   time.Duration // customerCacheTTL; tests shorten it
}

// customerCacheTTL bounds how long another process may still resolve a
// customer this one changed or deleted; the hot path (checks, consumes)
// resolves from this cache instead of Postgres.
const customerCacheTTL = 5 * time.Second

// maxCachedCustomers bounds the cache's memory; a full cache starts over.
const maxCachedCustomers = 200_000

type resolveKey struct {
	scope  Scope
	value  string
	strict bool
	// byID marks an entry of CachedByKey: value is the customer's id, never
	// an external id.
	byID bool
}

// NewCustomers returns the customer service.
func NewCustomers(dir Directory, clock Clock) *Customers {
	return &Customers{dir: dir, clock: clock, cache: newSWRCache[resolveKey, Customer](maxCachedCustomers), ttl: customerCacheTTL}
}

// Cached resolves ref like Resolve, from a short-lived lock-free cache of
// found customers (misses and errors are never cached). An entry past its
// TTL but younger than customerStaleLimit is served at once while one
// background look-up refreshes it, so the hot path never waits on Postgres
// for a customer it has seen lately; a customer deleted elsewhere drops out
// at that refresh.
func (s *Customers) Cached(ctx context.Context, scope Scope, ref CustomerRef, create bool) (Customer, error) {
	k := resolveKey{scope: Scope{TenantID: scope.TenantID, Environment: scope.Environment}, value: ref.Value, strict: ref.Strict}
	now := time.Now()
	c, st := s.cache.get(k, now, customerStaleLimit)
	switch st {
	case cacheFresh:
		return c, nil
	case cacheRefresh:
		go s.refresh(k, scope, ref)
		return c, nil
	}
	gen := s.cache.generation()
	c, err := s.Resolve(ctx, scope, ref, create)
	if err != nil {
		return Customer{}, err
	}
	s.cache.put(k, c, now.Add(s.ttl), gen)
	s.cache.put(byKeyEntry(c), c, now.Add(s.ttl), gen)
	return c, nil
}

// CachedByKey is the customer of key (its id, tenant and environment), from
// the cache Cached fills, else from the directory: a hold's commit or
// release resolves the customer its index names without Postgres. A
// customer the directory no longer has (deleted) is key alone, with no
// external id: its holds can still be settled.
func (s *Customers) CachedByKey(ctx context.Context, key CustomerKey) Customer {
	k := resolveKey{scope: Scope{TenantID: key.TenantID, Environment: key.Environment}, value: key.CustomerID.String(), byID: true}
	now := time.Now()
	c, st := s.cache.get(k, now, customerStaleLimit)
	switch st {
	case cacheFresh:
		return c
	case cacheRefresh:
		go s.refreshByKey(k, key)
		return c
	}
	gen := s.cache.generation()
	c, err := s.dir.CustomerByID(ctx, key.CustomerID)
	if err != nil || c.TenantID != key.TenantID || c.Environment != key.Environment {
		return Customer{ID: key.CustomerID, TenantID: key.TenantID, Environment: key.Environment}
	}
	s.cache.put(k, c, now.Add(s.ttl), gen)
	return c
}

// refreshByKey looks a customer CachedByKey serves up again in the
// background.
func (s *Customers) refreshByKey(k resolveKey, key CustomerKey) {
	ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
	defer cancel()
	gen := s.cache.generation()
	c, err := s.dir.CustomerByID(ctx, key.CustomerID)
	switch {
	case errors.Is(err, ErrNotFound):
		s.cache.delete(k)
	case err != nil:
		s.cache.refreshFailed(k)
	default:
		s.cache.put(k, c, time.Now().Add(s.ttl), gen)
	}
}

// byKeyEntry is the CachedByKey entry of c, which a resolve by any
// reference fills too: the commit right after a reserve finds it.
func byKeyEntry(c Customer) resolveKey {
	return resolveKey{scope: Scope{TenantID: c.TenantID, Environment: c.Environment}, value: c.ID.String(), byID: true}
}

// customerStaleLimit bounds how long past its TTL a cached customer may be
// served while its refresh runs.
const customerStaleLimit = time.Minute

// refresh looks a cached customer up again in the background.
func (s *Customers) refresh(k resolveKey, scope Scope, ref CustomerRef) {
	ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
	defer cancel()
	gen := s.cache.generation()
	c, err := s.Resolve(ctx, scope, ref, false)
	if err != nil {
		if ne, isErr := AsError(err); isErr && ne.Kind == KindNotFound {
			s.cache.delete(k)
		} else {
			s.cache.refreshFailed(k)
		}
		return
	}
	s.cache.put(k, c, time.Now().Add(s.ttl), gen)
}

// forget drops cached resolutions of customer id after a change.
func (s *Customers) forget(id uuid.UUID) {
	s.cache.deleteWhere(func(_ resolveKey, c Customer) bool { return c.ID == id })
}

// CustomerRef is how a request names a customer: a lenient own-or-external id,
// or (Strict) an external id only.
type CustomerRef struct {
	Value  string
	Strict bool
}

// CreateCustomer is a checked request to add a customer: api builds it from
// the body of POST /v1/customers (or an import row) once every field has
// passed its shape checks.
type CreateCustomer struct {
	ExternalID            string
	DisplayName           *string        // nil: none
	OveragePolicy         *OveragePolicy // nil: the tenant's default
	LowBalanceThresholdMC *int64         // nil: none
	Metadata              Metadata       // canonical; nil: none
}

// UpdateCustomer is a checked PATCH of a customer: a nil field keeps its
// value, an empty DisplayName or OveragePolicy clears it, and Metadata
// merges key by key.
type UpdateCustomer struct {
	DisplayName           *string
	OveragePolicy         *OveragePolicy
	LowBalanceThresholdMC *int64
	Metadata              Metadata // canonical
}

// Create adds a customer. Errors: 409 when the external id is taken in this
// tenant and environment.
func (s *Customers) Create(ctx context.Context, scope Scope, in CreateCustomer) (Customer, error) {
	now := s.clock.Now()
	c := Customer{
		ID:          uuid.Must(uuid.NewV7()),
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
	if err := s.dir.CreateCustomer(ctx, c); err != nil {
		if errors.Is(err, ErrExternalIDTaken) {
			return Customer{}, &Error{Kind: KindConflict, Field: "external_id", Detail: "a customer with this external_id already exists"}
		}
		return Customer{}, err
	}
	return c, nil
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
	c.UpdatedAt = s.clock.Now()
	if err := s.dir.UpdateCustomer(ctx, c); err != nil {
		return Customer{}, err
	}
	s.forget(c.ID)
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
	s.forget(c.ID)
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
