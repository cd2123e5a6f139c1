package persist

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/jackc/pgx/v5"
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
// query: while maxAppliedQueries are in flight, new calls queue and the
// next query takes the whole queue (one `= ANY`-style join per batch, served
// by operations_tenant_key_op_key). It is safe for concurrent use.
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
		cancel()
		for _, w := range batch {
			close(w.done)
		}
	}
}

// appliedOps answers every wait of batch with one query.
func (s *Store) appliedOps(ctx context.Context, batch []*appliedWait) {
	// Text, not uuid.UUID: QueryExecModeExec (below) sends its parameters
	// as text, and Postgres casts them ($1::uuid[]).
	var tenants, customers, keys []string
	for _, w := range batch {
		w.ms, w.found = make([]engine.Mutation, len(w.refs)), make([]bool, len(w.refs))
		for _, r := range w.refs {
			tenants = append(tenants, r.Customer.TenantID.String())
			customers = append(customers, r.Customer.CustomerID.String())
			keys = append(keys, r.Key)
		}
	}
	fail := func(err error) {
		for _, w := range batch {
			w.err = err
		}
	}
	// The ordinal (1-based) of a row names the ref it answers. The customer
	// is compared as "IS TRUE", which no index can answer: with a plain
	// equality the planner, its statistics stale on a table that grows by
	// thousands of rows a second, ANDed the (tenant, key) index with the
	// customer index and read every operation of the customer for each
	// key (the bench's consume fell from 3,000/s to under 500/s).
	//
	// QueryExecModeExec plans every execution with its own arrays: a
	// prepared statement's generic plan, made while the table was small,
	// hash-joined a sequential scan of operations, and kept doing so as it
	// grew to millions of rows (the look-up then cost Postgres more than
	// everything else a consume does).
	rows, err := s.pool.Query(ctx, `SELECT k.i, o.mutation
		FROM unnest($1::uuid[], $2::uuid[], $3::text[]) WITH ORDINALITY AS k(tenant_id, customer_id, idempotency_key, i)
		JOIN operations o ON o.tenant_id = k.tenant_id AND o.idempotency_key = k.idempotency_key
			AND (o.customer_id = k.customer_id) IS TRUE`, pgx.QueryExecModeExec, tenants, customers, keys)
	if err != nil {
		fail(fmt.Errorf("persist: applied ops: %w", err))
		return
	}
	defer rows.Close()
	for rows.Next() {
		var i int64
		var doc []byte
		if err := rows.Scan(&i, &doc); err != nil {
			fail(fmt.Errorf("persist: applied ops: %w", err))
			return
		}
		w, j := locate(batch, int(i-1))
		if w == nil {
			fail(fmt.Errorf("persist: applied ops: row for ref %d of %d", i, len(keys)))
			return
		}
		if err := json.Unmarshal(doc, &w.ms[j]); err != nil {
			fail(fmt.Errorf("persist: applied op %q: %w", w.refs[j].Key, err))
			return
		}
		w.found[j] = true
	}
	if err := rows.Err(); err != nil {
		fail(fmt.Errorf("persist: applied ops: %w", err))
	}
}

// locate is the wait and index within it of the i-th ref of batch.
func locate(batch []*appliedWait, i int) (*appliedWait, int) {
	for _, w := range batch {
		if i < len(w.refs) {
			if i < 0 {
				return nil, 0
			}
			return w, i
		}
		i -= len(w.refs)
	}
	return nil, 0
}
