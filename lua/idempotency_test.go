package lua

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

const (
	idemLockTTL = time.Minute
	idemTTL     = 24 * time.Hour
)

func idemBegin(t *testing.T, b portBundle, tenant uuid.UUID, key, rh string) (engine.IdemRecord, bool) {
	t.Helper()
	rec, claimed, err := b.store.Begin(context.Background(), tenant, key, rh, idemLockTTL)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	return rec, claimed
}

// TestIdempotencyBeginRace checks that of 20 requests racing with one key
// exactly one claims it and the others see it in progress (invariant 4).
func TestIdempotencyBeginRace(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		const n = 20
		tenant := uuid.New()
		var wg sync.WaitGroup
		var mu sync.Mutex
		claimed := 0
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rec, ok, err := b.store.Begin(context.Background(), tenant, "race-key", "rh1", idemLockTTL)
				if err != nil {
					t.Errorf("Begin: %v", err)
					return
				}
				if !ok && (rec.Done || rec.RequestHash != "rh1") {
					t.Errorf("loser saw %+v, want in progress of rh1", rec)
				}
				if ok {
					mu.Lock()
					claimed++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if claimed != 1 {
			t.Fatalf("%d of %d Begins claimed the key, want exactly 1", claimed, n)
		}
	})
}

// TestIdempotencyFinishReplay checks that a finished record replays its
// status, content type and body byte for byte, for the TTL given.
func TestIdempotencyFinishReplay(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		tenant := uuid.New()
		rec, claimed := idemBegin(t, b, tenant, "k1", "rh1")
		if !claimed || rec.RequestHash != "rh1" || rec.Done {
			t.Fatalf("first Begin = %+v, %v", rec, claimed)
		}
		body := []byte("{\"id\":\"x\"}\x00\xff\n")
		if err := b.store.Finish(ctx, tenant, "k1", engine.IdemRecord{RequestHash: "rh1", Status: 201, ContentType: "application/json", Body: body}, idemTTL); err != nil {
			t.Fatal(err)
		}
		for _, rh := range []string{"rh1", "rh-other"} {
			got, claimed := idemBegin(t, b, tenant, "k1", rh)
			if claimed || !got.Done || got.RequestHash != "rh1" || got.Status != 201 || got.ContentType != "application/json" || !bytes.Equal(got.Body, body) {
				t.Fatalf("Begin(%s) after Finish = %+v, %v", rh, got, claimed)
			}
		}
		ttl := b.rdb.PTTL(ctx, b.store.idemRecordKey(tenant, "k1")).Val()
		if ttl <= idemTTL-time.Minute || ttl > idemTTL {
			t.Fatalf("record TTL %s, want about %s", ttl, idemTTL)
		}

		// An empty body replays as empty.
		idemBegin(t, b, tenant, "k2", "rh2")
		if err := b.store.Finish(ctx, tenant, "k2", engine.IdemRecord{RequestHash: "rh2", Status: 204}, idemTTL); err != nil {
			t.Fatal(err)
		}
		got, _ := idemBegin(t, b, tenant, "k2", "rh2")
		if !got.Done || got.Status != 204 || len(got.Body) != 0 || got.ContentType != "" {
			t.Fatalf("empty-body replay %+v", got)
		}
	})
}

// TestIdempotencyFinishKeepsOthers checks that Finish never overwrites a
// record of another request nor the first stored response, and stores the
// response when the lock lapsed and nobody claimed since.
func TestIdempotencyFinishKeepsOthers(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		tenant := uuid.New()
		finish := func(key, rh string, status int) {
			t.Helper()
			if err := b.store.Finish(ctx, tenant, key, engine.IdemRecord{RequestHash: rh, Status: status, Body: []byte("b")}, idemTTL); err != nil {
				t.Fatal(err)
			}
		}

		idemBegin(t, b, tenant, "other", "rh1")
		finish("other", "rh2", 200)
		if got, _ := idemBegin(t, b, tenant, "other", "rh1"); got.Done || got.RequestHash != "rh1" {
			t.Fatalf("Finish of another hash changed the record: %+v", got)
		}

		idemBegin(t, b, tenant, "first", "rh1")
		finish("first", "rh1", 201)
		finish("first", "rh1", 500)
		if got, _ := idemBegin(t, b, tenant, "first", "rh1"); got.Status != 201 {
			t.Fatalf("second Finish replaced the first response: %+v", got)
		}

		finish("lapsed", "rh1", 202)
		if got, claimed := idemBegin(t, b, tenant, "lapsed", "rh1"); claimed || !got.Done || got.Status != 202 {
			t.Fatalf("Finish after the lock lapsed = %+v, %v", got, claimed)
		}
	})
}

