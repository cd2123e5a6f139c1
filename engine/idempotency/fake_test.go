package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"
)

// errUnavailable stands for engine.ErrUnavailable: the record's Redis slot
// has no master.
var errUnavailable = errors.New("fake: unavailable")

// fakeRecords is Records over a map (no TTLs: tests are short).
type fakeRecords struct {
	mu      sync.Mutex
	records map[string]fakeRecord
	// begins counts Begin calls; aborts Abort calls.
	begins, aborts int
	// abortFails is how many Aborts still fail.
	abortFails int
	// markCalls counts MarkRerun calls (batches of rerun marks);
	// markFails is how many of them still fail (Redis restarting).
	markCalls, markFails int
	// beginFails, when set, is what every Begin answers.
	beginFails error
}

// fakeRecord is a stored record with the request hash it belongs to.
type fakeRecord struct {
	hash string
	rec  Record
}

func newFakeRecords() *fakeRecords { return &fakeRecords{records: map[string]fakeRecord{}} }

func fakeKey(tenant uuid.UUID, key string) string { return tenant.String() + "|" + key }

func (f *fakeRecords) Begin(_ context.Context, tenant uuid.UUID, key, hash string, _ time.Duration) (Record, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.begins++
	if f.beginFails != nil {
		return Record{}, false, f.beginFails
	}
	k := fakeKey(tenant, key)
	if cur, ok := f.records[k]; ok {
		rec := cur.rec
		rec.Mismatch = cur.hash != hash
		return rec, false, nil
	}
	f.records[k] = fakeRecord{hash: hash}
	return Record{}, true, nil
}

func (f *fakeRecords) Finish(_ context.Context, tenant uuid.UUID, key, hash string, rec Record, _ time.Duration, held bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := fakeKey(tenant, key)
	cur, ok := f.records[k]
	if held && (!ok || cur.hash != hash || cur.rec.Done) {
		panic("Finish says held but the claim is gone")
	}
	if ok && (cur.rec.Done || cur.hash != hash) {
		return nil
	}
	rec.Done, rec.Body = true, append([]byte(nil), rec.Body...)
	f.records[k] = fakeRecord{hash: hash, rec: rec}
	return nil
}

func (f *fakeRecords) MarkRerun(ctx context.Context, marks []RerunMark, ttl time.Duration) error {
	f.mu.Lock()
	f.markCalls++
	if f.markFails > 0 {
		f.markFails--
		f.mu.Unlock()
		return errors.New("fake: redis restarting")
	}
	f.mu.Unlock()
	for _, m := range marks {
		if err := f.Finish(ctx, m.Tenant, m.Key, m.RequestHash, Record{Rerun: true}, ttl, m.Held); err != nil {
			return err
		}
	}
	return nil
}

func (f *fakeRecords) Abort(_ context.Context, tenant uuid.UUID, key, hash string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.aborts++
	if f.abortFails > 0 {
		f.abortFails--
		return errUnavailable
	}
	k := fakeKey(tenant, key)
	if cur, ok := f.records[k]; ok && !cur.rec.Done && cur.hash == hash {
		delete(f.records, k)
	}
	return nil
}

// put stores rec for hash under tenant and key (a twin's record).
func (f *fakeRecords) put(tenant uuid.UUID, key, hash string, rec Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.records[fakeKey(tenant, key)] = fakeRecord{hash: hash, rec: rec}
}

// record is the stored record under tenant and key, and whether there is one.
func (f *fakeRecords) record(tenant uuid.UUID, key string) (Record, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.records[fakeKey(tenant, key)]
	return r.rec, ok
}

// counts is Begin's and Abort's calls so far.
func (f *fakeRecords) counts() (begins, aborts int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.begins, f.aborts
}
