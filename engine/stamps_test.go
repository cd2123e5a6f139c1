package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// memStamps is a ChangeStamps in memory, shared by the nodes of a test as
// Redis is by a fleet; fail makes every call fail (Redis unreachable).
type memStamps struct {
	mu    sync.Mutex
	m     map[uuid.UUID]TenantStamps
	fail  error
	reads int
}

func (s *memStamps) StampsRead(_ context.Context, tenant uuid.UUID) (TenantStamps, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads++
	if s.fail != nil {
		return TenantStamps{}, s.fail
	}
	return s.m[tenant], nil
}

func (s *memStamps) StampBump(_ context.Context, tenant uuid.UUID, kind StampKind) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, s.fail
	}
	v := s.m[tenant]
	v[kind]++
	s.m[tenant] = v
	return v[kind], nil
}

// keyNode is one node's key cache and forgetting directory over a shared
// directory and shared stamps.
type keyNode struct {
	keys *CachedKeys
	dir  Directory
}

func newKeyNode(dir Directory, store ChangeStamps) keyNode {
	keys := NewCachedKeys(NewKeyLookup(dir)).WithStamps(NewStamps(store, zerolog.Nop()))
	return keyNode{keys: keys, dir: keys.ForgettingDirectory(dir)}
}

// TestStampsKeysAcrossNodes guards invariant 15 for keys and tenant
// settings: a key revoked, a tenant's settings changed or a key created on
// node A governs node B's very next look-up, though B had cached the key
// (or its absence) a moment before; with no change B asks Postgres
// nothing; with the stamps unreachable B serves what it cached (the TTLs
// then bound it).
func TestStampsKeysAcrossNodes(t *testing.T) {
	ctx := context.Background()
	tenant := Tenant{ID: uuid.New(), Name: "acme", DefaultOveragePolicy: OveragePolicyBlock}
	plain := []byte("ck_live_" + "01234567890123456789012345678901")
	sum := sha256.Sum256(plain)
	key := APIKey{ID: uuid.New(), TenantID: tenant.ID, Environment: EnvironmentLive}
	notify := OveragePolicyNotify
	tests := []struct {
		name        string
		known       bool
		unreachable bool
		write       func(d Directory) error
		wantErr     error
		wantPolicy  OveragePolicy
		wantLookups int // B's look-ups after its first
	}{
		{"no write", true, false, func(Directory) error { return nil }, nil, OveragePolicyBlock, 0},
		{"revoked on A", true, false, func(d Directory) error { return d.RevokeAPIKey(ctx, tenant.ID, key.ID, time.Now()) }, ErrNotFound, "", 1},
		{"overage policy set on A", true, false, func(d Directory) error {
			changed := tenant
			changed.DefaultOveragePolicy = notify
			return d.UpdateTenant(ctx, changed)
		}, nil, notify, 1},
		{"created on A after B found it unknown", false, false, func(d Directory) error { return d.CreateAPIKey(ctx, key, sum[:]) }, nil, OveragePolicyBlock, 1},
		{"revoked on A, stamps unreachable", true, true, func(d Directory) error { return d.RevokeAPIKey(ctx, tenant.ID, key.ID, time.Now()) }, nil, OveragePolicyBlock, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := &keyDirectory{tenant: tenant, keys: map[[32]byte]APIKey{}}
			if tc.known {
				dir.keys[sum] = key
			}
			store := &memStamps{m: map[uuid.UUID]TenantStamps{}}
			a, b := newKeyNode(dir, store), newKeyNode(dir, store)
			b.keys.KeyScope(ctx, sum)
			first := dir.lookups
			if tc.unreachable {
				store.fail = errors.New("redis: connection refused")
			}
			if err := tc.write(a.dir); err != nil {
				t.Fatal(err)
			}
			before := dir.lookups
			_, got, err := b.keys.KeyScope(ctx, sum)
			if !errors.Is(err, tc.wantErr) || (err == nil) != (tc.wantErr == nil) || got.DefaultOveragePolicy != tc.wantPolicy {
				t.Errorf("B answered %q, %v; want %q, %v", got.DefaultOveragePolicy, err, tc.wantPolicy, tc.wantErr)
			}
			if n := dir.lookups - before; n != tc.wantLookups {
				t.Errorf("B's next look-up read the directory %d times, want %d (first: %d)", n, tc.wantLookups, first)
			}
		})
	}
}

