package lua

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// legacyHash writes c's account hash as a binary before issue 10's compact
// encoding did: UUID text in "id" and in the block field names, "rs" "0",
// every block's original written out and the eighth field (one block with
// its metadata inline, one with it in "m:<id>"). It returns the Postgres
// state the hash stands for.
func legacyHash(t *testing.T, b bundle, c engine.CustomerKey, account uuid.UUID) engine.AccountState {
	t.Helper()
	created := t0.Add(-time.Hour).UnixMilli()
	exp := t0.Add(24 * time.Hour).UnixMilli()
	st := engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
		AccountID: account.String(), Version: 3, LifetimeEarned: 3500, UpdatedAtMS: created,
		Blocks: []engine.MutationBlock{
			{ID: uuid.New(), Remaining: 500, Original: 500, Priority: 0, Source: engine.SourceMigration,
				CreatedMS: created, StartsMS: created, ExpiresMS: &exp},
			{ID: uuid.New(), Remaining: 1000, Original: 1000, Priority: 1, Source: engine.SourceTopup,
				CreatedMS: created, StartsMS: created, Metadata: json.RawMessage(`{"k":"v"}`)},
			{ID: uuid.New(), Remaining: 2000, Original: 2000, Priority: 2, Source: "partner_credit",
				CreatedMS: created, StartsMS: created, Metadata: json.RawMessage(`{"x":"a|b"}`)},
		}}
	c36, e36 := b36(created), b36(exp-created)
	bl := st.Blocks
	fields := []any{"v", "3", "id", account.String(), "rs", "0", "le", "3500", "ua", dec(created),
		"b:" + bl[0].ID.String(), "500|500|0|" + c36 + "||" + e36 + "|g|",
		"b:" + bl[1].ID.String(), "1000|1000|1|" + c36 + "|||t|",
		"m:" + bl[1].ID.String(), `{"k":"v"}`,
		"b:" + bl[2].ID.String(), "2000|2000|2|" + c36 + `|||partner_credit|{"x":"a|b"}`,
	}
	if err := b.rdb.HSet(context.Background(), b.store.accountKey(c.CustomerID), fields...).Err(); err != nil {
		t.Fatal(err)
	}
	return st
}

// storedMatches fails t unless the store's account of c agrees with st as
// a reconcile pass compares them.
func storedMatches(t *testing.T, b bundle, st engine.AccountState, what string) {
	t.Helper()
	got, err := b.store.StoredAccounts(context.Background(), []uuid.UUID{st.CustomerID})
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := engine.CompareAccount(st, got[0], sumLeft(st.Blocks)); !ok {
		t.Fatalf("%s: reconcile finds %s (stored %+v)", what, d, got[0])
	}
}

// sumLeft is the credit left in blocks (the ledger sum of a consistent
// account).
func sumLeft(blocks []engine.MutationBlock) int64 {
	var n int64
	for _, b := range blocks {
		n += b.Remaining
	}
	return n
}

