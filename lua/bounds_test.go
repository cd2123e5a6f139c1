package lua

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// maxKeptReservations is prelude/bounds.lua MAX_KEPT_RESERVATIONS: finalized reservations kept in the
// account hash (docs/limits.md).
const maxKeptReservations = 8

// TestCapErrorsNameTheCap: the errors of the caps prelude/bounds.lua names
// (their values: TestLuaConstantsMatchGo) are 409s naming the cap
// (invariant 13).
func TestCapErrorsNameTheCap(t *testing.T) {
	for _, e := range []*engine.Error{engine.ErrTooManyBlocks, engine.ErrTooManyReservations} {
		if !strings.Contains(e.Detail, fmt.Sprint(engine.MaxLiveBlocks)) || e.Kind != engine.KindConflict || e.Field == "" {
			t.Errorf("cap error %+v: want a 409 naming its field and the cap", e)
		}
	}
}

// withMeta is a grant carrying block metadata.
func withMeta(c engine.CustomerKey, amount int64, now time.Time, meta string) engine.GrantCommand {
	g := grantCmd(c, amount, now)
	g.Block.Metadata = engine.Metadata{"tag": json.RawMessage(`"` + meta + `"`)}
	return g
}

// TestCapsRefuseAndChangeNothing: at MaxLiveBlocks live blocks a grant is
// ErrTooManyBlocks and at MaxActiveReservations active reservations a reservation is
// ErrTooManyReservations, each leaving every key as it was; an expired or emptied
// block frees its slot (invariant 13, invariant 9).
func TestCapsRefuseAndChangeNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		short := withMeta(c, 5, t0, "short")
		short.Block.ExpiresAt = ptr(t0.Add(time.Hour))
		b.grant(t, short)
		for i := 1; i < engine.MaxLiveBlocks; i++ {
			b.grant(t, withMeta(c, 1000, t0, fmt.Sprint("b", i)))
		}
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 1}
		for i := 0; i < engine.MaxActiveReservations; i++ {
			b.reserve(t, reserveCmd(c, 1, terms, time.Hour, t0))
		}
		cases := []struct {
			name string
			run  func() error
			want error
		}{
			{"grant past the live-block cap", func() error {
				_, err := b.store.Grant(ctx, withMeta(c, 1, t0, "over"))
				return err
			}, engine.ErrTooManyBlocks},
			{"reserve past the reservation cap", func() error {
				_, err := b.store.Reserve(ctx, reserveCmd(c, 1, terms, time.Hour, t0))
				return err
			}, engine.ErrTooManyReservations},
			{"stack_after grant past the cap", func() error {
				g := withMeta(c, 1, t0, "stack")
				g.DurationSeconds = 60
				g.StackAfter = &engine.StackAfter{MetadataMatch: engine.Metadata{"tag": json.RawMessage(`"b1"`)}, Fallback: engine.FallbackNow}
				_, err := b.store.Grant(ctx, g)
				return err
			}, engine.ErrTooManyBlocks},
			{"stack_after grant under reject past the cap", func() error {
				g := withMeta(c, 1, t0, "stack")
				g.DurationSeconds = 60
				g.StackAfter = &engine.StackAfter{MetadataMatch: engine.Metadata{"tag": json.RawMessage(`"short"`)}, Fallback: engine.FallbackReject}
				_, err := b.store.Grant(ctx, g)
				return err
			}, engine.ErrTooManyBlocks},
		}
		// At the cap under fallback "now" Go reads no metadata (the
		// grant is refused whatever the start); under "reject" it still
		// finds the match, whose absence would answer NOMATCH instead.
		match := engine.Metadata{"tag": json.RawMessage(`"short"`)} // the one block with an expiry
		if _, ok, _, err := b.store.stackStart(ctx, c.CustomerID, match, engine.FallbackNow, t0); err != nil || ok {
			t.Errorf("stackStart at the cap under now: ok %v err %v, want no match read", ok, err)
		}
		if _, ok, _, err := b.store.stackStart(ctx, c.CustomerID, match, engine.FallbackReject, t0); err != nil || !ok {
			t.Errorf("stackStart at the cap under reject: ok %v err %v, want the match", ok, err)
		}
		for _, tc := range cases {
			before := b.reservationDump(t, c)
			if err := tc.run(); !errors.Is(err, tc.want) {
				t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
			}
			if after := b.reservationDump(t, c); after != before {
				t.Errorf("%s changed state:\nbefore %s\nafter  %s", tc.name, before, after)
			}
		}
		// The short block expires at t0+1h: its slot is free again.
		if _, err := b.store.Grant(ctx, withMeta(c, 1, t0.Add(2*time.Hour), "after expiry")); err != nil {
			t.Errorf("grant once a block expired: %v", err)
		}
	})
}

