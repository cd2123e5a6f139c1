package lua

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine/idempotency"
)

// Compile-time check that Store keeps the HTTP idempotency records.
var _ idempotency.Records = (*Store)(nil)

var (
	//go:embed idem_finish.lua
	idemFinishLua    string
	idemFinishScript = redis.NewScript(idemFinishLua)

	//go:embed idem_abort.lua
	idemAbortLua    string
	idemAbortScript = redis.NewScript(idemAbortLua)
)

// An HTTP idempotency record is one Redis string, written with plain
// commands on the usual path (a claim is one SET NX GET, a finish one SET):
//
//	byte 0       state: idemRunning, idemRerun or idemDone
//	bytes 1..11  fingerprint: sha256(tenant, request hash), first 11 bytes
//	idemDone only:
//	bytes 12..13 HTTP status, big endian
//	byte 14      content type: 'j' JSON, 'p' problem JSON, 'n' none, or
//	             'x' followed by one length byte and the type's text
//	the rest     the body
//
// A claim or a rerun record is 12 bytes under a 22-byte key (prefix "cd"):
// Redis's MEMORY USAGE is 88 bytes, the smallest allocation classes of
// both key and value (a key up to 30 bytes and a value up to 12 share them;
// so any prefix of up to 10 characters keeps a record at 88 bytes).
const (
	idemRunning = 'p'
	idemRerun   = 'r'
	idemDone    = 'd'

	idemFingerprintLen = 11
	idemHeadLen        = 1 + idemFingerprintLen
	// idemKeyHashLen bytes of sha256(tenant, key) name the record: 96 bits,
	// so two live keys of a day at 1,000/s share a name with odds ~1e-13.
	idemKeyHashLen = 12
)

// idemRecordKey is the Redis key of tenant's record for the Idempotency-Key
// value key: "{prefix:i:" and 16 base64url characters of a hash of the
// tenant and the key (the key is client text of up to 256 characters), a
// fixed 14 bytes beside the prefix. It has no closing brace, so no hash
// tag: records spread over every slot (only single-key commands and
// one-key scripts touch a record). The opening brace keeps the record in
// the prefix's "{prefix:*" SCAN that test and bench clean-ups use.
func (s *Store) idemRecordKey(tenant uuid.UUID, key string) string {
	h := sha256.New()
	h.Write(tenant[:])
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	var name [16]byte // base64 of idemKeyHashLen bytes
	base64.RawURLEncoding.Encode(name[:], h.Sum(sum[:0])[:idemKeyHashLen])
	return "{" + s.prefix + ":i:" + string(name[:])
}

// idemHead is the first 12 bytes of tenant's record for requestHash in
// state: the tenant is hashed in so that two tenants whose keys share a
// record name can only ever see a mismatch, never each other's answer.
func idemHead(state byte, tenant uuid.UUID, requestHash string) []byte {
	h := sha256.New()
	h.Write(tenant[:])
	h.Write([]byte(requestHash))
	var sum [sha256.Size]byte
	out := make([]byte, idemHeadLen, idemHeadLen+3)
	out[0] = state
	copy(out[1:], h.Sum(sum[:0]))
	return out
}

// Begin claims key of tenant for a request whose fingerprint is requestHash
// with one SET NX GET PX (Redis >= 7.0; sharing a round trip with concurrent
// requests' commands, coalescer): when no record exists it writes an
// in-progress one that lapses after lockTTL and returns claimed=true;
// otherwise it returns the stored record and claimed=false. lockTTL must be
// at least 1 ms.
func (s *Store) Begin(ctx context.Context, tenant uuid.UUID, key, requestHash string, lockTTL time.Duration) (idempotency.Record, bool, error) {
	claim, head, err := s.claimCmd(ctx, tenant, key, requestHash, lockTTL)
	if err != nil {
		return idempotency.Record{}, false, err
	}
	if err := s.trips.do(ctx, claim); err != nil && !errors.Is(err, redis.Nil) {
		return idempotency.Record{}, false, fmt.Errorf("lua: idempotency begin: %w", err)
	}
	return claimReply(claim, head)
}

// claimCmd is Begin's SET NX GET PX and the in-progress record it writes
// (Begin, DoorTrip).
func (s *Store) claimCmd(ctx context.Context, tenant uuid.UUID, key, requestHash string, lockTTL time.Duration) (*redis.StringCmd, []byte, error) {
	ttlMS, err := idemTTLMillis("lock TTL", lockTTL)
	if err != nil {
		return nil, nil, err
	}
	head := idemHead(idemRunning, tenant, requestHash)
	return redis.NewStringCmd(ctx, "set", s.idemRecordKey(tenant, key), head, "nx", "get", "px", ttlMS), head, nil
}

// claimReply reads an answered claimCmd: claimed when no record was there.
func claimReply(claim *redis.StringCmd, head []byte) (idempotency.Record, bool, error) {
	err := claim.Err()
	if errors.Is(err, redis.Nil) {
		return idempotency.Record{}, true, nil
	}
	if err != nil {
		return idempotency.Record{}, false, fmt.Errorf("lua: idempotency begin: %w", err)
	}
	return decodeIdemRecord(claim.Val(), head)
}

