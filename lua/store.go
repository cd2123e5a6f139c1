// Package lua keeps creditd's hot credit state in Redis: one hash per
// customer, changed only by the atomic Lua scripts embedded here, each of
// which appends its Mutation to the customer's outbox partition in the same
// script. It implements engine.BlockStore, engine.Outbox and
// idempotency.Records on a redis.UniversalClient, so the same code runs
// on a single Redis and on Redis Cluster.
package lua

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Partitions is the fixed number of outbox partitions. It is part of every
// key name, so changing it orphans existing state: keep it.
const Partitions = 32

// Store is the Redis implementation of the engine's hot-state ports. It is
// safe for concurrent use.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	clock  engine.Clock
	// unavail classifies transient Redis failures (unavailable.go).
	unavail unavailableHook
	// trips shares round trips among concurrent requests' single
	// commands (coalescer.go).
	trips *coalescer
	// layouts are the account keys last seen with the layout v2 summary:
	// their checks read the summary alone (readpath.go).
	layouts layoutSet
	// acks is the replica acknowledgement of money operations
	// (replicaack.go); nil is off.
	acks *replicaAck
	// funcs is whether the server runs the creditd library (library.go).
	funcs functionsState
	// applied finds operations Postgres holds (applied.go); nil: op keys
	// are the only memory.
	applied engine.AppliedOps
	// tags is each partition's hash tag (tag).
	tags [Partitions]string
	// seen is each partition's filter keys of the latest period asked
	// (seenKeys).
	seen [Partitions]atomic.Pointer[seenSet]
	// usageTags is each usage slot's hash tag (usageTag); usageSeen its
	// usage filter keys of the latest period asked (usageSeenKeys).
	usageTags [UsageSlots]string
	usageSeen [UsageSlots]atomic.Pointer[seenSet]
	// notes counts this node's reservation notices (appendNoteArgs).
	notes atomic.Uint64
	// refs are the reservation index records this node wrote
	// (reservation_refs.go).
	refs reservationRefs
}

// NewStore returns a Store on rdb whose keys all start with "{prefix:". Its
// clock (for what a rebuild restores) is the system clock until WithClock.
// It installs on rdb (once per client) a hook that makes transient Redis
// failures match engine.ErrUnavailable and refreshes a cluster's slot map
// after them (unavailable.go).
func NewStore(rdb redis.UniversalClient, prefix string) *Store {
	s := &Store{rdb: rdb, prefix: prefix, clock: engine.SystemClock{}, unavail: withUnavailable(rdb), trips: &coalescer{rdb: rdb}}
	for p := range s.tags {
		s.tags[p] = fmt.Sprintf("{%s:p%02d}", prefix, p)
	}
	for n := range s.usageTags {
		s.usageTags[n] = fmt.Sprintf("{%s:u:%02d}", prefix, n)
	}
	return s
}

// WithClock makes Load read c (invariant 6: one injectable clock).
func (s *Store) WithClock(c engine.Clock) *Store {
	s.clock = c
	return s
}

// Partition is the outbox partition of a customer.
func Partition(customer uuid.UUID) int {
	var id [36]byte
	hexUUID(id[:], customer)
	return partitionOf(&id)
}

// partitionOf is the partition of a customer id's canonical text: FNV-1a
// of it, computed without hash/fnv's allocations (the check path builds a
// key per request).
func partitionOf(id *[36]byte) int {
	h := uint32(2166136261)
	for _, ch := range id {
		h = (h ^ uint32(ch)) * 16777619
	}
	return int(h % Partitions)
}

// Partitions reports the fixed partition count.
func (s *Store) Partitions() int { return Partitions }

// tag is the hash tag shared by every key of partition p: formatted once
// per Store (NewStore), since a money call builds several keys from it.
func (s *Store) tag(p int) string { return s.tags[p] }

// PartitionTag is the hash tag of partition p's keys: on a Redis Cluster
// it names the slot, so the master, that serves the partition (the
// readiness check pings the masters of every partition).
func (s *Store) PartitionTag(p int) string { return s.tag(p) }

