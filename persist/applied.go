package persist

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"sync"
	"time"

	"github.com/creditd/creditd/engine"
)

// Compile-time check that AppliedBatcher answers the money calls' look-ups.
var _ engine.AppliedOps = (*AppliedBatcher)(nil)

// Limits of the applied look-ups (docs/limits.md).
const (
	// maxAppliedQueries is how many look-up queries run at once; callers
	// arriving meanwhile queue and share the next one.
	maxAppliedQueries = 2
	// maxAppliedBatch is how many keys one query takes from the queue (a
	// caller's own refs are never split, so one may exceed it).
	maxAppliedBatch = 1000
	// appliedQueryTimeout bounds one look-up query; it serves many callers,
	// so it does not run under any one caller's context.
	appliedQueryTimeout = 5 * time.Second
)

// AppliedBatcher finds persisted operations by (customer, idempotency key)
// for every money call with a key (engine.AppliedOps). A fresh operation is
// a miss, so it costs each call one index probe; concurrent calls share one
// round trip: while maxAppliedQueries are in flight, new calls queue and the
// next batch takes the whole queue (one prepared probe of
// operations_tenant_key_op_key and one of ledger_entries_op_key_idx per
// key, pipelined: a lean consume's record is its ledger entry, ophead.go). It is safe for
// concurrent use.
type AppliedBatcher struct {
	store   *Store
	mu      sync.Mutex
	queue   []*appliedWait
	running int
}

// appliedWait is one caller's refs and, once done is closed, its answer.
type appliedWait struct {
	refs  []engine.OpRef
	ms    []engine.Mutation
	found []bool
	err   error
	done  chan struct{}
}

// NewAppliedBatcher returns a batcher reading s.
func NewAppliedBatcher(s *Store) *AppliedBatcher { return &AppliedBatcher{store: s} }

// AppliedOps returns for each ref the persisted Mutation of that customer
// under that key and whether there is one. Errors: the query's, or ctx's
// when it ends first (the query goes on for the others).
func (b *AppliedBatcher) AppliedOps(ctx context.Context, refs []engine.OpRef) ([]engine.Mutation, []bool, error) {
	if len(refs) == 0 {
		return nil, nil, nil
	}
	w := &appliedWait{refs: refs, done: make(chan struct{})}
	b.mu.Lock()
	b.queue = append(b.queue, w)
	if b.running < maxAppliedQueries {
		b.running++
		go b.drain()
	}
	b.mu.Unlock()
	select {
	case <-w.done:
		return w.ms, w.found, w.err
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// drain runs queries until the queue is empty.
func (b *AppliedBatcher) drain() {
	for {
		b.mu.Lock()
		n, keys := 0, 0
		for n < len(b.queue) && (n == 0 || keys+len(b.queue[n].refs) <= maxAppliedBatch) {
			keys += len(b.queue[n].refs)
			n++
		}
		if n == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		batch := append([]*appliedWait(nil), b.queue[:n]...)
		b.queue = append(b.queue[:0], b.queue[n:]...)
		b.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), appliedQueryTimeout)
		b.store.appliedOps(ctx, batch)
		if err := batch[0].err; err != nil && ctx.Err() == nil && lostConnection(err) {
			// A connection that broke (Postgres restarted, or ended the
			// backend) leaves its idle siblings as dead, and the pool
			// pings only those idle for a second: the money calls behind
			// them would each answer "retry later" once. The pool drops
			// them all, and the look-up, a read, runs again on a new
			// connection (TestAppliedAfterRestart).
			b.store.pool.Reset()
			b.store.appliedOps(ctx, batch)
		}
		cancel()
		for _, w := range batch {
			close(w.done)
		}
	}
}

// lostConnection reports whether err says a connection in hand broke
// (Unavailable, but not a failure to connect: then no pooled connection
// is known dead, and a reset would only close live ones).
func lostConnection(err error) bool {
	var ce *pgconn.ConnectError
	return Unavailable(err) && !errors.As(err, &ce)
}