// TestDrainCarriesNoBlockMetadata: only the Mutation that creates a block
// carries its metadata; a consume, debit, commit or expiry that drains it
// does not, and its op key does not keep it, while the block still shows
// it and a rebuild from the (metadata-keeping) state restores it.
func TestDrainCarriesNoBlockMetadata(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		big := strings.Repeat("m", 8000)
		g := withMeta(c, 100, t0, big)
		g.Block.ExpiresAt = ptr(t0.Add(time.Hour))
		if m := b.grant(t, g); len(m.Blocks) != 1 || !strings.Contains(string(m.Blocks[0].Metadata), big) {
			t.Fatalf("the grant's Mutation must carry the block metadata: %+v", m.Blocks)
		}
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 1}
		cons := consumeCmd(c, 10, terms, engine.OveragePolicyBlock, t0)
		cons.IdempotencyKey = "drain-key"
		if _, err := b.store.Consume(ctx, cons); err != nil {
			t.Fatal(err)
		}
		if _, err := b.store.Debit(ctx, debitCmd(c, 10, t0)); err != nil {
			t.Fatal(err)
		}
		reservation := b.reserve(t, reserveCmd(c, 10, terms, time.Minute, t0))
		if _, err := b.store.Commit(ctx, commitCmd(c, reservation.Reservation.ID, 5, terms, t0)); err != nil {
			t.Fatal(err)
		}
		if a := b.snapshot(t, c, t0); len(a.Blocks) != 1 || a.Blocks[0].Metadata["tag"] == nil {
			t.Errorf("the block lost its metadata in Redis: %+v", a.Blocks)
		}
		if _, _, err := b.store.Expire(ctx, uuid.New(), c, t0.Add(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
		ms := b.outbox(t, c)
		if len(ms) != 6 {
			t.Fatalf("outbox has %d mutations, want 6", len(ms))
		}
		for _, m := range ms[1:] {
			for _, blk := range m.Blocks {
				if len(blk.Metadata) > 0 {
					t.Errorf("%s Mutation carries block metadata", m.Kind)
				}
			}
		}
		op := b.rdb.Get(ctx, b.store.opKeyOf(c.CustomerID, "drain-key")).Val()
		if op == "" || strings.Contains(op, big) {
			t.Errorf("op key of the consume: %d bytes, holds the metadata: %v", len(op), strings.Contains(op, big))
		}
		// Emptied, the block leaves the hash with its metadata field.
		keys := b.rdb.HKeys(ctx, b.store.accountKey(c.CustomerID)).Val()
		for _, k := range keys {
			if strings.HasPrefix(k, "m:") {
				t.Errorf("metadata field %s outlived its block", k)
			}
		}

		// A rebuild installs the metadata Postgres kept; drains after it
		// still carry none, and the block still shows it.
		c2 := newCustomer()
		blk := engine.MutationBlock{ID: uuid.New(), Original: 50, Remaining: 50, Source: engine.SourceManual,
			StartsMS: t0.UnixMilli(), CreatedMS: t0.UnixMilli(), Metadata: json.RawMessage(`{"tag":"` + big + `"}`)}
		if ok, err := b.store.LoadAt(ctx, engine.AccountState{TenantID: c2.TenantID, CustomerID: c2.CustomerID,
			Environment: c2.Environment, AccountID: uuid.NewString(), Version: 3, LifetimeEarned: 50,
			Blocks: []engine.MutationBlock{blk}}, t0); err != nil || !ok {
			t.Fatalf("load: %v %v", ok, err)
		}
		if a := b.snapshot(t, c2, t0); len(a.Blocks) != 1 || string(a.Blocks[0].Metadata["tag"]) != `"`+big+`"` {
			t.Errorf("rebuilt block metadata %v", a.Blocks)
		}
		res, err := b.store.Debit(ctx, debitCmd(c2, 5, t0))
		if err != nil || len(res.Mutation.Blocks) != 1 || len(res.Mutation.Blocks[0].Metadata) != 0 {
			t.Errorf("debit after rebuild: %v %+v", err, res.Mutation.Blocks)
		}
	})
}