// accountKey is the customer's hash of account fields and blocks
// ("{prefix:pNN}:a:<id>", as tag builds the tag), built without fmt: the
// check path calls it once per request.
func (s *Store) accountKey(c uuid.UUID) string {
	var id [36]byte
	hexUUID(id[:], c)
	p := partitionOf(&id)
	var buf [128]byte
	b := append(buf[:0], '{')
	b = append(b, s.prefix...)
	b = append(b, ":p"...)
	if p < 10 {
		b = append(b, '0')
	}
	b = strconv.AppendInt(b, int64(p), 10)
	b = append(b, "}:a:"...)
	b = append(b, id[:]...)
	return string(b)
}

// opKey remembers what an idempotency key did for one customer.
func (s *Store) opKey(c uuid.UUID, idemHash string) string {
	var id [36]byte
	hexUUID(id[:], c)
	// One allocation: the money path builds this key per request.
	var buf [192]byte
	b := append(buf[:0], s.tag(partitionOf(&id))...)
	b = append(b, ":op:"...)
	b = append(b, id[:]...)
	b = append(b, ':')
	b = append(b, idemHash...)
	return string(b)
}

// outboxKey is partition p's stream.
func (s *Store) outboxKey(p int) string { return s.tag(p) + ":outbox" }

// legacyExpiryKey is partition p's customer -> next expiry zset, which
// creditd no longer keeps (the sweep asks Postgres, engine.ExpiryIndex).
func (s *Store) legacyExpiryKey(p int) string { return s.tag(p) + ":exp" }

// DropLegacyExpiryIndex deletes the partitions' expiry zsets an earlier
// creditd kept (a member per customer with an expiring block), freeing
// their memory; serve calls it once at start. UNLINK frees in the
// background, and a key already gone costs nothing.
func (s *Store) DropLegacyExpiryIndex(ctx context.Context) error {
	for p := 0; p < Partitions; p++ {
		if err := s.rdb.Unlink(ctx, s.legacyExpiryKey(p)).Err(); err != nil {
			return fmt.Errorf("lua: drop the legacy expiry index: %w", err)
		}
	}
	return nil
}

// reservationExpiryKey is partition p's zset of active reservations by expires_at (ms);
// members are "tenant|env|customer|reservation id".
func (s *Store) reservationExpiryKey(p int) string { return s.tag(p) + ":rexp" }

// reservationIndexKey maps a reservation id to its customer. It lives
// outside the customer's slot (the id alone must find it), spread over 256
// tags by the id's first byte; a script never touches it.
func (s *Store) reservationIndexKey(id uuid.UUID) string {
	return "{" + s.prefix + ":rx:" + hex.EncodeToString(id[:1]) + "}:" + id.String()
}

// reservationRecordKey maps a reservation id to its customer and its metric
// or items (reservationRecord), in reservationIndexKey's slot so one MGET reads
// both: a record of reservationIndexKey alone is an older version's.
func (s *Store) reservationRecordKey(id uuid.UUID) string {
	return "{" + s.prefix + ":rx:" + hex.EncodeToString(id[:1]) + "}:h:" + id.String()
}

// tenantTag is the hash tag of tenant's own keys (rate budgets, delivery
// slots): one Cluster slot per tenant.
func (s *Store) tenantTag(tenant uuid.UUID) string {
	return s.tenantKey(tenant, "")
}

// tenantKey is tenant's tag followed by suffix, built with one
// allocation (the money path builds several per request).
func (s *Store) tenantKey(tenant uuid.UUID, suffix string) string {
	var buf [192]byte
	b := append(buf[:0], '{')
	b = append(b, s.prefix...)
	b = append(b, ":t:"...)
	b = appendUUID(b, tenant)
	b = append(b, '}')
	b = append(b, suffix...)
	return string(b)
}

// appendUUID appends u's canonical text to b.
func appendUUID(b []byte, u uuid.UUID) []byte {
	var id [36]byte
	hexUUID(id[:], u)
	return append(b, id[:]...)
}
