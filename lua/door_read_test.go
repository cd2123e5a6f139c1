package lua

import (
	"context"
	"errors"
	"testing"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// TestReadDoor: a check's balances read under a read door
// (engine.FusedDoor.Read) carries the tenant's stamps in its round trip and
// settles the door: checked when the stamps are as the request saw them,
// stale (engine.ErrFusedStale, nothing read) when one moved; a door already
// settled, or a money route's door, is left to its own path.
func TestReadDoor(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	b := bundle{store: NewStore(rdb, prefix), rdb: rdb, real: true}
	ctx := context.Background()
	if !b.store.FusesReads() {
		t.Fatal("a store does not fuse reads")
	}
	cases := []struct {
		name        string
		checked     bool
		bump        bool // a stamp moves after the door is opened
		read        bool // false: a money route's door
		wantErr     error
		wantOutcome engine.FusedOutcome
	}{
		{name: "stamps as seen", checked: true, read: true, wantOutcome: engine.FusedChecked},
		{name: "a stamp moved", checked: true, read: true, bump: true, wantErr: engine.ErrFusedStale, wantOutcome: engine.FusedStale},
		{name: "a node alone", read: true, bump: true, wantOutcome: engine.FusedChecked},
		{name: "a money route's door", checked: true, bump: true, wantOutcome: engine.FusedUnused},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := b.funded(t)
			stamp, err := b.store.StampBump(ctx, c.TenantID, engine.StampTenant)
			if err != nil {
				t.Fatal(err)
			}
			d := &engine.FusedDoor{Tenant: c.TenantID, Checked: tc.checked, Read: tc.read}
			d.Stamps[engine.StampTenant] = stamp
			if tc.bump {
				if _, err := b.store.StampBump(ctx, c.TenantID, engine.StampCatalog); err != nil {
					t.Fatal(err)
				}
			}
			bal, err := b.store.Balances(engine.WithFusedDoor(ctx, d), c, t0)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("balances: %v, want %v", err, tc.wantErr)
			}
			if d.Outcome() != tc.wantOutcome {
				t.Errorf("outcome %d, want %d", d.Outcome(), tc.wantOutcome)
			}
			if tc.wantErr == nil && bal.Balance != 100 {
				t.Errorf("balance %d, want 100", bal.Balance)
			}
			// A second read under the settled door is a plain read.
			if _, err := b.store.Balances(engine.WithFusedDoor(ctx, d), c, t0); err != nil {
				t.Errorf("second read: %v", err)
			}
			if d.Outcome() != tc.wantOutcome {
				t.Errorf("outcome after a second read %d, want %d", d.Outcome(), tc.wantOutcome)
			}
		})
	}
}
