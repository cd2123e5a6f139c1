package lua

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that Store keeps the HTTP idempotency records.
var _ engine.IdempotencyRecords = (*Store)(nil)

var (
	//go:embed idem_begin.lua
	idemBeginLua    string
	idemBeginScript = redis.NewScript(idemBeginLua)

	//go:embed idem_finish.lua
	idemFinishLua    string
	idemFinishScript = redis.NewScript(idemFinishLua)

	//go:embed idem_abort.lua
	idemAbortLua    string
	idemAbortScript = redis.NewScript(idemAbortLua)
)

// idemRecordKey is the Redis key of tenant's record for the Idempotency-Key
// value key. The value is hashed because it is client text of up to 256
// characters: the hash keeps key names short and free of stray braces that
// would change the hash tag.
func (s *Store) idemRecordKey(tenant uuid.UUID, key string) string {
	sum := sha256.Sum256([]byte(key))
	return s.idemKey(tenant, hex.EncodeToString(sum[:]))
}

// Begin claims key of tenant for a request whose fingerprint is requestHash
// (idem_begin.lua). When no record exists it writes an in-progress one that
// lapses after lockTTL and returns claimed=true; otherwise it returns the
// stored record (Done false while its request is still running) and
// claimed=false. lockTTL must be at least 1 ms.
func (s *Store) Begin(ctx context.Context, tenant uuid.UUID, key, requestHash string, lockTTL time.Duration) (engine.IdemRecord, bool, error) {
	ttlMS, err := idemTTLMillis("lock TTL", lockTTL)
	if err != nil {
		return engine.IdemRecord{}, false, err
	}
	k := s.idemRecordKey(tenant, key)
	res, err := idemBeginScript.Run(ctx, s.rdb, []string{k}, requestHash, ttlMS).Slice()
	if err != nil {
		return engine.IdemRecord{}, false, fmt.Errorf("lua: idempotency begin: %w", err)
	}
	if len(res) == 0 {
		return engine.IdemRecord{}, false, fmt.Errorf("lua: idempotency begin: empty reply")
	}
	if claimed, _ := res[0].(int64); claimed == 1 {
		return engine.IdemRecord{RequestHash: requestHash}, true, nil
	}
	if len(res) != 6 {
		return engine.IdemRecord{}, false, fmt.Errorf("lua: idempotency begin: reply of %d items, want 6", len(res))
	}
	rec := engine.IdemRecord{
		RequestHash: idemString(res[1]),
		Done:        idemString(res[2]) == "1",
		ContentType: idemString(res[4]),
	}
	if st := idemString(res[3]); st != "" {
		rec.Status, err = strconv.Atoi(st)
		if err != nil {
			return engine.IdemRecord{}, false, fmt.Errorf("lua: idempotency begin: bad stored status %q", st)
		}
	}
	if b := idemString(res[5]); b != "" {
		rec.Body = []byte(b)
	}
	return rec, false, nil
}

// Finish stores rec's status, content type and body under key of tenant for
// ttl (24 h), marking the record done (idem_finish.lua). It writes only when
// the record is rec.RequestHash's and in progress, or has lapsed: a record of
// another request, or one already finished (its response was the first), is
// left alone without error. ttl must be at least 1 ms.
func (s *Store) Finish(ctx context.Context, tenant uuid.UUID, key string, rec engine.IdemRecord, ttl time.Duration) error {
	ttlMS, err := idemTTLMillis("TTL", ttl)
	if err != nil {
		return err
	}
	k := s.idemRecordKey(tenant, key)
	err = idemFinishScript.Run(ctx, s.rdb, []string{k},
		rec.RequestHash, rec.Status, rec.ContentType, rec.Body, ttlMS).Err()
	if err != nil {
		return fmt.Errorf("lua: idempotency finish: %w", err)
	}
	return nil
}

// Abort deletes key's record of tenant when it is in progress for
// requestHash (idem_abort.lua), so a retry of a request that changed nothing
// runs afresh; any other record stays.
func (s *Store) Abort(ctx context.Context, tenant uuid.UUID, key, requestHash string) error {
	k := s.idemRecordKey(tenant, key)
	if err := idemAbortScript.Run(ctx, s.rdb, []string{k}, requestHash).Err(); err != nil {
		return fmt.Errorf("lua: idempotency abort: %w", err)
	}
	return nil
}

// idemTTLMillis converts a TTL for PEXPIRE, refusing one under 1 ms, which
// PEXPIRE would turn into an immediate delete (or an error).
func idemTTLMillis(what string, d time.Duration) (int64, error) {
	ms := d.Milliseconds()
	if ms < 1 {
		return 0, fmt.Errorf("lua: idempotency %s %s must be at least 1ms", what, d)
	}
	return ms, nil
}

// idemString reads one bulk item of a script reply; nil (an absent hash
// field) reads as "".
func idemString(v any) string {
	s, _ := v.(string)
	return s
}
