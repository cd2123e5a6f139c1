package idempotency_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine/idempotency"
	"github.com/creditd/creditd/engine/idempotency/idempotencytest"
)

// TestRerunMarksBatch: marks queued together travel in a few MarkRerun
// calls, every claim ends with the rerun mark, and closing the writer
// writes what is still queued; only a full queue refuses a mark (its
// request then writes it itself).
func TestRerunMarksBatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		marks    int
		maxCalls int
	}{
		{"one", 1, 1},
		{"a burst", 300, 300 / 10},
		{"a full queue", idempotency.MaxMarksInFlight + 50, idempotency.MaxMarksInFlight},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			recs := idempotencytest.New()
			c := idempotency.NewClaims(recs, zerolog.Nop(), errUnavailable)
			tenant := uuid.New()
			refused := 0
			for i := range tc.marks {
				key := fmt.Sprintf("k%d", i)
				if _, claimed, _ := recs.Begin(context.Background(), tenant, key, "rh", time.Minute); !claimed {
					t.Fatalf("%s not claimed", key)
				}
				if !c.QueueMark(idempotency.RerunMark{Tenant: tenant, Key: key, RequestHash: "rh"}, time.Now()) {
					refused++
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c.Close(ctx)
			if ctx.Err() != nil {
				t.Fatal("close did not return")
			}
			// The writer drains the queue as it fills, so a burst over its
			// size may or may not be refused in part.
			if want := max(tc.marks-idempotency.MaxMarksInFlight, 0); refused > want {
				t.Errorf("refused %d marks, want at most %d", refused, want)
			}
			marked := 0
			for i := range tc.marks {
				if rec, _ := recs.Record(tenant, fmt.Sprintf("k%d", i)); rec.Done && rec.Rerun {
					marked++
				}
			}
			if marked != tc.marks-refused {
				t.Errorf("%d of %d taken marks written", marked, tc.marks-refused)
			}
			_, _, calls := recs.Calls()
			if calls < 1 || calls > tc.maxCalls {
				t.Errorf("%d MarkRerun calls for %d marks, want 1 to %d", calls, tc.marks, tc.maxCalls)
			}
		})
	}
}

// TestRerunMarksRetried: a batch whose write fails (Redis restarting) is
// written once Redis answers again, so a retry of the acknowledged request
// finds the rerun mark instead of a claim that outlived its answer (which
// would wait and get 409 "still in progress"); a claim already lapsed is
// not marked.
func TestRerunMarksRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		fails     int
		claimedAt time.Duration // before now
		wantMark  bool
	}{
		{"written at once", 0, 0, true},
		{"written after two failed tries", 2, 0, true},
		{"lapsed claim left alone", 1, idempotency.LockTTL + time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			recs := idempotencytest.New()
			recs.FailMarks(tc.fails)
			c := idempotency.NewClaims(recs, zerolog.Nop(), errUnavailable)
			c.OneAbortSlot()
			tenant := uuid.New()
			if _, claimed, _ := recs.Begin(context.Background(), tenant, "k", "rh", time.Minute); !claimed {
				t.Fatal("not claimed")
			}
			c.WriteMark(idempotency.RerunMark{Tenant: tenant, Key: "k", RequestHash: "rh"}, time.Now().Add(-tc.claimedAt))
			deadline := time.Now().Add(time.Duration(tc.fails+2) * idempotency.AbortRetry * 2)
			var rec idempotency.Record
			for time.Now().Before(deadline) {
				if rec, _ = recs.Record(tenant, "k"); rec.Rerun {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if rec.Rerun != tc.wantMark {
				t.Errorf("rerun mark written = %v, want %v", rec.Rerun, tc.wantMark)
			}
		})
	}
}
