package lua

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestDeliverySlots: a tenant's slots are one cap for every holder: taken
// up to the limit, renewed by a holder that has one, freed by a release or
// when a lease ends (a crashed node's slot), and per tenant.
func TestDeliverySlots(t *testing.T) {
	t.Parallel()
	h := [4]uuid.UUID{uuid.New(), uuid.New(), uuid.New(), uuid.New()}
	const lease = 10 * time.Second
	type step struct {
		advance time.Duration
		op      string // acquire, release
		holder  int
		other   bool // another tenant's slots
		want    bool
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"up to the limit", []step{
			{0, "acquire", 0, false, true}, {0, "acquire", 1, false, true}, {0, "acquire", 2, false, false}}},
		{"a holder renews its own", []step{
			{0, "acquire", 0, false, true}, {0, "acquire", 1, false, true}, {0, "acquire", 0, false, true}}},
		{"a release frees one", []step{
			{0, "acquire", 0, false, true}, {0, "acquire", 1, false, true},
			{0, "release", 0, false, true}, {0, "acquire", 2, false, true}, {0, "acquire", 3, false, false}}},
		{"an ended lease frees one", []step{
			{0, "acquire", 0, false, true}, {5 * time.Second, "acquire", 1, false, true},
			{5 * time.Second, "acquire", 2, false, true}, {0, "acquire", 3, false, false}}},
		{"tenants apart", []step{
			{0, "acquire", 0, false, true}, {0, "acquire", 1, false, true}, {0, "acquire", 2, true, true}}},
	}
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		for _, tc := range cases {
			tenant, other := uuid.New(), uuid.New()
			now := t0
			for i, st := range tc.steps {
				now = now.Add(st.advance)
				tn := tenant
				if st.other {
					tn = other
				}
				got := true
				var err error
				if st.op == "release" {
					err = b.store.ReleaseDeliverySlot(ctx, tn, h[st.holder])
				} else {
					got, err = b.store.acquireDeliverySlotAt(ctx, tn, h[st.holder], 2, lease, now)
				}
				if err != nil {
					t.Fatalf("%s step %d: %v", tc.name, i, err)
				}
				if got != st.want {
					t.Fatalf("%s step %d: %s holder %d = %v, want %v", tc.name, i, st.op, st.holder, got, st.want)
				}
			}
		}
		if _, err := b.store.AcquireDeliverySlot(ctx, uuid.New(), h[0], 0, lease); err == nil {
			t.Fatal("limit 0 accepted")
		}
		if ok, err := b.store.AcquireDeliverySlot(ctx, uuid.New(), h[0], 1, lease); err != nil || !ok {
			t.Fatalf("on Redis' clock: %v %v", ok, err)
		}
	})
}
