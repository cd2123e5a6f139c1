package persist

import (
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// TestAppliedMutations: a usage event's key is found in Postgres after Redis
// forgot it (event ids are idempotent forever), only for its own tenant.
func TestAppliedMutations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	other, _ := b.tenant(t)
	acct := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	g := acct.grant("usage:evt-1", 500, nil)
	if err := b.store.Apply(b.ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Apply(b.ctx, []engine.Mutation{g}); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.AppliedMutations(b.ctx, live.TenantID, []string{"usage:evt-1", "usage:evt-2"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got["usage:evt-1"].OpID != g.OpID {
		t.Fatalf("got %v, want only usage:evt-1 -> %s", got, g.OpID)
	}
	none, err := b.store.AppliedMutations(b.ctx, other.TenantID, []string{"usage:evt-1"})
	if err != nil || len(none) != 0 {
		t.Fatalf("another tenant sees the key: %v %v", none, err)
	}
}
