package lua

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
)

// OutboxGroup is the consumer group of the persister on every outbox stream.
// It is part of the stored state (the group remembers what was delivered),
// so renaming it would redeliver every pending entry: keep it.
const OutboxGroup = "persister"

// outboxField is the stream entry field holding the Mutation JSON; the money
// scripts write it and docs/design.md fixes it.
const outboxField = "m"

// outboxClaimRounds bounds the XAUTOCLAIM calls of one Claim, so a huge
// pending list full of young entries cannot keep one call busy for long.
const outboxClaimRounds = 8

// Compile-time checks that Store is the engine's outbox.
var _ engine.Outbox = (*Store)(nil)

// MalformedEntryError reports an outbox entry whose Mutation cannot be
// decoded. Read and Claim return it (and no messages) instead of skipping the
// entry, so nothing is dropped silently: the entry stays pending for the
// consumer, the caller stores Raw somewhere durable (a dead letter) and then
// Acks ID. Until it does, every Read of that consumer returns this error again,
// and the other messages of the batch stay pending and come back after it.
type MalformedEntryError struct {
	// Partition is the outbox partition the entry is in.
	Partition int
	// ID is the stream id to dead-letter and then Ack.
	ID string
	// Raw is the entry's `m` field as stored (empty when it had none).
	Raw []byte
	// Err is why it could not be decoded.
	Err error
}

// Error implements error.
func (e *MalformedEntryError) Error() string {
	return fmt.Sprintf("lua: outbox partition %d entry %s: undecodable mutation: %v", e.Partition, e.ID, e.Err)
}

// Unwrap exposes the decoding error.
func (e *MalformedEntryError) Unwrap() error { return e.Err }

// OutboxEntryID is the entry's stream id. With RawEntry it lets a caller that
// must not import this package (persist depends on engine only) find the
// entry with errors.As on interface{ OutboxEntryID() string }.
func (e *MalformedEntryError) OutboxEntryID() string { return e.ID }

// RawEntry is the entry's stored `m` field, for the dead letter.
func (e *MalformedEntryError) RawEntry() []byte { return e.Raw }

