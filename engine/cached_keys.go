// CachedKeys: the KeyLookup decorator every request authenticates through,
// lock-free and stale while one background look-up re-checks a key in use,
// with a short memory of unknown keys; and the Directory decorator whose
// key and tenant writes make it forget.

package engine

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
)

const (
	// authCacheTTL bounds how long a key stays trusted without a Postgres
	// look-up in another process; a revoke in this process is seen at once.
	authCacheTTL = 2 * time.Second
	// unknownKeyTTL is how long a key Postgres did not know is refused from
	// memory, so a stream of random well-prefixed keys costs one query per
	// distinct key per 2 s, not one per request; maxUnknownKeys bounds that
	// memory (a full cache drops expired entries, then an eighth at random).
	unknownKeyTTL  = 2 * time.Second
	maxUnknownKeys = 10_000
)

// authStaleLimit bounds how long past authCacheTTL a key in use is trusted
// while its background re-check runs (a revoke elsewhere is seen within
// authCacheTTL plus that re-check); maxCachedKeys bounds the cache.
const (
	authStaleLimit = 5 * time.Second
	maxCachedKeys  = 100_000
)

// directoryKeys is the uncached KeyLookup of a Directory.
type directoryKeys struct{ dir Directory }

// NewKeyLookup reads dir afresh on every look-up.
func NewKeyLookup(dir Directory) KeyLookup { return directoryKeys{dir} }

// KeyScope reads the key, then its tenant.
func (d directoryKeys) KeyScope(ctx context.Context, sum [32]byte) (Scope, Tenant, error) {
	k, err := d.dir.APIKeyByHash(ctx, sum[:])
	if err != nil {
		return Scope{}, Tenant{}, err
	}
	t, err := d.dir.GetTenant(ctx, k.TenantID)
	if err != nil {
		return Scope{}, Tenant{}, err
	}
	return Scope{TenantID: k.TenantID, Environment: k.Environment, KeyID: k.ID}, t, nil
}

type authEntry struct {
	scope  Scope
	tenant Tenant
}

// CachedKeys caches what another KeyLookup finds for authCacheTTL, served
// up to authStaleLimit past it while one background look-up re-checks the
// key, and remembers for unknownKeyTTL that a key was unknown.
type CachedKeys struct {
	next KeyLookup
	// cache maps a key's sha256 to what it authenticates (lock-free reads).
	cache *swrCache[[32]byte, authEntry]
	mu    sync.Mutex
	// unknown holds hashes of keys next did not know, with when that
	// answer expires.
	unknown map[[32]byte]time.Time
}

var _ KeyLookup = (*CachedKeys)(nil)

// NewCachedKeys caches next. Writes must reach the directory through
// ForgettingDirectory for this process to see them at once.
func NewCachedKeys(next KeyLookup) *CachedKeys {
	return &CachedKeys{next: next, cache: newSWRCache[[32]byte, authEntry](maxCachedKeys), unknown: map[[32]byte]time.Time{}}
}

// KeyScope is the cached scope and tenant of the key hashed to sum.
func (s *CachedKeys) KeyScope(ctx context.Context, sum [32]byte) (Scope, Tenant, error) {
	now := time.Now()
	e, st := s.cache.get(sum, now, authStaleLimit)
	switch st {
	case cacheFresh:
		return e.scope, e.tenant, nil
	case cacheRefresh:
		s.cache.refreshInBackground(sum, func(ctx context.Context) error {
			_, _, err := s.lookUp(ctx, sum)
			if errors.Is(err, ErrNotFound) {
				return nil // lookUp dropped the entry
			}
			return err
		})
		return e.scope, e.tenant, nil
	}
	s.mu.Lock()
	until, seen := s.unknown[sum]
	s.mu.Unlock()
	if seen && now.Before(until) {
		return Scope{}, Tenant{}, ErrNotFound
	}
	return s.lookUp(ctx, sum)
}

// lookUp asks next for the key hashed to sum and caches the answer: its
// scope and tenant, or (unknown key) the refusal.
func (s *CachedKeys) lookUp(ctx context.Context, sum [32]byte) (Scope, Tenant, error) {
	gen := s.cache.generation()
	now := time.Now()
	scope, t, err := s.next.KeyScope(ctx, sum)
	if errors.Is(err, ErrNotFound) {
		s.cache.delete(sum)
		s.rememberUnknown(sum, now)
		return Scope{}, Tenant{}, ErrNotFound
	}
	if err != nil {
		return Scope{}, Tenant{}, err
	}
	s.cache.put(sum, authEntry{scope: scope, tenant: t}, now.Add(authCacheTTL), gen)
	return scope, t, nil
}

// rememberUnknown notes that next does not know the key hashed to sum,
// keeping the memory within maxUnknownKeys.
func (s *CachedKeys) rememberUnknown(sum [32]byte, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.unknown) >= maxUnknownKeys {
		for h, until := range s.unknown {
			if !now.Before(until) {
				delete(s.unknown, h)
			}
		}
		// Still full: a flood of distinct keys. Drop an eighth (map order
		// is random), so each insert does not rescan.
		for h := range s.unknown {
			if len(s.unknown) < maxUnknownKeys-maxUnknownKeys/8 {
				break
			}
			delete(s.unknown, h)
		}
	}
	s.unknown[sum] = now.Add(unknownKeyTTL)
}

// forget drops the cached keys drop picks.
func (s *CachedKeys) forget(drop func(authEntry) bool) {
	s.cache.deleteWhere(func(_ [32]byte, e authEntry) bool { return drop(e) })
}

// known forgets that the key hashed to sum was unknown.
func (s *CachedKeys) known(sum [32]byte) {
	s.mu.Lock()
	delete(s.unknown, sum)
	s.mu.Unlock()
}

// ForgettingDirectory decorates dir so that a key it creates is no longer
// remembered as unknown, a key it revokes is no longer trusted, and the
// keys of a tenant it updates are looked up afresh, each once written.
func (s *CachedKeys) ForgettingDirectory(dir Directory) Directory {
	return &keyForgettingDirectory{Directory: dir, keys: s}
}

// keyForgettingDirectory is a Directory whose key and tenant writes make a
// CachedKeys forget; the rest passes through.
type keyForgettingDirectory struct {
	Directory
	keys *CachedKeys
}

// CreateAPIKey stores the key, then lets it work at once in this process
// even if someone presented it a moment ago; another process may refuse
// it for up to unknownKeyTTL.
func (d *keyForgettingDirectory) CreateAPIKey(ctx context.Context, k APIKey, hash []byte) error {
	err := d.Directory.CreateAPIKey(ctx, k, hash)
	if err == nil && len(hash) == 32 {
		d.keys.known([32]byte(hash))
	}
	return err
}

func (d *keyForgettingDirectory) RevokeAPIKey(ctx context.Context, tenant, key uuid.UUID, at time.Time) error {
	err := d.Directory.RevokeAPIKey(ctx, tenant, key, at)
	if err == nil {
		d.keys.forget(func(e authEntry) bool { return e.scope.KeyID == key })
	}
	return err
}

func (d *keyForgettingDirectory) UpdateTenant(ctx context.Context, t Tenant) error {
	err := d.Directory.UpdateTenant(ctx, t)
	if err == nil {
		d.keys.forget(func(e authEntry) bool { return e.scope.TenantID == t.ID })
	}
	return err
}
