package engine

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"math/big"
	"net"
	"net/netip"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// API key prefixes (docs/spec/addendum.md §1): the prefix picks the environment.
const (
	LiveKeyPrefix    = "ck_live_"
	SandboxKeyPrefix = "ck_test_"
	keyRandomChars   = 32
	// MaxTenantNameChars bounds a tenant name (the style of display_name).
	MaxTenantNameChars = 200
	// MaxWebhookURLBytes bounds a webhook URL (what browsers and proxies
	// reliably carry).
	MaxWebhookURLBytes = 2048
	// Default rate limit per API key (docs/spec/addendum.md §10).
	DefaultRateLimitPerSecond = 1000
	DefaultRateLimitBurst     = 2000
)

// Tenants manages tenants, their API keys and configuration, and turns a
// presented key into a Scope.
type Tenants struct {
	dir          Directory
	clock        Clock
	allowPrivate bool
	// resolve looks a webhook host up (net.DefaultResolver; tests swap it).
	resolve func(ctx context.Context, host string) ([]netip.Addr, error)

	// keys turns a key's sha256 into what it authenticates (a CachedKeys
	// in a running creditd).
	keys KeyLookup
	// door and doorStamps open a request's door (WithDoor, door.go).
	door       DoorTrips
	doorStamps *Stamps
}

// NewTenants returns the tenant service; keys nil reads dir afresh on
// every request; allowPrivate lets webhook URLs point at loopback or
// private addresses (dev mode and tests, docs/spec/addendum.md §12).
func NewTenants(dir Directory, keys KeyLookup, clock Clock, allowPrivate bool) *Tenants {
	if keys == nil {
		keys = NewKeyLookup(dir)
	}
	return &Tenants{dir: dir, keys: keys, clock: clock, allowPrivate: allowPrivate,
		resolve: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}}
}

// NewTenantResult is the 201 body of POST /admin/v1/tenants.
type NewTenantResult struct {
	Tenant struct {
		ID        uuid.UUID `json:"id"`
		Name      string    `json:"name"`
		CreatedAt time.Time `json:"created_at"`
	} `json:"tenant"`
	APIKeys struct {
		Live    string `json:"live"`
		Sandbox string `json:"sandbox"`
	} `json:"api_keys"`
}

// Create makes a tenant with one live and one sandbox key. Errors: 422.
func (s *Tenants) Create(ctx context.Context, name string) (NewTenantResult, error) {
	var out NewTenantResult
	if strings.TrimSpace(name) == "" {
		return out, Invalid("name", "name is required")
	}
	if utf8.RuneCountInString(name) > MaxTenantNameChars {
		return out, Invalid("name", "name is longer than 200 characters")
	}
	now := s.clock.Now()
	t := Tenant{
		ID: uuid.Must(uuid.NewV7()), Name: name, DefaultOveragePolicy: OveragePolicyBlock,
		RateLimitPerSecond: DefaultRateLimitPerSecond, RateLimitBurst: DefaultRateLimitBurst,
		CreatedAt: now, UpdatedAt: now,
	}
	if err := s.dir.CreateTenant(ctx, t); err != nil {
		return out, err
	}
	live, err := s.CreateKey(ctx, t.ID, EnvironmentLive)
	if err != nil {
		return out, err
	}
	sandbox, err := s.CreateKey(ctx, t.ID, EnvironmentSandbox)
	if err != nil {
		return out, err
	}
	out.Tenant.ID, out.Tenant.Name, out.Tenant.CreatedAt = t.ID, t.Name, t.CreatedAt
	out.APIKeys.Live, out.APIKeys.Sandbox = live.Key, sandbox.Key
	return out, nil
}

// Get reads a tenant. Errors: 404.
func (s *Tenants) Get(ctx context.Context, id uuid.UUID) (Tenant, error) {
	t, err := s.dir.GetTenant(ctx, id)
	if errors.Is(err, ErrNotFound) {
		return Tenant{}, NotFound("tenant not found")
	}
	return t, err
}

