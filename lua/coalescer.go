package lua

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// coalescer shares Redis round trips among concurrent requests: a request's
// single command (an idempotency claim, a money script, a check's account
// read) that finds fewer than maxTripsInFlight round trips under way goes
// out at once, with whatever queued meanwhile; one that finds them all busy
// queues, and the next round trip to finish carries the queue in one
// pipeline. At low load nothing waits; under load a request costs creditd
// and Redis a share of one write and one read syscall instead of a pair of
// its own per command. go-redis pipelines run the client's hooks (the 503
// classification, telemetry) and, on a Cluster, split by node and follow
// MOVED and ASK, so each command ends as it would alone. Nothing runs in
// the background between round trips: a queued command always has a round
// trip in flight that will carry it, so a shutdown that waits for its
// requests drains the queue.
type coalescer struct {
	rdb redis.UniversalClient
	// off sends every command alone, on the caller's goroutine
	// (Store.WithCoalescing).
	off      bool
	mu       sync.Mutex
	inFlight int
	queue    []*tripCmd
}

// maxTripsInFlight bounds the coalescer's concurrent round trips (and so the
// connections they hold): one slow pipeline does not stall the others.
// maxTripCommands bounds one pipeline.
const (
	maxTripsInFlight = 4
	maxTripCommands  = 256
)

// The states of a tripCmd: queued until a round trip takes it (sent) or
// drops it (its caller's context ended first), or its caller leaves it.
const (
	tripQueued int32 = iota
	tripSent
	tripDropped
	tripLeft
)

// tripCmd is one command handed to the coalescer; pooled with its channel.
type tripCmd struct {
	ctx context.Context
	cmd redis.Cmder
	// more are commands sent right after cmd in the same round trip
	// (doGroup): one request's independent commands.
	more  []redis.Cmder
	state atomic.Int32
	done  chan struct{} // one signal when a queued command is answered or dropped
}

var tripCmds = sync.Pool{New: func() any { return &tripCmd{done: make(chan struct{}, 1)} }}

// errLeftInFlight: the caller's context ended while its command was on its
// way to Redis or back, so whether it ran is unknown, as for a command whose
// read timed out. It is an UnavailableError (a 503: retry with the same
// idempotency key, which replays what ran).
var errLeftInFlight = errors.New("lua: the request ended while its Redis command was in flight; its outcome is unknown")

// do sends cmd and returns its error. A command whose ctx is done, or past
// its deadline, when its round trip is built is never written: its error is
// the context's. On an error the caller reads the returned error, never cmd
// (a pipeline the caller left may still be writing it).
func (co *coalescer) do(ctx context.Context, cmd redis.Cmder) error {
	return co.doGroup(ctx, cmd, nil)
}

// doGroup is do for cmd and more, written together in one round trip
// (and so to one pipeline); each command carries its own answer or error,
// and the error returned is cmd's. On an error the caller reads the
// commands only when the returned error is cmd's own (a dropped or left
// group was never answered).
func (co *coalescer) doGroup(ctx context.Context, cmd redis.Cmder, more []redis.Cmder) error {
	now := time.Now()
	if err := ended(ctx, now); err != nil {
		return err
	}
	if co.off {
		if len(more) == 0 {
			return co.rdb.Process(ctx, cmd)
		}
		pipe := co.rdb.Pipeline()
		_ = pipe.Process(ctx, cmd)
		for _, m := range more {
			_ = pipe.Process(ctx, m)
		}
		_, _ = pipe.Exec(ctx)
		return cmd.Err()
	}
	t := tripCmds.Get().(*tripCmd)
	t.ctx, t.cmd, t.more = ctx, cmd, more
	co.mu.Lock()
	if co.inFlight < maxTripsInFlight {
		co.inFlight++
		t.state.Store(tripSent)
		trip := append(make([]*tripCmd, 0, 1+min(len(co.queue), maxTripCommands-1)), t)
		trip = co.take(trip, now)
		co.mu.Unlock()
		co.send(trip, t)
		co.next()
		return co.release(t)
	}
	t.state.Store(tripQueued)
	co.queue = append(co.queue, t)
	co.mu.Unlock()
	select {
	case <-t.done:
		return co.release(t)
	case <-ctx.Done():
	}
	select {
	case <-t.done: // answered meanwhile
		return co.release(t)
	default:
	}
	if t.state.CompareAndSwap(tripQueued, tripLeft) || t.state.Load() == tripDropped {
		// Never written; a dropped or left tripCmd is not pooled (the
		// queue or the signal may still hold it).
		return ctx.Err()
	}
	return &UnavailableError{Err: fmt.Errorf("%w: %w", errLeftInFlight, ctx.Err())}
}

// ended is ctx's error, or context.DeadlineExceeded once its deadline is at
// or before now even if its timer has not fired yet.
func ended(ctx context.Context, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !now.Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// release returns t to the pool once its command is answered, with the
// command's error.
func (co *coalescer) release(t *tripCmd) error {
	err := t.cmd.Err()
	*t = tripCmd{done: t.done}
	tripCmds.Put(t)
	return err
}

// take moves queued commands into trip, up to maxTripCommands in all; a
// command whose context ended (or whose deadline is at or before now) is
// dropped and answered with the context's error; co.mu is held.
func (co *coalescer) take(trip []*tripCmd, now time.Time) []*tripCmd {
	n := 0
	for n < len(co.queue) && len(trip) < maxTripCommands {
		t := co.queue[n]
		n++
		if err := ended(t.ctx, now); err != nil {
			if t.state.CompareAndSwap(tripQueued, tripDropped) {
				t.cmd.SetErr(err)
				for _, m := range t.more {
					m.SetErr(err)
				}
				t.done <- struct{}{}
			}
			continue
		}
		if t.state.CompareAndSwap(tripQueued, tripSent) {
			trip = append(trip, t)
		}
	}
	clear(co.queue[:n])
	co.queue = append(co.queue[:0], co.queue[n:]...)
	return trip
}

// next hands the queue gathered during a round trip to a new round trip,
// or gives the slot back.
func (co *coalescer) next() {
	co.mu.Lock()
	trip := co.take(nil, time.Now())
	if len(trip) == 0 {
		co.inFlight--
		co.mu.Unlock()
		return
	}
	co.mu.Unlock()
	go func() {
		co.send(trip, nil)
		co.next()
	}()
}

// send writes trip as one round trip and wakes each command's caller but
// self's (who runs it). A command alone goes out under its own context, as
// it would without the coalescer; a pipeline runs under none of its
// callers' cancellations or deadlines (one caller's must not cut the
// others' replies), bounded by the client's read and write timeouts.
func (co *coalescer) send(trip []*tripCmd, self *tripCmd) {
	if len(trip) == 1 && len(trip[0].more) == 0 {
		_ = co.rdb.Process(trip[0].ctx, trip[0].cmd)
	} else {
		ctx := context.WithoutCancel(trip[0].ctx)
		pipe := co.rdb.Pipeline()
		for _, t := range trip {
			_ = pipe.Process(ctx, t.cmd)
			for _, m := range t.more {
				_ = pipe.Process(ctx, m)
			}
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
	}
	for _, t := range trip {
		if t != self {
			t.done <- struct{}{}
		}
	}
}
