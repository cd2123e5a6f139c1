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