// decodeIdemRecord reads a stored record; head is the caller's in-progress
// record, whose fingerprint tells a mismatch.
func decodeIdemRecord(v string, head []byte) (idempotency.Record, bool, error) {
	if len(v) < idemHeadLen {
		return idempotency.Record{}, false, fmt.Errorf("lua: idempotency begin: record of %d bytes", len(v))
	}
	rec := idempotency.Record{Mismatch: v[1:idemHeadLen] != string(head[1:])}
	switch v[0] {
	case idemRunning:
		return rec, false, nil
	case idemRerun:
		rec.Done, rec.Rerun = true, true
		return rec, false, nil
	case idemDone:
	default:
		return idempotency.Record{}, false, fmt.Errorf("lua: idempotency begin: record state %q", v[0])
	}
	rest := v[idemHeadLen:]
	if len(rest) < 3 {
		return idempotency.Record{}, false, fmt.Errorf("lua: idempotency begin: finished record of %d bytes", len(v))
	}
	rec.Done, rec.Status = true, int(rest[0])<<8|int(rest[1])
	ct := rest[2]
	rest = rest[3:]
	switch ct {
	case 'j':
		rec.ContentType = "application/json"
	case 'p':
		rec.ContentType = "application/problem+json"
	case 'n':
	case 'x':
		if len(rest) < 1 || len(rest) < 1+int(rest[0]) {
			return idempotency.Record{}, false, fmt.Errorf("lua: idempotency begin: cut content type")
		}
		n := int(rest[0])
		rec.ContentType, rest = rest[1:1+n], rest[1+n:]
	default:
		return idempotency.Record{}, false, fmt.Errorf("lua: idempotency begin: content type code %q", ct)
	}
	if rest != "" {
		rec.Body = []byte(rest)
	}
	return rec, false, nil
}

// encodeIdemRecord is rec finished for requestHash of tenant.
func encodeIdemRecord(tenant uuid.UUID, requestHash string, rec idempotency.Record) ([]byte, error) {
	if rec.Rerun {
		return idemHead(idemRerun, tenant, requestHash), nil
	}
	if rec.Status < 100 || rec.Status > 999 {
		return nil, fmt.Errorf("lua: idempotency finish: status %d", rec.Status)
	}
	out := idemHead(idemDone, tenant, requestHash)
	out = append(out, byte(rec.Status>>8), byte(rec.Status))
	switch rec.ContentType {
	case "application/json":
		out = append(out, 'j')
	case "application/problem+json":
		out = append(out, 'p')
	case "":
		out = append(out, 'n')
	default:
		if len(rec.ContentType) > 255 {
			return nil, fmt.Errorf("lua: idempotency finish: content type of %d bytes", len(rec.ContentType))
		}
		out = append(append(out, 'x', byte(len(rec.ContentType))), rec.ContentType...)
	}
	return append(out, rec.Body...), nil
}

// Finish stores rec as requestHash's final answer under key of tenant for
// ttl (24 h). With held (the caller's claim certainly still stands) it is
// one plain SET PX; otherwise idem_finish.lua writes only when the record
// is requestHash's and in progress, or has lapsed: a record of another
// request, or one already finished (its answer was the first), is left
// alone without error. ttl must be at least 1 ms.
func (s *Store) Finish(ctx context.Context, tenant uuid.UUID, key, requestHash string, rec idempotency.Record, ttl time.Duration, held bool) error {
	ttlMS, err := idemTTLMillis("TTL", ttl)
	if err != nil {
		return err
	}
	v, err := encodeIdemRecord(tenant, requestHash, rec)
	if err != nil {
		return err
	}
	k := s.idemRecordKey(tenant, key)
	if held {
		err = s.rdb.Do(ctx, "SET", k, v, "PX", ttlMS).Err()
	} else {
		err = idemFinishScript.Run(ctx, s.rdb, []string{k}, v, ttlMS).Err()
	}
	if err != nil {
		return fmt.Errorf("lua: idempotency finish: %w", err)
	}
	return nil
}

// MarkRerun finishes marks with the rerun mark for ttl
// (idempotency.Records): the held ones as plain SETs in one pipeline
// (one round trip per node however many marks), the others one by one
// through Finish's checked write.
func (s *Store) MarkRerun(ctx context.Context, marks []idempotency.RerunMark, ttl time.Duration) error {
	ttlMS, err := idemTTLMillis("TTL", ttl)
	if err != nil {
		return err
	}
	var first error
	pipe := s.rdb.Pipeline()
	for _, m := range marks {
		if !m.Held {
			if err := s.Finish(ctx, m.Tenant, m.Key, m.RequestHash, idempotency.Record{Rerun: true}, ttl, false); err != nil && first == nil {
				first = err
			}
			continue
		}
		pipe.Do(ctx, "SET", s.idemRecordKey(m.Tenant, m.Key), idemHead(idemRerun, m.Tenant, m.RequestHash), "PX", ttlMS)
	}
	if pipe.Len() > 0 {
		if _, err := pipe.Exec(ctx); err != nil && first == nil {
			first = fmt.Errorf("lua: idempotency marks: %w", err)
		}
	}
	return first
}

// Abort deletes key's record of tenant when it is in progress for
// requestHash (idem_abort.lua), so a retry of a request that changed nothing
// runs afresh; any other record stays.
func (s *Store) Abort(ctx context.Context, tenant uuid.UUID, key, requestHash string) error {
	k := s.idemRecordKey(tenant, key)
	if err := idemAbortScript.Run(ctx, s.rdb, []string{k}, idemHead(idemRunning, tenant, requestHash)).Err(); err != nil {
		return fmt.Errorf("lua: idempotency abort: %w", err)
	}
	return nil
}

// idemTTLMillis converts a TTL for PX, refusing one under 1 ms, which Redis
// would refuse (or turn into an immediate expiry).
func idemTTLMillis(what string, d time.Duration) (int64, error) {
	ms := d.Milliseconds()
	if ms < 1 {
		return 0, fmt.Errorf("lua: idempotency %s %s must be at least 1ms", what, d)
	}
	return ms, nil
}
