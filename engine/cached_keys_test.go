package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
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

// downKeys is a KeyLookup that fails as an unreachable Postgres while down.
type downKeys struct {
	next    KeyLookup
	down    bool
	lookups int
}

var errPostgresDown = errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")

func (d *downKeys) KeyScope(ctx context.Context, sum [32]byte) (Scope, Tenant, error) {
	d.lookups++
	if d.down {
		return Scope{}, Tenant{}, errPostgresDown
	}
	return d.next.KeyScope(ctx, sum)
}

// TestCachedKeysPostgresDown (issue 26 item 3, invariant 16): a cached key
// whose look-up finds Postgres down is served from its last good copy,
// Postgres asked again at most once per lastGoodRetry, and not past
// lastGoodLimit; but a key whose tenant's stamp moved (a revoke or a
// settings change somewhere) is never served from memory: 503
// (ErrRecordUnavailable) until Postgres answers.
func TestCachedKeysPostgresDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tenant := Tenant{ID: uuid.New(), Name: "acme"}
	sum := sha256.Sum256([]byte("ck_live_" + "01234567890123456789012345678901"))
	key := APIKey{ID: uuid.New(), TenantID: tenant.ID, Environment: EnvironmentLive}
	for _, tc := range []struct {
		name string
		// age is how long ago the cached entry expired.
		age        time.Duration
		stampMoved bool
		wantErr    error
		// wantLookups is the second answer's look-ups when the first was
		// served, else both answers'.
		wantLookups int
	}{
		{"past its stale limit", time.Minute, false, nil, 0},
		{"just within the last-good limit", lastGoodLimit - time.Minute, false, nil, 0},
		{"past the last-good limit", lastGoodLimit + time.Second, false, ErrRecordUnavailable, 2},
		{"its tenant's stamp moved", 0, true, ErrRecordUnavailable, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := &keyDirectory{tenant: tenant, keys: map[[32]byte]APIKey{sum: key}}
			store := &memStamps{m: map[uuid.UUID]TenantStamps{}}
			next := &downKeys{next: NewKeyLookup(dir)}
			keys := NewCachedKeys(next).WithStamps(NewStamps(store, zerolog.Nop())).
				WithSourceDown(func(err error) bool { return errors.Is(err, errPostgresDown) })
			if _, _, err := keys.KeyScope(ctx, sum); err != nil {
				t.Fatal(err)
			}
			if tc.age > 0 {
				e, _ := keys.cache.load(sum)
				e.expires = time.Now().Add(-tc.age).UnixNano()
			}
			if tc.stampMoved {
				_, _ = store.StampBump(ctx, tenant.ID, StampTenant)
			}
			next.down, next.lookups = true, 0
			for i := range 2 {
				scope, got, err := keys.KeyScope(ctx, sum)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Errorf("answer %d: %v, want %v", i, err, tc.wantErr)
					}
					if e, ok := AsError(err); !ok || e.Kind != KindUnavailable {
						t.Errorf("answer %d: %v is no unavailable (503)", i, err)
					}
					continue
				}
				if err != nil || got.Name != "acme" || scope.KeyID != key.ID {
					t.Errorf("answer %d: %+v %q %v, want the last good copy", i, scope, got.Name, err)
				}
				if i == 0 && next.lookups != 1 {
					t.Errorf("the first answer past the stale limit made %d look-ups, want 1", next.lookups)
				}
				next.lookups = 0
			}
			if next.lookups != tc.wantLookups {
				t.Errorf("the second answer made %d look-ups, want %d", next.lookups, tc.wantLookups)
			}
		})
	}
}
