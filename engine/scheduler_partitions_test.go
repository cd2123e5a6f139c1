package engine

import (
	"context"
	"errors"
	"testing"
	"time"
)

// fakePartitions counts EnsurePartitions calls and fails while err is set.
type fakePartitions struct {
	calls int
	err   error
}

func (f *fakePartitions) EnsurePartitions(context.Context, time.Time) (int, int64, error) {
	f.calls++
	return 0, 0, f.err
}

// TestSchedulerKeepsPartitions (issue 30 item 1): the scheduler makes the
// coming months' partitions at its first pass, then once an hour; a
// failed call is retried at the next pass, not an hour later.
func TestSchedulerKeepsPartitions(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	steps := []struct {
		at        time.Duration // since t0
		fail      bool
		wantCalls int // total after the pass
	}{
		{0, false, 1},                       // the first pass makes them
		{time.Second, false, 1},             // within the hour: nothing
		{59 * time.Minute, false, 1},        // still within it
		{time.Hour, true, 2},                // an hour on: called, fails
		{time.Hour + time.Second, false, 3}, // retried at the next pass
		{time.Hour + time.Minute, false, 3}, // then quiet for an hour
		{2*time.Hour + time.Second, false, 4},
	}
	keeper := &fakePartitions{}
	s := &Scheduler{Partitions: keeper}
	for _, st := range steps {
		keeper.err = nil
		if st.fail {
			keeper.err = errors.New("lock timeout")
		}
		s.keepPartitions(context.Background(), t0.Add(st.at))
		if keeper.calls != st.wantCalls {
			t.Fatalf("after the pass at +%v: %d calls, want %d", st.at, keeper.calls, st.wantCalls)
		}
	}
	// Without a keeper the pass skips the step.
	(&Scheduler{}).keepPartitions(context.Background(), t0)
}
