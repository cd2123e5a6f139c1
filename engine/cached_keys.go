// CachedKeys: the KeyLookup decorator every request authenticates through,
// lock-free and stale while one background look-up re-checks a key in use,
// with a short memory of unknown keys; and the Directory decorator whose
// key and tenant writes make it forget.

package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
)

const (
	// authCacheTTL bounds how long a key and its tenant are trusted without
	// a Postgres look-up while no write moves the tenant's stamp (Stamps: a
	// revoke or a settings change made anywhere in the fleet is seen by the
	// next request; the TTL bounds staleness only while the stamps cannot
	// be read).
	authCacheTTL = 2 * time.Second
	// unknownKeyTTL is how long a key Postgres did not know is refused from
	// memory, so a stream of random well-prefixed keys costs one query per
	// distinct key per 2 s, not one per request (a key created anywhere in
	// the fleet moves the fleet's key stamp, which ends that memory at
	// once); maxUnknownKeys bounds that memory (a full cache drops expired
	// entries, then an eighth at random).
	unknownKeyTTL  = 2 * time.Second
	maxUnknownKeys = 10_000
)

// authStaleLimit bounds how long past authCacheTTL a key in use is trusted
// while its background re-check runs (only while the stamps cannot be
// read, a revoke elsewhere is seen within authCacheTTL plus that
// re-check); maxCachedKeys bounds the cache.
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
	// stamp is the tenant's StampTenant as seen before the key was read.
	stamp uint64
}

// unknownKey is the memory of a key next did not know.
type unknownKey struct {
	until time.Time // when the answer expires
	// keys is the fleet's key stamp (StampTenant of uuid.Nil) as seen
	// before the look-up: a key created since moved it.
	keys uint64
}

// CachedKeys caches what another KeyLookup finds for authCacheTTL, served
// up to authStaleLimit past it while one background look-up re-checks the
// key, and remembers for unknownKeyTTL that a key was unknown. With Stamps
// (WithStamps) every look-up first reads the tenant's change stamps, the
// request's one Redis read for them: a key whose tenant's StampTenant moved
// since it was cached is looked up afresh (a revoke or a settings change
// made on any node), and the other caches then compare what they hold with
// the stamps this read brought.
type CachedKeys struct {
	next KeyLookup
	// cache maps a key's sha256 to what it authenticates (lock-free reads).
	cache  *swrCache[[32]byte, authEntry]
	stamps *Stamps
	// down tells a failed look-up of an unreachable Postgres from an
	// answer (nil: SourceDown's default).
	down SourceDown
	mu   sync.Mutex
	// unknown reservations hashes of keys next did not know.
	unknown map[[32]byte]unknownKey
}

var _ KeyLookup = (*CachedKeys)(nil)

// NewCachedKeys caches next. Writes must reach the directory through
// ForgettingDirectory for this process to see them at once.
func NewCachedKeys(next KeyLookup) *CachedKeys {
	return &CachedKeys{next: next, cache: newSWRCache[[32]byte, authEntry](maxCachedKeys), unknown: map[[32]byte]unknownKey{}}
}

// WithStamps makes s read the tenant's change stamps on every look-up and
// trust a cached key only while its tenant's StampTenant holds; its
// ForgettingDirectory then moves the stamps on every write. nil (the
// default) is a node alone.
func (s *CachedKeys) WithStamps(st *Stamps) *CachedKeys {
	s.stamps = st
	return s
}

// WithSourceDown makes s tell an unreachable source by down (internal/app:
// persist.Unavailable): a key whose look-up fails so is served from its
// last good copy, within lastGoodLimit, unless its tenant's stamp moved.
func (s *CachedKeys) WithSourceDown(down SourceDown) *CachedKeys {
	s.down = down
	return s
}

// KeyScope is the cached scope and tenant of the key hashed to sum. It
// reads the change stamps of the key's tenant first (of the fleet's keys
// for a key not cached), so what it answers, and what every cache holds for
// the rest of the request, is as new as the last write that answered
// anywhere in the fleet.
func (s *CachedKeys) KeyScope(ctx context.Context, sum [32]byte) (Scope, Tenant, error) {
	now := time.Now()
	e, st := s.cache.get(sum, now, authStaleLimit, 0)
	if st != cacheMiss {
		tenant := e.scope.TenantID
		_ = s.stamps.Refresh(ctx, tenant) // on failure the TTLs govern
		if e.stamp != s.stamps.Seen(tenant, maskTenant) {
			scope, t, err := s.lookUp(ctx, sum, tenant)
			if s.down.says(err) {
				// The stamp moved: the tenant's keys or settings changed
				// somewhere, perhaps this key was revoked. A revoked key
				// must stop working on every node at once, so it is not
				// served from the last copy: 503 until Postgres answers
				// (docs/decisions.md "The last good copy").
				return Scope{}, Tenant{}, recordDown(err)
			}
			return scope, t, err
		}
	}
	switch st {
	case cacheFresh:
		return e.scope, e.tenant, nil
	case cacheRefresh:
		tenant := e.scope.TenantID
		s.cache.refreshInBackground(sum, s.down, func(ctx context.Context) error {
			_, _, err := s.lookUp(ctx, sum, tenant)
			if errors.Is(err, ErrNotFound) {
				return nil // lookUp dropped the entry
			}
			return err
		})
		return e.scope, e.tenant, nil
	case cacheExpired:
		scope, t, err := s.lookUp(ctx, sum, e.scope.TenantID)
		if s.down.says(err) {
			// Postgres unreachable, no change stamped since the key was
			// read: the last good copy (invariant 16, lastGoodLimit).
			s.cache.markDown(sum, time.Now())
			return e.scope, e.tenant, nil
		}
		return scope, t, err
	}
	_ = s.stamps.Refresh(ctx, uuid.Nil)
	s.mu.Lock()
	u, seen := s.unknown[sum]
	s.mu.Unlock()
	if seen && now.Before(u.until) && u.keys == s.stamps.Seen(uuid.Nil, maskTenant) {
		return Scope{}, Tenant{}, ErrNotFound
	}
	scope, t, err := s.lookUp(ctx, sum, uuid.Nil)
	if s.down.says(err) {
		return Scope{}, Tenant{}, recordDown(err)
	}
	return scope, t, err
}

