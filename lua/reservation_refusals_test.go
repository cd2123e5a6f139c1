package lua

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// TestReservationOpenAndSettleRefusals: reserve_open refuses a reservation id
// already taken, and commit_meta refuses with STALE a merge Go made from
// a reservation field "r:<id>" the hash no longer holds (so possibly from
// metadata the reservation no longer has), leaving the reservation active.
func TestReservationOpenAndSettleRefusals(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 1}
		first := reserveCmd(c, 5, terms, time.Hour, t0)
		b.reserve(t, first)

		again := reserveCmd(c, 5, terms, time.Hour, t0)
		again.ReservationID = first.ReservationID
		if _, err := b.store.Reserve(ctx, again); err == nil || !strings.Contains(err.Error(), "reservation id is taken") {
			t.Fatalf("reserve of a taken id: %v, want BADARG the reservation id is taken", err)
		}

		cmd := commitCmd(c, first.ReservationID, 3, terms, t0)
		head, err := newHotHead(cmd.CommandHeader, cmd.Context)
		if err != nil {
			t.Fatal(err)
		}
		a := commitArgv{hotHead: head, ResID: cmd.ReservationID.String(), Actual: "3", Terms: "per_unit|0|1||",
			Meta: `{"b":2}`, Merge: mergeArgv{Stored: "a|5|5|stale", Merged: `{"a":1,"b":2}`}}
		_, err = b.store.runMoney(ctx, commitScript, "commit", b.store.reservationKeys(c.CustomerID, ""), a.list())
		if !errors.Is(err, errStale) {
			t.Fatalf("commit merged from metadata the reservation does not have: %v, want STALE", err)
		}
		if _, err := b.store.Commit(ctx, commitCmd(c, first.ReservationID, 3, terms, t0)); err != nil {
			t.Fatalf("the reservation should still be active after STALE: %v", err)
		}
	})
}
