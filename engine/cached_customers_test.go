package engine

import (
	"context"
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
