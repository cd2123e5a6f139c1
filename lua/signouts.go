package lua

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Console sign-outs (console.SignOuts): one key per revoked session,
// living until the session would have expired, so a copy of its cookie is
// refused by every node. The session id is hashed into the key name; like
// the HTTP idempotency records, the key has no hash tag and spreads over
// the slots.
func (s *Store) signOutKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return "{" + s.prefix + ":so:" + base64.RawURLEncoding.EncodeToString(sum[:12])
}

// SignOut revokes session id until until (a past until revokes nothing:
// the session has expired anyway).
func (s *Store) SignOut(ctx context.Context, id string, until time.Time) error {
	ttl := time.Until(until)
	if ttl < time.Millisecond {
		return nil
	}
	if err := s.rdb.Set(ctx, s.signOutKey(id), "1", ttl).Err(); err != nil {
		return fmt.Errorf("lua: sign out: %w", s.unavail.classify(err))
	}
	return nil
}

// SignedOut reports whether session id was revoked.
func (s *Store) SignedOut(ctx context.Context, id string) (bool, error) {
	err := s.rdb.Get(ctx, s.signOutKey(id)).Err()
	switch {
	case errors.Is(err, redis.Nil):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("lua: signed out: %w", s.unavail.classify(err))
	}
	return true, nil
}