// EnsureOutboxGroups creates the persister group on every partition stream
// (creating empty streams as needed). Read, Claim and Ack recreate a missing
// group on their own; calling this at start only saves that first round trip.
func (s *Store) EnsureOutboxGroups(ctx context.Context) error {
	for p := 0; p < Partitions; p++ {
		if err := s.ensureOutboxGroup(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// ensureOutboxGroup creates the group of partition p reading from the start
// of the stream, so entries the scripts appended before any persister ran
// (or after Redis came back empty) are all delivered.
func (s *Store) ensureOutboxGroup(ctx context.Context, p int) error {
	err := s.rdb.XGroupCreateMkStream(ctx, s.outboxKey(p), OutboxGroup, "0").Err()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return fmt.Errorf("lua: create outbox group of partition %d: %w", p, err)
	}
	return nil
}

// isOutboxNoGroup tells whether err means the stream or its group is gone, which
// happens when Redis was flushed or restarted without data.
func isOutboxNoGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOGROUP")
}

// withOutboxGroup runs op and, when it fails for want of the group, creates
// the group and runs op once more.
func (s *Store) withOutboxGroup(ctx context.Context, p int, op func() error) error {
	err := op()
	if !isOutboxNoGroup(err) {
		return err
	}
	if err := s.ensureOutboxGroup(ctx, p); err != nil {
		return err
	}
	return op()
}

func (s *Store) checkOutboxPartition(p int) error {
	if p < 0 || p >= Partitions {
		return fmt.Errorf("lua: outbox partition %d out of range [0, %d)", p, Partitions)
	}
	return nil
}

// Read returns up to count messages of partition p for consumer: first the
// entries already delivered to consumer and not acknowledged (so a restarted
// creditd resumes them), and only when there are none, new entries, waiting
// up to block for some (block <= 0 does not wait). It returns an empty slice
// when nothing came, and a *MalformedEntryError for an undecodable entry.
func (s *Store) Read(ctx context.Context, p int, consumer string, count int, block time.Duration) ([]engine.OutboxMessage, error) {
	if err := s.checkRead(p, count); err != nil {
		return nil, err
	}
	msgs, err := s.readGroup(ctx, p, consumer, count, "0", -1)
	if err != nil || len(msgs) > 0 {
		return msgs, err
	}
	return s.ReadNew(ctx, p, consumer, count, block)
}

// ReadNew is Read without the look at consumer's pending entries: for a
// reader that knows it acknowledged everything it was given (the
// persister after a fully acknowledged batch), that look is a round trip
// that finds nothing. Errors as Read.
func (s *Store) ReadNew(ctx context.Context, p int, consumer string, count int, block time.Duration) ([]engine.OutboxMessage, error) {
	if err := s.checkRead(p, count); err != nil {
		return nil, err
	}
	if block <= 0 {
		// go-redis sends BLOCK 0 for a zero duration, which waits forever.
		block = -1
	} else if block < time.Millisecond {
		block = time.Millisecond
	}
	return s.readGroup(ctx, p, consumer, count, ">", block)
}

// checkRead refuses a read of a partition that does not exist or of no
// messages.
func (s *Store) checkRead(p, count int) error {
	if err := s.checkOutboxPartition(p); err != nil {
		return err
	}
	if count <= 0 {
		return fmt.Errorf("lua: outbox read count %d must be positive", count)
	}
	return nil
}

// readGroup runs one XREADGROUP from id ("0": the consumer's pending
// entries; ">": new ones) and decodes what it returns.
func (s *Store) readGroup(ctx context.Context, p int, consumer string, count int, id string, block time.Duration) ([]engine.OutboxMessage, error) {
	key := s.outboxKey(p)
	var streams []redis.XStream
	err := s.withOutboxGroup(ctx, p, func() error {
		var err error
		streams, err = s.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group:    OutboxGroup,
			Consumer: consumer,
			Streams:  []string{key, id},
			Count:    int64(count),
			Block:    block,
		}).Result()
		return err
	})
	if errors.Is(err, redis.Nil) {
		return []engine.OutboxMessage{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("lua: read outbox partition %d: %w", p, err)
	}
	var entries []redis.XMessage
	for _, st := range streams {
		entries = append(entries, st.Messages...)
	}
	return s.decodeOutbox(ctx, p, entries)
}

// Claim takes over up to count messages of partition p that have been idle
// for at least minIdle in other consumers (a creditd that died), so they are
// persisted by consumer instead. Errors as Read.
func (s *Store) Claim(ctx context.Context, p int, consumer string, minIdle time.Duration, count int) ([]engine.OutboxMessage, error) {
	if err := s.checkOutboxPartition(p); err != nil {
		return nil, err
	}
	if count <= 0 {
		return nil, fmt.Errorf("lua: outbox claim count %d must be positive", count)
	}
	key := s.outboxKey(p)
	var entries []redis.XMessage
	start := "0-0"
	// One pass over the pending list at most: XAUTOCLAIM scans a bounded
	// slice of it per call and returns where to go on ("0-0" at the end).
	for round := 0; round < outboxClaimRounds && len(entries) < count; round++ {
		var got []redis.XMessage
		var next string
		err := s.withOutboxGroup(ctx, p, func() error {
			var err error
			got, next, err = s.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
				Stream:   key,
				Group:    OutboxGroup,
				Consumer: consumer,
				MinIdle:  minIdle,
				Start:    start,
				Count:    int64(count - len(entries)),
			}).Result()
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("lua: claim outbox partition %d: %w", p, err)
		}
		entries = append(entries, got...)
		if next == "0-0" || next == "" {
			break
		}
		start = next
	}
	return s.decodeOutbox(ctx, p, entries)
}

