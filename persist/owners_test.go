package persist

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// leaseTable is outbox_lease.lua and outbox_members.lua in memory, shared
// by the persisters of a test fleet.
type leaseTable struct {
	mu      sync.Mutex
	owner   []string
	token   []int64
	last    []int64
	expires []time.Time
	members map[string]time.Time
}

func newLeaseTable(parts int) *leaseTable {
	return &leaseTable{owner: make([]string, parts), token: make([]int64, parts), last: make([]int64, parts),
		expires: make([]time.Time, parts), members: map[string]time.Time{}}
}

// held is p's owner now ("" when free or lapsed); mu held.
func (l *leaseTable) held(p int) string {
	if l.owner[p] != "" && time.Now().After(l.expires[p]) {
		l.owner[p] = ""
	}
	return l.owner[p]
}

// owners copies the owner of every partition.
func (l *leaseTable) owners() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(l.owner))
	for p := range out {
		out[p] = l.held(p)
	}
	return out
}

// leasedOutbox is one node's view of a fakeOutbox with partition leases;
// while down, every call fails as if the node had lost Redis.
type leasedOutbox struct {
	*fakeOutbox
	leases *leaseTable
	down   atomic.Bool
}

var errDown = errors.New("redis unreachable")

func (o *leasedOutbox) Read(ctx context.Context, p int, consumer string, count int, block time.Duration) ([]engine.OutboxMessage, error) {
	if o.down.Load() {
		time.Sleep(block)
		return nil, errDown
	}
	return o.fakeOutbox.Read(ctx, p, consumer, count, block)
}

func (o *leasedOutbox) Claim(ctx context.Context, p int, consumer string, minIdle time.Duration, count int) ([]engine.OutboxMessage, error) {
	if o.down.Load() {
		return nil, errDown
	}
	return o.fakeOutbox.Claim(ctx, p, consumer, minIdle, count)
}

func (o *leasedOutbox) Ack(ctx context.Context, p int, ids []string) error {
	if o.down.Load() {
		return errDown
	}
	return o.fakeOutbox.Ack(ctx, p, ids)
}

func (o *leasedOutbox) TakePartition(_ context.Context, p int, consumer string, ttl time.Duration) (int64, bool, error) {
	if o.down.Load() {
		return 0, false, errDown
	}
	l := o.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	if h := l.held(p); h != "" && h != consumer {
		return 0, false, nil
	}
	l.last[p]++
	l.owner[p], l.token[p], l.expires[p] = consumer, l.last[p], time.Now().Add(ttl)
	return l.token[p], true, nil
}

func (o *leasedOutbox) RenewPartition(_ context.Context, p int, consumer string, token int64, ttl time.Duration) (bool, error) {
	if o.down.Load() {
		return false, errDown
	}
	l := o.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held(p) != consumer || l.token[p] != token {
		return false, nil
	}
	l.expires[p] = time.Now().Add(ttl)
	return true, nil
}

func (o *leasedOutbox) ReleasePartition(_ context.Context, p int, consumer string, token int64) error {
	if o.down.Load() {
		return errDown
	}
	l := o.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held(p) == consumer && l.token[p] == token {
		l.owner[p] = ""
	}
	return nil
}

func (o *leasedOutbox) PartitionOwners(context.Context) ([]string, error) {
	if o.down.Load() {
		return nil, errDown
	}
	return o.leases.owners(), nil
}

func (o *leasedOutbox) Persisters(_ context.Context, consumer string, ttl time.Duration) (int, error) {
	if o.down.Load() {
		return 0, errDown
	}
	l := o.leases
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for c, end := range l.members {
		if !end.After(now) {
			delete(l.members, c)
		}
	}
	if ttl == 0 {
		delete(l.members, consumer)
	} else {
		l.members[consumer] = now.Add(ttl)
	}
	return len(l.members), nil
}

// orderWriter commits through inner one Apply at a time and records, per
// customer, the versions of the operations it committed first, in commit
// order; every Mutation must carry an outbox lease.
type orderWriter struct {
	inner engine.LedgerWriter
	mu    sync.Mutex
	seen  map[uuid.UUID]bool
	order map[uuid.UUID][]int64
	bad   []string
}

