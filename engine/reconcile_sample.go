package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// The reconcile sampler (issue 15) runs in serve: every Interval it
// compares a few random customers' Redis state with Postgres and counts
// the mismatches for /metrics, logging each one. It never repairs (that is
// `creditd reconcile --repair`, an operator's decision), and it compares a
// customer only when no write of it is in flight: the store at Postgres'
// version, or ahead of it while the outbox is empty (an ahead store with
// entries still queued is the persister's lag, not a mismatch).

// DefaultReconcileSampleInterval is how often the sampler samples.
const DefaultReconcileSampleInterval = time.Minute

// MaxReconcileSample bounds one sample (docs/limits.md).
const MaxReconcileSample = 1000

// ReconcileSampler checks Size random customers every Interval.
type ReconcileSampler struct {
	Source ReconcileSampleSource
	Store  ReconcileStore
	// Drained tells whether the outbox is empty (nil: never, so a store
	// ahead of Postgres is always taken for a write in flight).
	Drained  func(ctx context.Context) (bool, error)
	Size     int
	Interval time.Duration // default one minute
	Clock    Clock
	Log      zerolog.Logger
	Loop

	checked, mismatches, skipped, last atomic.Int64
}

// ReconcileSampleStats are the sampler's counters since start.
type ReconcileSampleStats struct {
	// Checked counts the customers compared; Mismatches those that
	// differed; Skipped those left out (no state in Redis, or a write in
	// flight); LastMismatches the mismatches of the last sample.
	Checked, Mismatches, Skipped, LastMismatches int64
}

// Stats reads the counters.
func (s *ReconcileSampler) Stats() ReconcileSampleStats {
	return ReconcileSampleStats{Checked: s.checked.Load(), Mismatches: s.mismatches.Load(), Skipped: s.skipped.Load(),
		LastMismatches: s.last.Load()}
}

// Name is the sampler's key in /readyz.
func (s *ReconcileSampler) Name() string { return "reconcile_sample" }

// Start runs the sampler in the background until Stop; with Size 0 it is
// off (and healthy).
func (s *ReconcileSampler) Start(ctx context.Context) error {
	if s.Size <= 0 {
		return s.Off()
	}
	return s.Go(ctx, cmpOr(s.Interval, DefaultReconcileSampleInterval), s.Run)
}

// Run samples every Interval until ctx ends; Size 0 does nothing.
func (s *ReconcileSampler) Run(ctx context.Context) {
	if s.Size <= 0 {
		return
	}
	s.every(ctx, s.Interval, DefaultReconcileSampleInterval, func() error {
		_, err := s.SampleOnce(ctx)
		if err != nil && ctx.Err() == nil {
			s.Log.Warn().Err(err).Msg("reconcile sample failed")
		}
		return err
	})
}

// SampleOnce checks one sample and returns the customers that differed.
func (s *ReconcileSampler) SampleOnce(ctx context.Context) ([]Difference, error) {
	clock := s.Clock
	if clock == nil {
		clock = SystemClock{}
	}
	states, err := s.Source.SampleStates(ctx, min(s.Size, MaxReconcileSample))
	if err != nil {
		return nil, fmt.Errorf("engine: reconcile sample: %w", err)
	}
	if len(states) == 0 {
		s.last.Store(0)
		return nil, nil
	}
	ids := make([]uuid.UUID, len(states))
	for i, st := range states {
		ids[i] = st.CustomerID
	}
	// Postgres first, then Redis: a write in between leaves the store
	// ahead, never behind.
	stored, err := s.Store.StoredAccounts(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("engine: reconcile sample: %w", err)
	}
	var diffs []Difference
	var ahead []int
	var checked, skipped int64
	for i, st := range states {
		switch {
		case !stored[i].Present:
			skipped++ // loaded from Postgres on first use
			continue
		case stored[i].Version > st.Version:
			ahead = append(ahead, i)
			continue
		}
		checked++
		if d, ok := s.compare(st, stored[i], clock); !ok {
			diffs = append(diffs, d)
		}
	}
	if len(ahead) > 0 {
		drained := false
		if s.Drained != nil {
			// Read after the store: every entry of the versions it
			// showed has left the outbox when it is empty now.
			if drained, err = s.Drained(ctx); err != nil {
				return nil, fmt.Errorf("engine: reconcile sample: outbox: %w", err)
			}
		}
		for _, i := range ahead {
			if !drained {
				skipped++
				continue
			}
			again, err := s.Source.ReconcileStates(ctx, ReconcileScope{}, beforeID(ids[i]), 1)
			if err != nil {
				return nil, fmt.Errorf("engine: reconcile sample: %w", err)
			}
			if len(again) == 0 || again[0].CustomerID != ids[i] {
				skipped++ // the account is gone
				continue
			}
			checked++
			if d, ok := s.compare(again[0], stored[i], clock); !ok {
				diffs = append(diffs, d)
			}
		}
	}
	s.checked.Add(checked)
	s.skipped.Add(skipped)
	s.mismatches.Add(int64(len(diffs)))
	s.last.Store(int64(len(diffs)))
	for _, d := range diffs {
		ev := s.Log.Warn().Str("customer_id", d.Customer.CustomerID.String()).Str("tenant_id", d.Customer.TenantID.String()).
			Str("environment", string(d.Customer.Environment)).Int64("redis_version", d.StoreVersion).
			Int64("postgres_version", d.PostgresVersion)
		for _, f := range d.Fields {
			ev = ev.Str(f.Field, "redis "+f.Redis+", postgres "+f.Postgres)
		}
		ev.Msg("reconcile sample: redis differs from postgres (run creditd reconcile --repair)")
	}
	return diffs, nil
}

// compare holds the store to Postgres' state; the ledger is not summed (a
// customer with millions of entries would make the sample expensive:
// `creditd reconcile` checks it).
func (s *ReconcileSampler) compare(st AccountState, stored StoredAccount, clock Clock) (Difference, bool) {
	ledger := sumRemaining(st.Blocks)
	d, ok := CompareAccount(st, stored, ledger)
	if !ok {
		d.Fields = FieldDifferences(st, stored, ledger, clock.Now().UnixMilli())
	}
	return d, ok
}

// beforeID is the id just below id, so a page "after" it starts at id.
func beforeID(id uuid.UUID) uuid.UUID {
	for i := len(id) - 1; i >= 0; i-- {
		if id[i] > 0 {
			id[i]--
			return id
		}
		id[i] = 0xff
	}
	return id
}
