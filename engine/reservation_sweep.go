package engine

import (
	"cmp"
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/rs/zerolog"
)

// ReservationSweeper expires reservations past their expires_at (docs/spec/interface.md:
// once per minute; the interval is configurable for tests).
type ReservationSweeper struct {
	Hot      MeteringStore
	Credits  *Credits
	Clock    Clock
	Interval time.Duration
	Log      zerolog.Logger
	Loop
}

// Name is the sweep's key in /readyz.
func (s *ReservationSweeper) Name() string { return "reservation_sweep" }

// Start runs the sweep in the background until Stop.
func (s *ReservationSweeper) Start(ctx context.Context) error {
	return s.Go(ctx, cmpOr(s.Interval, time.Minute), s.Run)
}

// Run sweeps every Interval (default one minute) until ctx ends; the first
// pass waits one Interval.
func (s *ReservationSweeper) Run(ctx context.Context) {
	interval := s.Interval
	if interval <= 0 {
		interval = time.Minute
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, err := s.sweep(ctx)
			s.passed(ctx, err)
		}
	}
}

// SweepOnce expires every due reservation; it returns how many it expired.
func (s *ReservationSweeper) SweepOnce(ctx context.Context) int {
	n, _ := s.sweep(ctx)
	return n
}

// sweep is SweepOnce, also returning the first error it logged.
func (s *ReservationSweeper) sweep(ctx context.Context) (int, error) {
	var failed error
	n := 0
	now := s.Clock.Now()
	for p := range sweepOrder(s.Credits.blocks.Partitions()) {
		due, err := s.Hot.DueReservations(ctx, p, now, 500)
		if err != nil {
			if ctx.Err() == nil {
				s.Log.Warn().Err(err).Int("partition", p).Msg("reservation sweep: list due")
			}
			failed = cmp.Or(failed, err)
			continue
		}
		for _, d := range due {
			cmd := ReleaseCommand{
				CommandHeader: headerOf(d.Customer, Idempotency{}, now), ReservationID: d.ReservationID, Expire: true}
			_, err := withLoad(ctx, s.Credits, d.Customer, func() (MutationResult, error) { return s.Hot.Release(ctx, cmd) })
			if err == nil {
				n++
			} else if !errors.Is(err, ErrReservationNotActive) && !errors.Is(err, ErrReservationNotFound) {
				s.Log.Warn().Err(err).Str("reservation_id", d.ReservationID.String()).Msg("reservation sweep")
				failed = cmp.Or(failed, err)
			}
		}
	}
	return n, failed
}

// sweepOrder yields the partitions 0..n-1 from a random one on: the reservation
// sweep's order. Every node of a fleet sweeps every partition (release.lua
// is atomic and refuses what is no longer due); starting each pass at a
// random partition sets the nodes to work on different partitions
// (docs/decisions.md "Background work across nodes").
func sweepOrder(n int) func(yield func(int) bool) {
	return func(yield func(int) bool) {
		if n <= 0 {
			return
		}
		start := rand.IntN(n)
		for i := range n {
			if !yield((start + i) % n) {
				return
			}
		}
	}
}
