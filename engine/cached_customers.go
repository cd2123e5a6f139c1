// CachedCustomers: the CustomerLookup decorator the hot path resolves
// customers through, lock-free and stale while one background look-up
// revalidates, and the Directory decorator whose customer writes make it
// forget.

package engine

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
)

// customerCacheTTL bounds how long a customer is kept without a Postgres
// read while no write moves the tenant's customer stamp (Stamps: a change
// made anywhere in the fleet is seen by the next request; the TTL bounds
// staleness only while the stamps cannot be read); the hot path (checks,
// consumes) resolves from this cache instead of Postgres.
const customerCacheTTL = 5 * time.Second

// customerStaleLimit bounds how long past its TTL a cached customer may be
// served while its refresh runs.
const customerStaleLimit = time.Minute

// maxCachedCustomers bounds the cache's memory; a full cache starts over.
const maxCachedCustomers = 200_000

type resolveKey struct {
	scope  Scope
	value  string
	strict bool
	// byID marks an entry of CustomerByKey: value is the customer's id,
	// never an external id.
	byID bool
}

// CachedCustomers caches the customers another CustomerLookup finds
// (misses and errors are never cached). An entry past its TTL but younger
// than customerStaleLimit is served at once while one background look-up
// refreshes it, so the hot path never waits on Postgres for a customer it
// has seen lately; a customer deleted elsewhere drops out at that refresh.
type CachedCustomers struct {
	next   CustomerLookup
	cache  *swrCache[resolveKey, Customer]
	ttl    time.Duration // customerCacheTTL; tests shorten it
	stamps *Stamps
	// down tells a failed read of an unreachable Postgres from an answer
	// (nil: SourceDown's default).
	down SourceDown
}

var _ CustomerLookup = (*CachedCustomers)(nil)

// NewCachedCustomers caches next. Writes must reach the directory through
// ForgettingDirectory for this process to see them at once.
func NewCachedCustomers(next CustomerLookup) *CachedCustomers {
	return &CachedCustomers{next: next, cache: newSWRCache[resolveKey, Customer](maxCachedCustomers), ttl: customerCacheTTL}
}

// WithStamps makes s check its entries against the fleet's customer
// stamps; its ForgettingDirectory then moves them on every write. nil (the
// default) is a node alone.
func (s *CachedCustomers) WithStamps(st *Stamps) *CachedCustomers {
	s.stamps = st
	return s
}

// WithSourceDown makes s tell an unreachable source by down (internal/app:
// persist.Unavailable): a customer whose read fails so is served from its
// last good copy, within lastGoodLimit; one never cached needs Postgres.
func (s *CachedCustomers) WithSourceDown(down SourceDown) *CachedCustomers {
	s.down = down
	return s
}

// Resolve resolves ref as next does, from the cache when it can.
func (s *CachedCustomers) Resolve(ctx context.Context, scope Scope, ref CustomerRef, create bool) (Customer, error) {
	k := resolveKey{scope: Scope{TenantID: scope.TenantID, Environment: scope.Environment}, value: ref.Value, strict: ref.Strict}
	now := time.Now()
	stamp := s.stamps.Seen(scope.TenantID, maskCustomers)
	c, st := s.cache.get(k, now, customerStaleLimit, stamp)
	switch st {
	case cacheFresh:
		return c, nil
	case cacheRefresh:
		go s.refresh(k, scope, ref)
		return c, nil
	}
	gen := s.cache.generation()
	last := c
	c, err := s.next.Resolve(ctx, scope, ref, create)
	if err != nil {
		if st != cacheMiss && s.down.says(err) {
			if st == cacheExpired {
				s.cache.markDown(k, time.Now())
			}
			return last, nil // Postgres unreachable: the last good copy (invariant 16)
		}
		return Customer{}, err
	}
	s.cache.put(k, c, now.Add(s.stamps.TTL(s.ttl)), gen, stamp)
	s.cache.put(byKeyEntry(c), c, now.Add(s.stamps.TTL(s.ttl)), gen, stamp)
	return c, nil
}

