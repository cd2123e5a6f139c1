package lua

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// TestConsumeDry: a dry run answers the Mutation the consume would write
// (the same draws a real consume then makes) and leaves every key it could
// touch as it was, scratch keys included; a refusal comes back with its
// record; a customer without state is ErrStateMissing (issue 28 item 5).
func TestConsumeDry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, blocks := b.funded(t)
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 7}
		before := b.dump(t, c)
		dry, err := b.store.ConsumeDry(ctx, consumeCmd(c, 10, terms, engine.OveragePolicyBlock, t0))
		if err != nil {
			t.Fatal(err)
		}
		if after := b.dump(t, c); after != before {
			t.Errorf("a dry run changed the customer's keys:\nbefore %s\nafter  %s", before, after)
		}
		if n := len(b.rdb.Keys(ctx, b.store.tag(Partition(c.CustomerID))+":dry:*").Val()); n != 0 {
			t.Errorf("%d scratch keys left", n)
		}
		real, err := b.store.Consume(ctx, consumeCmd(c, 10, terms, engine.OveragePolicyBlock, t0))
		if err != nil {
			t.Fatal(err)
		}
		dm, rm := dry.Mutation, real.Mutation
		if dm.Account.Balance != rm.Account.Balance || dm.Account.Balance != 30 || len(dm.Entries) != len(rm.Entries) {
			t.Fatalf("dry %+v, real %+v", dm.Account, rm.Account)
		}
		_, dd := dm.Entries[0].PaidBy()
		_, rd := rm.Entries[0].PaidBy()
		if len(dd) != 2 || len(rd) != 2 || dd[0] != rd[0] || dd[1] != rd[1] || dd[0].BlockID != blocks[0] {
			t.Errorf("dry draws %v, real draws %v (first block %s)", dd, rd, blocks[0])
		}

		before = b.dump(t, c)
		refused, err := b.store.ConsumeDry(ctx, consumeCmd(c, 100, terms, engine.OveragePolicyBlock, t0))
		if !errors.Is(err, engine.ErrInsufficientCredits) || refused.Mutation.Usage == nil || !refused.Mutation.Usage.Refused {
			t.Errorf("dry run past the balance: %+v %v, want the refusal record and ErrInsufficientCredits", refused.Mutation.Usage, err)
		}
		if after := b.dump(t, c); after != before {
			t.Errorf("a refused dry run changed the customer's keys")
		}

		if _, err := b.store.ConsumeDry(ctx, consumeCmd(newCustomer(), 1, terms, engine.OveragePolicyBlock, t0)); !errors.Is(err, engine.ErrStateMissing) {
			t.Errorf("dry run without state: %v, want ErrStateMissing", err)
		}
	})
}

// TestReserveDry: a reservation's dry run answers the reservation reserve.lua would take
// and leaves the account, the outbox and the partition's reservation-expiry zset
// as they were.
func TestReserveDry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 7}
		rexp := b.store.reservationExpiryKey(Partition(c.CustomerID))
		before, zBefore := b.dump(t, c), b.rdb.ZCard(ctx, rexp).Val()
		res, err := b.store.ReserveDry(ctx, reserveCmd(c, 10, terms, time.Minute, t0))
		if err != nil {
			t.Fatal(err)
		}
		if r := res.Mutation.Reservation; r == nil || res.Mutation.Account.Reserved != 70 {
			t.Errorf("dry reservation: %+v reserved %d, want a reservation of 70", r, res.Mutation.Account.Reserved)
		}
		if after, z := b.dump(t, c), b.rdb.ZCard(ctx, rexp).Val(); after != before || z != zBefore {
			t.Errorf("a reservation's dry run changed the keys (zset %d -> %d)", zBefore, z)
		}
		if _, err := b.store.ReserveDry(ctx, reserveCmd(c, 100, terms, time.Minute, t0)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Errorf("dry reservation past the balance: %v", err)
		}
		// Only this store's scratch keys of the customer's slot: the Redis
		// is shared with other tests' dry runs, whose keys live for a
		// moment too.
		if n := len(b.rdb.Keys(ctx, b.store.tag(Partition(c.CustomerID))+":dry:*").Val()); n != 0 {
			t.Errorf("%d scratch keys left", n)
		}
	})
}
