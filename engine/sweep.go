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

	lastDeep atomic.Int64 // unix ns of the last deep pass
}

// Run sweeps every Interval until ctx ends.
func (s *ExpirySweeper) Run(ctx context.Context) {
	every(ctx, s.Interval, time.Second, func() { s.SweepOnce(ctx) })
}

// every runs pass at once and then every interval (def when interval is not
// positive) until ctx ends: the loop of the sweeps and the scheduler.
func every(ctx context.Context, interval, def time.Duration, pass func()) {
	if interval <= 0 {
		interval = def
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		pass()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepOrder yields the partitions 0..n-1 from a random one on: the hold
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
			return n
		}
		if len(due) == 0 {
			return n
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
			if s.expire(ctx, d.Customer, now) {
				n++
			}
		}
		if len(due) < batch || !next.After(since) {
			return n
		}
		since = next
	}
	return n
}

// expire runs expire.lua for c, loading c first when Redis lacks it.
func (s *ExpirySweeper) expire(ctx context.Context, c CustomerKey, now time.Time) bool {
	_, ok, err := s.Blocks.Expire(ctx, uuid.Must(uuid.NewV7()), c, now)
	if errors.Is(err, ErrStateMissing) && s.Credits != nil {
		if err = s.Credits.Load(ctx, c); err == nil {
			_, ok, err = s.Blocks.Expire(ctx, uuid.Must(uuid.NewV7()), c, now)
		}
	}
	if err != nil {
		s.Log.Warn().Err(err).Str("customer_id", c.CustomerID.String()).Msg("expiry sweep")
		return false
	}
	return ok
}

// cmpOr is v, or def when v is not positive.
func cmpOr[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