// TestStampsCatalogAcrossNodes guards invariant 15 for metering rules and
// metrics: a rule or metric written through node A's cache is read afresh
// by node B's next look-up once B has read the stamps (as every request
// does when it authenticates), and only then.
func TestStampsCatalogAcrossNodes(t *testing.T) {
	ctx := context.Background()
	scope := Scope{TenantID: uuid.New(), Environment: EnvironmentLive}
	unitCost := func(n int64) MeteringRule {
		return MeteringRule{TenantID: scope.TenantID, Environment: scope.Environment, BillableMetricKey: "tokens", UnitCost: n}
	}
	tests := []struct {
		name      string
		write     func(c *CachedCatalog) error
		wantCost  int64
		wantReads int
	}{
		{"no write", func(*CachedCatalog) error { return nil }, 5, 0},
		{"rule changed on A", func(c *CachedCatalog) error { return c.CreateRule(ctx, unitCost(9), BillableMetric{}) }, 9, 1},
		{"metric changed on A", func(c *CachedCatalog) error {
			return c.UpdateMetric(ctx, BillableMetric{TenantID: scope.TenantID, Environment: scope.Environment, Key: "other"})
		}, 5, 1}, // one stamp for the catalog: the rule is read again too
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			store := &memStamps{m: map[uuid.UUID]TenantStamps{}}
			db := &countingCatalog{metrics: map[string]BillableMetric{}, rules: map[string]MeteringRule{"tokens": unitCost(5)}}
			stampsB := NewStamps(store, zerolog.Nop())
			a := NewCachedCatalog(db).WithStamps(NewStamps(store, zerolog.Nop()))
			b := NewCachedCatalog(db).WithStamps(stampsB)
			if _, _, err := b.Rule(ctx, scope, "tokens"); err != nil {
				t.Fatal(err)
			}
			if err := tc.write(a); err != nil {
				t.Fatal(err)
			}
			before := db.reads
			if err := stampsB.Refresh(ctx, scope.TenantID); err != nil {
				t.Fatal(err)
			}
			r, ok, err := b.Rule(ctx, scope, "tokens")
			if err != nil || !ok || r.UnitCost != tc.wantCost {
				t.Errorf("B's rule costs %d (%v, %v), want %d", r.UnitCost, ok, err, tc.wantCost)
			}
			if n := db.reads - before; n != tc.wantReads {
				t.Errorf("B read Postgres %d times, want %d", n, tc.wantReads)
			}
		})
	}
}

// TestStampsSeenOnlyGrows: an answer read before a bump that arrives after
// it cannot take a node's view back, and a kind outside the mask leaves
// the sum alone.
func TestStampsSeenOnlyGrows(t *testing.T) {
	tenant := uuid.New()
	s := NewStamps(&memStamps{m: map[uuid.UUID]TenantStamps{}}, zerolog.Nop())
	s.observe(tenant, TenantStamps{StampTenant: 5, StampCatalog: 9})
	s.observe(tenant, TenantStamps{StampTenant: 4, StampCatalog: 9})
	for _, tc := range []struct {
		mask stampMask
		want uint64
	}{
		{maskTenant, 5},
		{maskCatalog, 9},
		{maskOf(StampTenant, StampCatalog), 14},
		{maskCustomers, 0},
	} {
		if got := s.Seen(tenant, tc.mask); got != tc.want {
			t.Errorf("Seen(%b) = %d, want %d", tc.mask, got, tc.want)
		}
	}
	var alone *Stamps
	if alone.Seen(tenant, maskTenant) != 0 || alone.Refresh(context.Background(), tenant) != nil {
		t.Error("a nil Stamps is not a node alone")
	}
	alone.Bump(context.Background(), tenant, StampTenant)
}

