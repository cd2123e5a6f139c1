package idempotency

import "time"

// Hooks of the external tests (package idempotency_test, which share
// idempotencytest's Records with api's tests) into a Claims' insides.

// SetWait sets how long a duplicate waits for its twin.
func (c *Claims) SetWait(d time.Duration) { c.wait = d }

// WaitFor is how long a duplicate waits for its twin.
func (c *Claims) WaitFor() time.Duration { return c.wait }

// QueueMark queues mark, claimed at claimedAt, with the batch writer, and
// says whether it took it.
func (c *Claims) QueueMark(mark RerunMark, claimedAt time.Time) bool {
	return c.marks.add(pendingMark{mark: mark, claimedAt: claimedAt})
}

// WriteMark writes mark, claimed at claimedAt, as the batch writer does.
func (c *Claims) WriteMark(mark RerunMark, claimedAt time.Time) {
	c.marks.write([]pendingMark{{mark: mark, claimedAt: claimedAt}})
}

// OneAbortSlot leaves the Claims one slot for a retried Abort.
func (c *Claims) OneAbortSlot() { c.abortSlots = make(chan struct{}, 1) }
