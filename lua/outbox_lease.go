package lua

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that Store hands out the outbox partitions.
var _ engine.OutboxLeases = (*Store)(nil)

var (
	//go:embed outbox_lease.lua
	outboxLeaseLua    string
	outboxLeaseScript = redis.NewScript(outboxLeaseLua)
	//go:embed outbox_members.lua
	outboxMembersLua    string
	outboxMembersScript = redis.NewScript(outboxMembersLua)
)

// outboxLeaseKey is partition p's lease, under the partition's hash tag.
func (s *Store) outboxLeaseKey(p int) string { return s.tag(p) + ":owner" }

// outboxLeaseTokenKey is partition p's last fencing token.
func (s *Store) outboxLeaseTokenKey(p int) string { return s.tag(p) + ":owner:n" }

// outboxMembersKey is the live persisters, under a hash tag of its own.
func (s *Store) outboxMembersKey() string { return "{" + s.prefix + ":persisters}" }

// TakePartition makes consumer the owner of partition p for ttl when no
// other consumer holds it (outbox_lease.lua) and returns the new fencing
// token; ok is false when another consumer owns p.
func (s *Store) TakePartition(ctx context.Context, p int, consumer string, ttl time.Duration) (int64, bool, error) {
	n, err := s.outboxLease(ctx, p, "take", consumer, 0, ttl)
	return n, n > 0, err
}

// RenewPartition extends consumer's lease of p taken with token to ttl.
func (s *Store) RenewPartition(ctx context.Context, p int, consumer string, token int64, ttl time.Duration) (bool, error) {
	n, err := s.outboxLease(ctx, p, "renew", consumer, token, ttl)
	return n == 1, err
}

// ReleasePartition ends consumer's lease of p taken with token.
func (s *Store) ReleasePartition(ctx context.Context, p int, consumer string, token int64) error {
	_, err := s.outboxLease(ctx, p, "release", consumer, token, time.Millisecond)
	return err
}

func (s *Store) outboxLease(ctx context.Context, p int, mode, consumer string, token int64, ttl time.Duration) (int64, error) {
	if err := s.checkOutboxPartition(p); err != nil {
		return 0, err
	}
	if ttl < time.Millisecond {
		return 0, fmt.Errorf("lua: outbox lease of partition %d: ttl %s below 1ms", p, ttl)
	}
	n, err := outboxLeaseScript.Run(ctx, s.rdb, []string{s.outboxLeaseKey(p), s.outboxLeaseTokenKey(p)},
		mode, consumer, token, ttl.Milliseconds()).Int64()
	if err != nil {
		return 0, fmt.Errorf("lua: outbox lease %s of partition %d: %w", mode, p, err)
	}
	return n, nil
}

// PartitionOwners reads every partition's lease in one pipeline (one
// round trip per node on a Cluster) and returns each owner, "" for none.
// A lease that cannot be read (its Cluster node is down) is reported as ""
// too: a take of it fails on its own, while the other partitions are
// still handed out; an error only when none could be read.
func (s *Store) PartitionOwners(ctx context.Context) ([]string, error) {
	cmds := make([]*redis.StringCmd, Partitions)
	_, err := s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for p := range cmds {
			cmds[p] = pipe.Get(ctx, s.outboxLeaseKey(p))
		}
		return nil
	})
	if err == nil || errors.Is(err, redis.Nil) {
		err = nil
	}
	owners := make([]string, Partitions)
	read := 0
	for p, c := range cmds {
		v, cerr := c.Result()
		if cerr != nil && !errors.Is(cerr, redis.Nil) {
			continue
		}
		read++
		if _, owner, ok := strings.Cut(v, "|"); ok {
			owners[p] = owner
		}
	}
	if read == 0 && err != nil {
		return nil, fmt.Errorf("lua: outbox partition owners: %w", err)
	}
	return owners, nil
}

// Persisters announces consumer as a live persister for ttl (0 withdraws
// it) and returns how many are live (outbox_members.lua).
func (s *Store) Persisters(ctx context.Context, consumer string, ttl time.Duration) (int, error) {
	n, err := outboxMembersScript.Run(ctx, s.rdb, []string{s.outboxMembersKey()}, consumer, ttl.Milliseconds()).Int64()
	if err != nil {
		return 0, fmt.Errorf("lua: outbox persisters: %w", err)
	}
	return int(n), nil
}
