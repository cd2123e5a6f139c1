// Package idempotencytest is idempotency.Records over a map, for the tests
// of the packages that claim and finish records (engine/idempotency, api),
// with switches for the failures a Redis without a master gives. It keeps
// no TTLs: tests are short.
package idempotencytest

import (
	"context"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine/idempotency"
)

var _ idempotency.Records = (*Records)(nil)

// ErrMarks is what a failing MarkRerun answers (FailMarks).
var ErrMarks = errors.New("idempotencytest: redis restarting")

// Records is idempotency.Records over a map. It is safe for concurrent use.
type Records struct {
	mu                        sync.Mutex
	records                   map[Ref]stored
	begins, aborts, markCalls int
	// beginErr, when set, is what every Begin answers.
	beginErr error
	// abortFails Aborts still answer abortErr; markFails MarkRerun calls
	// still answer ErrMarks.
	abortFails, markFails int
	abortErr              error
}

// Ref names a record: its tenant and key value.
type Ref struct {
	Tenant uuid.UUID
	Key    string
}

// stored is a record with the request hash it belongs to.
type stored struct {
	hash string
	rec  idempotency.Record
}

// New is an empty Records.
func New() *Records { return &Records{records: map[Ref]stored{}} }

// Begin claims the key, as idempotency.Records.Begin.
func (f *Records) Begin(_ context.Context, tenant uuid.UUID, key, hash string, _ time.Duration) (idempotency.Record, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.begins++
	if f.beginErr != nil {
		return idempotency.Record{}, false, f.beginErr
	}
	k := Ref{tenant, key}
	if cur, ok := f.records[k]; ok {
		rec := cur.rec
		rec.Mismatch = cur.hash != hash
		return rec, false, nil
	}
	f.records[k] = stored{hash: hash}
	return idempotency.Record{}, true, nil
}

// Finish stores the answer, as idempotency.Records.Finish. A Finish that
// says held when the claim is gone panics: the caller's bookkeeping is
// wrong, which a test must not pass over.
func (f *Records) Finish(_ context.Context, tenant uuid.UUID, key, hash string, rec idempotency.Record, _ time.Duration, held bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := Ref{tenant, key}
	cur, ok := f.records[k]
	if held && (!ok || cur.hash != hash || cur.rec.Done) {
		panic("Finish says held but the claim is gone")
	}
	if ok && (cur.rec.Done || cur.hash != hash) {
		return nil
	}
	rec.Done, rec.Body = true, append([]byte(nil), rec.Body...)
	f.records[k] = stored{hash: hash, rec: rec}
	return nil
}

// MarkRerun finishes each claim with the rerun mark, as
// idempotency.Records.MarkRerun, unless FailMarks has calls left to fail.
func (f *Records) MarkRerun(ctx context.Context, marks []idempotency.RerunMark, ttl time.Duration) error {
	f.mu.Lock()
	f.markCalls++
	if f.markFails > 0 {
		f.markFails--
		f.mu.Unlock()
		return ErrMarks
	}
	f.mu.Unlock()
	for _, m := range marks {
		if err := f.Finish(ctx, m.Tenant, m.Key, m.RequestHash, idempotency.Record{Rerun: true}, ttl, m.Held); err != nil {
			return err
		}
	}
	return nil
}

// Abort drops an in-progress claim, as idempotency.Records.Abort, unless
// FailAborts has calls left to fail.
func (f *Records) Abort(_ context.Context, tenant uuid.UUID, key, hash string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.aborts++
	if f.abortFails > 0 {
		f.abortFails--
		return f.abortErr
	}
	k := Ref{tenant, key}
	if cur, ok := f.records[k]; ok && !cur.rec.Done && cur.hash == hash {
		delete(f.records, k)
	}
	return nil
}

// FailBegins makes every Begin answer err from now on (nil: none fail).
func (f *Records) FailBegins(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.beginErr = err
}

// FailAborts makes the next n Aborts answer err.
func (f *Records) FailAborts(n int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.abortFails, f.abortErr = n, err
}

// FailMarks makes the next n MarkRerun calls answer ErrMarks.
func (f *Records) FailMarks(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.markFails = n
}

// Put stores rec for hash under tenant and key (a record another request
// left).
func (f *Records) Put(tenant uuid.UUID, key, hash string, rec idempotency.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records[Ref{tenant, key}] = stored{hash: hash, rec: rec}
}

// Record is the record stored under tenant and key, and whether there is
// one.
func (f *Records) Record(tenant uuid.UUID, key string) (idempotency.Record, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.records[Ref{tenant, key}]
	return r.rec, ok
}

// Refs lists the stored records, by tenant and then key.
func (f *Records) Refs() []Ref {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Ref, 0, len(f.records))
	for k := range f.records {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if c := out[i].Tenant.String(); c != out[j].Tenant.String() {
			return c < out[j].Tenant.String()
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// Calls is how many times Begin, Abort and MarkRerun were called so far.
func (f *Records) Calls() (begins, aborts, marks int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.begins, f.aborts, f.markCalls
}
