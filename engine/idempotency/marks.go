package idempotency

import (
	"context"
	"sync"
	"time"
)

// pendingMark is a claim waiting for its rerun mark.
type pendingMark struct {
	mark      RerunMark
	claimedAt time.Time
	reqID     []byte
}

// rerunMarks is the batch writer of rerun marks (MarkLinger,
// MaxMarkBatch). Its queue holds at most MaxMarksInFlight marks; when it
// is full the caller writes its mark itself before answering, so a slow
// Redis slows requests instead of piling marks up.
type rerunMarks struct {
	c     *Claims
	queue chan pendingMark
	start sync.Once
	stop  chan struct{}
	done  chan struct{}
	// stopOnce guards stop: Close may be called more than once.
	stopOnce sync.Once
}

func newRerunMarks(c *Claims) *rerunMarks {
	return &rerunMarks{c: c, queue: make(chan pendingMark, MaxMarksInFlight),
		stop: make(chan struct{}), done: make(chan struct{})}
}

// add queues m and reports whether it was taken; the writer starts with the
// first mark (a server that never answers a money request runs none).
func (w *rerunMarks) add(m pendingMark) bool {
	w.start.Do(func() { go w.run() })
	select {
	case w.queue <- m:
		return true
	default:
		return false
	}
}

// run writes the queued marks in batches until close.
func (w *rerunMarks) run() {
	defer close(w.done)
	batch := make([]pendingMark, 0, MaxMarkBatch)
	for {
		select {
		case m := <-w.queue:
			batch = append(batch[:0], m)
		case <-w.stop:
			w.drain(batch[:0])
			return
		}
		timer := time.NewTimer(MarkLinger)
	gather:
		for len(batch) < MaxMarkBatch {
			select {
			case m := <-w.queue:
				batch = append(batch, m)
			case <-timer.C:
				break gather
			case <-w.stop:
				break gather
			}
		}
		timer.Stop()
		w.write(batch)
	}
}

// drain writes what is queued when the server stops.
func (w *rerunMarks) drain(batch []pendingMark) {
	for {
		select {
		case m := <-w.queue:
			batch = append(batch, m)
			if len(batch) < MaxMarkBatch {
				continue
			}
		default:
		}
		if len(batch) == 0 {
			return
		}
		w.write(batch)
		batch = batch[:0]
	}
}

// write finishes batch's claims in one MarkRerun. A failed write (Redis
// restarting or failing over) is tried again until it lands or the claims
// lapse (retryMarks): a claim outliving the answer it stands for would
// make a retry of an acknowledged request wait and get 409 "still in
// progress" until it lapsed, where it must get the first answer.
func (w *rerunMarks) write(batch []pendingMark) {
	if err := w.mark(batch); err != nil {
		w.retryMarks(append([]pendingMark(nil), batch...), err)
	}
}

// mark writes the rerun marks of batch's claims that have not lapsed.
func (w *rerunMarks) mark(batch []pendingMark) error {
	marks := make([]RerunMark, 0, len(batch))
	for _, p := range batch {
		if time.Since(p.claimedAt) >= LockTTL {
			continue // lapsed: a retry runs afresh into the op key
		}
		m := p.mark
		m.Held = held(p.claimedAt)
		marks = append(marks, m)
	}
	if len(marks) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), LockTTL/2)
	defer cancel()
	return w.c.records.MarkRerun(ctx, marks, ReplayWindow)
}

// retryMarks tries batch again every AbortRetry, in the background, until
// it is written or every claim in it has lapsed. The retries share the
// abort slots (Claims.abortLater): when all are taken the marks are left
// to lapse.
func (w *rerunMarks) retryMarks(batch []pendingMark, first error) {
	select {
	case w.c.abortSlots <- struct{}{}:
	default:
		w.c.log.Error().Bytes("request_id", batch[0].reqID).Int("marks", len(batch)).Err(first).
			Msg("idempotency rerun marks failed; their claims lapse and a retry re-runs into the op key")
		return
	}
	w.c.log.Warn().Bytes("request_id", batch[0].reqID).Int("marks", len(batch)).Err(first).
		Msg("idempotency rerun marks failed; trying again until they land or their claims lapse")
	go func() {
		defer func() { <-w.c.abortSlots }()
		for {
			time.Sleep(AbortRetry)
			// mark skips lapsed claims, so this ends once all have lapsed.
			if w.mark(batch) == nil {
				return
			}
		}
	}()
}

// close stops the writer after it wrote what was queued, waiting at most
// until ctx ends.
func (w *rerunMarks) close(ctx context.Context) {
	w.stopOnce.Do(func() { close(w.stop) })
	w.start.Do(func() { close(w.done) }) // never started: nothing to wait for
	select {
	case <-w.done:
	case <-ctx.Done():
	}
}
