package persist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
)

// fakeOutbox is an in-memory engine.Outbox with Redis-stream semantics: a
// message read by a consumer stays pending for it until acknowledged, Read
// returns the consumer's pending messages before new ones, and Claim moves
// messages idle in other consumers.
type fakeOutbox struct {
	mu      sync.Mutex
	parts   int
	seq     int
	queue   [][]fakeMsg           // per partition, unread
	pending []map[string]*fakeMsg // per partition, delivered and unacked
	acked   atomic.Int64
	now     func() time.Time
}

type fakeMsg struct {
	msg       engine.OutboxMessage
	bad       []byte // set: the entry is undecodable
	consumer  string
	delivered time.Time
	addedMS   int64
}

func newFakeOutbox(parts int) *fakeOutbox {
	o := &fakeOutbox{parts: parts, queue: make([][]fakeMsg, parts), pending: make([]map[string]*fakeMsg, parts), now: time.Now}
	for i := range o.pending {
		o.pending[i] = map[string]*fakeMsg{}
	}
	return o
}

func (o *fakeOutbox) add(p int, ms ...engine.Mutation) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range ms {
		o.seq++
		o.queue[p] = append(o.queue[p], fakeMsg{msg: engine.OutboxMessage{ID: fmt.Sprintf("%d-0", o.seq), Mutation: m}, addedMS: o.now().UnixMilli()})
	}
}

// addBad appends an undecodable entry.
func (o *fakeOutbox) addBad(p int, raw string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	o.queue[p] = append(o.queue[p], fakeMsg{msg: engine.OutboxMessage{ID: fmt.Sprintf("%d-0", o.seq)}, bad: []byte(raw), addedMS: o.now().UnixMilli()})
}

// malformedErr has the shape of lua.MalformedEntryError.
type malformedErr struct {
	id  string
	raw []byte
}

func (e *malformedErr) Error() string         { return "undecodable entry " + e.id }
func (e *malformedErr) OutboxEntryID() string { return e.id }
func (e *malformedErr) RawEntry() []byte      { return e.raw }

func (o *fakeOutbox) Partitions() int { return o.parts }

func (o *fakeOutbox) Read(ctx context.Context, p int, consumer string, count int, block time.Duration) ([]engine.OutboxMessage, error) {
	return o.read(ctx, p, consumer, count, block, true)
}