// TestLegacyHashStillServes: a hash written in the text-id encoding (before
// issue 10) is read, drained, granted to, rolled over and reconciled
// exactly as Postgres has it, without a flush: the Mutations name every
// block and the account by UUID text, a new block lands beside the old
// ones in the compact form, and a reconcile reload rewrites the whole hash
// compactly with the same content.
func TestLegacyHashStillServes(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, account := newCustomer(), uuid.New()
		st := legacyHash(t, b, c, account)
		bl := st.Blocks

		a := b.snapshot(t, c, t0)
		if a.ID != account.String() || a.Balance != 3500 || a.ReservedBalance != 0 || a.LifetimeEarned != 3500 || len(a.Blocks) != 3 {
			t.Fatalf("snapshot of the legacy hash: %+v", a)
		}
		for i, blk := range a.Blocks {
			if blk.ID != bl[i].ID || blk.OriginalAmount != bl[i].Original || blk.Source != bl[i].Source {
				t.Errorf("block %d: %+v, want %+v", i, blk, bl[i])
			}
		}
		if string(a.Blocks[1].Metadata["k"]) != `"v"` || string(a.Blocks[2].Metadata["x"]) != `"a|b"` {
			t.Errorf("metadata: %v %v", a.Blocks[1].Metadata, a.Blocks[2].Metadata)
		}
		if bal, err := b.store.Balances(ctx, c, t0); err != nil || bal.Balance != 3500 || bal.Effective != 3500 {
			t.Fatalf("balances: %+v %v", bal, err)
		}
		storedMatches(t, b, st, "legacy hash")

		// A reservation moves "rs" (written as "0" here) and its release takes the
		// field away again: a missing one reads as zero.
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 1}
		rv := reserveCmd(c, 10, terms, time.Minute, t0)
		if _, err := b.store.Reserve(ctx, rv); err != nil {
			t.Fatal(err)
		}
		if got := b.rdb.HGet(ctx, b.store.accountKey(c.CustomerID), "rs").Val(); got != "10" {
			t.Fatalf("rs after a reservation of 10: %q", got)
		}
		if _, err := b.store.Release(ctx, releaseCmd(c, rv.ReservationID, false, t0)); err != nil {
			t.Fatal(err)
		}
		if n := b.rdb.HExists(ctx, b.store.accountKey(c.CustomerID), "rs").Val(); n {
			t.Fatal("rs kept at zero after the release")
		}
		st.Version = 5
		storedMatches(t, b, st, "after a reservation and its release")

		// A debit drains the old blocks in spend order; its Mutation names
		// them and the account by UUID text.
		res, err := b.store.Debit(ctx, debitCmd(c, 700, t0))
		if err != nil {
			t.Fatal(err)
		}
		m := res.Mutation
		if m.Account.ID != account.String() || len(m.Entries) != 2 || *m.Entries[0].BlockID != bl[0].ID ||
			*m.Entries[1].BlockID != bl[1].ID || m.Entries[1].Delta != -200 {
			t.Fatalf("debit mutation: %+v", m)
		}
		if len(m.Blocks) != 2 || m.Blocks[0].ID != bl[0].ID || m.Blocks[1].ID != bl[1].ID || m.Blocks[1].Remaining != 800 || m.Blocks[1].Original != 1000 {
			t.Fatalf("debit blocks: %+v", m.Blocks)
		}
		// A consume draws what is left of block 2 and all but 100 of block 3.
		cres, err := b.store.Consume(ctx, consumeCmd(c, 2700, terms, engine.OveragePolicyBlock, t0.Add(time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		paid, draws := cres.Mutation.Entries[len(cres.Mutation.Entries)-1].PaidBy()
		if paid != nil || len(draws) != 2 || draws[0].BlockID != bl[1].ID || draws[0].Amount != 800 || draws[1].BlockID != bl[2].ID || draws[1].Amount != 1900 {
			t.Fatalf("consume paid by %v %+v", paid, draws)
		}
		st.Version, st.Blocks = 7, []engine.MutationBlock{bl[2]}
		st.Blocks[0].Remaining = 100
		st.UpdatedAtMS = t0.Add(time.Second).UnixMilli()
		storedMatches(t, b, st, "after the debit and the consume")

		// A grant adds a compact block beside the old one; both read back.
		g := grantCmd(c, 300, t0.Add(2*time.Second))
		gres, err := b.store.Grant(ctx, g)
		if err != nil {
			t.Fatal(err)
		}
		if gres.Mutation.Account.ID != account.String() || gres.Mutation.Blocks[len(gres.Mutation.Blocks)-1].ID != g.Block.ID {
			t.Fatalf("grant mutation: %+v", gres.Mutation)
		}
		h := b.rdb.HGetAll(ctx, b.store.accountKey(c.CustomerID)).Val()
		if _, ok := h["b:"+engine.CompactID(g.Block.ID)]; !ok {
			t.Fatalf("the new block is not kept compactly: %v", h)
		}
		if _, ok := h["b:"+bl[2].ID.String()]; !ok || h["id"] != account.String() {
			t.Fatalf("the old block or the account id changed form: %v", h)
		}
		st.Version, st.LifetimeEarned = 8, st.LifetimeEarned+300
		st.Blocks = append(st.Blocks, gres.Mutation.Blocks[len(gres.Mutation.Blocks)-1])
		storedMatches(t, b, st, "after the grant")

		// A rollover finds the old block by its text id.
		exp := t0.Add(48 * time.Hour)
		rcmd := engine.RolloverCommand{OpID: uuid.New(), Customer: c, Now: t0.Add(3 * time.Second),
			Blocks: []uuid.UUID{bl[2].ID}, Percentage: 50,
			Block:     engine.Block{ID: uuid.New(), Source: engine.SourcePlanGrant, ExpiresAt: &exp},
			EntryType: engine.EntryPlanGrant}
		rres, err := b.store.Rollover(ctx, rcmd)
		if err != nil {
			t.Fatal(err)
		}
		rm := rres.Mutation
		if len(rm.Entries) != 2 || *rm.Entries[0].BlockID != bl[2].ID || rm.Entries[0].Delta != -100 || rm.Entries[1].Delta != 50 ||
			*rm.Entries[1].BlockID != rcmd.Block.ID {
			t.Fatalf("rollover mutation: %+v", rm)
		}

		// A reconcile reload rewrites the hash in the compact form: the
		// same account, read and compared alike.
		before := b.snapshot(t, c, t0.Add(4*time.Second))
		st.Version = 9 // a rollover carries credit: lifetime earned stays
		st.Blocks = append(st.Blocks[1:], rm.Blocks[len(rm.Blocks)-1])
		st.UpdatedAtMS = rcmd.Now.UnixMilli()
		storedMatches(t, b, st, "after the rollover")
		if ok, err := b.store.Reload(ctx, st, st.Version); err != nil || !ok {
			t.Fatalf("reload: %v %v", ok, err)
		}
		h = b.rdb.HGetAll(ctx, b.store.accountKey(c.CustomerID)).Val()
		if h["id"] != engine.CompactID(account) {
			t.Fatalf("reloaded hash: %v", h)
		}
		if _, ok := h["rs"]; ok {
			t.Fatalf("reloaded hash keeps rs 0: %v", h)
		}
		after := b.snapshot(t, c, t0.Add(4*time.Second))
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("reload changed the account\nbefore %+v\nafter  %+v", before, after)
		}
		storedMatches(t, b, st, "after the reload")
	})
}
