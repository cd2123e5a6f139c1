package lua

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestReservationRefsRemembered: the node that took a reservation finds its
// index record without Redis (the record is also in Redis, for the other
// nodes), until the record's TTL ends; a node that did not take it reads
// Redis.
func TestReservationRefsRemembered(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		clock := &testClock{now: t0}
		b.store.WithClock(clock)
		rc := reserveCmd(c, 3, perUnitTerms(10), 30*time.Minute, t0)
		rc.IdempotencyKey, rc.RequestHash = "refs-1", "rh"
		b.reserve(t, rc)

		// Another node on the same Redis reads the record Redis holds.
		other := NewStore(b.rdb, b.store.prefix).WithClock(clock)
		if ref, ok, err := other.ReservationRef(ctx, rc.ReservationID); err != nil || !ok || ref.Customer != c ||
			!ref.Described || ref.Metric != "gpu.seconds" {
			t.Fatalf("another node's look-up: %+v %v %v", ref, ok, err)
		}

		// With Redis's copy gone, the node that took it still knows it.
		if err := b.rdb.Del(ctx, b.store.reservationRecordKey(rc.ReservationID)).Err(); err != nil {
			t.Fatal(err)
		}
		if ref, ok, err := b.store.ReservationRef(ctx, rc.ReservationID); err != nil || !ok || ref.Customer != c || ref.Metric != "gpu.seconds" {
			t.Errorf("the reserving node's look-up: %+v %v %v", ref, ok, err)
		}
		if _, ok, err := other.ReservationRef(ctx, rc.ReservationID); ok || err != nil {
			t.Errorf("another node's look-up after the record is gone: %v %v", ok, err)
		}

		// Past the record's TTL (expiry + reservationIndexSlack) the memory
		// is gone too.
		clock.now = t0.Add(30*time.Minute + reservationIndexSlack)
		if _, ok, err := b.store.ReservationRef(ctx, rc.ReservationID); ok || err != nil {
			t.Errorf("look-up past the record's TTL: %v %v", ok, err)
		}
		if _, ok, _ := b.store.ReservationRef(ctx, uuid.New()); ok {
			t.Error("an unknown reservation is found")
		}
	})
}

// TestReservationRefsBounded: a full memory starts over.
func TestReservationRefsBounded(t *testing.T) {
	var r reservationRefs
	until := t0.Add(time.Hour)
	first := uuid.New()
	r.put(first, "x", until)
	for range maxReservationRefs - 1 {
		r.put(uuid.New(), "x", until)
	}
	if _, ok := r.get(first, t0); !ok {
		t.Fatal("an entry of a memory not yet full is gone")
	}
	r.put(uuid.New(), "x", until)
	if _, ok := r.get(first, t0); ok {
		t.Error("a full memory kept its entries")
	}
	if len(r.m) != 1 {
		t.Errorf("%d entries after starting over, want 1", len(r.m))
	}
}
