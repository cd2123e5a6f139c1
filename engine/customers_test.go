package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// memDirectory is an in-memory Directory for the customer rules.
type memDirectory struct {
	Directory
	mu        sync.Mutex
	customers []Customer
}

func (d *memDirectory) CreateCustomer(_ context.Context, c Customer) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, o := range d.customers {
		if o.TenantID == c.TenantID && o.Environment == c.Environment && o.ExternalID == c.ExternalID && o.DeletedAt == nil {
			return ErrExternalIDTaken
		}
	}
	d.customers = append(d.customers, c)
	return nil
}

func (d *memDirectory) CustomerByExternalID(_ context.Context, s Scope, ext string) (Customer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, o := range d.customers {
		if o.TenantID == s.TenantID && o.Environment == s.Environment && o.ExternalID == ext && o.DeletedAt == nil {
			return o, nil
		}
	}
	return Customer{}, ErrNotFound
}

func (d *memDirectory) CustomerByID(_ context.Context, id uuid.UUID) (Customer, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, o := range d.customers {
		if o.ID == id && o.DeletedAt == nil {
			return o, nil
		}
	}
	return Customer{}, ErrNotFound
}

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// TestResolve states docs/spec/interface.md Common rules 3-5: external id first, then
// UUID; auto-create only where allowed; another tenant's id is a 400 there
// and a 404 elsewhere.
func TestResolve(t *testing.T) {
	dir := &memDirectory{}
	svc := NewCustomers(dir, fixedClock{time.Unix(1000, 0)})
	ctx := context.Background()
	tenantA := Scope{TenantID: uuid.New(), Environment: EnvironmentSandbox}
	tenantB := Scope{TenantID: uuid.New(), Environment: EnvironmentSandbox}
	ext := "alice"
	alice, err := svc.Create(ctx, tenantA, CreateCustomer{ExternalID: ext})
	if err != nil {
		t.Fatal(err)
	}
	// A customer whose external id is another customer's UUID text: the
	// external id must win.
	shadowExt := alice.ID.String()
	shadowB, err := svc.Create(ctx, tenantB, CreateCustomer{ExternalID: shadowExt})
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name   string
		scope  Scope
		ref    CustomerRef
		create bool
		want   uuid.UUID
		kind   Kind
	}{
		{"external id", tenantA, CustomerRef{Value: "alice"}, false, alice.ID, ""},
		{"uuid", tenantA, CustomerRef{Value: alice.ID.String()}, false, alice.ID, ""},
		{"external id beats uuid", tenantB, CustomerRef{Value: alice.ID.String()}, true, shadowB.ID, ""},
		{"strict refuses uuid", tenantA, CustomerRef{Value: alice.ID.String(), Strict: true}, false, uuid.Nil, KindNotFound},
		{"unknown without create", tenantA, CustomerRef{Value: "bob"}, false, uuid.Nil, KindNotFound},
		{"other tenant uuid on read", Scope{TenantID: uuid.New(), Environment: EnvironmentSandbox}, CustomerRef{Value: alice.ID.String()}, false, uuid.Nil, KindNotFound},
		{"other tenant uuid with create", Scope{TenantID: uuid.New(), Environment: EnvironmentSandbox}, CustomerRef{Value: alice.ID.String()}, true, uuid.Nil, KindBadRequest},
		{"other environment uuid with create", Scope{TenantID: tenantA.TenantID, Environment: EnvironmentLive}, CustomerRef{Value: alice.ID.String()}, true, uuid.Nil, KindBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := svc.Resolve(ctx, tt.scope, tt.ref, tt.create)
			if tt.kind != "" {
				e, ok := AsError(err)
				if !ok || e.Kind != tt.kind {
					t.Fatalf("err = %v, want kind %s", err, tt.kind)
				}
				return
			}
			if err != nil || got.ID != tt.want {
				t.Fatalf("got %v, %v; want %v", got.ID, err, tt.want)
			}
		})
	}

	t.Run("auto-create", func(t *testing.T) {
		c, err := svc.Resolve(ctx, tenantA, CustomerRef{Value: "carol"}, true)
		if err != nil || c.ExternalID != "carol" || c.ID == uuid.Nil {
			t.Fatalf("auto-create: %+v %v", c, err)
		}
		again, err := svc.Resolve(ctx, tenantA, CustomerRef{Value: "carol"}, true)
		if err != nil || again.ID != c.ID {
			t.Fatalf("second resolve created again: %v %v", again.ID, err)
		}
	})
}

// TestCachedServesStaleWhileRefreshing: past its TTL a cached customer is
// served at once while a background look-up refreshes it; a customer
// deleted meanwhile drops out of the cache at that refresh.
func TestCachedServesStaleWhileRefreshing(t *testing.T) {
	dir := &memDirectory{}
	svc := NewCustomers(dir, fixedClock{time.Unix(1000, 0)})
	cached := NewCachedCustomers(svc)
	cached.ttl = time.Millisecond
	ctx := context.Background()
	scope := Scope{TenantID: uuid.New(), Environment: EnvironmentLive}
	ext := "dora"
	c, err := svc.Create(ctx, scope, CreateCustomer{ExternalID: ext})
	if err != nil {
		t.Fatal(err)
	}
	ref := CustomerRef{Value: ext}
	if got, err := cached.Resolve(ctx, scope, ref, false); err != nil || got.ID != c.ID {
		t.Fatalf("first resolve: %v %v", got.ID, err)
	}
	dir.mu.Lock()
	now := time.Now()
	dir.customers[0].DeletedAt = &now
	dir.mu.Unlock()
	time.Sleep(5 * time.Millisecond)
	if got, err := cached.Resolve(ctx, scope, ref, false); err != nil || got.ID != c.ID {
		t.Fatalf("stale entry not served while refreshing: %v %v", got.ID, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		if _, err := cached.Resolve(ctx, scope, ref, false); err != nil {
			break // the refresh saw the delete
		}
		if time.Now().After(deadline) {
			t.Fatal("a deleted customer is still served after its refresh")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
