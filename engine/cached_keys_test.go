package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

// keyDirectory is a Directory of one tenant's keys that counts the key
// look-ups reaching it.
type keyDirectory struct {
	Directory
	tenant  Tenant
	keys    map[[32]byte]APIKey
	lookups int
}

func (d *keyDirectory) APIKeyByHash(_ context.Context, hash []byte) (APIKey, error) {
	d.lookups++
	k, ok := d.keys[[32]byte(hash)]
	if !ok || k.RevokedAt != nil {
		return APIKey{}, ErrNotFound
	}
	return k, nil
}

func (d *keyDirectory) GetTenant(context.Context, uuid.UUID) (Tenant, error) { return d.tenant, nil }

func (d *keyDirectory) CreateAPIKey(_ context.Context, k APIKey, hash []byte) error {
	d.keys[[32]byte(hash)] = k
	return nil
}

func (d *keyDirectory) RevokeAPIKey(_ context.Context, _, key uuid.UUID, at time.Time) error {
	for h, k := range d.keys {
		if k.ID == key {
			k.RevokedAt = &at
			d.keys[h] = k
			return nil
		}
	}
	return ErrNotFound
}

func (d *keyDirectory) UpdateTenant(_ context.Context, t Tenant) error {
	d.tenant = t
	return nil
}

// TestCachedKeys: a key is looked up once until a write through the
// forgetting directory changes it, its tenant, or (created) makes an
// unknown key known.
func TestCachedKeys(t *testing.T) {
	ctx := context.Background()
	tenant := Tenant{ID: uuid.New(), Name: "acme"}
	plain := []byte("ck_live_" + "01234567890123456789012345678901")
	sum := sha256.Sum256(plain)
	key := APIKey{ID: uuid.New(), TenantID: tenant.ID, Environment: EnvironmentLive}
	tests := []struct {
		name        string
		known       bool
		write       func(d Directory) error
		wantErr     error
		wantName    string
		wantLookups int
	}{
		{"known key, no write", true, func(Directory) error { return nil }, nil, "acme", 1},
		{"unknown key, no write", false, func(Directory) error { return nil }, ErrNotFound, "", 1},
		{"revoked here", true, func(d Directory) error { return d.RevokeAPIKey(ctx, tenant.ID, key.ID, time.Now()) }, ErrNotFound, "", 2},
		{"tenant renamed here", true, func(d Directory) error {
			renamed := tenant
			renamed.Name = "acme2"
			return d.UpdateTenant(ctx, renamed)
		}, nil, "acme2", 2},
		{"created here after it was unknown", false, func(d Directory) error { return d.CreateAPIKey(ctx, key, sum[:]) }, nil, "acme", 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := &keyDirectory{tenant: tenant, keys: map[[32]byte]APIKey{}}
			if tc.known {
				dir.keys[sum] = key
			}
			keys := NewCachedKeys(NewKeyLookup(dir))
			keys.KeyScope(ctx, sum)
			if err := tc.write(keys.ForgettingDirectory(dir)); err != nil {
				t.Fatal(err)
			}
			_, got, err := keys.KeyScope(ctx, sum)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) || got.Name != tc.wantName {
				t.Errorf("got %q, %v; want %q, %v", got.Name, err, tc.wantName, tc.wantErr)
			}
			if dir.lookups != tc.wantLookups {
				t.Errorf("%d look-ups, want %d", dir.lookups, tc.wantLookups)
			}
		})
	}
}