// TestKeptReservationsBounded: finalized reservations stay in the hash for a while, but
// never more than MAX_KEPT_RESERVATIONS of them; reservation metadata is kept out of what
// every script reads (field "n:<id>") and out of release Mutations.
func TestKeptReservationsBounded(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		terms := engine.RuleTerms{CostType: engine.CostFlat, BaseCost: 1}
		for i := 0; i < 2*engine.MaxActiveReservations+5; i++ {
			r := reserveCmd(c, 1, terms, time.Hour, t0)
			r.Metadata = engine.Metadata{"i": json.RawMessage(fmt.Sprint(i))}
			b.reserve(t, r)
			res, err := b.store.Release(ctx, releaseCmd(c, r.ReservationID, false, t0))
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Mutation.Reservation.Metadata) != 0 {
				t.Fatalf("a release Mutation carries the reservation metadata %s", res.Mutation.Reservation.Metadata)
			}
		}
		var reservations, metas int
		for _, k := range b.rdb.HKeys(ctx, b.store.accountKey(c.CustomerID)).Val() {
			switch {
			case strings.HasPrefix(k, "r:"):
				reservations++
			case strings.HasPrefix(k, "n:"):
				metas++
			}
		}
		if reservations > maxKeptReservations || reservations == 0 || metas != reservations {
			t.Errorf("hash keeps %d finalized reservations and %d reservation metadata fields, want 1..%d of each", reservations, metas, maxKeptReservations)
		}
	})
}

// TestKeptReservationTextsRemembered: the finalized instant of a kept reservation
// is remembered by its text across calls (prelude res_final); two customers whose
// kept reservations are the same texts, read on the slow path, each let them go
// exactly when RES_KEEP_MS has passed since they were finalized.
func TestKeptReservationTextsRemembered(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		terms := engine.RuleTerms{CostType: engine.CostFlat, BaseCost: 1}
		a, _ := b.funded(t)
		o, _ := b.funded(t)
		for _, c := range []engine.CustomerKey{a, o} {
			for i := 0; i < 3; i++ {
				r := reserveCmd(c, 1, terms, time.Hour, t0)
				b.reserve(t, r)
				if _, err := b.store.Release(ctx, releaseCmd(c, r.ReservationID, false, t0)); err != nil {
					t.Fatal(err)
				}
			}
		}
		keep := 10 * time.Minute // prelude/reservations.lua RES_KEEP_MS
		steps := []struct {
			c    engine.CustomerKey
			at   time.Time
			kept int
		}{
			{a, t0.Add(time.Minute), 3},
			{o, t0.Add(time.Minute), 3},
			{a, t0.Add(keep - time.Millisecond), 3},
			{o, t0.Add(keep), 0},
			{a, t0.Add(keep), 0},
		}
		for i, st := range steps {
			if _, err := b.store.Consume(ctx, consumeCmd(st.c, 1, perUnitTerms(1), engine.OveragePolicyBlock, st.at)); err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			kept := 0
			for _, k := range b.rdb.HKeys(ctx, b.store.accountKey(st.c.CustomerID)).Val() {
				if strings.HasPrefix(k, "r:") {
					kept++
				}
			}
			if kept != st.kept {
				t.Errorf("step %d: the hash keeps %d finalized reservations, want %d", i, kept, st.kept)
			}
		}
	})
}

