package engine

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
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

// RebuildProgress reports how far a rebuild got.
type RebuildProgress struct {
	Done, Total, Loaded int64
}

// Rebuild loads every account Postgres holds into the block store. Accounts
// whose store version is already at or past Postgres' are left alone (the
// load is fenced), so a rebuild is safe while creditd serves. progress is
// called after every page.
//
// The customer id space is cut into rebuildReaders ranges walked in
// parallel (a page read is Postgres and decoding work, a page load is Redis
// work; both overlap), and up to rebuildLoaders pages load at once.
func Rebuild(ctx context.Context, src RebuildSource, blocks BlockStore, clock Clock, pageSize int, progress func(RebuildProgress)) (RebuildProgress, error) {
	var pr RebuildProgress
	total, err := src.CountAccounts(ctx)
	if err != nil {
		return pr, err
	}
	pr.Total = total
	cuts, err := src.AccountIDCuts(ctx, rebuildReaders)
	if err != nil {
		return pr, err
	}
	if pageSize <= 0 {
		pageSize = 1000
	}
	since := clock.Now().Add(-AppliedRetention)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type page struct {
		states []AccountState
		err    error
	}
	pages := make(chan page, rebuildLoaders)
	var readers sync.WaitGroup
	for r := 0; r <= len(cuts); r++ {
		from, to := rebuildRange(r, cuts)
		readers.Add(1)
		go func() {
			defer readers.Done()
			after := from
			for {
				states, err := src.AccountStates(ctx, after, pageSize, since)
				last := len(states) < pageSize
				if to != nil {
					// The page may run into the next reader's range.
					for i, st := range states {
						if bytes.Compare(st.CustomerID[:], to[:]) >= 0 {
							states, last = states[:i], true
							break
						}
					}
				}
				if err != nil || len(states) > 0 {
					select {
					case pages <- page{states, err}:
					case <-ctx.Done():
						return
					}
				}
				if err != nil || last {
					return
				}
				after = states[len(states)-1].CustomerID
			}
		}()
	}
	go func() {
		readers.Wait()
		close(pages)
	}()
	type loaded struct {
		pr  RebuildProgress
		err error
	}
	results := make(chan loaded)
	var loaders sync.WaitGroup
	for l := 0; l < rebuildLoaders; l++ {
		loaders.Add(1)
		go func() {
			defer loaders.Done()
			for pg := range pages {
				var r loaded
				if r.err = pg.err; r.err == nil {
					r.err = loadAll(ctx, blocks, pg.states, &r.pr)
				}
				select {
				case results <- r:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	go func() {
		loaders.Wait()
		close(results)
	}()
	for r := range results {
		pr.Done += r.pr.Done
		pr.Loaded += r.pr.Loaded
		if r.err != nil {
			cancel()
			for range results {
			}
			return pr, r.err
		}
		if progress != nil {
			progress(pr)
		}
	}
	return pr, ctx.Err()
}

// rebuildReaders is how many customer id ranges a rebuild reads in
// parallel; rebuildLoaders how many pages load into the store at once.
const (
	rebuildReaders = 4
	rebuildLoaders = 4
)

// rebuildRange is reader r's customer ids: after from (exclusive: the page
// read is "greater than"), before to (nil: no end), between the cuts.
func rebuildRange(r int, cuts []uuid.UUID) (from uuid.UUID, to *uuid.UUID) {
	if r > 0 {
		// "Greater than" from: step back to the last id before the cut.
		from = prevID(cuts[r-1])
	}
	if r < len(cuts) {
		to = &cuts[r]
	}
	return from, to
}

// prevID is the id just before u (u is not the zero id).
func prevID(u uuid.UUID) uuid.UUID {
	for i := len(u) - 1; i >= 0; i-- {
		if u[i] > 0 {
			u[i]--
			return u
		}
		u[i] = 0xff
	}
	return u
}

// loadChunk is how many states one pipelined LoadBatch carries: a whole
// page, so the store can batch accounts of one partition into one call.
const loadChunk = 2000

// loadAll loads a page with a few workers: a rebuild of a million accounts
// is bound by round trips, so a store that loads in batches gets chunks.
func loadAll(ctx context.Context, blocks BlockStore, states []AccountState, pr *RebuildProgress) error {
	if bl, ok := blocks.(BatchLoader); ok {
		return loadChunks(ctx, bl, states, pr)
	}
	const workers = 16
	type result struct {
		loaded bool
		err    error
	}
	jobs := make(chan AccountState)
	results := make(chan result, len(states))
	for w := 0; w < workers; w++ {
		go func() {
			for st := range jobs {
				ok, err := blocks.Load(ctx, st)
				results <- result{ok, err}
			}
		}()
	}
	for _, st := range states {
		jobs <- st
	}
	close(jobs)
	var firstErr error
	for range states {
		r := <-results
		pr.Done++
		if r.loaded {
			pr.Loaded++
		}
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
	}
	return firstErr
}

// loadChunks pipelines a page in chunks of loadChunk over a few workers.
func loadChunks(ctx context.Context, bl BatchLoader, states []AccountState, pr *RebuildProgress) error {
	const workers = 4
	type result struct {
		n, loaded int64
		err       error
	}
	jobs := make(chan []AccountState)
	results := make(chan result)
	for w := 0; w < workers; w++ {
		go func() {
			for chunk := range jobs {
				ok, err := bl.LoadBatch(ctx, chunk)
				r := result{n: int64(len(chunk)), err: err}
				for _, l := range ok {
					if l {
						r.loaded++
					}
				}
				results <- r
			}
		}()
	}
	var chunks [][]AccountState
	for i := 0; i < len(states); i += loadChunk {
		chunks = append(chunks, states[i:min(i+loadChunk, len(states))])
	}
	go func() {
		for _, c := range chunks {
			jobs <- c
		}
		close(jobs)
	}()
	var firstErr error
	for range chunks {
		r := <-results
		pr.Done += r.n
		pr.Loaded += r.loaded
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
	}
	return firstErr
}