// hookedKeys is a keyDirectory that runs hook once, during its first key
// look-up, after reading the key: a write racing the look-up.
type hookedKeys struct {
	*keyDirectory
	hook func()
}

func (d *hookedKeys) APIKeyByHash(ctx context.Context, hash []byte) (APIKey, error) {
	k, err := d.keyDirectory.APIKeyByHash(ctx, hash)
	if h := d.hook; h != nil {
		d.hook = nil
		h()
	}
	return k, err
}

// TestStampsKeyRevokedDuringFirstLookUp guards invariant 15 at a node's
// first sight of a key: a revoke that commits on node A while node B reads
// the key (B read it live, then A revoked it and moved the stamp) must not
// leave B trusting the key under the stamp A moved. B sees the stamp moved
// across its read and reads the key again.
func TestStampsKeyRevokedDuringFirstLookUp(t *testing.T) {
	ctx := context.Background()
	tenant := Tenant{ID: uuid.New(), Name: "acme"}
	sum := sha256.Sum256([]byte("ck_live_" + "01234567890123456789012345678901"))
	key := APIKey{ID: uuid.New(), TenantID: tenant.ID, Environment: EnvironmentLive}
	dir := &keyDirectory{tenant: tenant, keys: map[[32]byte]APIKey{sum: key}}
	store := &memStamps{m: map[uuid.UUID]TenantStamps{}}
	a := newKeyNode(dir, store)
	hooked := &hookedKeys{keyDirectory: dir}
	b := newKeyNode(hooked, store)
	hooked.hook = func() {
		if err := a.dir.RevokeAPIKey(ctx, tenant.ID, key.ID, time.Now()); err != nil {
			t.Error(err)
		}
	}
	_, _, _ = b.keys.KeyScope(ctx, sum) // races the revoke: either answer is fair
	if _, _, err := b.keys.KeyScope(ctx, sum); !errors.Is(err, ErrNotFound) {
		t.Errorf("B's next look-up after the revoke: %v, want ErrNotFound", err)
	}
}

// TestStampsPostgresDown guards invariant 16 under the stamps: when a
// stamp moved but Postgres cannot be read, a node serves the copy it had,
// as its TTLs allowed before, rather than failing the request; a row that
// is gone is not served.
func TestStampsPostgresDown(t *testing.T) {
	ctx := context.Background()
	scope := Scope{TenantID: uuid.New(), Environment: EnvironmentLive}
	for _, tc := range []struct {
		name      string
		fail      error
		wantFound bool
		wantErr   bool
	}{
		{"Postgres unreachable", errors.New("connection refused"), true, false},
		{"Postgres answers", nil, false, false}, // the metric was removed from the fake
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &memStamps{m: map[uuid.UUID]TenantStamps{}}
			db := &countingCatalog{metrics: map[string]BillableMetric{"seats": {Key: "seats"}}, rules: map[string]MeteringRule{}}
			stampsB := NewStamps(store, zerolog.Nop())
			b := NewCachedCatalog(db).WithStamps(stampsB)
			if _, ok, err := b.Metric(ctx, scope, "seats"); !ok || err != nil {
				t.Fatalf("warm: %v %v", ok, err)
			}
			NewStamps(store, zerolog.Nop()).Bump(ctx, scope.TenantID, StampCatalog)
			delete(db.metrics, "seats")
			db.fail = tc.fail
			if err := stampsB.Refresh(ctx, scope.TenantID); err != nil {
				t.Fatal(err)
			}
			_, ok, err := b.Metric(ctx, scope, "seats")
			if ok != tc.wantFound || (err != nil) != tc.wantErr {
				t.Errorf("found %v, err %v; want found %v", ok, err, tc.wantFound)
			}
		})
	}
}
