package engine

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine/idempotency"
)

// SeenSeeder fills the seen filters (engine/idempotency/windows.go: the
// partitions' and the usage index's, SeenFilter) from Postgres, so money
// calls and usage batches stop asking Postgres: at start for every filter (from where the
// last seeding read, less SeenSeedOverlap, or the whole idempotency.SeenHorizon for a
// partition never seeded), then every Interval for a partition whose mark
// is gone (a Redis that lost its data). Starting from the last seeding,
// not from the horizon, keeps a restart cheap; the overlap covers the
// operations a previous release's persister committed without recording
// them (a rolling upgrade, docs/operations.md): each node that starts
// records them again. Every node of a fleet seeds; recording a key twice
// keeps one copy.
type SeenSeeder struct {
	Filter   SeenFilter
	Keys     AppliedKeys
	Clock    Clock
	Interval time.Duration // default 1 min
	Page     int           // keys per Postgres page, default 2,000
	Log      zerolog.Logger
	Loop
	started bool
}

// SeenSeedOverlap is how far before the last seeding's start a seeding
// reads again: an operation created before it but committed after it by a
// persister that does not record keys.
const SeenSeedOverlap = time.Hour

// Name is the loop's key in /readyz.
func (s *SeenSeeder) Name() string { return "seen_seed" }

// Start runs the seeding in the background until Stop.
func (s *SeenSeeder) Start(ctx context.Context) error {
	return s.Go(ctx, cmpOr(s.Interval, time.Minute), s.Run)
}

// Run seeds at once and then every Interval until ctx ends. A failed pass
// (Postgres or Redis unreachable) is logged and tried again next time: it
// costs only Postgres look-ups on the money path meanwhile, so it is no
// reason for the node to leave the balancer.
func (s *SeenSeeder) Run(ctx context.Context) {
	s.every(ctx, s.Interval, time.Minute, func() error {
		if err := s.SeedOnce(ctx); err != nil && ctx.Err() == nil {
			s.Log.Warn().Err(err).Msg("seen filter seeding failed; money calls ask Postgres for absent op keys until it succeeds")
		}
		return nil
	})
}

// SeedOnce is one pass: every partition on the first, then only those
// whose mark is missing.
func (s *SeenSeeder) SeedOnce(ctx context.Context) error {
	marks, err := s.Filter.SeenSeeded(ctx)
	if err != nil {
		return err
	}
	now := s.Clock.Now()
	var parts []int
	since := now
	for p, m := range marks {
		if s.started && !m.IsZero() {
			continue
		}
		parts = append(parts, p)
		from := m.Add(-SeenSeedOverlap)
		if m.IsZero() || from.Before(now.Add(-idempotency.SeenHorizon)) {
			from = now.Add(-idempotency.SeenHorizon)
		}
		if from.Before(since) {
			since = from
		}
	}
	if len(parts) == 0 {
		return nil
	}
	n := 0
	err = s.Keys.AppliedKeysSince(ctx, since, cmpOr(s.Page, 2000), func(refs []OpRef) error {
		n += len(refs)
		return s.Filter.SeedSeen(ctx, refs, nil, now, false)
	})
	if err != nil {
		return err
	}
	if err := s.Filter.SeedSeen(ctx, nil, parts, now, true); err != nil {
		return err
	}
	s.started = true
	s.Log.Info().Int("partitions", len(parts)).Int("keys", n).Time("since", since).Msg("seen filter seeded")
	return nil
}
