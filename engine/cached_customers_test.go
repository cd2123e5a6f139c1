package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

// writableDirectory is a memDirectory that updates and deletes customers
// and counts the look-ups reaching it.
type writableDirectory struct {
	*memDirectory
	reads int
}

func (d *writableDirectory) CustomerByExternalID(ctx context.Context, s Scope, ext string) (Customer, error) {
	d.reads++
	return d.memDirectory.CustomerByExternalID(ctx, s, ext)
}

func (d *writableDirectory) CustomerByID(ctx context.Context, id uuid.UUID) (Customer, error) {
	d.reads++
	return d.memDirectory.CustomerByID(ctx, id)
}

func (d *writableDirectory) UpdateCustomer(_ context.Context, c Customer) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range d.customers {
		if d.customers[i].ID == c.ID {
			d.customers[i] = c
			return nil
		}
	}
	return ErrNotFound
}

func (d *writableDirectory) DeleteCustomer(_ context.Context, _ Scope, id uuid.UUID, at time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range d.customers {
		if d.customers[i].ID == id && d.customers[i].DeletedAt == nil {
			d.customers[i].DeletedAt = &at
			return nil
		}
	}
	return ErrNotFound
}

// TestCachedCustomers: a resolved customer is served from memory, by its
// reference and by its key, until the service changes or deletes it
// through the cache's forgetting directory; a miss is not cached.
func TestCachedCustomers(t *testing.T) {
	ctx := context.Background()
	scope := Scope{TenantID: uuid.New(), Environment: EnvironmentLive}
	ext := "dora"
	ref := CustomerRef{Value: ext}
	name := "Dora"
	tests := []struct {
		name      string
		run       func(svc *Customers, cached *CachedCustomers, c Customer) error
		wantReads int
	}{
		{"resolved once, found by key without a read", func(_ *Customers, cached *CachedCustomers, c Customer) error {
			cached.Resolve(ctx, scope, ref, false)
			cached.Resolve(ctx, scope, ref, false)
			_, err := cached.CustomerByKey(ctx, CustomerKeyOf(c))
			return err
		}, 1},
		{"an update is seen at once", func(svc *Customers, cached *CachedCustomers, _ Customer) error {
			cached.Resolve(ctx, scope, ref, false)
			if _, err := svc.Update(ctx, scope, ref, UpdateCustomer{DisplayName: &name}); err != nil {
				return err
			}
			got, err := cached.Resolve(ctx, scope, ref, false)
			if err == nil && (got.DisplayName == nil || *got.DisplayName != name) {
				t.Errorf("stale display name after the update")
			}
			return err
		}, 3}, // resolve, the update's own resolve, resolve again
		{"a delete is seen at once", func(svc *Customers, cached *CachedCustomers, c Customer) error {
			cached.Resolve(ctx, scope, ref, false)
			if err := svc.Delete(ctx, scope, ref); err != nil {
				return err
			}
			if _, err := cached.Resolve(ctx, scope, ref, false); err == nil {
				t.Errorf("a deleted customer is still resolved")
			}
			if _, err := cached.CustomerByKey(ctx, CustomerKeyOf(c)); err == nil {
				t.Errorf("a deleted customer is still found by key")
			}
			return nil
		}, 4}, // resolve, the delete's resolve, resolve again, by key
		{"a miss is not cached", func(_ *Customers, cached *CachedCustomers, _ Customer) error {
			other := CustomerRef{Value: "nobody", Strict: true}
			cached.Resolve(ctx, scope, other, false)
			cached.Resolve(ctx, scope, other, false)
			return nil
		}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mem := &memDirectory{}
			dir := &writableDirectory{memDirectory: mem}
			cached := NewCachedCustomers(NewCustomers(dir, fixedClock{time.Unix(1000, 0)}))
			svc := NewCustomers(cached.ForgettingDirectory(dir), fixedClock{time.Unix(1000, 0)})
			c, err := svc.Create(ctx, scope, CreateCustomer{ExternalID: ext})
			if err != nil {
				t.Fatal(err)
			}
			dir.reads = 0
			if err := tc.run(svc, cached, c); err != nil {
				t.Fatal(err)
			}
			if dir.reads != tc.wantReads {
				t.Errorf("%d directory reads, want %d", dir.reads, tc.wantReads)
			}
		})
	}
}

// downCustomers is a CustomerLookup of one customer that fails as an
// unreachable Postgres while down.
type downCustomers struct {
	c     Customer
	down  bool
	reads int
}

func (d *downCustomers) Resolve(context.Context, Scope, CustomerRef, bool) (Customer, error) {
	d.reads++
	if d.down {
		return Customer{}, errPostgresDown
	}
	return d.c, nil
}

func (d *downCustomers) CustomerByKey(ctx context.Context, _ CustomerKey) (Customer, error) {
	return d.Resolve(ctx, Scope{}, CustomerRef{}, false)
}

// TestCachedCustomersPostgresDown (issue 26 item 3, invariant 16): a
// cached customer whose read finds Postgres down is served from its last
// good copy, by reference and by key, within lastGoodLimit of its expiry
// and with one read of the source per lastGoodRetry; past that limit, or
// never cached, it is the error (a 503).
func TestCachedCustomersPostgresDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	scope := Scope{TenantID: uuid.New(), Environment: EnvironmentLive}
	c := Customer{ID: uuid.New(), TenantID: scope.TenantID, Environment: scope.Environment}
	ref := CustomerRef{Value: "dora"}
	for _, tc := range []struct {
		name    string
		age     time.Duration // how long ago the cached entries expired
		cached  bool
		wantErr bool
		// wantReads is what the second round of reads costs the source.
		wantReads int
	}{
		{"past the stale limit", 2 * customerStaleLimit, true, false, 0},
		{"just within the last-good limit", lastGoodLimit - time.Minute, true, false, 0},
		{"past the last-good limit", lastGoodLimit + time.Minute, true, true, 2},
		{"never cached", 0, false, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			next := &downCustomers{c: c}
			s := NewCachedCustomers(next).WithSourceDown(func(err error) bool { return errors.Is(err, errPostgresDown) })
			if tc.cached {
				if _, err := s.Resolve(ctx, scope, ref, false); err != nil {
					t.Fatal(err)
				}
				s.cache.each(func(_ resolveKey, e *swrEntry[Customer]) bool {
					e.expires = time.Now().Add(-tc.age).UnixNano()
					return true
				})
			}
			next.down = true
			for round := range 2 {
				next.reads = 0
				got, err := s.Resolve(ctx, scope, ref, false)
				byKey, kerr := s.CustomerByKey(ctx, CustomerKeyOf(c))
				if tc.wantErr {
					if err == nil || kerr == nil {
						t.Errorf("round %d: %v, %v; want the source's error", round, err, kerr)
					}
					continue
				}
				if err != nil || kerr != nil || got.ID != c.ID || byKey.ID != c.ID {
					t.Errorf("round %d: %v %v, %v %v; want the last good copy", round, got.ID, err, byKey.ID, kerr)
				}
			}
			if next.reads != tc.wantReads {
				t.Errorf("the second round read the source %d times, want %d", next.reads, tc.wantReads)
			}
		})
	}
}