// Peek is the scope and tenant this node holds for the key hashed to sum,
// and the tenant's StampTenant they were read under, without reading
// anything (Tenants.Open): KeyScope confirms them after.
func (s *CachedKeys) Peek(sum [32]byte) (Scope, Tenant, uint64, bool) {
	e, ok := s.cache.peek(sum, time.Now(), authStaleLimit)
	return e.scope, e.tenant, e.stamp, ok
}

// recordDown is err, a look-up that found Postgres unreachable, as the 503
// it answers (ErrRecordUnavailable), its cause kept in the error's text.
func recordDown(err error) error { return fmt.Errorf("%w: %w", ErrRecordUnavailable, err) }

// lookUp asks next for the key hashed to sum and caches the answer: its
// scope and tenant, or (unknown key) the refusal. tenant is the key's
// tenant when known (a cached key), whose stamps the caller has read;
// uuid.Nil when the key is new to this node: its tenant's stamps are then
// read after the look-up, and unless no stamp this node had seen moved
// meanwhile (the stamp it then has was read before the look-up), the key
// is looked up once more under them, since a revoke may have come between.
func (s *CachedKeys) lookUp(ctx context.Context, sum [32]byte, tenant uuid.UUID) (Scope, Tenant, error) {
	gen := s.cache.generation()
	keys := s.stamps.Seen(uuid.Nil, maskTenant)
	stamp := s.stamps.Seen(tenant, maskTenant)
	rises := s.stamps.rises()
	now := time.Now()
	scope, t, err := s.next.KeyScope(ctx, sum)
	if err == nil && tenant == uuid.Nil {
		// On failure the stamps stay as seen; the TTL bounds the entry.
		_ = s.stamps.Refresh(ctx, t.ID)
		stamp = s.stamps.Seen(t.ID, maskTenant)
		if s.stamps.rises() != rises {
			scope, t, err = s.next.KeyScope(ctx, sum)
		}
	}
	if errors.Is(err, ErrNotFound) {
		s.cache.delete(sum)
		s.rememberUnknown(sum, now, keys)
		return Scope{}, Tenant{}, ErrNotFound
	}
	if err != nil {
		return Scope{}, Tenant{}, err
	}
	s.cache.put(sum, authEntry{scope: scope, tenant: t, stamp: stamp}, now.Add(s.stamps.TTL(authCacheTTL)), gen, 0)
	return scope, t, nil
}

// rememberUnknown notes that next does not know the key hashed to sum,
// keeping the memory within maxUnknownKeys.
func (s *CachedKeys) rememberUnknown(sum [32]byte, now time.Time, keys uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.unknown) >= maxUnknownKeys {
		for h, u := range s.unknown {
			if !now.Before(u.until) {
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
	s.unknown[sum] = unknownKey{until: now.Add(unknownKeyTTL), keys: keys}
}

// forget drops the cached keys drop picks, then moves tenant's StampTenant
// so every other node looks its keys up afresh before its next request.
func (s *CachedKeys) forget(ctx context.Context, tenant uuid.UUID, drop func(authEntry) bool) {
	s.cache.deleteWhere(func(_ [32]byte, e authEntry) bool { return drop(e) })
	s.stamps.Bump(ctx, tenant, StampTenant)
}

// known forgets that the key hashed to sum was unknown.
func (s *CachedKeys) known(sum [32]byte) {
	s.mu.Lock()
	delete(s.unknown, sum)
	s.mu.Unlock()
}

// ForgettingDirectory decorates dir so that a key it creates is no longer
// remembered as unknown, a key it revokes is no longer trusted, and the
// keys of a tenant it updates are looked up afresh, each once written, by
// this node and (through the stamps) by every node's next request.
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
// even if someone presented it a moment ago, and moves the fleet's key
// stamp so that no other node refuses it from its memory of unknown keys.
func (d *keyForgettingDirectory) CreateAPIKey(ctx context.Context, k APIKey, hash []byte) error {
	err := d.Directory.CreateAPIKey(ctx, k, hash)
	if err == nil {
		if len(hash) == 32 {
			d.keys.known([32]byte(hash))
		}
		d.keys.stamps.Bump(ctx, uuid.Nil, StampTenant)
	}
	return err
}

func (d *keyForgettingDirectory) RevokeAPIKey(ctx context.Context, tenant, key uuid.UUID, at time.Time) error {
	err := d.Directory.RevokeAPIKey(ctx, tenant, key, at)
	if err == nil {
		d.keys.forget(ctx, tenant, func(e authEntry) bool { return e.scope.KeyID == key })
	}
	return err
}

func (d *keyForgettingDirectory) UpdateTenant(ctx context.Context, t Tenant) error {
	err := d.Directory.UpdateTenant(ctx, t)
	if err == nil {
		d.keys.forget(ctx, t.ID, func(e authEntry) bool { return e.scope.TenantID == t.ID })
	}
	return err
}
