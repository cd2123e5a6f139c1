package engine

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// LeaseSweeper writes down the lapse of leases past their expires for
// gauges nobody touches (reads already ignore them): the lease's status
// becomes expired in Postgres and the count there drops. It finds them in
// Postgres (Index); every node of a fleet sweeps, and the lease script
// refuses what is no longer due, so a lapse is written once.
type LeaseSweeper struct {
	Hot      LeaseStore
	Index    LeaseIndex
	Credits  *Credits
	Clock    Clock
	Interval time.Duration // default 1s
	Batch    int           // leases per pass, default 500
	Log      zerolog.Logger
	Loop
}

// Name is the sweep's key in /readyz.
func (s *LeaseSweeper) Name() string { return "lease_sweep" }

// Start runs the sweep in the background until Stop.
func (s *LeaseSweeper) Start(ctx context.Context) error {
	return s.Go(ctx, cmpOr(s.Interval, time.Second), s.Run)
}

// Run sweeps every Interval until ctx ends.
func (s *LeaseSweeper) Run(ctx context.Context) {
	s.every(ctx, s.Interval, time.Second, func() error {
		_, err := s.sweep(ctx)
		return err
	})
}

// SweepOnce expires the due leases Postgres lists; it returns how many
// lapses it wrote (one write lapses every due lease of its gauge).
func (s *LeaseSweeper) SweepOnce(ctx context.Context) int {
	n, _ := s.sweep(ctx)
	return n
}

// sweep is SweepOnce, also returning the first error it logged.
func (s *LeaseSweeper) sweep(ctx context.Context) (int, error) {
	now := s.Clock.Now()
	due, err := s.Index.DueLeases(ctx, now, cmpOr(s.Batch, 500))
	if err != nil {
		if ctx.Err() == nil {
			s.Log.Warn().Err(err).Msg("lease sweep: list due")
		}
		return 0, err
	}
	var failed error
	type gauge struct {
		customer uuid.UUID
		metric   string
	}
	done := map[gauge]bool{}
	n := 0
	for _, d := range due {
		g := gauge{d.Customer.CustomerID, d.Metric}
		if done[g] {
			continue
		}
		cmd := LeaseCommand{
			CommandHeader: headerOf(d.Customer, Idempotency{}, now), Metric: d.Metric,
			LeaseID: d.LeaseID, Action: LeaseExpire}
		_, err := withLoad(ctx, s.Credits, d.Customer, func() (MutationResult, error) { return s.Hot.Lease(ctx, cmd) })
		switch {
		case err == nil:
			done[g] = true
			n++
		case errors.Is(err, ErrLeaseNotDue), errors.Is(err, ErrLeaseNotFound):
			// Renewed, released or lapsed already: Postgres has yet to hear.
		default:
			s.Log.Warn().Err(err).Str("lease_id", d.LeaseID.String()).Msg("lease sweep")
			failed = cmp.Or(failed, err)
		}
	}
	return n, failed
}
