package persist

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
)

// Persister defaults (invariant 11).
const (
	// DefaultBatchSize is the most outbox messages one transaction writes.
	DefaultBatchSize = 500
	// DefaultBlock is how long one Read waits for new messages.
	DefaultBlock = 200 * time.Millisecond
	// DefaultClaimIdle is how long a message sits unacknowledged in another
	// consumer before this one takes it over (that consumer died). A live
	// consumer renews the batch it works on (renewWhile), so 3 s only runs
	// out for a dead or stalled one, or one whose Apply failed; with the
	// look every ClaimIdle/claimLooks, a dead node's batch is taken over
	// within 4 s of its last delivery, inside the readiness bound on lag
	// (5 s), so the surviving nodes stay ready (issue 11.4). A stalled
	// node's batch may be applied twice: Apply is idempotent (ON CONFLICT,
	// version-fenced upserts), so the effect is once and the cost one
	// extra write of at most a batch per partition and ClaimIdle.
	DefaultClaimIdle = 3 * time.Second
	// claimLooks is how many times per ClaimIdle a partition loop looks
	// for idle messages of other consumers: the takeover bound is
	// ClaimIdle + ClaimIdle/claimLooks.
	claimLooks = 3
	// maxBackoff caps the wait between retries of a failing Apply or Read.
	maxBackoff = 5 * time.Second
	// minBackoff is the first retry wait.
	minBackoff = 50 * time.Millisecond
	// ackTimeout bounds an Ack sent after ctx ended.
	ackTimeout = 5 * time.Second
	// drainPoll is how often Drain looks at the backlog.
	drainPoll = 20 * time.Millisecond
	// groupLinger is the longest the committer waits for more partitions'
	// batches before it commits. A transaction's fixed cost dwarfs its
	// per-row cost (persist/profile_test.go, lean COPY write: ~75 µs of
	// Postgres CPU per consume in groups of 30, ~52 in groups of 150, ~45
	// in groups of 500); at 20 ms the bench's ~1400 consumes/s make groups
	// of ~30 (1400/s × 20 ms). 100 ms makes them ~150 and keeps the
	// lag far under its 1 s bound; a read of its own write never waits for
	// it (Hurry), and a webhook is stored at most that much later.
	groupLinger = 100 * time.Millisecond
	// meteringLinger is the longest the committer waits while its group
	// holds only consumes and gauge moves. Their account, block and usage
	// rows are one upsert per customer per group, so a longer group writes
	// fewer of them per op (issue 26's rows per consume: 200 customers at
	// 1,500 consumes/s wrote 0.50 of each per consume at 100 ms). Nothing
	// waits on these batches that groupLinger protects: a read of its own
	// write hurries the committer, and a grant, reservation or any other
	// kind joining the group brings its end back to groupLinger.
	meteringLinger = 250 * time.Millisecond
	// groupTarget ends the linger early: a group this big already spreads
	// the transaction's fixed cost thin, and under a backlog waiting longer
	// would only slow the partitions down.
	// It also bounds a group: at most groupTarget plus one partition batch.
	groupTarget = DefaultBatchSize
	// DefaultHoldRefresh is how often the persister re-counts unresolved
	// dead letters: while there are none it skips the per-batch look-up of
	// held accounts (a retry elsewhere may have resolved them, or another
	// process set one aside).
	DefaultHoldRefresh = time.Second
)

// PersisterConfig tunes a Persister; zero fields take the defaults.
type PersisterConfig struct {
	// Consumer names this process in the outbox consumer group; each
	// creditd process needs its own so a dead one's messages can be claimed.
	Consumer string
	// BatchSize is the most messages read and applied at once (default 500).
	BatchSize int
	// Block is how long a Read waits for messages (default 200ms).
	Block time.Duration
	// ClaimIdle is the idle time after which messages of another consumer
	// are claimed (default 3s); each partition looks for them every
	// ClaimIdle/3, so a dead consumer's messages are taken over within
	// 4/3 ClaimIdle of their delivery.
	ClaimIdle time.Duration
	// Clock measures lag (default engine.SystemClock, invariant 6).
	Clock engine.Clock
	// HoldRefresh is how often unresolved dead letters are re-counted
	// (default 1s).
	HoldRefresh time.Duration
	// Wakes, when set, is told the tenants of every committed batch, so
	// the change streams of every node read their new events at once
	// rather than at their next poll (issue 27 propagation).
	Wakes engine.FeedWakes
}

