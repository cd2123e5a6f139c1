package lua

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

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
		bump        []engine.StampKind // stamps that move after the door is opened
		read        bool               // false: a money route's door
		rate        int                // a take of the rate budget the door asks (0: none), this burst
		spent       bool               // the budget is spent before
		wantErr     error
		wantOutcome engine.FusedOutcome
		wantTaken   bool
	}{
		{name: "stamps as seen", checked: true, read: true, wantOutcome: engine.FusedChecked},
		{name: "a stamp moved", checked: true, read: true, bump: []engine.StampKind{engine.StampCatalog}, wantErr: engine.ErrFusedStale, wantOutcome: engine.FusedStale},
		{name: "a node alone", read: true, bump: []engine.StampKind{engine.StampCatalog}, wantOutcome: engine.FusedChecked},
		{name: "a money route's door", checked: true, bump: []engine.StampKind{engine.StampCatalog}, wantOutcome: engine.FusedUnused},
		{name: "with a rate take", checked: true, read: true, rate: 5, wantOutcome: engine.FusedChecked, wantTaken: true},
		{name: "the rate refused", checked: true, read: true, rate: 1, spent: true, wantErr: engine.ErrFusedStale, wantOutcome: engine.FusedRateRefused, wantTaken: true},
		// The take is fenced on the tenant's stamp: moved, it takes nothing.
		{name: "the tenant's stamp moved under a take", checked: true, read: true, rate: 5, bump: []engine.StampKind{engine.StampTenant}, wantErr: engine.ErrFusedStale, wantOutcome: engine.FusedStale},
		// Another stamp moved: the take stands (the usual path then uses it), the read does not.
		{name: "a stamp moved beside a take", checked: true, read: true, rate: 5, bump: []engine.StampKind{engine.StampCatalog}, wantErr: engine.ErrFusedStale, wantOutcome: engine.FusedStale, wantTaken: true},
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
			if tc.rate > 0 {
				d.Rate = &engine.RateAsk{Key: uuid.New(), PerSecond: 1, Burst: tc.rate, Requests: 1, Fenced: true, Stamp: stamp}
				if tc.spent {
					if rd, err := b.store.TakeRate(ctx, c.TenantID, d.Rate.Key, 1, tc.rate, tc.rate, time.Time{}); err != nil || !rd.Allowed {
						t.Fatalf("spend the budget: %+v %v", rd, err)
					}
				}
			}
			for _, k := range tc.bump {
				if _, err := b.store.StampBump(ctx, c.TenantID, k); err != nil {
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
			if d.RateTaken != tc.wantTaken {
				t.Errorf("rate taken %v, want %v", d.RateTaken, tc.wantTaken)
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

// TestReadDoorGauge: a gauge check's read (GaugeValue) carries the read
// door's stamps in its round trip as the balances read does.
func TestReadDoorGauge(t *testing.T) {
	t.Parallel()
	rdb, prefix := testenv.Redis(t)
	b := bundle{store: NewStore(rdb, prefix), rdb: rdb, real: true}
	ctx := context.Background()
	for _, moved := range []bool{false, true} {
		c, _ := b.funded(t)
		if _, err := b.store.Gauge(ctx, engine.GaugeCommand{CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: t0},
			Metric: "seats", Delta: 3, Cap: 10}); err != nil {
			t.Fatal(err)
		}
		stamp, err := b.store.StampBump(ctx, c.TenantID, engine.StampTenant)
		if err != nil {
			t.Fatal(err)
		}
		d := &engine.FusedDoor{Tenant: c.TenantID, Checked: true, Read: true}
		d.Stamps[engine.StampTenant] = stamp
		if moved {
			if _, err := b.store.StampBump(ctx, c.TenantID, engine.StampCatalog); err != nil {
				t.Fatal(err)
			}
		}
		v, err := b.store.GaugeValue(engine.WithFusedDoor(ctx, d), c, "seats")
		switch {
		case moved && (!errors.Is(err, engine.ErrFusedStale) || d.Outcome() != engine.FusedStale):
			t.Errorf("a stamp moved: %d %v, outcome %d; want ErrFusedStale and stale", v, err, d.Outcome())
		case !moved && (err != nil || v != 3 || d.Outcome() != engine.FusedChecked):
			t.Errorf("stamps as seen: %d %v, outcome %d; want 3 and checked", v, err, d.Outcome())
		}
	}
}
