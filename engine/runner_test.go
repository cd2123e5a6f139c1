package engine

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// loopRunner is a Runner over a Loop whose passes return what fail says.
type loopRunner struct {
	Loop
	fail    atomic.Pointer[error]
	block   chan struct{} // a pass waits on it when set
	passes  atomic.Int64
	stopped atomic.Bool // set after the body saw its end, late on purpose
	body    func(ctx context.Context)
}

func (r *loopRunner) Name() string { return "test_loop" }

func (r *loopRunner) Start(ctx context.Context) error {
	body := r.body
	if body == nil {
		body = func(ctx context.Context) {
			r.every(ctx, 5*time.Millisecond, time.Second, func() error {
				if r.block != nil {
					select {
					case <-r.block:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				r.passes.Add(1)
				if p := r.fail.Load(); p != nil {
					return *p
				}
				return nil
			})
			time.Sleep(20 * time.Millisecond)
			r.stopped.Store(true)
		}
	}
	return r.Go(ctx, 5*time.Millisecond, body)
}

var _ Runner = (*loopRunner)(nil)

// waitPasses waits until r made n passes.
func waitPasses(t *testing.T, r *loopRunner, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for r.passes.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d passes after 5s, want %d", r.passes.Load(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestLoop: the Runner base's lifecycle and health: start, Stop waits for
// the body, a failing pass makes it unhealthy (and a later success heals
// it), Stop before Start and a second Stop or Start are harmless, a loop
// whose passes stop succeeding is stalled, and one turned off is healthy.
func TestLoop(t *testing.T) {
	t.Parallel()
	errDown := errors.New("dial tcp 10.0.0.7:5432: connection refused")
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, r *loopRunner) error // returns the health to check
		want string                                  // "" healthy, else a part of the reason
	}{
		{"not started", func(t *testing.T, r *loopRunner) error { return r.Health() }, "not started"},
		{"running and passing", func(t *testing.T, r *loopRunner) error {
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			waitPasses(t, r, 2)
			return r.Health()
		}, ""},
		{"stop waits for the body", func(t *testing.T, r *loopRunner) error {
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			waitPasses(t, r, 1)
			r.Stop()
			if !r.stopped.Load() {
				t.Fatal("Stop returned before the body ended")
			}
			return r.Health()
		}, "stopped"},
		{"failing pass", func(t *testing.T, r *loopRunner) error {
			r.fail.Store(&errDown)
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			waitPasses(t, r, 2)
			err := r.Health()
			if !errors.Is(err, errDown) {
				t.Errorf("Health() = %v, want its cause to be the pass's error", err)
			}
			if err != nil && strings.Contains(err.Error(), "10.0.0.7") {
				t.Errorf("Health() text %q shows the cause", err)
			}
			return err
		}, "failed, none succeeded yet"},
		{"healed after a failure", func(t *testing.T, r *loopRunner) error {
			r.fail.Store(&errDown)
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			waitPasses(t, r, 1)
			r.fail.Store(nil)
			n := r.passes.Load()
			waitPasses(t, r, n+2)
			return r.Health()
		}, ""},
		{"stalled", func(t *testing.T, r *loopRunner) error {
			r.stallAfter = 30 * time.Millisecond
			r.block = make(chan struct{})
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			time.Sleep(60 * time.Millisecond)
			return r.Health()
		}, "stalled"},
		{"stop before start", func(t *testing.T, r *loopRunner) error {
			r.Stop()
			if err := r.Start(context.Background()); !errors.Is(err, ErrRunnerStarted) {
				t.Fatalf("Start after Stop = %v, want ErrRunnerStarted", err)
			}
			time.Sleep(20 * time.Millisecond)
			if r.passes.Load() != 0 {
				t.Fatal("a stopped loop ran")
			}
			return r.Health()
		}, "stopped"},
		{"double stop", func(t *testing.T, r *loopRunner) error {
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			r.Stop()
			r.Stop()
			return r.Health()
		}, "stopped"},
		{"double start", func(t *testing.T, r *loopRunner) error {
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			if err := r.Start(context.Background()); !errors.Is(err, ErrRunnerStarted) {
				t.Fatalf("second Start = %v, want ErrRunnerStarted", err)
			}
			return r.Health()
		}, ""},
		{"parent context ends", func(t *testing.T, r *loopRunner) error {
			ctx, cancel := context.WithCancel(context.Background())
			if err := r.Start(ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			waitPasses(t, r, 1)
			cancel()
			time.Sleep(50 * time.Millisecond)
			return r.Health()
		}, "exited"},
		{"body exits on its own", func(t *testing.T, r *loopRunner) error {
			r.body = func(context.Context) {}
			if err := r.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			time.Sleep(10 * time.Millisecond)
			return r.Health()
		}, "exited"},
		{"off", func(t *testing.T, r *loopRunner) error {
			if err := r.Off(); err != nil {
				t.Fatal(err)
			}
			r.Stop()
			return r.Health()
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &loopRunner{}
			err := tc.run(t, r)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Health() = %v, want healthy", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Health() = %v, want %q", err, tc.want)
			}
			var u *Unhealthy
			if err != nil && !errors.As(err, &u) {
				t.Fatalf("Health() = %T, want *Unhealthy", err)
			}
		})
	}
}

// TestLoopStopCancelledPassNotFailure: a pass cut short by Stop is not
// recorded as a failure.
func TestLoopStopCancelledPassNotFailure(t *testing.T) {
	t.Parallel()
	r := &loopRunner{block: make(chan struct{})}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.Stop()
	if n := r.failures.Load(); n != 0 {
		t.Fatalf("%d failures recorded for a pass the stop ended", n)
	}
}