// PersisterStats are the persister's counters since it was made.
type PersisterStats struct {
	// MutationsPersisted counts mutations in committed batches (replays included).
	MutationsPersisted int64
	// Batches counts committed batches.
	Batches int64
	// ApplyErrors counts failed Apply calls (each one is retried).
	ApplyErrors int64
	// LastBatch is how long the last committed Apply took.
	LastBatch time.Duration
	// DeadLettered counts outbox entries set aside: refused, undecodable, or held behind one.
	DeadLettered int64
	// NotReplicated counts batches read again because they had not reached
	// a replica yet (replica acks on).
	NotReplicated int64
	// ForksRepaired counts forked ops this process applied again on the
	// true state and resolved (forks.go).
	ForksRepaired int64
	// ForkRepairsFailed counts fork repairs that failed (each retried at
	// the next hold refresh; the dead letter stays unresolved meanwhile).
	ForkRepairsFailed int64
	// OwnedPartitions is how many outbox partitions this persister runs:
	// those it holds a lease of (engine.OutboxLeases), else all.
	OwnedPartitions int64
	// ReplayedBatches counts Applies that met rows already stored (a
	// redelivery after a commit) and were written again with ON CONFLICT
	// statements (0 when the writer does not tell).
	ReplayedBatches int64
}

// replayCounter is a LedgerWriter that counts replayed Applies (Store).
type replayCounter interface{ ReplayedApplies() int64 }

// Persister streams the Redis outbox into Postgres: one loop per outbox
// partition reads a batch, applies it in one transaction and acknowledges
// it only after the commit, so a crash at any point redelivers messages
// whose replay is a no-op (invariant 3). Its methods are safe for
// concurrent use.
type Persister struct {
	outbox engine.Outbox
	writer engine.LedgerWriter
	cfg    PersisterConfig
	log    zerolog.Logger

	mutations    atomic.Int64
	batches      atomic.Int64
	applyErrors  atomic.Int64
	lastBatchNS  atomic.Int64
	deadLettered atomic.Int64
	// notReplicated counts batches put back because they had not reached a
	// replica yet.
	notReplicated atomic.Int64
	// forksRepaired and forkRepairsFailed count fork repairs (forks.go).
	forksRepaired     atomic.Int64
	forkRepairsFailed atomic.Int64
	dead              DeadLetters
	// mayHold is false only while no dead letter is known to be unresolved,
	// so the hot path skips HeldBehind. Every dead letter sets it and bumps
	// holdGen under holdMu; the refresh in Run clears it only when the count
	// found none and no dead letter came in meanwhile.
	mayHold atomic.Bool
	holdMu  sync.Mutex
	holdGen int64
	// commits feeds the group committer while Run runs; nil otherwise (the
	// partition loops then apply on their own).
	commits chan commitRequest
	// hurry ends the committer's linger at once: a request waiting to read
	// its own write (a commit after its reserve, history after a consume)
	// should not wait for a bigger group.
	hurry chan struct{}
	// linger is groupLinger and meteringLinger is meteringLinger; a test
	// sets them long to see Hurry end them.
	linger, meteringLinger time.Duration
	// leases hands out the partitions when the outbox does (owners.go):
	// then this persister runs only the partitions it owns; nil: all.
	leases engine.OutboxLeases
	// held is each partition's latest lease of this persister (nil: none
	// yet), whose token its commits carry; only with leases.
	held []atomic.Pointer[partitionLease]
	// live is how many persisters the balancer last counted.
	live atomic.Int64
	// ownedParts is how many partitions the balancer runs, as of its last
	// pass.
	ownedParts atomic.Int64
	// wakes publishes the tenants of committed batches (cfg.Wakes).
	wakes *engine.WakeSender
	// Loop runs Run as an engine.Runner; every outbox read, claim, failed
	// apply and partition balancing pass reports a pass to it.
	engine.Loop
}

// Name is the persister loop's key in /readyz (its lag is "persister").
func (p *Persister) Name() string { return "outbox_persister" }

// Start runs the persister in the background until Stop.
func (p *Persister) Start(ctx context.Context) error {
	return p.Go(ctx, p.cfg.Block, func(ctx context.Context) {
		if err := p.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			p.log.Error().Err(err).Msg("persister stopped")
		}
	})
}

// Hurry asks the committer to commit what it has gathered now instead of
// lingering for a bigger group; it never blocks.
func (p *Persister) Hurry() {
	select {
	case p.hurry <- struct{}{}:
	default:
	}
}

// commitRequest is one partition's batch waiting for a group transaction.
type commitRequest struct {
	ms   []engine.Mutation
	done chan error
}

