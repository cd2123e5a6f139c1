package lua

import (
	"context"
	"testing"
	"time"
)

// TestOutboxLeases (issue 25): a partition has one owner at a time; its
// owner renews and releases it with its token, nobody else can; a lease
// under the taker's own name (an earlier run of it) is taken again; every
// take's token is greater than the one before; a lapsed lease is free; the
// owners read back per partition, and the live persisters are counted.
func TestOutboxLeases(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		s := b.store
		const ttl = 10 * time.Second
		t1, ok, err := s.TakePartition(ctx, 3, "a", ttl)
		if err != nil || !ok || t1 <= 0 {
			t.Fatalf("take by a: %d %v %v", t1, ok, err)
		}
		if _, ok, err := s.TakePartition(ctx, 3, "b", ttl); err != nil || ok {
			t.Fatalf("b took a's partition: %v %v", ok, err)
		}
		if ok, err := s.RenewPartition(ctx, 3, "b", t1, ttl); err != nil || ok {
			t.Fatalf("b renewed a's lease: %v %v", ok, err)
		}
		if ok, err := s.RenewPartition(ctx, 3, "a", t1, ttl); err != nil || !ok {
			t.Fatalf("a renews: %v %v", ok, err)
		}
		t2, ok, err := s.TakePartition(ctx, 3, "a", ttl)
		if err != nil || !ok || t2 <= t1 {
			t.Fatalf("a takes again: token %d after %d, %v %v", t2, t1, ok, err)
		}
		if ok, err := s.RenewPartition(ctx, 3, "a", t1, ttl); err != nil || ok {
			t.Fatalf("the earlier token renews: %v %v", ok, err)
		}
		owners, err := s.PartitionOwners(ctx)
		if err != nil || len(owners) != Partitions || owners[3] != "a" || owners[4] != "" {
			t.Fatalf("owners %q: %v", owners, err)
		}
		if err := s.ReleasePartition(ctx, 3, "b", t2); err != nil {
			t.Fatal(err)
		}
		if owners, _ := s.PartitionOwners(ctx); owners[3] != "a" {
			t.Fatalf("b released a's lease: owners %q", owners)
		}
		if err := s.ReleasePartition(ctx, 3, "a", t2); err != nil {
			t.Fatal(err)
		}
		t3, ok, err := s.TakePartition(ctx, 3, "b", time.Millisecond)
		if err != nil || !ok || t3 <= t2 {
			t.Fatalf("b takes the released partition: token %d after %d, %v %v", t3, t2, ok, err)
		}
		time.Sleep(20 * time.Millisecond)
		if b.real {
			// miniredis keeps its own time: only real Redis lapses the lease.
			t4, ok, err := s.TakePartition(ctx, 3, "a", ttl)
			if err != nil || !ok || t4 <= t3 {
				t.Fatalf("a takes the lapsed lease: token %d after %d, %v %v", t4, t3, ok, err)
			}
		}

		for _, step := range []struct {
			consumer string
			ttl      time.Duration
			want     int
		}{{"a", ttl, 1}, {"b", ttl, 2}, {"a", ttl, 2}, {"c", ttl, 3}, {"b", 0, 2}} {
			if n, err := s.Persisters(ctx, step.consumer, step.ttl); err != nil || n != step.want {
				t.Fatalf("Persisters(%s, %s) = %d, %v; want %d", step.consumer, step.ttl, n, err, step.want)
			}
		}
	})
}