// List pages the tenants in id order (UUIDv7: oldest first) after cursor,
// a tenant id ("" from the start), for the operator. Errors: 400 for a
// cursor that is not a tenant id.
func (s *Tenants) List(ctx context.Context, cursor string, limit int) (Page[TenantConfig], error) {
	after := uuid.Nil
	if cursor != "" {
		id, err := uuid.Parse(cursor)
		if err != nil {
			return Page[TenantConfig]{}, BadRequest("cursor", "cursor is not one this list returned")
		}
		after = id
	}
	// One more than asked says whether another page follows.
	ts, err := s.dir.ListTenants(ctx, after, limit+1)
	if err != nil {
		return Page[TenantConfig]{}, err
	}
	page := Page[TenantConfig]{Data: make([]TenantConfig, 0, min(len(ts), limit))}
	for i, t := range ts {
		if i == limit {
			page.HasMore = true
			page.NextCursor = ts[i-1].ID.String()
			break
		}
		page.Data = append(page.Data, ConfigOf(t))
	}
	return page, nil
}

// Keys lists a tenant's API keys, revoked ones included, oldest first;
// their text is never stored, so it is never shown. Errors: 404.
func (s *Tenants) Keys(ctx context.Context, tenant uuid.UUID) ([]APIKey, error) {
	if _, err := s.Get(ctx, tenant); err != nil {
		return nil, err
	}
	return s.dir.ListAPIKeys(ctx, tenant)
}

// CreateKey issues a key; its plain text is only in the result.
func (s *Tenants) CreateKey(ctx context.Context, tenant uuid.UUID, env Environment) (APIKey, error) {
	if !env.Valid() {
		return APIKey{}, Invalid("environment", "environment must be live or sandbox")
	}
	if _, err := s.Get(ctx, tenant); err != nil {
		return APIKey{}, err
	}
	prefix := LiveKeyPrefix
	if env == EnvironmentSandbox {
		prefix = SandboxKeyPrefix
	}
	plain := prefix + randomBase62(keyRandomChars)
	sum := sha256.Sum256([]byte(plain))
	k := APIKey{ID: uuid.Must(uuid.NewV7()), TenantID: tenant, Environment: env, CreatedAt: s.clock.Now()}
	if err := s.dir.CreateAPIKey(ctx, k, sum[:]); err != nil {
		return APIKey{}, err
	}
	k.Key = plain
	return k, nil
}

// RevokeKey revokes a key; requests with it get 401 from now on.
func (s *Tenants) RevokeKey(ctx context.Context, tenant, key uuid.UUID) error {
	if err := s.dir.RevokeAPIKey(ctx, tenant, key, s.clock.Now()); err != nil {
		if errors.Is(err, ErrNotFound) {
			return NotFound("api key not found")
		}
		return err
	}
	return nil
}

// ErrUnauthenticated: the key is missing, malformed, unknown or revoked.
var ErrUnauthenticated = &Error{Kind: KindUnauthorized, Detail: "missing or invalid API key"}

// Authenticate turns a presented key into its scope and tenant.
func (s *Tenants) Authenticate(ctx context.Context, plain string) (Scope, Tenant, error) {
	if !strings.HasPrefix(plain, LiveKeyPrefix) && !strings.HasPrefix(plain, SandboxKeyPrefix) {
		return Scope{}, Tenant{}, ErrUnauthenticated
	}
	return s.authenticate(ctx, sha256.Sum256([]byte(plain)))
}

// AuthenticateBytes is Authenticate of a key still in the request's
// buffer: the hot path hashes it without copying it to a string.
func (s *Tenants) AuthenticateBytes(ctx context.Context, plain []byte) (Scope, Tenant, error) {
	if !bytes.HasPrefix(plain, []byte(LiveKeyPrefix)) && !bytes.HasPrefix(plain, []byte(SandboxKeyPrefix)) {
		return Scope{}, Tenant{}, ErrUnauthenticated
	}
	return s.authenticate(ctx, sha256.Sum256(plain))
}

func (s *Tenants) authenticate(ctx context.Context, sum [32]byte) (Scope, Tenant, error) {
	scope, t, err := s.keys.KeyScope(ctx, sum)
	if errors.Is(err, ErrNotFound) {
		return Scope{}, Tenant{}, ErrUnauthenticated
	}
	return scope, t, err
}

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

func randomBase62(n int) string {
	out := make([]byte, n)
	max := big.NewInt(int64(len(base62)))
	for i := range out {
		v, err := rand.Int(rand.Reader, max)
		if err != nil {
			panic(err) // crypto/rand never fails on Linux
		}
		out[i] = base62[v.Int64()]
	}
	return string(out)
}