// read is Read, or with pending false lua.Store's ReadNew: new messages
// only.
func (o *fakeOutbox) read(ctx context.Context, p int, consumer string, count int, block time.Duration, pending bool) ([]engine.OutboxMessage, error) {
	deadline := time.Now().Add(block)
	for {
		o.mu.Lock()
		var out []engine.OutboxMessage
		var bad error
		for _, m := range o.sortedPending(p) {
			if pending && m.consumer == consumer && len(out) < count {
				m.delivered = o.now()
				out = append(out, m.msg)
				if m.bad != nil && bad == nil {
					bad = &malformedErr{id: m.msg.ID, raw: m.bad}
				}
			}
		}
		for len(out) == 0 && len(o.queue[p]) > 0 && len(out) < count {
			for len(out) < count && len(o.queue[p]) > 0 {
				m := o.queue[p][0]
				o.queue[p] = o.queue[p][1:]
				m.consumer, m.delivered = consumer, o.now()
				o.pending[p][m.msg.ID] = &m
				out = append(out, m.msg)
				if m.bad != nil && bad == nil {
					bad = &malformedErr{id: m.msg.ID, raw: m.bad}
				}
			}
		}
		o.mu.Unlock()
		if bad != nil {
			// As lua.Store: the error and no messages; all stay pending.
			return nil, bad
		}
		if len(out) > 0 || time.Now().After(deadline) {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// sortedPending lists partition p's pending messages in id order.
func (o *fakeOutbox) sortedPending(p int) []*fakeMsg {
	out := make([]*fakeMsg, 0, len(o.pending[p]))
	for _, m := range o.pending[p] {
		out = append(out, m)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && idLess(out[j].msg.ID, out[j-1].msg.ID); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func idLess(a, b string) bool {
	var x, y int
	fmt.Sscanf(a, "%d-", &x)
	fmt.Sscanf(b, "%d-", &y)
	return x < y
}

func (o *fakeOutbox) Claim(ctx context.Context, p int, consumer string, minIdle time.Duration, count int) ([]engine.OutboxMessage, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []engine.OutboxMessage
	for _, m := range o.sortedPending(p) {
		if m.consumer != consumer && o.now().Sub(m.delivered) >= minIdle && len(out) < count {
			m.consumer, m.delivered = consumer, o.now()
			out = append(out, m.msg)
		}
	}
	return out, nil
}

func (o *fakeOutbox) Ack(ctx context.Context, p int, ids []string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, id := range ids {
		if _, ok := o.pending[p][id]; ok {
			delete(o.pending[p], id)
			o.acked.Add(1)
		}
	}
	return nil
}

func (o *fakeOutbox) Backlog(ctx context.Context, p int) (int64, int64, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	var oldest int64
	for _, m := range o.pending[p] {
		if oldest == 0 || m.addedMS < oldest {
			oldest = m.addedMS
		}
	}
	if len(o.queue[p]) > 0 && (oldest == 0 || o.queue[p][0].addedMS < oldest) {
		oldest = o.queue[p][0].addedMS
	}
	return int64(len(o.pending[p]) + len(o.queue[p])), oldest, nil
}

// flakyWriter fails its first n Applies, committing the first of them
// anyway: a crash after the commit but before the ack.
type flakyWriter struct {
	inner    engine.LedgerWriter
	failures atomic.Int64
	calls    atomic.Int64
	commitOn int64 // the call number (1-based) that commits and then fails
}

func (w *flakyWriter) Apply(ctx context.Context, ms []engine.Mutation) error {
	n := w.calls.Add(1)
	if n == w.commitOn {
		if err := w.inner.Apply(ctx, ms); err != nil {
			return err
		}
		w.failures.Add(1)
		return errors.New("connection lost after commit")
	}
	if w.failures.Load() < 3 {
		w.failures.Add(1)
		return errors.New("connection refused")
	}
	return w.inner.Apply(ctx, ms)
}

func quietLog() zerolog.Logger { return zerolog.Nop() }

// TestPersisterExactlyOnce states invariant 3 for the persister: with
// Applies failing before and after their commit, every outbox message
// still reaches Postgres exactly once and is acknowledged only after.
func TestPersisterExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	ob := newFakeOutbox(4)
	want := 0
	for p := range 4 {
		a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
		for i := range 30 {
			ob.add(p, a.grant(fmt.Sprintf("k%d", i), 1, nil))
			want++
		}
	}
	w := &flakyWriter{inner: b.store, commitOn: 1}
	per := NewPersister(ob, w, PersisterConfig{Consumer: "c1", BatchSize: 7, Block: 10 * time.Millisecond}, quietLog())
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- per.Run(ctx) }()

	if err := per.Drain(b.ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	if n := b.count(t, "ledger_entries"); n != want {
		t.Fatalf("%d ledger entries, want %d", n, want)
	}
	if n := b.count(t, "operations"); n != want {
		t.Fatalf("%d operations, want %d", n, want)
	}
	st := per.Stats()
	// The group committer may absorb a failure by re-applying each batch
	// alone, so count the failures the writer produced, not the retries.
	if w.failures.Load() < 3 || st.MutationsPersisted < int64(want) || st.Batches == 0 {
		t.Fatalf("stats = %+v", st)
	}
	if ob.acked.Load() != int64(want) {
		t.Fatalf("acked %d, want %d", ob.acked.Load(), want)
	}
	lag, backlog, err := per.Lag(b.ctx)
	if err != nil || lag != 0 || backlog != 0 {
		t.Fatalf("Lag = %v %d %v", lag, backlog, err)
	}
	var sb strings.Builder
	per.WriteMetrics(&sb)
	if !strings.Contains(sb.String(), fmt.Sprintf("creditd_persister_mutations_total %d", st.MutationsPersisted)) {
		t.Fatalf("metrics:\n%s", sb.String())
	}
}

// TestPersisterRedeliveryAfterCrash: a consumer that read messages and died
// before committing leaves them pending; a restarted consumer of the same
// name resumes them, and another consumer claims them once idle. Either
// way each lands exactly once.
func TestPersisterRedeliveryAfterCrash(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	ob := newFakeOutbox(1)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	for i := range 10 {
		ob.add(0, a.grant(fmt.Sprintf("k%d", i), 1, nil))
	}
	// "dead" reads five and crashes before Apply commits.
	if got, _ := ob.Read(b.ctx, 0, "dead", 5, 0); len(got) != 5 {
		t.Fatalf("read %d", len(got))
	}
	// It had applied (but not acked) the first two before dying.
	first := []engine.Mutation{}
	for _, m := range ob.sortedPending(0)[:2] {
		first = append(first, m.msg.Mutation)
	}
	if err := b.store.Apply(b.ctx, first); err != nil {
		t.Fatal(err)
	}

	lag, backlog, err := NewPersister(ob, b.store, PersisterConfig{}, quietLog()).Lag(b.ctx)
	if err != nil || backlog != 10 || lag < 0 {
		t.Fatalf("Lag before = %v %d %v", lag, backlog, err)
	}

	per := NewPersister(ob, b.store, PersisterConfig{Consumer: "alive", Block: 5 * time.Millisecond, ClaimIdle: 20 * time.Millisecond}, quietLog())
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- per.Run(ctx) }()
	if err := per.Drain(b.ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	if n := b.count(t, "ledger_entries"); n != 10 {
		t.Fatalf("%d ledger entries, want 10", n)
	}
	if v, bal := b.accountRow(t, a.key.CustomerID); v != 10 || bal != 10 {
		t.Fatalf("account version %d balance %d", v, bal)
	}
}

func TestDrainTimesOut(t *testing.T) {
	t.Parallel()
	ob := newFakeOutbox(2)
	ob.add(1, engine.Mutation{})
	per := NewPersister(ob, nil, PersisterConfig{}, quietLog())
	err := per.Drain(context.Background(), 30*time.Millisecond)
	if !errors.Is(err, ErrDrainTimeout) {
		t.Fatalf("Drain = %v", err)
	}
}

// TestPersisterDeadLetters: an undecodable outbox entry and a Mutation
// Postgres refuses (a NUL in its JSON metadata) are each set aside in
// outbox_dead_letters and acknowledged; the account's later Mutations are
// held behind the refused one (set aside too, naming it), and every other
// message of the partition, including those batched with them, is persisted.
func TestPersisterDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	ob := newFakeOutbox(1)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	other := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	ob.add(0, a.grant("k0", 1, nil), a.grant("k1", 1, nil))
	ob.addBad(0, "{not json")
	poison := a.grant("k2", 1, nil)
	poison.Entries[0].Metadata = json.RawMessage(`{"x":"\u0000"}`)
	ob.add(0, other.grant("o1", 1, nil), poison, a.grant("k3", 1, nil), other.grant("o2", 1, nil), a.grant("k4", 1, nil))

	per := NewPersister(ob, b.store, PersisterConfig{Consumer: "c", Block: 5 * time.Millisecond}, quietLog())
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- per.Run(ctx) }()
	if err := per.Drain(b.ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	if n := b.count(t, "ledger_entries"); n != 4 {
		t.Fatalf("%d ledger entries, want 4 (k0, k1, o1, o2)", n)
	}
	rows, err := b.pool.Query(b.ctx, "SELECT id, raw, sqlstate, held_by FROM outbox_dead_letters ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		id       int64
		raw      string
		sqlstate *string
		heldBy   *int64
	}
	var got []row
	for rows.Next() {
		var r row
		var raw []byte
		if err := rows.Scan(&r.id, &raw, &r.sqlstate, &r.heldBy); err != nil {
			t.Fatal(err)
		}
		r.raw = string(raw)
		got = append(got, r)
	}
	if len(got) != 4 || got[0].raw != "{not json" || !strings.Contains(got[1].raw, poison.OpID.String()) ||
		got[1].sqlstate == nil || *got[1].sqlstate != "22P05" || got[1].heldBy != nil {
		t.Fatalf("dead letters = %+v", got)
	}
	for _, held := range got[2:] {
		if held.heldBy == nil || *held.heldBy != got[1].id || held.sqlstate != nil {
			t.Fatalf("held dead letter %+v does not name %d", held, got[1].id)
		}
	}
	if st := per.Stats(); st.DeadLettered != 4 {
		t.Fatalf("stats = %+v", st)
	}
}

// slowWriter delays every Apply, so a shutdown lands mid-commit.
type slowWriter struct{ inner engine.LedgerWriter }

func (w slowWriter) Apply(ctx context.Context, ms []engine.Mutation) error {
	select {
	case <-time.After(3 * time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	return w.inner.Apply(ctx, ms)
}

// TestPersisterStopsMidCommit: cancelling Run while batches wait for the
// group committer returns promptly (no partition waits forever on a
// committer that has stopped), and leaves what it did not commit pending.
func TestPersisterStopsMidCommit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	for round := 0; round < 10; round++ {
		ob := newFakeOutbox(8)
		for p := range 8 {
			a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
			for i := range 20 {
				ob.add(p, a.grant(fmt.Sprintf("r%d-k%d", round, i), 1, nil))
			}
		}
		per := NewPersister(ob, slowWriter{b.store}, PersisterConfig{Consumer: "c", BatchSize: 3, Block: time.Millisecond}, quietLog())
		ctx, cancel := context.WithCancel(b.ctx)
		done := make(chan error, 1)
		go func() { done <- per.Run(ctx) }()
		time.Sleep(time.Duration(round) * time.Millisecond)
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Run did not return after cancel", round)
		}
	}
}

// recordingWriter counts Applies and the mutations each carried.
type recordingWriter struct{ applied chan int }

func (w *recordingWriter) Apply(_ context.Context, ms []engine.Mutation) error {
	w.applied <- len(ms)
	return nil
}

// TestHurryEndsTheLinger: a read waiting for its own write (Credits'
// read-your-writes wait calls Hurry) gets the batch gathered so far
// committed at once, not after the group-commit linger; without Hurry the
// committer keeps gathering.
func TestHurryEndsTheLinger(t *testing.T) {
	w := &recordingWriter{applied: make(chan int, 4)}
	p := NewPersister(nil, w, PersisterConfig{}, zerolog.Nop())
	p.linger = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	commits := make(chan commitRequest)
	go p.commitGroups(ctx, commits)
	done := make(chan error, 2)
	commits <- commitRequest{ms: make([]engine.Mutation, 2), done: done}
	commits <- commitRequest{ms: make([]engine.Mutation, 1), done: done}
	select {
	case n := <-w.applied:
		t.Fatalf("applied %d mutations before anyone hurried (linger is an hour)", n)
	case <-time.After(100 * time.Millisecond):
	}
	p.Hurry()
	select {
	case n := <-w.applied:
		if n != 3 {
			t.Fatalf("the hurried group carried %d mutations, want both batches' 3", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Hurry did not end the linger")
	}
	for i := 0; i < 2; i++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestMeteringLinger: a group of consumes and gauge moves gathers for
// meteringLinger; a batch of any other kind joining it ends the group at
// the ordinary linger, counted from the group's first batch.
func TestMeteringLinger(t *testing.T) {
	batch := func(kinds ...engine.MutationKind) []engine.Mutation {
		ms := make([]engine.Mutation, len(kinds))
		for i, k := range kinds {
			ms[i].Kind = k
		}
		return ms
	}
	metering := batch(engine.MutationConsume, engine.MutationGaugeKind)
	tests := []struct {
		name    string
		batches [][]engine.Mutation
		// commits: whether the group commits within a second (the
		// ordinary linger is 50 ms, meteringLinger an hour).
		commits bool
	}{
		{"consumes and gauge moves wait", [][]engine.Mutation{metering, batch(engine.MutationConsume)}, false},
		{"a grant joining ends the wait", [][]engine.Mutation{metering, batch(engine.MutationGrant)}, true},
		{"a commit in the first batch", [][]engine.Mutation{batch(engine.MutationConsume, engine.MutationCommit)}, true},
		{"a reserve first", [][]engine.Mutation{batch(engine.MutationReserve), metering}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := &recordingWriter{applied: make(chan int, 4)}
			p := NewPersister(nil, w, PersisterConfig{}, zerolog.Nop())
			p.linger, p.meteringLinger = 50*time.Millisecond, time.Hour
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			commits := make(chan commitRequest)
			go p.commitGroups(ctx, commits)
			done := make(chan error, len(tc.batches))
			want := 0
			for _, ms := range tc.batches {
				commits <- commitRequest{ms: ms, done: done}
				want += len(ms)
			}
			select {
			case n := <-w.applied:
				if !tc.commits {
					t.Fatalf("applied %d mutations of a metering group before meteringLinger", n)
				}
				if n != want {
					t.Fatalf("the group carried %d mutations, want %d", n, want)
				}
			case <-time.After(time.Second):
				if tc.commits {
					t.Fatal("the group did not commit at the ordinary linger")
				}
			}
		})
	}
}

// newOnlyOutbox is a fakeOutbox that can also read new messages only
// (lua.Store.ReadNew) and fails the acks it is told to.
type newOnlyOutbox struct {
	*fakeOutbox
	newReads  atomic.Int64
	fullReads atomic.Int64
	failAcks  atomic.Int64 // acks still to fail
}

func (o *newOnlyOutbox) Read(ctx context.Context, p int, consumer string, count int, block time.Duration) ([]engine.OutboxMessage, error) {
	o.fullReads.Add(1)
	return o.read(ctx, p, consumer, count, block, true)
}

func (o *newOnlyOutbox) ReadNew(ctx context.Context, p int, consumer string, count int, block time.Duration) ([]engine.OutboxMessage, error) {
	o.newReads.Add(1)
	return o.read(ctx, p, consumer, count, block, false)
}

func (o *newOnlyOutbox) Ack(ctx context.Context, p int, ids []string) error {
	if o.failAcks.Add(-1) >= 0 {
		return errors.New("connection reset")
	}
	return o.fakeOutbox.Ack(ctx, p, ids)
}

// TestPersisterSkipsPendingOnlyWhenAcked: once every message it was given
// is acknowledged, the persister reads new messages without looking at its
// pending list; a batch whose ack failed stays pending, and the next read
// looks there again, so each message is still acknowledged exactly once.
func TestPersisterSkipsPendingOnlyWhenAcked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	ob := &newOnlyOutbox{fakeOutbox: newFakeOutbox(1)}
	ob.failAcks.Store(2)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	want := 40
	for i := range want {
		ob.add(0, a.grant(fmt.Sprintf("k%d", i), 1, nil))
	}
	per := NewPersister(ob, b.store, PersisterConfig{Consumer: "c1", BatchSize: 5, Block: 5 * time.Millisecond}, quietLog())
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- per.Run(ctx) }()
	if err := per.Drain(b.ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// A few idle reads, which follow fully acknowledged batches.
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run returned %v", err)
	}
	if got := ob.acked.Load(); got != int64(want) {
		t.Fatalf("acked %d, want %d", got, want)
	}
	if n := b.count(t, "ledger_entries"); n != want {
		t.Fatalf("%d ledger entries, want %d", n, want)
	}
	if ob.newReads.Load() == 0 {
		t.Fatal("never read new messages alone after a fully acknowledged batch")
	}
	// The first read, and one after each failed ack, look at the pending list.
	if got := ob.fullReads.Load(); got < 3 {
		t.Fatalf("%d reads looked at the pending list, want at least 3 (the first and one per failed ack)", got)
	}
}
