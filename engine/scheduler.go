package engine

import (
	"cmp"
	"context"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Scheduler moves subscriptions on time: it fires due grants, renews
// postpaid periods, ends trials, warns of renewals, and moves prepaid
// subscriptions to past_due, expired or canceled (docs/spec/addendum.md §6). Each pass
// claims due subscriptions with FOR UPDATE SKIP LOCKED, so several creditd
// processes split the work and never run one subscription at once; each
// firing's idempotency key is derived from the subscription, grant and
// firing, so a firing retried after a crash replays. After downtime a pass
// does every missed piece of work once, in time order. It reads time only
// from Clock (invariant 6).
type Scheduler struct {
	Subscriptions *Subscriptions
	Clock         Clock
	Interval      time.Duration // default 1s
	Batch         int           // subscriptions per claim round, default 200
	// Partitions, when set, creates the months of the time-partitioned
	// tables ahead, at the first pass and then hourly (issue 30 item 1).
	Partitions PartitionKeeper
	Log        zerolog.Logger
	Loop

	partitionsAt atomic.Int64 // Unix ns of Partitions' last success (RunOnce may run beside Run)
}

// PartitionKeeper creates the partitions of the coming months of the
// tables partitioned by time (persist.Store.EnsurePartitions): created is
// how many it made, strays the rows left in a DEFAULT partition (an alarm).
// Every node calls it; it must be safe to run concurrently.
type PartitionKeeper interface {
	EnsurePartitions(ctx context.Context, now time.Time) (created int, strays int64, err error)
}

// partitionInterval is how often a node's scheduler makes sure the coming
// months' partitions exist: months are made two ahead, so hourly leaves a
// margin of weeks.
const partitionInterval = time.Hour

// keepPartitions runs Partitions when partitionInterval has passed since
// its last success. A failure is logged and retried at the next pass; it
// does not fail the pass (the subscriptions' work is unaffected).
func (s *Scheduler) keepPartitions(ctx context.Context, now time.Time) {
	if last := s.partitionsAt.Load(); s.Partitions == nil || (last != 0 && now.Sub(time.Unix(0, last)) < partitionInterval) {
		return
	}
	created, strays, err := s.Partitions.EnsurePartitions(ctx, now)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			s.Log.Warn().Err(err).Msg("scheduler: create coming partitions")
		}
		return
	case strays > 0:
		s.Log.Error().Int64("rows", strays).
			Msg("scheduler: rows in a DEFAULT partition: dated in a month without a partition (docs/operations.md \"Partitions\")")
	case created > 0:
		s.Log.Info().Int("created", created).Msg("scheduler: created coming partitions")
	}
	s.partitionsAt.Store(now.UnixNano())
}

// Name is the scheduler's key in /readyz.
func (s *Scheduler) Name() string { return "scheduler" }

// Start runs the scheduler in the background until Stop.
func (s *Scheduler) Start(ctx context.Context) error {
	return s.Go(ctx, cmpOr(s.Interval, time.Second), s.Run)
}

// Run runs a pass every Interval until ctx ends.
func (s *Scheduler) Run(ctx context.Context) {
	s.every(ctx, s.Interval, time.Second, func() error {
		_, err := s.pass(ctx)
		return err
	})
}

// RunOnce does the work due now and returns how many subscriptions it
// advanced.
func (s *Scheduler) RunOnce(ctx context.Context) int {
	n, _ := s.pass(ctx)
	return n
}

// pass is RunOnce, also returning the first error it logged.
func (s *Scheduler) pass(ctx context.Context) (int, error) {
	var failed error
	batch := s.Batch
	if batch <= 0 {
		batch = 200
	}
	now := s.Clock.Now()
	s.keepPartitions(ctx, now)
	total := 0
	// Rounds are bounded: subscriptions that keep failing are retried on
	// the next pass, not in a loop here.
	for round := 0; round < 50 && ctx.Err() == nil; round++ {
		n, err := s.Subscriptions.store.RunDue(ctx, now, batch, func(ctx context.Context, r *SubscriptionRecord) error {
			err := s.Subscriptions.advance(ctx, r, now)
			if err != nil && ctx.Err() == nil {
				s.Log.Warn().Err(err).Str("subscription", r.ID.String()).Msg("scheduler: advance subscription")
				failed = cmp.Or(failed, err)
			}
			return err
		})
		total += n
		if err != nil {
			if ctx.Err() == nil {
				s.Log.Warn().Err(err).Msg("scheduler: claim due subscriptions")
			}
			return total, cmp.Or(err, failed)
		}
		if n < batch {
			return total, failed
		}
	}
	return total, failed
}
