package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// writtenBehindWait bounds how long a read waits for the persister: past
// it the read answers with what Postgres holds (the persister is stalled or
// Postgres slow; /readyz and the lag metric say so).
const writtenBehindWait = 2 * time.Second

// writtenBehindPoll is how often a waiting read looks at the outbox again.
const writtenBehindPoll = 5 * time.Millisecond

// WrittenBehind gives the reads that Postgres answers read-your-writes on
// any node of a fleet (issue 25): before reading, it marks the outbox as it
// stands (the same streams on every node, so the mark covers every write any
// node acknowledged before the read came in) and waits, bounded, until the
// persister has moved every entry up to the mark into Postgres. A customer's
// read marks its partition only; a tenant-wide read marks every partition.
// A nil *WrittenBehind waits for nothing.
type WrittenBehind struct {
	marks OutboxMarks
	// hurry ends the local persister's linger; a partition another node
	// persists commits within that node's linger.
	hurry func()
	wait  time.Duration
}

// NewWrittenBehind waits on marks; hurry (may be nil) is the local
// persister's Hurry.
func NewWrittenBehind(marks OutboxMarks, hurry func()) *WrittenBehind {
	return &WrittenBehind{marks: marks, hurry: hurry, wait: writtenBehindWait}
}

// Customer waits until Postgres holds every write on customer acknowledged
// before the call.
func (w *WrittenBehind) Customer(ctx context.Context, customer uuid.UUID) { w.await(ctx, &customer) }

// All waits until Postgres holds every write acknowledged before the call.
func (w *WrittenBehind) All(ctx context.Context) { w.await(ctx, nil) }

// await never fails the read: a Redis that cannot answer leaves the read to
// Postgres alone, which is what it would have answered anyway.
func (w *WrittenBehind) await(ctx context.Context, customer *uuid.UUID) {
	if w == nil || w.marks == nil {
		return
	}
	mark, err := w.marks.OutboxMark(ctx, customer)
	if err != nil || len(mark.Partitions) == 0 {
		return
	}
	deadline := time.Now().Add(w.wait)
	t := time.NewTimer(writtenBehindPoll)
	defer t.Stop()
	for {
		done, err := w.marks.OutboxPersisted(ctx, mark)
		if err != nil || done || time.Now().After(deadline) {
			return
		}
		if w.hurry != nil {
			w.hurry()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(writtenBehindPoll)
	}
}

// OutboxMark is a position in the outbox: for each partition that held
// entries, the id of its newest.
type OutboxMark struct {
	Partitions []int
	Entries    []string
}
