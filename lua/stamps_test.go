package lua

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// TestStamps: a tenant's stamps read 0 until moved; a bump moves only its
// kind of its tenant, to the server's clock in microseconds or one past the
// old value, so a stamp only grows, even across a lost key (a Redis
// restarted empty) or a value ahead of the clock (issue 25).
func TestStamps(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		tenant, other := uuid.New(), uuid.New()
		read := func(id uuid.UUID) engine.TenantStamps {
			t.Helper()
			v, err := b.store.StampsRead(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		if v := read(tenant); v != (engine.TenantStamps{}) {
			t.Fatalf("never moved: %v, want zeros", v)
		}
		bump := func(id uuid.UUID, k engine.StampKind) uint64 {
			t.Helper()
			n, err := b.store.StampBump(ctx, id, k)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := uint64(time.Now().Add(-time.Minute).UnixMicro())
		var want engine.TenantStamps
		for k := engine.StampKind(0); k < engine.StampKinds; k++ {
			want[k] = bump(tenant, k)
			if b.real && want[k] < before {
				t.Errorf("kind %s moved to %d, below the clock (%d)", k, want[k], before)
			}
		}
		if got := read(tenant); got != want {
			t.Errorf("read %v, want %v", got, want)
		}
		if got := read(other); got != (engine.TenantStamps{}) {
			t.Errorf("another tenant's stamps moved: %v", got)
		}
		cases := []struct {
			name  string
			setup func() // changes the stored stamp before the bump
			least func(old uint64) uint64
		}{
			{"twice in a row", func() {}, func(old uint64) uint64 { return old + 1 }},
			{"after the hash was lost", func() {
				time.Sleep(time.Millisecond) // the clock moves past the old value
				b.rdb.Del(ctx, b.store.stampsKey(tenant))
			}, func(old uint64) uint64 { return old + 1 }},
			{"ahead of the clock", func() {
				b.rdb.HSet(ctx, b.store.stampsKey(tenant), engine.StampCatalog.String(), "9000000000000000")
			}, func(uint64) uint64 { return 9000000000000001 }},
		}
		for _, tc := range cases {
			old := read(tenant)[engine.StampCatalog]
			tc.setup()
			got := bump(tenant, engine.StampCatalog)
			if w := tc.least(old); got < w {
				t.Errorf("%s: moved to %d, want at least %d", tc.name, got, w)
			}
			if r := read(tenant)[engine.StampCatalog]; r != got {
				t.Errorf("%s: reads %d after moving to %d", tc.name, r, got)
			}
		}
		if _, err := b.store.StampBump(ctx, tenant, engine.StampKinds); err == nil {
			t.Error("a bump of no kind was taken")
		}
	})
}
