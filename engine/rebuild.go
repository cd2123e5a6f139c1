package engine

import (
	"bytes"
	"context"
	"sync"

	"github.com/google/uuid"
)

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