// NewPersister returns a Persister from outbox to writer; cfg's zero
// fields take the defaults, and an empty Consumer becomes "creditd".
func NewPersister(outbox engine.Outbox, writer engine.LedgerWriter, cfg PersisterConfig, log zerolog.Logger) *Persister {
	if cfg.Consumer == "" {
		cfg.Consumer = "creditd"
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	if cfg.Block <= 0 {
		cfg.Block = DefaultBlock
	}
	if cfg.ClaimIdle <= 0 {
		cfg.ClaimIdle = DefaultClaimIdle
	}
	if cfg.Clock == nil {
		cfg.Clock = engine.SystemClock{}
	}
	if cfg.HoldRefresh <= 0 {
		cfg.HoldRefresh = DefaultHoldRefresh
	}
	dead, _ := writer.(DeadLetters)
	p := &Persister{outbox: outbox, writer: writer, dead: dead, cfg: cfg, hurry: make(chan struct{}, 1),
		linger: groupLinger, meteringLinger: meteringLinger, log: log.With().Str("component", "persister").Logger()}
	p.mayHold.Store(dead != nil)
	if cfg.Wakes != nil {
		p.wakes = engine.NewWakeSender(cfg.Wakes, p.log)
	}
	if leases, ok := outbox.(engine.OutboxLeases); ok {
		p.leases = leases
		p.held = make([]atomic.Pointer[partitionLease], outbox.Partitions())
	}
	return p
}

// Run persists every partition until ctx is done, then returns ctx's error
// once every partition loop has stopped. Messages read but not committed
// when it stops stay pending and are delivered again on the next Run.
func (p *Persister) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	commits := make(chan commitRequest, p.outbox.Partitions())
	p.commits = commits
	committerDone := make(chan struct{})
	go func() {
		defer close(committerDone)
		p.commitGroups(ctx, commits)
	}()
	defer func() { <-committerDone }()
	wakesDone := make(chan struct{})
	go func() {
		defer close(wakesDone)
		p.wakes.Run(ctx)
	}()
	defer func() { <-wakesDone }()
	if p.dead != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.refreshHold(ctx)
		}()
	}
	if p.leases != nil {
		p.runLeased(ctx, &wg)
	} else {
		for part := range p.outbox.Partitions() {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.runPartition(ctx, part, nil)
			}()
		}
	}
	wg.Wait()
	return ctx.Err()
}

// runPartition is one partition's loop: claim (now and then), read,
// persist. Under a lease l it first takes over what the partition's
// previous owner left pending, and ends once l is given up or may have
// lapsed (ctx ends when it is lost).
func (p *Persister) runPartition(ctx context.Context, part int, l *partitionLease) {
	log := p.log.With().Int("partition", part).Logger()
	if l != nil && !p.takeOver(ctx, log, part, l) {
		return
	}
	backoff := newBackoff()
	var lastClaim time.Time
	claimEvery := p.cfg.ClaimIdle / claimLooks
	// acked is true while every message this loop was given is
	// acknowledged: the consumer's pending list is then empty, and the
	// next read can skip looking at it (a round trip that finds nothing).
	// It starts false so a restarted node resumes what it left pending.
	acked := false
	newOnly, canSkip := p.outbox.(newReader)
	for ctx.Err() == nil {
		if l != nil && !l.readable(p.cfg.Block) {
			if !l.shed.Load() {
				log.Warn().Msg("outbox partition lease not renewed in time: reading stops")
			}
			return
		}
		if time.Since(lastClaim) >= claimEvery {
			msgs, err := p.outbox.Claim(ctx, part, p.cfg.Consumer, p.cfg.ClaimIdle, p.cfg.BatchSize)
			if err != nil {
				if !p.setAside(ctx, log, part, err) && ctx.Err() == nil {
					log.Error().Err(err).Msg("outbox claim failed")
					p.Pass(err)
				}
			} else {
				lastClaim = time.Now()
				if len(msgs) > 0 {
					log.Info().Int("count", len(msgs)).Msg("claimed messages of an idle consumer")
					acked = p.persistRenewed(ctx, log, part, msgs) && acked
				}
			}
		}
		var msgs []engine.OutboxMessage
		var err error
		if acked && canSkip {
			msgs, err = newOnly.ReadNew(ctx, part, p.cfg.Consumer, p.cfg.BatchSize, p.cfg.Block)
		} else {
			msgs, err = p.outbox.Read(ctx, part, p.cfg.Consumer, p.cfg.BatchSize, p.cfg.Block)
		}
		// An empty answer means the pending list was empty too (Read looked
		// at it first, or acked already said so).
		acked = err == nil && len(msgs) == 0
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if p.setAside(ctx, log, part, err) {
				continue
			}
			log.Error().Err(err).Msg("outbox read failed")
			p.Pass(err)
			backoff.wait(ctx)
			continue
		}
		p.Pass(nil)
		backoff.reset()
		if len(msgs) > 0 {
			acked = p.persistRenewed(ctx, log, part, msgs)
		}
	}
}

