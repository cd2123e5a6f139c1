package lua

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

var _ engine.OutboxMarks = (*Store)(nil)

// OutboxMark is the newest entry of customer's outbox partition, or of every
// partition when customer is nil: what the outbox held at this instant.
// Every node sees the same streams, so a mark taken on one node covers the
// writes every node acknowledged before it.
func (s *Store) OutboxMark(ctx context.Context, customer *uuid.UUID) (engine.OutboxMark, error) {
	parts := s.markPartitions(customer)
	cmds := make([]*redis.XMessageSliceCmd, len(parts))
	_, err := s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, p := range parts {
			cmds[i] = pipe.XRevRangeN(ctx, s.outboxKey(p), "+", "-", 1)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return engine.OutboxMark{}, fmt.Errorf("lua: outbox mark: %w", err)
	}
	var m engine.OutboxMark
	for i, c := range cmds {
		if msgs := c.Val(); len(msgs) > 0 {
			m.Partitions = append(m.Partitions, parts[i])
			m.Entries = append(m.Entries, msgs[0].ID)
		}
	}
	return m, nil
}

// OutboxPersisted reports whether every entry up to mark has left the
// outbox. The persister deletes an entry only once Postgres committed it
// or set it aside as a dead letter (Ack), so an empty range up to the
// mark's entry means Postgres holds everything written before the mark.
func (s *Store) OutboxPersisted(ctx context.Context, mark engine.OutboxMark) (bool, error) {
	if len(mark.Partitions) == 0 {
		return true, nil
	}
	cmds := make([]*redis.XMessageSliceCmd, len(mark.Partitions))
	_, err := s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, p := range mark.Partitions {
			cmds[i] = pipe.XRangeN(ctx, s.outboxKey(p), "-", mark.Entries[i], 1)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, fmt.Errorf("lua: outbox persisted: %w", err)
	}
	for _, c := range cmds {
		if len(c.Val()) > 0 {
			return false, nil
		}
	}
	return true, nil
}

// markPartitions is customer's partition, or all of them.
func (s *Store) markPartitions(customer *uuid.UUID) []int {
	if customer != nil {
		return []int{Partition(*customer)}
	}
	parts := make([]int, Partitions)
	for p := range parts {
		parts[p] = p
	}
	return parts
}
