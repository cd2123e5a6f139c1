package lua

import (
	"context"
	"testing"
	"time"
)

// TestOutboxRenew: messages their consumer renews do not grow idle, so
// another consumer's Claim leaves them alone; once the renewals stop they
// grow idle and are claimed. Renewing acknowledged ids is harmless.
func TestOutboxRenew(t *testing.T) {
	t.Parallel()
	portBackends(t, func(t *testing.T, b portBundle) {
		ctx := context.Background()
		const p = 11
		// Wide enough that a loaded machine's pause between Renew and Claim
		// (real Redis sleeps for real) does not pass it: 300 ms did, once,
		// under make test with two more builds sharing the 2 cores.
		const minIdle = time.Second
		xadd(t, b, p, "", outboxMutation(t))
		xadd(t, b, p, "", outboxMutation(t))
		read, err := b.store.Read(ctx, p, "busy", 10, 0)
		if err != nil || len(read) != 2 {
			t.Fatalf("Read = %d, %v", len(read), err)
		}
		ids := []string{read[0].ID, read[1].ID}
		for range 3 {
			b.elapse(minIdle * 2 / 3)
			if err := b.store.Renew(ctx, p, "busy", ids); err != nil {
				t.Fatal(err)
			}
			got, err := b.store.Claim(ctx, p, "other", minIdle, 10)
			if err != nil || len(got) != 0 {
				t.Fatalf("Claim of renewed messages = %v, %v", opIDs(got), err)
			}
		}
		b.elapse(minIdle + 20*time.Millisecond)
		got, err := b.store.Claim(ctx, p, "other", minIdle, 10)
		if err != nil || len(got) != 2 {
			t.Fatalf("Claim once the renewals stopped = %v, %v; want both", opIDs(got), err)
		}
		if err := b.store.Ack(ctx, p, ids); err != nil {
			t.Fatal(err)
		}
		if err := b.store.Renew(ctx, p, "busy", ids); err != nil {
			t.Fatalf("Renew of acknowledged ids: %v", err)
		}
		if n, _, err := b.store.Backlog(ctx, p); err != nil || n != 0 {
			t.Fatalf("Backlog after the ack and a late renew = %d, %v", n, err)
		}
	})
}