// TestCommitMergesMetadataInGo: the commit's metadata is merged into the
// reservation's by Go and the script only checks the reservation is unchanged; the result
// is the key-by-key merge either way.
func TestCommitMergesMetadataInGo(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, _ := b.funded(t)
		terms := engine.RuleTerms{CostType: engine.CostTiered, TierConfig: &engine.TierConfig{Mode: engine.TierGraduated,
			Tiers: []engine.Tier{{UpTo: ptr(int64(2)), UnitCost: 1}, {UnitCost: 2, FlatCost: 3}}}}
		r := reserveCmd(c, 3, terms, time.Hour, t0)
		r.Metadata = engine.Metadata{"a": json.RawMessage(`1`), "b": json.RawMessage(`"x"`)}
		if m := b.reserve(t, r); m.Reservation == nil || m.Reservation.EstimatedCost != 2+2+3 {
			t.Fatalf("reserve priced %+v, want 7 (2 x 1 + 1 x 2 + flat 3)", m.Reservation)
		}
		cm := commitCmd(c, r.ReservationID, 1, terms, t0)
		cm.Metadata = engine.Metadata{"b": json.RawMessage(`"y"`), "c": json.RawMessage(`12345678901234567890`)}
		res, err := b.store.Commit(ctx, cm)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]json.RawMessage{}
		if err := json.Unmarshal(res.Mutation.Reservation.Metadata, &got); err != nil {
			t.Fatal(err)
		}
		if string(got["a"]) != "1" || string(got["b"]) != `"y"` || string(got["c"]) != "12345678901234567890" {
			t.Errorf("merged metadata %s", res.Mutation.Reservation.Metadata)
		}
		if res.Mutation.Usage == nil || res.Mutation.Usage.Cost != 1 {
			t.Errorf("commit usage %+v, want cost 1", res.Mutation.Usage)
		}
	})
}

// TestCommitReservationMetadataField: after a commit, field "n:<id>" (which the
// commit no longer rewrites when its metadata is unchanged) and the
// commit's Mutation hold the reservation's metadata, merged with the commit's when
// it brings some.
func TestCommitReservationMetadataField(t *testing.T) {
	for _, tc := range []struct {
		name   string
		commit engine.Metadata
		want   string
		// kept finalized reservations before: 7 make the hash long enough
		// for acct_read's summary HMGET, which finds no summary, so the
		// script reads the field with HKEYS and HMGET instead of HGETALL.
		kept int
	}{
		{"no metadata", nil, `{"a":1}`, 0},
		{"merged", engine.Metadata{"b": json.RawMessage(`2`)}, `{"a":1,"b":2}`, 0},
		{"no metadata, kept reservations", nil, `{"a":1}`, maxKeptReservations - 1},
		{"merged, kept reservations", engine.Metadata{"b": json.RawMessage(`2`)}, `{"a":1,"b":2}`, maxKeptReservations - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eachBackend(t, func(t *testing.T, b bundle) {
				ctx := context.Background()
				c, _ := b.funded(t)
				terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 3}
				for i := 0; i < tc.kept; i++ {
					k := reserveCmd(c, 1, terms, time.Hour, t0)
					b.reserve(t, k)
					if _, err := b.store.Release(ctx, releaseCmd(c, k.ReservationID, false, t0)); err != nil {
						t.Fatal(err)
					}
				}
				r := reserveCmd(c, 2, terms, time.Hour, t0)
				r.Metadata = engine.Metadata{"a": json.RawMessage(`1`)}
				b.reserve(t, r)
				cm := commitCmd(c, r.ReservationID, 2, terms, t0)
				cm.Metadata = tc.commit
				res, err := b.store.Commit(ctx, cm)
				if err != nil {
					t.Fatal(err)
				}
				if got := string(res.Mutation.Reservation.Metadata); got != tc.want {
					t.Errorf("commit Mutation metadata %s, want %s", got, tc.want)
				}
				key := b.store.accountKey(c.CustomerID)
				var fields []string
				for _, k := range b.rdb.HKeys(ctx, key).Val() {
					if strings.HasPrefix(k, "n:") {
						fields = append(fields, b.rdb.HGet(ctx, key, k).Val())
					}
				}
				if len(fields) != 1 || fields[0] != tc.want {
					t.Errorf("reservation metadata fields %q, want [%s]", fields, tc.want)
				}
			})
		})
	}
}