// newReader is an Outbox that can read new messages without first looking
// at the consumer's pending ones (lua.Store.ReadNew).
type newReader interface {
	ReadNew(ctx context.Context, p int, consumer string, count int, block time.Duration) ([]engine.OutboxMessage, error)
}

// replicatedOutbox is an outbox that tells whether what a partition's
// reads returned has reached the replicas (lua.Store.Replicated).
type replicatedOutbox interface {
	Replicated(ctx context.Context, p int) (bool, error)
}

// notReplicatedWait is how long a partition waits before reading its batch
// again when the batch had not reached a replica (the WAIT's own timeout
// comes on top).
const notReplicatedWait = 50 * time.Millisecond

// persist commits msgs (see apply), then acknowledges them. Nothing is
// acknowledged before its commit, and nothing is committed before it
// reached a replica when the outbox can tell (issue 11: Postgres must not
// hold an op a failover can take from Redis); such a batch stays pending
// and is read again.
func (p *Persister) persist(ctx context.Context, log zerolog.Logger, part int, msgs []engine.OutboxMessage) (acked bool) {
	if r, ok := p.outbox.(replicatedOutbox); ok {
		replicated, err := r.Replicated(ctx, part)
		if err != nil || !replicated {
			p.notReplicated.Add(1)
			if err != nil && ctx.Err() == nil {
				log.Warn().Err(err).Msg("outbox replication check failed; batch read again")
			}
			t := time.NewTimer(notReplicatedWait)
			defer t.Stop()
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			return false
		}
	}
	if !p.apply(ctx, log, part, msgs) {
		return false
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return p.ack(ctx, log, part, ids)
}

// persistRenewed is persist while renewWhile keeps msgs this consumer's,
// so a batch waiting on a busy Postgres is not claimed and written a
// second time by another node.
func (p *Persister) persistRenewed(ctx context.Context, log zerolog.Logger, part int, msgs []engine.OutboxMessage) (acked bool) {
	stop := p.renewWhile(ctx, part, msgs)
	defer stop()
	return p.persist(ctx, log, part, msgs)
}

// outboxRenewer is an Outbox that can keep a consumer's messages from
// growing idle while it works on them (lua.Store.Renew).
type outboxRenewer interface {
	Renew(ctx context.Context, p int, consumer string, ids []string) error
}

// renewWhile renews msgs every ClaimIdle/claimLooks until the returned
// stop is called, so they never reach the claim idle time while this
// consumer works on them. It gives up once any Apply fails: a Postgres this
// node cannot write to may be one another node can, so after ClaimIdle the
// batch is theirs to try (an idempotent second write). Without a renewing
// outbox it does nothing.
func (p *Persister) renewWhile(ctx context.Context, part int, msgs []engine.OutboxMessage) (stop func()) {
	r, ok := p.outbox.(outboxRenewer)
	if !ok || len(msgs) == 0 {
		return func() {}
	}
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	errs := p.applyErrors.Load()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(max(p.cfg.ClaimIdle/claimLooks, time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if p.applyErrors.Load() != errs {
				return
			}
			if err := r.Renew(ctx, part, p.cfg.Consumer, ids); err != nil && ctx.Err() == nil {
				p.log.Warn().Err(err).Int("partition", part).Msg("outbox renew failed; another node may claim the batch")
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// ack acknowledges committed messages even if ctx just ended, so a clean
// shutdown does not leave committed messages to replay.
func (p *Persister) ack(ctx context.Context, log zerolog.Logger, part int, ids []string) bool {
	ackCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	if err := p.outbox.Ack(ackCtx, part, ids); err != nil {
		// Harmless: the messages stay pending, come back on the next Read
		// and replay into no-ops.
		log.Warn().Err(err).Int("count", len(ids)).Msg("ack failed after commit; messages will replay")
		return false
	}
	return true
}

// apply writes msgs in one transaction, retrying with backoff until it
// commits; it reports false when ctx ended first. When Postgres refuses a
// batch for its data, the batch is halved until the refused Mutation stands
// alone, and that one is dead-lettered (when the writer keeps dead letters)
// so the rest of the partition moves on. Mutations of an account with an
// unresolved dead letter are dead-lettered behind it, in order, and not
// written: Postgres keeps the account as it stood before the refused one
// (books balanced) until `creditd deadletters retry` replays them all.
func (p *Persister) apply(ctx context.Context, log zerolog.Logger, part int, msgs []engine.OutboxMessage) bool {
	backoff := newBackoff()
	began := time.Now()
	for {
		rest, err := p.reservation(ctx, log, part, msgs)
		if err == nil {
			msgs = rest
			if len(msgs) == 0 {
				return true
			}
			l := p.lease(part)
			ms := make([]engine.Mutation, len(msgs))
			for i, m := range msgs {
				ms[i] = m.Mutation
				ms[i].OutboxMS = streamMS(m.ID)
				if l != nil {
					ms[i].OutboxPartition, ms[i].OutboxLease = part, l.token
				}
			}
			start := time.Now()
			if err = p.write(ctx, ms); err == nil {
				if !p.forgetOps(ctx, log, part, ms) {
					return false
				}
				p.lastBatchNS.Store(int64(time.Since(start)))
				p.batches.Add(1)
				p.mutations.Add(int64(len(ms)))
				return true
			}
		}
		if ctx.Err() != nil {
			return false
		}
		p.applyErrors.Add(1)
		if sqlState(err) == leaseStale {
			// Another persister owns the partition and committed under it:
			// the batch stays pending for it to take over (owners.go).
			log.Warn().Err(err).Int("count", len(msgs)).Msg("outbox partition lost to another persister; its batch is left to it")
			if l := p.lease(part); l != nil {
				l.cancel()
			}
			return false
		}
		if p.dead != nil && refusedData(err) {
			if len(msgs) > 1 {
				half := len(msgs) / 2
				return p.apply(ctx, log, part, msgs[:half]) && p.apply(ctx, log, part, msgs[half:])
			}
			// The bytes the operations table would have held (one Mutation
			// encoder on the way to Postgres: engine.AppendMutationJSON).
			raw, jerr := engine.AppendMutationJSON(nil, &msgs[0].Mutation)
			if jerr == nil && p.deadLetter(ctx, log, Letter{Partition: part, EntryID: msgs[0].ID, Raw: raw,
				Reason: err.Error(), Mutation: &msgs[0].Mutation, SQLState: sqlState(err)}) {
				if sqlState(err) == forkRefused {
					// Before the rest of the batch: an unfenced fork holds
					// the account's later entries, a fenced one refuses
					// those of the forked history.
					p.fenceForks(ctx, log)
				}
				return true
			}
		}
		log.Error().Err(err).Int("count", len(msgs)).Str("first_id", msgs[0].ID).Msg("apply failed; retrying without ack")
		p.Pass(err)
		if l := p.lease(part); l != nil && p.live.Load() > 1 && time.Since(began) >= p.cfg.ClaimIdle {
			// A Postgres this node cannot write to may be one another node
			// can: after ClaimIdle the partition, its batch still pending,
			// is theirs to try (owners.go).
			log.Warn().Msg("apply failing for the claim idle; partition handed to another persister")
			l.shed.Store(true)
			return false
		}
		backoff.wait(ctx)
		if ctx.Err() != nil {
			return false
		}
	}
}

// hold dead-letters, in stream order, the messages of accounts that have an
// unresolved dead letter, and returns the others. An account refused within
// msgs itself is held from the next call on (apply halves the batch, and
// each half asks again).
func (p *Persister) reservation(ctx context.Context, log zerolog.Logger, part int, msgs []engine.OutboxMessage) ([]engine.OutboxMessage, error) {
	if p.dead == nil || !p.mayHold.Load() {
		return msgs, nil
	}
	customers := make([]uuid.UUID, 0, len(msgs))
	for _, m := range msgs {
		customers = append(customers, m.Mutation.CustomerID)
	}
	held, err := p.dead.HeldBehind(ctx, customers)
	if err != nil || len(held) == 0 {
		return msgs, err
	}
	rest := make([]engine.OutboxMessage, 0, len(msgs))
	for i, m := range msgs {
		first, ok := held[m.Mutation.CustomerID]
		if !ok {
			rest = append(rest, m)
			continue
		}
		raw, err := engine.AppendMutationJSON(nil, &msgs[i].Mutation)
		if err != nil {
			return nil, err
		}
		if !p.deadLetter(ctx, log, Letter{Partition: part, EntryID: m.ID, Raw: raw, Mutation: &msgs[i].Mutation, HeldBy: first,
			Reason: fmt.Sprintf("held behind dead letter %d of the same account", first)}) {
			return nil, fmt.Errorf("persist: hold %s behind dead letter %d failed", m.ID, first)
		}
	}
	return rest, nil
}

// refreshHold re-counts unresolved dead letters every HoldRefresh until ctx
// ends, so hold looks accounts up only while some may be held.
func (p *Persister) refreshHold(ctx context.Context) {
	t := time.NewTicker(p.cfg.HoldRefresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.holdMu.Lock()
		gen := p.holdGen
		p.holdMu.Unlock()
		n, err := p.dead.UnresolvedDeadLetters(ctx)
		if err != nil {
			continue
		}
		if n > 0 {
			p.fenceForks(ctx, p.log) // a fence that failed, or a process that died first
		}
		p.holdMu.Lock()
		// A dead letter stored while the count ran bumped holdGen after its
		// insert committed: keep holding.
		p.mayHold.Store(n > 0 || gen != p.holdGen)
		p.holdMu.Unlock()
	}
}

// fenceForks fences every fork dead letter no fence covers yet and reloads
// its account in Redis from Postgres, then applies the fenced forks' ops
// again on it and resolves their dead letters (forks.go), when the writer
// keeps forks and the outbox is the hot store; a failure is logged and
// retried at the next hold refresh.
func (p *Persister) fenceForks(ctx context.Context, log zerolog.Logger) {
	w, ok := p.writer.(forkWriter)
	store, ok2 := p.outbox.(engine.ReconcileStore)
	if !ok || !ok2 {
		return
	}
	forks, err := w.UnfencedForks(ctx)
	if err != nil {
		log.Error().Err(err).Msg("fork look-up failed")
		return
	}
	for _, f := range forks {
		if err := fenceFork(ctx, w, store, f.Customer, p.cfg.Clock, log); err != nil {
			log.Error().Err(err).Str("customer_id", f.Customer.CustomerID.String()).Msg("fork fence failed; retried at the next hold refresh")
		}
	}
	// The forked ops were acknowledged: once fenced, they are applied
	// again on the reloaded state instead of waiting for an operator.
	r, ok := p.writer.(forkRepairer)
	hot, ok2 := p.outbox.(forkHotStore)
	if !ok || !ok2 {
		return
	}
	repaired, failed := repairForks(ctx, r, hot, p.cfg.Clock, log)
	p.forksRepaired.Add(repaired)
	p.forkRepairsFailed.Add(failed)
}

// deadLetter stores one entry that cannot be persisted now, raises the
// alarm (counter, error log naming the op, tenant, customer and SQLSTATE)
// and reports whether it did.
func (p *Persister) deadLetter(ctx context.Context, log zerolog.Logger, l Letter) bool {
	id, err := p.dead.DeadLetter(ctx, l)
	if err != nil {
		log.Error().Err(err).Str("entry_id", l.EntryID).Msg("dead letter failed")
		return false
	}
	p.holdMu.Lock()
	p.holdGen++
	p.mayHold.Store(true)
	p.holdMu.Unlock()
	p.deadLettered.Add(1)
	ev := log.Error().Int64("dead_letter_id", id).Str("entry_id", l.EntryID).Str("reason", l.Reason)
	if m := l.Mutation; m != nil {
		ev = ev.Str("op_id", m.OpID.String()).Str("tenant_id", m.TenantID.String()).
			Str("customer_id", m.CustomerID.String()).Str("kind", string(m.Kind)).Int64("account_version", m.Account.Version)
	}
	if l.SQLState != "" {
		ev = ev.Str("sqlstate", l.SQLState)
	}
	if l.HeldBy != 0 {
		ev = ev.Int64("held_by", l.HeldBy)
	}
	if l.SQLState == forkRefused {
		ev.Msg("outbox entry dead-lettered as a fork: applied again on the true state once the fork is fenced (`creditd deadletters list --repaired`)")
		return true
	}
	ev.Msg("outbox entry dead-lettered: missing from Postgres until `creditd deadletters retry`; /readyz warns meanwhile")
	return true
}

// setAside dead-letters and acknowledges the undecodable entry a Read or
// Claim error names, so the partition moves past it; false when err names
// none or the dead letter failed.
func (p *Persister) setAside(ctx context.Context, log zerolog.Logger, part int, err error) bool {
	var bad malformedEntry
	if p.dead == nil || !errors.As(err, &bad) {
		return false
	}
	if !p.deadLetter(ctx, log, Letter{Partition: part, EntryID: bad.OutboxEntryID(), Raw: bad.RawEntry(), Reason: err.Error()}) {
		return false
	}
	p.ack(ctx, log, part, []string{bad.OutboxEntryID()})
	return true
}

// Lag is the age of the oldest outbox message not yet committed, the
// largest over all partitions (0 when none), and the total backlog.
func (p *Persister) Lag(ctx context.Context) (time.Duration, int64, error) {
	now := p.cfg.Clock.Now().UnixMilli()
	var lagMS, total int64
	for part := range p.outbox.Partitions() {
		n, oldestMS, err := p.outbox.Backlog(ctx, part)
		if err != nil {
			return 0, 0, fmt.Errorf("persist: backlog of partition %d: %w", part, err)
		}
		total += n
		if n > 0 && oldestMS > 0 && now-oldestMS > lagMS {
			lagMS = now - oldestMS
		}
	}
	return time.Duration(lagMS) * time.Millisecond, total, nil
}

// ErrDrainTimeout is returned by Drain when the backlog outlives its timeout.
var ErrDrainTimeout = errors.New("persist: outbox not drained before the timeout")

// Drain waits until every partition's backlog is empty (the running
// persister committed everything queued), or until timeout or ctx ends.
func (p *Persister) Drain(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	for {
		_, n, err := p.Lag(ctx)
		if err == nil && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return fmt.Errorf("%w: %w", ErrDrainTimeout, err)
			}
			return fmt.Errorf("%w: %d messages left", ErrDrainTimeout, n)
		case <-tick.C:
		}
	}
}

// Stats reads the counters.
func (p *Persister) Stats() PersisterStats {
	var replayed int64
	if r, ok := p.writer.(replayCounter); ok {
		replayed = r.ReplayedApplies()
	}
	owned := int64(p.outbox.Partitions())
	if p.leases != nil {
		owned = p.ownedParts.Load()
	}
	return PersisterStats{
		OwnedPartitions:    owned,
		ReplayedBatches:    replayed,
		MutationsPersisted: p.mutations.Load(),
		Batches:            p.batches.Load(),
		ApplyErrors:        p.applyErrors.Load(),
		LastBatch:          time.Duration(p.lastBatchNS.Load()),
		DeadLettered:       p.deadLettered.Load(),
		NotReplicated:      p.notReplicated.Load(),
		ForksRepaired:      p.forksRepaired.Load(),
		ForkRepairsFailed:  p.forkRepairsFailed.Load(),
	}
}

// WriteMetrics writes the counters in the Prometheus text format.
func (p *Persister) WriteMetrics(w io.Writer) {
	s := p.Stats()
	fmt.Fprintf(w, "# HELP creditd_persister_mutations_total Mutations in committed persister batches.\n"+
		"# TYPE creditd_persister_mutations_total counter\ncreditd_persister_mutations_total %d\n", s.MutationsPersisted)
	fmt.Fprintf(w, "# HELP creditd_persister_batches_total Committed persister batches.\n"+
		"# TYPE creditd_persister_batches_total counter\ncreditd_persister_batches_total %d\n", s.Batches)
	fmt.Fprintf(w, "# HELP creditd_persister_apply_errors_total Failed persister transactions (each retried).\n"+
		"# TYPE creditd_persister_apply_errors_total counter\ncreditd_persister_apply_errors_total %d\n", s.ApplyErrors)
	fmt.Fprintf(w, "# HELP creditd_persister_dead_letters_total Outbox entries this process set aside (refused by Postgres, undecodable, or held behind one).\n"+
		"# TYPE creditd_persister_dead_letters_total counter\ncreditd_persister_dead_letters_total %d\n", s.DeadLettered)
	fmt.Fprintf(w, "# HELP creditd_persister_forks_repaired_total Forked ops (dead letters of a fenced fork) this process applied again on the true state and resolved.\n"+
		"# TYPE creditd_persister_forks_repaired_total counter\ncreditd_persister_forks_repaired_total %d\n", s.ForksRepaired)
	fmt.Fprintf(w, "# HELP creditd_persister_fork_repairs_failed_total Fork repairs that failed; each is retried every second while its dead letter stays unresolved.\n"+
		"# TYPE creditd_persister_fork_repairs_failed_total counter\ncreditd_persister_fork_repairs_failed_total %d\n", s.ForkRepairsFailed)
	fmt.Fprintf(w, "# HELP creditd_persister_replayed_batches_total Persister transactions that met rows already stored (a redelivery after its commit) and were written again skipping them.\n"+
		"# TYPE creditd_persister_replayed_batches_total counter\ncreditd_persister_replayed_batches_total %d\n", s.ReplayedBatches)
	fmt.Fprintf(w, "# HELP creditd_persister_unreplicated_batches_total Outbox batches read again because they had not reached a replica yet.\n"+
		"# TYPE creditd_persister_unreplicated_batches_total counter\ncreditd_persister_unreplicated_batches_total %d\n", s.NotReplicated)
	fmt.Fprintf(w, "# HELP creditd_persister_partitions_owned Outbox partitions this persister runs (its leases; all without leases).\n"+
		"# TYPE creditd_persister_partitions_owned gauge\ncreditd_persister_partitions_owned %d\n", s.OwnedPartitions)
	fmt.Fprintf(w, "# HELP creditd_persister_last_batch_seconds Duration of the last committed persister batch.\n"+
		"# TYPE creditd_persister_last_batch_seconds gauge\ncreditd_persister_last_batch_seconds %g\n", s.LastBatch.Seconds())
}

// streamMS is the millisecond part of a stream id ("<ms>-<seq>"), 0 when
// it has none.
func streamMS(id string) int64 {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// backoff doubles a retry wait from minBackoff up to maxBackoff.
type backoff struct{ next time.Duration }

func newBackoff() *backoff { return &backoff{next: minBackoff} }

func (b *backoff) reset() { b.next = minBackoff }

// wait sleeps the current delay (or until ctx ends) and doubles it.
func (b *backoff) wait(ctx context.Context) {
	t := time.NewTimer(b.next)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	b.next = min(2*b.next, maxBackoff)
}

// write commits ms: through the group committer while Run runs, else alone.
func (p *Persister) write(ctx context.Context, ms []engine.Mutation) error {
	if p.commits == nil {
		return p.stored(ms, p.writer.Apply(ctx, ms))
	}
	req := commitRequest{ms: ms, done: make(chan error, 1)}
	select {
	case p.commits <- req:
	case <-ctx.Done():
		return ctx.Err()
	}
	// The committer may have stopped with the request still in its buffer:
	// give up with ctx, leaving the messages unacknowledged for a replay.
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// commitGroups gathers the batches partitions hand in within groupLinger
// (meteringLinger while they are all consumes and gauge moves), or until
// groupTarget mutations, and commits them in one transaction. When the
// group fails, each batch is applied on its own, so one partition's refused data (dead-lettered by its
// loop) or error never stalls the others.
func (p *Persister) commitGroups(ctx context.Context, commits chan commitRequest) {
	for {
		var first commitRequest
		select {
		case first = <-commits:
		case <-ctx.Done():
			return
		}
		group := []commitRequest{first}
		n := len(first.ms)
		start, linger := time.Now(), p.lingerFor(first.ms)
		timer := time.NewTimer(linger)
	gather:
		for n < groupTarget {
			select {
			case r := <-commits:
				group = append(group, r)
				n += len(r.ms)
				if l := p.lingerFor(r.ms); l < linger {
					linger = l
					timer.Reset(max(0, l-time.Since(start)))
				}
			case <-timer.C:
				break gather
			case <-p.hurry:
				break gather
			}
		}
		timer.Stop()
		if len(group) == 1 {
			first.done <- p.stored(first.ms, p.writer.Apply(ctx, first.ms))
			continue
		}
		all := make([]engine.Mutation, 0, n)
		for _, r := range group {
			all = append(all, r.ms...)
		}
		if err := p.stored(all, p.writer.Apply(ctx, all)); err == nil {
			for _, r := range group {
				r.done <- nil
			}
			continue
		}
		for _, r := range group {
			r.done <- p.stored(r.ms, p.writer.Apply(ctx, r.ms))
		}
	}
}

// lingerFor is how long a group holding ms may gather: meteringLinger
// when ms are all consumes and gauge moves, else the linger.
func (p *Persister) lingerFor(ms []engine.Mutation) time.Duration {
	for i := range ms {
		if k := ms[i].Kind; k != engine.MutationConsume && k != engine.MutationGaugeKind {
			return p.linger
		}
	}
	return max(p.linger, p.meteringLinger)
}

// stored queues the wakes of ms's tenants once their Apply committed
// (err nil), and returns err: a wake sent before the commit would have
// the feeds read before the events are there.
func (p *Persister) stored(ms []engine.Mutation, err error) error {
	if err == nil {
		p.wakes.Stored(ms)
	}
	return err
}