// CustomerByKey is the customer of key, from the cache Resolve fills too
// (the commit right after a reserve finds it), else from next.
func (s *CachedCustomers) CustomerByKey(ctx context.Context, key CustomerKey) (Customer, error) {
	k := resolveKey{scope: Scope{TenantID: key.TenantID, Environment: key.Environment}, value: key.CustomerID.String(), byID: true}
	now := time.Now()
	stamp := s.stamps.Seen(key.TenantID, maskCustomers)
	c, st := s.cache.get(k, now, customerStaleLimit, stamp)
	switch st {
	case cacheFresh:
		return c, nil
	case cacheRefresh:
		go s.refreshByKey(k, key)
		return c, nil
	}
	gen := s.cache.generation()
	last := c
	c, err := s.next.CustomerByKey(ctx, key)
	if err != nil {
		if st != cacheMiss && s.down.says(err) {
			if st == cacheExpired {
				s.cache.markDown(k, time.Now())
			}
			return last, nil // Postgres unreachable: the last good copy (invariant 16)
		}
		return Customer{}, err
	}
	s.cache.put(k, c, now.Add(s.stamps.TTL(s.ttl)), gen, stamp)
	return c, nil
}

// refreshByKey looks a customer CustomerByKey serves up again in the
// background.
func (s *CachedCustomers) refreshByKey(k resolveKey, key CustomerKey) {
	ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
	defer cancel()
	gen, stamp := s.cache.generation(), s.stamps.Seen(key.TenantID, maskCustomers)
	c, err := s.next.CustomerByKey(ctx, key)
	switch {
	case errors.Is(err, ErrNotFound):
		s.cache.delete(k)
	case err != nil:
		s.cache.refreshFailed(k, s.down.says(err))
	default:
		s.cache.put(k, c, time.Now().Add(s.stamps.TTL(s.ttl)), gen, stamp)
	}
}

// byKeyEntry is the CustomerByKey entry of c, which a resolve by any
// reference fills too.
func byKeyEntry(c Customer) resolveKey {
	return resolveKey{scope: Scope{TenantID: c.TenantID, Environment: c.Environment}, value: c.ID.String(), byID: true}
}

// refresh looks a cached customer up again in the background.
func (s *CachedCustomers) refresh(k resolveKey, scope Scope, ref CustomerRef) {
	ctx, cancel := context.WithTimeout(context.Background(), refreshTimeout)
	defer cancel()
	gen, stamp := s.cache.generation(), s.stamps.Seen(scope.TenantID, maskCustomers)
	c, err := s.next.Resolve(ctx, scope, ref, false)
	if err != nil {
		if ne, isErr := AsError(err); isErr && ne.Kind == KindNotFound {
			s.cache.delete(k)
		} else {
			s.cache.refreshFailed(k, s.down.says(err))
		}
		return
	}
	s.cache.put(k, c, time.Now().Add(s.stamps.TTL(s.ttl)), gen, stamp)
}

// isNotFound reports whether err says the customer is not there (a 404 of
// the directory or of the service), as opposed to a failed read.
func isNotFound(err error) bool {
	if errors.Is(err, ErrNotFound) {
		return true
	}
	ne, ok := AsError(err)
	return ok && ne.Kind == KindNotFound
}

// forget drops cached resolutions of customer id after a change, then
// moves the tenant's customer stamp so every other node drops them before
// its next request.
func (s *CachedCustomers) forget(ctx context.Context, tenant, id uuid.UUID) {
	s.cache.deleteWhere(func(_ resolveKey, c Customer) bool { return c.ID == id })
	s.stamps.Bump(ctx, tenant, StampCustomers)
}

// ForgettingDirectory decorates dir so that every customer it changes or
// deletes is forgotten by s, and by every node sharing its stamps, once
// written.
func (s *CachedCustomers) ForgettingDirectory(dir Directory) Directory {
	return &forgettingDirectory{Directory: dir, customers: s}
}

// forgettingDirectory is a Directory whose customer writes make a
// CachedCustomers forget the customer; the rest passes through.
type forgettingDirectory struct {
	Directory
	customers *CachedCustomers
}

func (d *forgettingDirectory) UpdateCustomer(ctx context.Context, c Customer) error {
	err := d.Directory.UpdateCustomer(ctx, c)
	if err == nil {
		d.customers.forget(ctx, c.TenantID, c.ID)
	}
	return err
}

func (d *forgettingDirectory) DeleteCustomer(ctx context.Context, s Scope, id uuid.UUID, at time.Time) error {
	err := d.Directory.DeleteCustomer(ctx, s, id, at)
	if err == nil {
		d.customers.forget(ctx, s.TenantID, id)
	}
	return err
}
