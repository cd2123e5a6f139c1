package engine

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// keylessDirectory knows no API key and counts the look-ups.
type keylessDirectory struct {
	Directory
	lookups atomic.Int64
}

func (d *keylessDirectory) APIKeyByHash(context.Context, []byte) (APIKey, error) {
	d.lookups.Add(1)
	return APIKey{}, ErrNotFound
}

// TestUnknownKeyCache: an unknown key is looked up once per unknownKeyTTL;
// an expired entry is looked up again; a flood of distinct keys keeps the
// cache within maxUnknownKeys; badly prefixed keys never reach the directory.
func TestUnknownKeyCache(t *testing.T) {
	t.Parallel()
	dir := &keylessDirectory{}
	keys := NewCachedKeys(NewKeyLookup(dir))
	s := NewTenants(keys.ForgettingDirectory(dir), keys, fixedClock{time.Now()}, false)
	ctx := context.Background()
	key := "ck_live_" + fmt.Sprintf("%032d", 7)
	for i := 0; i < 20; i++ {
		if _, _, err := s.Authenticate(ctx, key); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("unknown key: %v", err)
		}
	}
	if n := dir.lookups.Load(); n != 1 {
		t.Fatalf("20 tries of one unknown key made %d look-ups, want 1", n)
	}
	// An answer older than the TTL is asked again.
	keys.rememberUnknown(sha256.Sum256([]byte(key)), time.Now().Add(-2*unknownKeyTTL), 0)
	if _, _, err := s.Authenticate(ctx, key); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("expired unknown key: %v", err)
	}
	if n := dir.lookups.Load(); n != 2 {
		t.Fatalf("after expiry: %d look-ups, want 2", n)
	}
	if _, _, err := s.Authenticate(ctx, "nope_"+key); !errors.Is(err, ErrUnauthenticated) || dir.lookups.Load() != 2 {
		t.Fatalf("badly prefixed key: %v, look-ups %d", err, dir.lookups.Load())
	}
	for i := 0; i < maxUnknownKeys+2_000; i++ {
		_, _, _ = s.Authenticate(ctx, "ck_test_"+fmt.Sprintf("%032d", i))
	}
	keys.mu.Lock()
	n := len(keys.unknown)
	keys.mu.Unlock()
	if n > maxUnknownKeys || n < maxUnknownKeys/2 {
		t.Fatalf("unknown-key cache holds %d after a flood, want at most %d (and most of it)", n, maxUnknownKeys)
	}
}

// TestTenantFieldLimits: a tenant name past its limit is a 422 naming the
// field, checked before any store call.
func TestTenantFieldLimits(t *testing.T) {
	t.Parallel()
	s := NewTenants(&keylessDirectory{}, nil, fixedClock{time.Now()}, true)
	ctx := context.Background()
	if _, err := s.Create(ctx, strings.Repeat("é", MaxTenantNameChars+1)); !errors.Is(err, &Error{Kind: KindValidation, Field: "name"}) {
		t.Fatalf("201-character name: %v", err)
	}
}