func (w *orderWriter) Apply(ctx context.Context, ms []engine.Mutation) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.inner.Apply(ctx, ms); err != nil {
		return err
	}
	for _, m := range ms {
		if m.OutboxLease == 0 {
			w.bad = append(w.bad, fmt.Sprintf("op %s committed without a lease", m.OpID))
		}
		if !w.seen[m.OpID] {
			w.seen[m.OpID] = true
			w.order[m.CustomerID] = append(w.order[m.CustomerID], m.Account.Version)
		}
	}
	return nil
}

// TestPersistersShareThePartitions (issue 25): persisters sharing an
// outbox with partition leases each own at most about their share (two,
// then three when one joins and the others hand it partitions), so every
// partition has one owner and each account's operations are committed in
// version (stream) order, each once. When one of them loses
// Redis (as a node that died), its partitions go to the other two within
// the lease's lapse plus a balancing pass, pending entries first, still in
// order, and they then own up to half each.
func TestPersistersShareThePartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	const parts, claimIdle = 32, 300 * time.Millisecond
	ob := newFakeOutbox(parts)
	leases := newLeaseTable(parts)
	w := &orderWriter{inner: b.store, seen: map[uuid.UUID]bool{}, order: map[uuid.UUID][]int64{}}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	var nodes []*leasedOutbox
	var persisters []*Persister
	var wg sync.WaitGroup
	start := func() {
		o := &leasedOutbox{fakeOutbox: ob, leases: leases}
		per := NewPersister(o, w, PersisterConfig{Consumer: fmt.Sprintf("node-%d", len(nodes)), BatchSize: 5,
			Block: 10 * time.Millisecond, ClaimIdle: claimIdle}, quietLog())
		nodes, persisters = append(nodes, o), append(persisters, per)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = per.Run(ctx)
		}()
	}
	defer wg.Wait()
	defer cancel()

	accounts := make([]*account, parts)
	for p := range accounts {
		accounts[p] = newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	}
	ops := 0
	feed := func(rounds int) {
		for range rounds {
			for p, a := range accounts {
				ob.add(p, a.grant(fmt.Sprintf("k%d", a.version), 1, nil))
				ops++
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	shares := func(want int, among ...string) bool {
		counts := map[string]int{}
		for _, o := range leases.owners() {
			counts[o]++
		}
		total := 0
		for _, c := range among {
			if counts[c] > want {
				return false
			}
			total += counts[c]
		}
		return total == parts
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: owners %q", what, leases.owners())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	start()
	start()
	feed(10)
	waitFor("two persisters own half each", func() bool { return shares(16, "node-0", "node-1") })
	start()
	feed(10)
	waitFor("with a third one joining, each owns about a third", func() bool { return shares(11, "node-0", "node-1", "node-2") })
	feed(10)

	nodes[2].down.Store(true)
	downAt := time.Now()
	feed(10)
	waitFor("two persisters own half each", func() bool { return shares(16, "node-0", "node-1") })
	if took := time.Since(downAt); took > claimIdle+claimIdle/claimLooks+2*time.Second {
		t.Errorf("the partitions of the node that went down were taken over after %s", took)
	}
	waitFor("the survivors' stats count every partition", func() bool {
		return persisters[0].Stats().OwnedPartitions+persisters[1].Stats().OwnedPartitions == parts
	})
	feed(10)
	if err := persisters[0].Drain(b.ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	for _, bad := range w.bad {
		t.Error(bad)
	}
	if len(w.seen) != ops {
		t.Errorf("%d operations committed, want %d", len(w.seen), ops)
	}
	for id, versions := range w.order {
		for i := 1; i < len(versions); i++ {
			if versions[i] <= versions[i-1] {
				t.Fatalf("customer %s: versions committed in the order %v", id, versions)
			}
		}
	}
	if n := b.count(t, "ledger_entries"); n != ops {
		t.Errorf("%d ledger entries, want %d", n, ops)
	}
	if n := b.count(t, "outbox_dead_letters"); n != 0 {
		t.Errorf("%d dead letters", n)
	}
}
