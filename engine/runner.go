package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Runner is one background loop of a creditd process: the persister, the
// sweeps, webhook delivery, the scheduler, the reconcile sampler.
// internal/app lists them once, starts and stops them in one loop, and
// /readyz shows each one's Health under its Name.
type Runner interface {
	// Name is the loop's key in /readyz and in the metrics.
	Name() string
	// Start runs the loop in the background until Stop or ctx ends; it
	// fails only when the loop was started before.
	Start(ctx context.Context) error
	// Stop ends the loop and returns once it has stopped. It is safe
	// before Start (the loop then never starts) and more than once.
	Stop()
	// Health is nil, or an *Unhealthy saying why not: not started,
	// stopped, its last pass failed, or no pass succeeded for a while.
	Health() error
}

// ErrRunnerStarted is Start on a Runner started (or stopped) before.
var ErrRunnerStarted = errors.New("engine: runner already started")

// Unhealthy is why a Runner is unhealthy. Its text names no host or
// address (/readyz shows it without a key); Cause, for the log, may.
type Unhealthy struct {
	Reason string
	Cause  error
}

// Error is the public reason.
func (u *Unhealthy) Error() string { return u.Reason }

// Unwrap is the cause of the last failed pass, if any.
func (u *Unhealthy) Unwrap() error { return u.Cause }

// Stall bounds: a loop is stalled once no pass succeeded for stallPasses
// of its intervals, and never sooner than minStall (a pass that pages
// through a backlog may outlast a short interval).
const (
	stallPasses = 3
	minStall    = 10 * time.Second
)

// Loop states.
const (
	loopIdle int32 = iota
	loopRunning
	loopOff
	loopStopped
)

// Loop is the start/stop/health bookkeeping a Runner embeds, done once:
// the Runner's Start hands Go its body and interval, the body reports each
// pass with Pass (or runs its passes through every), and Stop and Health
// come from here. The zero Loop is ready to use; it is safe for concurrent
// use.
type Loop struct {
	mu       sync.Mutex
	state    int32
	cancel   context.CancelFunc
	done     chan struct{}
	interval time.Duration
	// stallAfter overrides the stall bound (tests).
	stallAfter time.Duration

	started, lastOK, lastFail atomic.Int64 // unix ns; 0: never
	failures                  atomic.Int64 // failed passes in a row
	lastErr                   atomic.Pointer[error]
}

// Go starts body in its own goroutine, with a context Stop cancels;
// interval is how often body reports a pass (the stall bound is counted
// in it). It returns ErrRunnerStarted when the loop ran before or was
// stopped.
func (l *Loop) Go(ctx context.Context, interval time.Duration, body func(ctx context.Context)) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != loopIdle {
		return ErrRunnerStarted
	}
	ctx, cancel := context.WithCancel(ctx)
	l.state, l.cancel, l.done, l.interval = loopRunning, cancel, make(chan struct{}), interval
	l.started.Store(time.Now().UnixNano())
	go func() {
		defer close(l.done)
		body(ctx)
	}()
	return nil
}

// Off marks a loop its configuration turns off (the reconcile sampler
// with no sample size): it never runs and is healthy.
func (l *Loop) Off() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != loopIdle {
		return ErrRunnerStarted
	}
	l.state = loopOff
	return nil
}

// Stop cancels the body and waits for it to return.
func (l *Loop) Stop() {
	l.mu.Lock()
	if l.state == loopRunning {
		l.cancel()
	}
	if l.state != loopOff {
		l.state = loopStopped
	}
	done := l.done
	l.mu.Unlock()
	if done != nil {
		<-done
	}
}

// Pass records the outcome of one pass: nil is a success. A pass cut
// short by the loop's own stop is not a failure, so callers pass only
// errors they would log.
func (l *Loop) Pass(err error) {
	now := time.Now().UnixNano()
	if err == nil {
		l.lastOK.Store(now)
		l.failures.Store(0)
		return
	}
	l.lastErr.Store(&err)
	l.lastFail.Store(now)
	l.failures.Add(1)
}

// LastSuccess is when a pass last succeeded (zero: never).
func (l *Loop) LastSuccess() time.Time {
	if ns := l.lastOK.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Health is nil while the loop runs and its passes succeed.
func (l *Loop) Health() error {
	l.mu.Lock()
	state, done, interval := l.state, l.done, l.interval
	l.mu.Unlock()
	switch state {
	case loopIdle:
		return &Unhealthy{Reason: "not started"}
	case loopOff:
		return nil
	case loopStopped:
		return &Unhealthy{Reason: "stopped"}
	}
	select {
	case <-done:
		return &Unhealthy{Reason: "exited"}
	default:
	}
	now := time.Now()
	var cause error
	if p := l.lastErr.Load(); p != nil {
		cause = *p
	}
	if n := l.failures.Load(); n == 1 {
		return &Unhealthy{Reason: "last pass failed, " + l.since(now), Cause: cause}
	} else if n > 1 {
		return &Unhealthy{Reason: fmt.Sprintf("last %d passes failed, %s", n, l.since(now)), Cause: cause}
	}
	stall := l.stallAfter
	if stall <= 0 {
		stall = max(stallPasses*interval, minStall)
	}
	from := l.lastOK.Load()
	if from == 0 {
		from = l.started.Load()
	}
	if idle := now.Sub(time.Unix(0, from)); idle > stall {
		return &Unhealthy{Reason: fmt.Sprintf("stalled: no pass succeeded for %s (interval %s)", roughly(idle), interval), Cause: cause}
	}
	return nil
}

// since says when a pass last succeeded.
func (l *Loop) since(now time.Time) string {
	ok := l.lastOK.Load()
	if ok == 0 {
		return "none succeeded yet"
	}
	return fmt.Sprintf("last success %s ago", roughly(now.Sub(time.Unix(0, ok))))
}

// roughly is d to the second, or to the millisecond under one.
func roughly(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

// every runs pass at once and then every interval (def when interval is
// not positive) until ctx ends, recording each outcome: the loop of the
// sweeps, the scheduler and the sampler. A pass that fails after ctx
// ended is the stop, not a failure.
func (l *Loop) every(ctx context.Context, interval, def time.Duration, pass func() error) {
	interval = cmpOr(interval, def)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		l.passed(ctx, pass())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// passed records err as a pass unless ctx ended meanwhile.
func (l *Loop) passed(ctx context.Context, err error) {
	if err != nil && ctx.Err() != nil {
		return
	}
	l.Pass(err)
}

// cmpOr is v, or def when v is not positive.
func cmpOr[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