// appliedSQL finds the operations of one tenant under one idempotency key.
// It is a prepared statement (pgx's statement cache), executed once per
// key in one pipelined batch: one round trip, and Postgres neither parses
// nor plans it again (a planned-per-execution array join cost ~90 µs of
// Postgres CPU per look-up, this ~12; every consume makes one). Its only
// plans are the (tenant_id, idempotency_key, op_id) index or, while the
// table fits in a page or two, a scan of those pages; ANALYZE invalidates
// the cached plan as the table grows, so it never keeps a scan of a big
// table (the array join's generic plan could: a hash join over all of
// operations). The customer is compared in Go: an index on it is never
// considered, however stale the statistics.
const appliedSQL = `SELECT customer_id, mutation FROM operations WHERE tenant_id = $1 AND idempotency_key = $2`

// appliedOps answers every wait of batch with one pipelined batch of
// appliedSQL, one execution per ref.
func (s *Store) appliedOps(ctx context.Context, batch []*appliedWait) {
	var q pgx.Batch
	for _, w := range batch {
		w.ms, w.found, w.err = make([]engine.Mutation, len(w.refs)), make([]bool, len(w.refs)), nil
		for _, r := range w.refs {
			q.Queue(appliedSQL, r.Customer.TenantID, r.Key)
			q.Queue(headLookupSQL, r.Customer.TenantID, r.Key)
		}
	}
	fail := func(err error) {
		for _, w := range batch {
			w.err = err
		}
	}
	res := s.pool.SendBatch(ctx, &q)
	defer res.Close()
	for _, w := range batch {
		for j, r := range w.refs {
			if err := s.appliedOne(res, w, j, r); err != nil {
				fail(err)
				return
			}
		}
	}
	if err := res.Close(); err != nil {
		fail(fmt.Errorf("persist: applied ops: %w", err))
	}
}

// appliedOne reads the answer of ref r (the j-th of w) from res: the
// operation of r's customer under r's key, when there is one, from its
// operations row or else from the ledger entry carrying its op head (a
// lean consume, ophead.go).
func (s *Store) appliedOne(res pgx.BatchResults, w *appliedWait, j int, r engine.OpRef) error {
	rows, err := res.Query()
	if err != nil {
		return fmt.Errorf("persist: applied ops: %w", err)
	}
	for rows.Next() {
		var customer uuid.UUID
		var doc []byte
		if err := rows.Scan(&customer, &doc); err != nil {
			rows.Close()
			return fmt.Errorf("persist: applied ops: %w", err)
		}
		if customer != r.Customer.CustomerID || w.found[j] {
			continue
		}
		if err := json.Unmarshal(doc, &w.ms[j]); err != nil {
			rows.Close()
			return fmt.Errorf("persist: applied op %q: %w", r.Key, err)
		}
		w.found[j] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("persist: applied ops: %w", err)
	}
	m, found, err := readHead(res, r.Customer.CustomerID)
	if err != nil {
		return fmt.Errorf("persist: applied op %q: %w", r.Key, err)
	}
	if found && !w.found[j] {
		w.ms[j], w.found[j] = m, true
	}
	return nil
}

// readHead reads the next result of res, headLookupSQL's rows, and
// returns the Mutation of customer's row among them, if any.
func readHead(res pgx.BatchResults, customer uuid.UUID) (engine.Mutation, bool, error) {
	rows, err := res.Query()
	if err != nil {
		return engine.Mutation{}, false, err
	}
	defer rows.Close()
	var m engine.Mutation
	found := false
	for rows.Next() {
		var h headRow
		if err := rows.Scan(h.scan()...); err != nil {
			return engine.Mutation{}, false, err
		}
		if h.customer != customer || found {
			continue
		}
		if m, err = h.mutation(); err != nil {
			return engine.Mutation{}, false, err
		}
		found = true
	}
	return m, found, rows.Err()
}
