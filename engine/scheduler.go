package engine

import (
	"cmp"
	"context"
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
	Log           zerolog.Logger
	Loop
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
