package persist

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// Partition ownership (issue 25, docs/decisions.md "One owner per outbox
// partition"). When the outbox hands out partition leases
// (engine.OutboxLeases), a partition is read by its owner alone, so one
// customer's entries are committed in stream order whichever node runs
// them: every node reading every partition of the shared consumer group
// split consecutive entries between nodes, and each node's group commit
// could land before the other's.
//
// Every ClaimIdle/claimLooks the balancer of each persister announces it
// as live, counts the live ones (n), renews its leases and takes free
// partitions while it owns fewer than its share, ceil(partitions/n); a
// partition seen free on two passes in a row is taken whatever the share,
// so none is left unread. One that owns more than its share gives the
// extra ones up after their current batch. A lease lasts ClaimIdle, so a
// dead node's partitions are taken within ClaimIdle + ClaimIdle/claimLooks
// of its last renewal, as the claim of its messages was before. The new
// owner first persists every entry still pending in the group, in stream
// order (the old owner's unacknowledged batch), then reads new ones.

// leaseSafetyDiv: 1/leaseSafetyDiv of a lease is what this persister does
// not count on (the time Redis may take to receive the renewal it sent,
// and what the clocks' rates may differ by).
const leaseSafetyDiv = 10

// handOverPasses is how many balancing passes a persister leaves alone a
// partition it handed over (above its share, or its writes failing), so
// that another one takes it.
const handOverPasses = 2

// partitionLease is this persister's lease of one partition while a loop
// of its own runs the partition under it.
type partitionLease struct {
	part  int
	token int64
	// cancel ends the partition loop: the lease was lost, or Run ends.
	cancel context.CancelFunc
	// validUntil (Unix ns) is when the lease may have lapsed in Redis, as
	// counted from the last take or renewal sent: no read starts that could
	// still deliver entries past it.
	validUntil atomic.Int64
	// shed asks the loop to stop after its current batch and hand the
	// partition over (this persister owns more than its share).
	shed atomic.Bool
	done chan struct{}
}

// extend counts the lease valid for ttl from sent, less leaseSafetyDiv.
func (l *partitionLease) extend(sent time.Time, ttl time.Duration) {
	l.validUntil.Store(sent.Add(ttl - ttl/leaseSafetyDiv).UnixNano())
}

// readable tells whether the loop may start a read that waits up to
// block: the lease is not being given up and lasts past the read.
func (l *partitionLease) readable(block time.Duration) bool {
	return !l.shed.Load() && time.Now().Add(block).UnixNano() < l.validUntil.Load()
}

// lease is the lease partition part runs under, nil without leases.
func (p *Persister) lease(part int) *partitionLease {
	if p.held == nil {
		return nil
	}
	return p.held[part].Load()
}

// balancer is one persister's share-keeping state; only runLeased's
// goroutine touches it.
type balancer struct {
	p   *Persister
	log zerolog.Logger
	ttl time.Duration
	// tick is the time between passes, and the bound of each call.
	tick  time.Duration
	parts int
	// order is the partitions in this persister's order of preference
	// (starting at a point its name picks), so the nodes of a fleet start
	// from different partitions and give up the ones they prefer least.
	order    []int
	owned    map[int]*partitionLease
	seenFree []int
	// pause counts the passes this persister leaves a partition it handed
	// over to the others.
	pause []int
	live  int
	wg    *sync.WaitGroup
}