// decodeOutbox turns stream entries into messages. An entry that was deleted
// while still pending comes back without fields; nothing is left of it to
// persist, so it is acknowledged here and skipped rather than handed on as
// an empty Mutation.
func (s *Store) decodeOutbox(ctx context.Context, p int, entries []redis.XMessage) ([]engine.OutboxMessage, error) {
	out := make([]engine.OutboxMessage, 0, len(entries))
	var gone []string
	for _, e := range entries {
		if len(e.Values) == 0 {
			gone = append(gone, e.ID)
			continue
		}
		raw, ok := e.Values[outboxField].(string)
		if !ok {
			return nil, &MalformedEntryError{Partition: p, ID: e.ID, Err: fmt.Errorf("no %q field", outboxField)}
		}
		var m engine.Mutation
		if err := engine.DecodeMutationString(raw, &m); err != nil {
			return nil, &MalformedEntryError{Partition: p, ID: e.ID, Raw: []byte(raw), Err: err}
		}
		out = append(out, engine.OutboxMessage{ID: e.ID, Mutation: m})
	}
	if len(gone) > 0 {
		if err := s.Ack(ctx, p, gone); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Ack acknowledges ids of partition p and deletes them from the stream in
// one MULTI, so an entry is never left deleted but pending or acknowledged
// but kept, and the stream holds only what is still to be persisted.
func (s *Store) Ack(ctx context.Context, p int, ids []string) error {
	if err := s.checkOutboxPartition(p); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	key := s.outboxKey(p)
	err := s.withOutboxGroup(ctx, p, func() error {
		_, err := s.rdb.TxPipelined(ctx, func(pipe redis.Pipeliner) error {
			pipe.XAck(ctx, key, OutboxGroup, ids...)
			pipe.XDel(ctx, key, ids...)
			return nil
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("lua: ack outbox partition %d: %w", p, err)
	}
	return nil
}

// Renew resets the idle time of messages consumer is still working on (an
// XCLAIM to itself with min idle 0 and JUSTID, which counts no delivery), so
// another consumer's Claim leaves them alone while their batch waits on
// Postgres: only a dead or stalled consumer's messages grow idle. Ids
// already acknowledged are skipped.
func (s *Store) Renew(ctx context.Context, p int, consumer string, ids []string) error {
	if err := s.checkOutboxPartition(p); err != nil {
		return err
	}
	if len(ids) == 0 {
		return nil
	}
	key := s.outboxKey(p)
	err := s.withOutboxGroup(ctx, p, func() error {
		return s.rdb.XClaimJustID(ctx, &redis.XClaimArgs{
			Stream: key, Group: OutboxGroup, Consumer: consumer, MinIdle: 0, Messages: ids,
		}).Err()
	})
	if err != nil {
		return fmt.Errorf("lua: renew outbox partition %d: %w", p, err)
	}
	return nil
}

// Backlog reports the messages of partition p not yet acknowledged (read or
// not) and the Unix ms of the oldest, 0 when there are none. Because Ack
// deletes what it acknowledges, the stream length is exactly that count and
// its first entry is the oldest; this holds with or without the group.
func (s *Store) Backlog(ctx context.Context, p int) (count int64, oldestMS int64, err error) {
	if err := s.checkOutboxPartition(p); err != nil {
		return 0, 0, err
	}
	key := s.outboxKey(p)
	var xlen *redis.IntCmd
	var first *redis.XMessageSliceCmd
	_, err = s.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		xlen = pipe.XLen(ctx, key)
		first = pipe.XRangeN(ctx, key, "-", "+", 1)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, fmt.Errorf("lua: outbox backlog of partition %d: %w", p, err)
	}
	count = xlen.Val()
	if msgs := first.Val(); len(msgs) > 0 {
		oldestMS, err = streamIDMillis(msgs[0].ID)
		if err != nil {
			return 0, 0, fmt.Errorf("lua: outbox backlog of partition %d: %w", p, err)
		}
	}
	return count, oldestMS, nil
}

// streamIDMillis is the Unix ms part of a stream id "<ms>-<seq>"; the
// scripts XADD with "*", so it is Redis's clock at the append.
func streamIDMillis(id string) (int64, error) {
	ms, _, _ := strings.Cut(id, "-")
	v, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad stream id %q", id)
	}
	return v, nil
}
