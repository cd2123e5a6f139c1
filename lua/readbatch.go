package lua

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// readBatcher coalesces the account reads of concurrent checks into
// pipelines. A read that finds fewer than maxReadsInFlight round trips
// under way runs at once (with whatever reads queued meanwhile); one that
// finds them all busy queues, and the next round trip to finish carries the
// whole queue in one pipeline. Under load a check then costs creditd and
// Redis a share of one write and one read syscall instead of a pair of its
// own; at low load nothing waits.
type readBatcher struct {
	mu       sync.Mutex
	inFlight int
	queue    []*accountRead
}

// maxReadsInFlight bounds the concurrent pipelines of account reads (and so
// the connections they hold); maxReadBatch bounds one pipeline.
const (
	maxReadsInFlight = 4
	maxReadBatch     = 128
)

// accountRead is one queued HGETALL; pooled with its channel.
type accountRead struct {
	key  string
	raw  map[string]string
	err  error
	done chan struct{}
}

var accountReads = sync.Pool{New: func() any { return &accountRead{done: make(chan struct{}, 1)} }}

// hgetall reads the hash at key, batched with concurrent reads.
func (b *readBatcher) hgetall(rdb redis.UniversalClient, key string) (map[string]string, error) {
	r := accountReads.Get().(*accountRead)
	r.key = key
	b.mu.Lock()
	if b.inFlight >= maxReadsInFlight {
		b.queue = append(b.queue, r)
		b.mu.Unlock()
		<-r.done
	} else {
		b.inFlight++
		batch := b.take(r)
		b.mu.Unlock()
		b.run(rdb, batch, r)
		b.next(rdb)
	}
	raw, err := r.raw, r.err
	*r = accountRead{done: r.done}
	accountReads.Put(r)
	return raw, err
}

// take moves up to maxReadBatch queued reads, plus self when not nil, into
// a batch; b.mu is held.
func (b *readBatcher) take(self *accountRead) []*accountRead {
	n := min(len(b.queue), maxReadBatch)
	batch := make([]*accountRead, 0, n+1)
	if self != nil {
		batch = append(batch, self)
	}
	batch = append(batch, b.queue[:n]...)
	clear(b.queue[:n])
	b.queue = append(b.queue[:0], b.queue[n:]...)
	return batch
}

// next hands the queue gathered during a round trip to a new round trip,
// or gives the slot back.
func (b *readBatcher) next(rdb redis.UniversalClient) {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.inFlight--
		b.mu.Unlock()
		return
	}
	batch := b.take(nil)
	b.mu.Unlock()
	go func() {
		b.run(rdb, batch, nil)
		b.next(rdb)
	}()
}

// run reads every key of batch in one round trip and wakes each read but
// self (whose caller is the one running it).
func (b *readBatcher) run(rdb redis.UniversalClient, batch []*accountRead, self *accountRead) {
	ctx := context.Background()
	if len(batch) == 1 {
		r := batch[0]
		r.raw, r.err = rdb.HGetAll(ctx, r.key).Result()
	} else {
		pipe := rdb.Pipeline()
		cmds := make([]*redis.MapStringStringCmd, len(batch))
		for i, r := range batch {
			cmds[i] = pipe.HGetAll(ctx, r.key)
		}
		_, _ = pipe.Exec(ctx) // each command carries its own error
		for i, r := range batch {
			r.raw, r.err = cmds[i].Result()
		}
	}
	for _, r := range batch {
		if r != self {
			r.done <- struct{}{}
		}
	}
}
