package lua

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/creditd/creditd/engine"
)

// TestAccountReadListpack: a reserving customer's hash holds its last
// finalized reservations, which LAYOUT_MIN_ITEMS does not count, so it
// passes acct_read's field count with no summary to read. While Redis
// keeps it as a listpack, one HGETALL reads it (no summary HMGET, HKEYS
// and HMGET of every field), and the scripts answer as before. A hash
// past the listpack (a long metadata value) is read without its metadata
// as before. On a private server: the command counts are server-wide.
func TestAccountReadListpack(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	b := bundle{store: NewStore(rdb, "lp"), rdb: rdb, real: true}
	for _, tc := range []struct {
		name     string
		meta     string // the value of the grant block's metadata key "k"
		listpack bool
	}{
		{"listpack", `"v"`, true},
		{"hashtable", `"` + strings.Repeat("v", 200) + `"`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCustomer()
			b.known(t, c)
			g := grantCmd(c, 1_000_000, t0.Add(-time.Minute))
			g.Block.Metadata = engine.Metadata{"k": json.RawMessage(tc.meta)}
			b.grant(t, g)
			// Reserve and commit until the finalized reservations kept take
			// the hash past the field count (the oldest leave by halves
			// past MAX_KEPT_RESERVATIONS).
			now, key := t0, b.store.accountKey(c.CustomerID)
			for i := 0; i < 20 && rdb.HLen(ctx, key).Val() < layoutMinItems+5; i++ {
				now = now.Add(time.Second)
				m := b.reserve(t, reserveCmd(c, 10, perUnitTerms(1), time.Hour, now))
				if _, err := b.store.Commit(ctx, commitCmd(c, m.Reservation.ID, 8, perUnitTerms(1), now)); err != nil {
					t.Fatalf("commit: %v", err)
				}
			}
			n, enc := rdb.HLen(ctx, key).Val(), rdb.ObjectEncoding(ctx, key).Val()
			if n < layoutMinItems+5 || (enc == "listpack") != tc.listpack {
				t.Fatalf("the hash has %d fields in a %s: the case is not the one under test", n, enc)
			}
			before := commandStats(t, rdb)
			m := b.reserve(t, reserveCmd(c, 10, perUnitTerms(1), time.Hour, now.Add(time.Second)))
			if m.Reservation == nil || m.Reservation.Status != engine.ReservationActive || m.Reservation.EstimatedUnits != 10 {
				t.Fatalf("reserve answered %+v", m.Reservation)
			}
			after := commandStats(t, rdb)
			got := func(cmd string) int64 { return after[cmd][0] - before[cmd][0] }
			if tc.listpack && (got("hgetall") != 1 || got("hkeys") != 0) {
				t.Errorf("a listpack hash: HGETALL %d, HKEYS %d; want one HGETALL, no HKEYS", got("hgetall"), got("hkeys"))
			}
			if !tc.listpack && (got("hgetall") != 0 || got("hkeys") != 1) {
				t.Errorf("a hashtable hash: HGETALL %d, HKEYS %d; want no HGETALL (its metadata stays in Redis), one HKEYS",
					got("hgetall"), got("hkeys"))
			}
		})
	}
}

// TestAccountReadRemembersWhole: a node remembers the accounts it last
// read whole, so the next money call of a small account reads it with one
// HGETALL and no HLEN; an account that has grown past what acct_read reads
// whole (a hashtable past the field count) is read right once more and
// forgotten, and its calls after that take the summary's path again. On a
// private server: the command counts are server-wide.
func TestAccountReadRemembersWhole(t *testing.T) {
	ctx := context.Background()
	rdb := privateRedis(t)
	b := bundle{store: NewStore(rdb, "rw"), rdb: rdb, real: true}
	c, _ := b.funded(t) // 60 and 40
	key := b.store.accountKey(c.CustomerID)
	consume := func(units int64) (engine.Mutation, func(string) int64) {
		t.Helper()
		before := commandStats(t, rdb)
		res, err := b.store.Consume(ctx, consumeCmd(c, units, perUnitTerms(1), engine.OveragePolicyBlock, t0))
		if err != nil {
			t.Fatal(err)
		}
		after := commandStats(t, rdb)
		return res.Mutation, func(cmd string) int64 { return after[cmd][0] - before[cmd][0] }
	}
	m, got := consume(1)
	if m.Account.Balance != 99 || got("hgetall") != 1 {
		t.Fatalf("a small account: balance %d, HGETALL %d; want 99, one HGETALL", m.Account.Balance, got("hgetall"))
	}
	m, got = consume(1)
	if m.Account.Balance != 98 || got("hlen") != 0 || got("hgetall") != 1 {
		t.Errorf("the same account again: balance %d, HLEN %d, HGETALL %d; want 98, no HLEN, one HGETALL",
			m.Account.Balance, got("hlen"), got("hgetall"))
	}
	// Grants with long metadata take the hash to a hashtable past the
	// field count (each grant reads the account too, remembered or not).
	total := int64(98)
	for range layoutMinItems + 5 {
		g := grantCmd(c, 10, t0.Add(-time.Minute))
		g.Block.Metadata = engine.Metadata{"k": json.RawMessage(`"` + strings.Repeat("v", 200) + `"`)}
		b.grant(t, g)
		total += 10
	}
	if n, enc := rdb.HLen(ctx, key).Val(), rdb.ObjectEncoding(ctx, key).Val(); n < layoutMinItems+5 || enc == "listpack" {
		t.Fatalf("the hash has %d fields in a %s: the case is not the one under test", n, enc)
	}
	for i := range 3 {
		total--
		m, got = consume(1)
		if m.Account.Balance != total {
			t.Fatalf("consume %d on the grown account: balance %d, want %d", i, m.Account.Balance, total)
		}
		if i == 2 && (got("hlen") != 1 || got("hgetall") != 0) {
			t.Errorf("a grown account, once forgotten: HLEN %d, HGETALL %d; want its HLEN back, no HGETALL", got("hlen"), got("hgetall"))
		}
	}
	if snap := b.snapshot(t, c, t0); snap.Balance != total {
		t.Errorf("the hash's balance %d, want %d", snap.Balance, total)
	}
}