// runLeased keeps this persister's share of the partitions until ctx ends,
// running a partition loop for each partition it owns; on the way out it
// releases every lease and withdraws from the live persisters, so the
// others take over at once.
func (p *Persister) runLeased(ctx context.Context, wg *sync.WaitGroup) {
	parts := p.outbox.Partitions()
	h := fnv.New32a()
	_, _ = h.Write([]byte(p.cfg.Consumer))
	start := int(h.Sum32() % uint32(parts))
	tick := max(p.cfg.ClaimIdle/claimLooks, time.Millisecond)
	b := &balancer{p: p, log: p.log, ttl: p.cfg.ClaimIdle, tick: tick, parts: parts, owned: map[int]*partitionLease{},
		seenFree: make([]int, parts), pause: make([]int, parts), live: 1, wg: wg}
	for i := range parts {
		b.order = append(b.order, (start+i)%parts)
	}
	defer b.stop(ctx)
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		p.Pass(b.pass(ctx))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pass is one round of the balancer: announce, renew, take, shed.
func (b *balancer) pass(ctx context.Context) error {
	leases, consumer := b.p.leases, b.p.cfg.Consumer
	for part, l := range b.owned {
		select {
		case <-l.done:
			delete(b.owned, part)
			if l.shed.Load() {
				// Handed over: the others have the first passes at it.
				b.pause[part] = handOverPasses
			}
		default:
		}
	}
	// Every call is bounded by a pass, and the renewals run at once: a
	// Redis node that does not answer delays neither the renewals of the
	// leases on the others nor the next pass.
	actx, acancel := context.WithTimeout(ctx, b.tick)
	live, announceErr := leases.Persisters(actx, consumer, b.ttl)
	acancel()
	if announceErr == nil {
		b.live = max(live, 1)
		b.p.live.Store(int64(b.live))
	} else if ctx.Err() == nil {
		b.log.Warn().Err(announceErr).Msg("persister announcement failed")
	}
	rctx, rcancel := context.WithTimeout(ctx, b.tick)
	var renewals sync.WaitGroup
	for part, l := range b.owned {
		renewals.Add(1)
		go func() {
			defer renewals.Done()
			sent := time.Now()
			ok, err := leases.RenewPartition(rctx, part, consumer, l.token, b.ttl)
			switch {
			case err != nil:
				// The loop stops by itself once the lease may have lapsed.
				if ctx.Err() == nil {
					b.log.Warn().Err(err).Int("partition", part).Msg("outbox partition lease renewal failed")
				}
			case ok:
				l.extend(sent, b.ttl)
			default:
				b.log.Warn().Int("partition", part).Int64("token", l.token).Msg("outbox partition lost to another persister")
				l.cancel()
			}
		}()
	}
	renewals.Wait()
	rcancel()
	// Without the announcement (its key's Redis node may be the one down)
	// the last count stands: the partitions on the other nodes go on.
	share := (b.parts + b.live - 1) / b.live
	octx, ocancel := context.WithTimeout(ctx, b.tick)
	owners, err := leases.PartitionOwners(octx)
	ocancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		b.log.Warn().Err(err).Msg("outbox partition owners unreadable")
		return err
	}
	// All takes of a pass share one deadline: a lease on a Redis node that
	// does not answer is tried again at the next pass, not waited for.
	tctx, tcancel := context.WithTimeout(ctx, b.tick)
	defer tcancel()
	var takeErr error
	for _, part := range b.order {
		if tctx.Err() != nil {
			break
		}
		if _, mine := b.owned[part]; mine {
			b.seenFree[part] = 0
			continue
		}
		// A lease under this consumer's name that no loop of its runs under
		// is from an earlier run of it: free to take again.
		if o := owners[part]; o != "" && o != consumer {
			b.seenFree[part] = 0
			continue
		}
		b.seenFree[part]++
		if b.pause[part] > 0 {
			b.pause[part]--
			continue
		}
		if b.active() >= share && b.seenFree[part] < 2 {
			continue
		}
		sent := time.Now()
		token, ok, err := leases.TakePartition(tctx, part, consumer, b.ttl)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			b.log.Warn().Err(err).Int("partition", part).Msg("outbox partition take failed")
			takeErr = err
			continue
		}
		if ok {
			b.seenFree[part] = 0
			b.run(ctx, part, token, sent)
		}
	}
	// Give up the extra partitions this persister prefers least, when a
	// live persister owns fewer than its fair part (one that just joined):
	// extras taken because their owner died while the count still had it
	// stay until the count catches up, rather than going round the fleet.
	for i := len(b.order) - 1; i >= 0 && b.active() > share && b.starved(owners); i-- {
		if l, mine := b.owned[b.order[i]]; mine && !l.shed.Load() {
			b.log.Info().Int("partition", l.part).Int("share", share).Int("persisters", b.live).Msg("outbox partition handed over: more than this persister's share")
			l.shed.Store(true)
		}
	}
	b.p.ownedParts.Store(int64(b.active()))
	if ctx.Err() != nil {
		return nil
	}
	return errors.Join(announceErr, takeErr)
}

// starved tells whether, by owners, some live persister owns fewer than
// partitions/live (rounded down), or none.
func (b *balancer) starved(owners []string) bool {
	counts := map[string]int{}
	for _, o := range owners {
		if o != "" {
			counts[o]++
		}
	}
	if len(counts) < b.live {
		return true
	}
	for _, n := range counts {
		if n < b.parts/b.live {
			return true
		}
	}
	return false
}

// active counts the partitions owned and not being given up.
func (b *balancer) active() int {
	n := 0
	for _, l := range b.owned {
		if !l.shed.Load() {
			n++
		}
	}
	return n
}

// run starts the loop of part under the lease taken with token at sent; the
// loop releases the lease when it ends (nothing when it was lost).
func (b *balancer) run(ctx context.Context, part int, token int64, sent time.Time) {
	p := b.p
	lctx, cancel := context.WithCancel(ctx)
	l := &partitionLease{part: part, token: token, cancel: cancel, done: make(chan struct{})}
	l.extend(sent, b.ttl)
	p.held[part].Store(l)
	b.owned[part] = l
	b.log.Info().Int("partition", part).Int64("token", token).Msg("outbox partition taken")
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer close(l.done)
		defer cancel()
		p.runPartition(lctx, part, l)
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
		defer rcancel()
		if err := p.leases.ReleasePartition(rctx, part, p.cfg.Consumer, token); err != nil {
			b.log.Warn().Err(err).Int("partition", part).Msg("outbox partition release failed; it lapses by itself")
		}
	}()
}

// stop ends every partition loop, waits for each to release its lease, and
// withdraws this persister from the live ones.
func (b *balancer) stop(ctx context.Context) {
	for _, l := range b.owned {
		l.cancel()
	}
	for _, l := range b.owned {
		<-l.done
	}
	b.p.ownedParts.Store(0)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	if _, err := b.p.leases.Persisters(wctx, b.p.cfg.Consumer, 0); err != nil {
		b.log.Warn().Err(err).Msg("persister withdrawal failed; it lapses by itself")
	}
}

// takeOver persists, in stream order, every entry of part still pending in
// the consumer group (the previous owner's unacknowledged batch, or this
// consumer's own from an earlier run) before the loop reads new ones; it
// reports false when the loop should end instead.
func (p *Persister) takeOver(ctx context.Context, log zerolog.Logger, part int, l *partitionLease) bool {
	backoff := newBackoff()
	for ctx.Err() == nil {
		if !l.readable(0) {
			return false
		}
		msgs, err := p.outbox.Claim(ctx, part, p.cfg.Consumer, 0, p.cfg.BatchSize)
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			if p.setAside(ctx, log, part, err) {
				continue
			}
			log.Error().Err(err).Msg("outbox take-over claim failed")
			p.Pass(err)
			backoff.wait(ctx)
			continue
		}
		if len(msgs) == 0 {
			return true
		}
		log.Info().Int("count", len(msgs)).Msg("persisting the pending entries of the partition's previous owner")
		p.persistRenewed(ctx, log, part, msgs)
	}
	return false
}
