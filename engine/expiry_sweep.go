package engine

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"
)

// ExpirySweeper writes the expiry ledger entries of blocks whose expires_at
// has passed. Balances already ignore such blocks at that instant; the sweep
// makes the ledger say so (invariant 1) for customers nobody touches. It
// finds them in Postgres (Index): each pass looks back Lookback, and every
// DeepEvery one pass looks back DeepLookback, for blocks a pass missed
// (Redis or Postgres away, or a block persisted after its window passed).
type ExpirySweeper struct {
	Blocks       BlockStore
	Index        ExpiryIndex
	Credits      *Credits
	Clock        Clock
	Interval     time.Duration // default 1s
	Batch        int           // customers per page, default 500
	Lookback     time.Duration // default 10 minutes
	DeepLookback time.Duration // default 7 days
	DeepEvery    time.Duration // default 10 minutes
	Log          zerolog.Logger
	// Prepare, when set, runs once before the first pass (internal/app
	// frees an earlier version's expiry index there).
	Prepare func(ctx context.Context)
	Loop

	lastDeep atomic.Int64 // unix ns of the last deep pass
}

// Name is the sweep's key in /readyz.
func (s *ExpirySweeper) Name() string { return "expiry_sweep" }

// Start runs the sweep in the background until Stop.
func (s *ExpirySweeper) Start(ctx context.Context) error {
	return s.Go(ctx, cmpOr(s.Interval, time.Second), s.Run)
}

// Run runs Prepare, then sweeps every Interval until ctx ends.
func (s *ExpirySweeper) Run(ctx context.Context) {
	if s.Prepare != nil {
		s.Prepare(ctx)
	}
	s.every(ctx, s.Interval, time.Second, func() error {
		_, err := s.sweep(ctx)
		return err
	})
}

// sweepPages bounds the pages of one pass: a backlog larger than this
// many pages waits for the next pass.
const sweepPages = 20

// SweepOnce expires what is due now; it returns how many customers had
// blocks expired. Every node of a fleet sweeps (expire.lua is atomic and
// refuses what is no longer due, so an expiry happens once whichever node
// gets there first); each node visits a page's customers in its own random
// order, so nodes mostly work on different customers (docs/decisions.md
// "Background work across nodes").
func (s *ExpirySweeper) SweepOnce(ctx context.Context) int {
	n, _ := s.sweep(ctx)
	return n
}

// sweep is SweepOnce, also returning the first error it logged (the pass
// then failed: Health reports it).
func (s *ExpirySweeper) sweep(ctx context.Context) (int, error) {
	var failed error
	batch := cmpOr(s.Batch, 500)
	now := s.Clock.Now()
	since := now.Add(-cmpOr(s.Lookback, 10*time.Minute))
	if last := s.lastDeep.Load(); last == 0 || now.Sub(time.Unix(0, last)) >= cmpOr(s.DeepEvery, 10*time.Minute) {
		since = now.Add(-cmpOr(s.DeepLookback, 7*24*time.Hour))
		s.lastDeep.Store(now.UnixNano())
	}
	n := 0
	seen := map[uuid.UUID]bool{}
	for page := 0; page < sweepPages; page++ {
		due, err := s.Index.DueExpiries(ctx, since, now, batch)
		if err != nil {
			if ctx.Err() == nil {
				s.Log.Warn().Err(err).Msg("expiry sweep: list due")
			}
			return n, err
		}
		if len(due) == 0 {
			return n, failed
		}
		// The next page starts after this one's last expiry (customers
		// tied with it past the limit wait for the next pass).
		next := due[len(due)-1].ExpiresAt
		rand.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
		for _, d := range due {
			// Postgres trails Redis: a customer just expired can be listed
			// again until its expiry is persisted.
			if seen[d.Customer.CustomerID] {
				continue
			}
			seen[d.Customer.CustomerID] = true
			ok, err := s.expire(ctx, d.Customer, now)
			if ok {
				n++
			}
			if failed == nil {
				failed = err
			}
		}
		if len(due) < batch || !next.After(since) {
			return n, failed
		}
		since = next
	}
	return n, failed
}

// expire runs expire.lua for c, loading c first when Redis lacks it; the
// error is the one it logged.
func (s *ExpirySweeper) expire(ctx context.Context, c CustomerKey, now time.Time) (bool, error) {
	_, ok, err := s.Blocks.Expire(ctx, uuid.Must(uuid.NewV7()), c, now)
	if errors.Is(err, ErrStateMissing) && s.Credits != nil {
		if err = s.Credits.Load(ctx, c); err == nil {
			_, ok, err = s.Blocks.Expire(ctx, uuid.Must(uuid.NewV7()), c, now)
		}
	}
	if err != nil {
		s.Log.Warn().Err(err).Str("customer_id", c.CustomerID.String()).Msg("expiry sweep")
		return false, err
	}
	return ok, nil
}

// DueExpiry is a customer with a block past its expires_at: ExpiresAt is
// its soonest such block's.
type DueExpiry struct {
	Customer  CustomerKey
	ExpiresAt time.Time
}