// TestIdempotencyAbort checks that Abort frees only an in-progress record of
// the same request hash.
func TestIdempotencyAbort(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		for _, tc := range []struct {
			name      string
			finished  bool
			abortHash string
			freed     bool
		}{
			{name: "in progress, same hash", abortHash: "rh1", freed: true},
			{name: "in progress, other hash", abortHash: "rh2"},
			{name: "finished, same hash", finished: true, abortHash: "rh1"},
			{name: "absent", abortHash: "rh1", freed: true},
		} {
			tenant := uuid.New()
			if tc.name != "absent" {
				idemBegin(t, b, tenant, "k", "rh1")
			}
			if tc.finished {
				if err := b.store.Finish(ctx, tenant, "k", engine.IdemRecord{RequestHash: "rh1", Status: 200}, idemTTL); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.store.Abort(ctx, tenant, "k", tc.abortHash); err != nil {
				t.Fatalf("%s: Abort: %v", tc.name, err)
			}
			rec, claimed := idemBegin(t, b, tenant, "k", "rh3")
			if claimed != tc.freed {
				t.Fatalf("%s: Begin after Abort claimed=%v (%+v), want %v", tc.name, claimed, rec, tc.freed)
			}
			if !tc.freed && (rec.RequestHash != "rh1" || rec.Done != tc.finished) {
				t.Fatalf("%s: record after Abort %+v", tc.name, rec)
			}
		}
	})
}

// TestIdempotencyLockExpiry checks that an in-progress record lapses after
// the lock TTL, so the retry of a crashed request can claim the key again.
func TestIdempotencyLockExpiry(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		tenant := uuid.New()
		const lock = 40 * time.Millisecond
		if _, claimed, err := b.store.Begin(ctx, tenant, "k", "rh1", lock); err != nil || !claimed {
			t.Fatalf("Begin = %v, %v", claimed, err)
		}
		if _, claimed, err := b.store.Begin(ctx, tenant, "k", "rh1", lock); err != nil || claimed {
			t.Fatalf("Begin while locked = %v, %v", claimed, err)
		}
		b.elapse(lock + 40*time.Millisecond)
		if _, claimed, err := b.store.Begin(ctx, tenant, "k", "rh1", lock); err != nil || !claimed {
			t.Fatalf("Begin after the lock lapsed = %v, %v", claimed, err)
		}
	})
}

// TestIdempotencyScope checks that a key is scoped by tenant: the same value
// in another tenant is a different record (interface.md Common rules 1,
// invariant 8), and keys that differ only in text are different records.
func TestIdempotencyScope(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		a, c := uuid.New(), uuid.New()
		if _, claimed := idemBegin(t, b, a, "shared", "rh1"); !claimed {
			t.Fatal("tenant a did not claim")
		}
		if _, claimed := idemBegin(t, b, c, "shared", "rh1"); !claimed {
			t.Fatal("tenant c did not claim its own key")
		}
		if _, claimed := idemBegin(t, b, a, "shared ", "rh1"); !claimed {
			t.Fatal("a different key value did not claim")
		}
		if _, claimed := idemBegin(t, b, a, "{brace}", "rh1"); !claimed {
			t.Fatal("a key with braces did not claim")
		}
	})
}

// TestIdempotencyBadTTL checks that TTLs under 1 ms are refused.
func TestIdempotencyBadTTL(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		tenant := uuid.New()
		if _, _, err := b.store.Begin(ctx, tenant, "k", "rh", 0); err == nil {
			t.Fatal("Begin with a zero lock TTL accepted")
		}
		if err := b.store.Finish(ctx, tenant, "k", engine.IdemRecord{RequestHash: "rh"}, time.Microsecond); err == nil {
			t.Fatal("Finish with a sub-ms TTL accepted")
		}
		if n := b.rdb.Exists(ctx, b.store.idemRecordKey(tenant, "k")).Val(); n != 0 {
			t.Fatal("a refused call wrote a record")
		}
	})
}
