package lua

import (
	"context"
	"encoding/json"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
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

// TestLayoutRewriteServes: a hash written in the text-id encoding (before
// issue 10) is refused by this release's readers until the layout rewrite
// (layout_fence.go) has run; then it is read, drained, granted to, rolled
// over and reconciled exactly as Postgres has it: the Mutations name every
// block and the account by UUID text, and a reconcile reload writes the
// same hash the rewrite made.
func TestLayoutRewriteServes(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c, account := newCustomer(), uuid.New()
		st := legacyHash(t, b, c, account)
		bl := st.Blocks
		key := b.store.accountKey(c.CustomerID)

		// No reader of this release takes the old layout.
		if _, err := b.store.Snapshot(ctx, c, t0); err == nil {
			t.Fatal("a legacy hash read without the rewrite")
		}
		if pending, err := b.store.LayoutsPending(ctx); err != nil || len(pending) != Partitions {
			t.Fatalf("pending before the rewrite: %v %v", pending, err)
		}
		r, err := b.store.RewriteLayouts(ctx)
		if err != nil || r.Scanned != 1 || r.Rewritten != 1 {
			t.Fatalf("rewrite: %+v %v", r, err)
		}
		if pending, err := b.store.LayoutsPending(ctx); err != nil || len(pending) != 0 {
			t.Fatalf("pending after the rewrite: %v %v", pending, err)
		}
		h := b.rdb.HGetAll(ctx, key).Val()
		cid := func(i int) string { return engine.CompactID(bl[i].ID) }
		want := map[string]string{"v": "3", "id": engine.CompactID(account), "le": "3500", "ua": dec(st.UpdatedAtMS),
			"b:" + cid(0): "500||0|" + b36(st.UpdatedAtMS) + "||" + b36(*bl[0].ExpiresMS-st.UpdatedAtMS) + "|g",
			"b:" + cid(1): "1000||1|" + b36(st.UpdatedAtMS) + "|||t", "m:" + cid(1): `{"k":"v"}`,
			"b:" + cid(2): "2000||2|" + b36(st.UpdatedAtMS) + "|||partner_credit", "m:" + cid(2): `{"x":"a|b"}`}
		if !reflect.DeepEqual(h, want) {
			t.Fatalf("rewritten hash\n got %v\nwant %v", h, want)
		}
		// Again: nothing left to do, the hash untouched.
		if n, err := b.store.rewriteBatch(ctx, []string{key}); err != nil || n != 0 {
			t.Fatalf("second rewrite of the hash: %d %v", n, err)
		}
		if !reflect.DeepEqual(b.rdb.HGetAll(ctx, key).Val(), want) {
			t.Fatal("a second rewrite changed the hash")
		}

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

		// A reservation moves "rs" (the rewrite dropped the old "0") and its
		// release takes the field away again: a missing one reads as zero.
		terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 1}
		rv := reserveCmd(c, 10, terms, time.Minute, t0)
		if _, err := b.store.Reserve(ctx, rv); err != nil {
			t.Fatal(err)
		}
		if got := b.rdb.HGet(ctx, key, "rs").Val(); got != "10" {
			t.Fatalf("rs after a reservation of 10: %q", got)
		}
		if _, err := b.store.Release(ctx, releaseCmd(c, rv.ReservationID, false, t0)); err != nil {
			t.Fatal(err)
		}
		if n := b.rdb.HExists(ctx, key, "rs").Val(); n {
			t.Fatal("rs kept at zero after the release")
		}
		st.Version = 5
		storedMatches(t, b, st, "after a reservation and its release")

		// A debit drains the rewritten blocks in spend order; its Mutation
		// names them and the account by UUID text.
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
		h = b.rdb.HGetAll(ctx, key).Val()
		if _, ok := h["b:"+engine.CompactID(g.Block.ID)]; !ok {
			t.Fatalf("the new block is not kept compactly: %v", h)
		}
		st.Version, st.LifetimeEarned = 8, st.LifetimeEarned+300
		st.Blocks = append(st.Blocks, gres.Mutation.Blocks[len(gres.Mutation.Blocks)-1])
		storedMatches(t, b, st, "after the grant")

		// A rollover finds the old block by its compact id.
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

		// A reconcile reload writes the hash as the rewrite left it: the
		// same account, read and compared alike.
		before := b.snapshot(t, c, t0.Add(4*time.Second))
		// Less the released reservation kept for RES_KEEP_MS: Postgres
		// state carries no finalized reservation.
		hBefore := b.rdb.HGetAll(ctx, key).Val()
		maps.DeleteFunc(hBefore, func(f, _ string) bool { return strings.HasPrefix(f, "r:") })
		st.Version = 9 // a rollover carries credit: lifetime earned stays
		st.Blocks = append(st.Blocks[1:], rm.Blocks[len(rm.Blocks)-1])
		st.UpdatedAtMS = rcmd.Now.UnixMilli()
		storedMatches(t, b, st, "after the rollover")
		if ok, err := b.store.Reload(ctx, st, st.Version); err != nil || !ok {
			t.Fatalf("reload: %v %v", ok, err)
		}
		if h = b.rdb.HGetAll(ctx, key).Val(); !reflect.DeepEqual(h, hBefore) {
			t.Fatalf("reload changed the hash\nbefore %v\nafter  %v", hBefore, h)
		}
		after := b.snapshot(t, c, t0.Add(4*time.Second))
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("reload changed the account\nbefore %+v\nafter  %+v", before, after)
		}
		storedMatches(t, b, st, "after the reload")
	})
}

// preIssue10 rewrites the current hash h as a creditd before issue 10 kept
// it: the account and block ids as UUID text, "rs" "0" when absent, every
// original written out and every block's metadata inline in an eighth
// field ("" for none), every reservation's after its tenth "|". The layout
// v2 fields, which name blocks by id, are left out.
func preIssue10(t *testing.T, h map[string]string) map[string]string {
	t.Helper()
	text := func(s string) string {
		id, err := engine.ParseCompactID(s)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		return id.String()
	}
	out := map[string]string{"rs": "0"}
	for f, v := range h {
		switch {
		case f == "id":
			out[f] = text(v)
		case f == "s" || f == "o" || f == "k" || strings.HasPrefix(f, "m:") || strings.HasPrefix(f, "n:"):
		case strings.HasPrefix(f, "b:"):
			p := strings.Split(v, "|")
			if len(p) != 7 {
				t.Fatalf("block %s: %q (scoped blocks came after the old layout)", f, v)
			}
			if p[1] == "" {
				p[1] = p[0]
			}
			out["b:"+text(f[2:])] = strings.Join(p, "|") + "|" + h["m:"+f[2:]]
		case strings.HasPrefix(f, "r:"):
			out[f] = v + h["n:"+f[2:]]
		default:
			out[f] = v
		}
	}
	return out
}

// TestLayoutRewriteRoundTrip: the rewrite of a hash put back in the old
// layout is the current hash byte for byte (less the layout v2 fields,
// which the next money script writes again), for a small account and one
// past LAYOUT_MIN_ITEMS; reservations with their metadata, gauges, leases
// and budget counters come through untouched; and the hash then serves.
func TestLayoutRewriteRoundTrip(t *testing.T) {
	for _, n := range []int{3, 9} {
		eachBackend(t, func(t *testing.T, b bundle) {
			ctx := context.Background()
			c := newCustomer()
			b.known(t, c)
			for i := range n {
				g := grantCmd(c, int64(100*(i+1)), t0.Add(-time.Minute))
				g.Block.Priority = i % 3
				if i%2 == 0 {
					g.Block.Metadata = engine.Metadata{"n": json.RawMessage(`"b|` + dec(int64(i)) + `"`)}
				}
				b.grant(t, g)
			}
			terms := engine.RuleTerms{CostType: engine.CostPerUnit, UnitCost: 1}
			rv := reserveCmd(c, 7, terms, time.Hour, t0)
			rv.Metadata = engine.Metadata{"job": json.RawMessage(`"j|1"`)}
			b.reserve(t, rv)
			rel := reserveCmd(c, 5, terms, time.Hour, t0)
			rel.Metadata = engine.Metadata{"job": json.RawMessage(`"j2"`)}
			b.reserve(t, rel)
			if _, err := b.store.Release(ctx, releaseCmd(c, rel.ReservationID, false, t0)); err != nil {
				t.Fatal(err)
			}
			if _, err := b.store.Debit(ctx, debitCmd(c, 150, t0)); err != nil {
				t.Fatal(err)
			}
			key := b.store.accountKey(c.CustomerID)
			// Fields whose layout never changed, kept as they are.
			extra := map[string]string{"g:seats": "2", "L:seats": uuid.NewString() + ",2," + dec(t0.Add(time.Hour).UnixMilli()) + "," + dec(t0.UnixMilli()) + ",3600",
				"u:d:api.calls": dec(t0.UnixMilli()) + " 40", "p:d": "12"}
			if err := b.rdb.HSet(ctx, key, extra).Err(); err != nil {
				t.Fatal(err)
			}
			current := b.rdb.HGetAll(ctx, key).Val()
			_, big := current["s"]
			if big != (n >= 8) {
				t.Fatalf("%d blocks: layout v2 fields %v", n, big)
			}
			before := b.snapshot(t, c, t0)
			old := preIssue10(t, current)
			if err := b.rdb.Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
			if err := b.rdb.HSet(ctx, key, old).Err(); err != nil {
				t.Fatal(err)
			}
			if r, err := b.store.RewriteLayouts(ctx); err != nil || r.Rewritten != 1 {
				t.Fatalf("rewrite: %+v %v", r, err)
			}
			want := maps.Clone(current)
			delete(want, "s")
			delete(want, "o")
			delete(want, "k")
			if got := b.rdb.HGetAll(ctx, key).Val(); !reflect.DeepEqual(got, want) {
				t.Fatalf("rewritten\n got %v\nwant %v", got, want)
			}
			if after := b.snapshot(t, c, t0); !reflect.DeepEqual(before, after) {
				t.Fatalf("the rewrite changed the account\nbefore %+v\nafter  %+v", before, after)
			}
			// The reservation commits with its metadata merged, and the
			// money script writes the layout v2 fields again.
			cm := commitCmd(c, rv.ReservationID, 6, terms, t0.Add(time.Second))
			cm.Metadata = engine.Metadata{"done": json.RawMessage(`true`)}
			res, err := b.store.Commit(ctx, cm)
			if err != nil {
				t.Fatal(err)
			}
			var meta map[string]any
			if err := json.Unmarshal(res.Mutation.Reservation.Metadata, &meta); err != nil ||
				!reflect.DeepEqual(meta, map[string]any{"job": "j|1", "done": true}) {
				t.Fatalf("commit metadata %s: %v", res.Mutation.Reservation.Metadata, err)
			}
			h := b.rdb.HGetAll(ctx, key).Val()
			if _, ok := h["s"]; ok != big {
				t.Fatalf("layout v2 fields after a commit: %v", h)
			}
			for f, v := range extra {
				if h[f] != v {
					t.Fatalf("field %s: %q, want %q", f, h[f], v)
				}
			}
		})
	}
}

// TestLayoutFence: a Redis without the layout markers (a new one, or a
// shard restored from before the rewrite) is found pending partition by
// partition, and a rewrite sets every marker; with them set the rewrite
// scans nothing.
func TestLayoutFence(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		if r, err := b.store.RewriteLayouts(ctx); err != nil || r.Scanned != 0 {
			t.Fatalf("rewrite of an empty store: %+v %v", r, err)
		}
		c := newCustomer()
		b.known(t, c)
		b.grant(t, grantCmd(c, 100, t0))
		if r, err := b.store.RewriteLayouts(ctx); err != nil || r != (LayoutRewrite{}) {
			t.Fatalf("rewrite with every marker set: %+v %v", r, err)
		}
		p := Partition(c.CustomerID)
		if err := b.rdb.Del(ctx, b.store.layoutMarkerKey(p)).Err(); err != nil {
			t.Fatal(err)
		}
		if pending, err := b.store.LayoutsPending(ctx); err != nil || !reflect.DeepEqual(pending, []int{p}) {
			t.Fatalf("pending: %v %v", pending, err)
		}
		// The current hash is scanned and left as it is.
		h := b.rdb.HGetAll(ctx, b.store.accountKey(c.CustomerID)).Val()
		if r, err := b.store.RewriteLayouts(ctx); err != nil || r.Scanned != 1 || r.Rewritten != 0 {
			t.Fatalf("rewrite: %+v %v", r, err)
		}
		if !reflect.DeepEqual(b.rdb.HGetAll(ctx, b.store.accountKey(c.CustomerID)).Val(), h) {
			t.Fatal("the rewrite changed a current hash")
		}
		if pending, err := b.store.LayoutsPending(ctx); err != nil || len(pending) != 0 {
			t.Fatalf("pending after the rewrite: %v %v", pending, err)
		}
	})
}

// TestLayoutRewriteChecksWhatItRead: layout_rewrite.lua writes nothing
// when a field the change came from moved after Go read it (a money call
// in between), and the batch then reads the hash again and rewrites it.
func TestLayoutRewriteChecksWhatItRead(t *testing.T) {
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		st := legacyHash(t, b, c, uuid.New())
		key := b.store.accountKey(c.CustomerID)
		check, del, set, err := layoutPlan(b.rdb.HGetAll(ctx, key).Val())
		if err != nil {
			t.Fatal(err)
		}
		// A drain of block 0 since the read.
		f := "b:" + st.Blocks[0].ID.String()
		moved := strings.Replace(b.rdb.HGet(ctx, key, f).Val(), "500|", "400|", 1)
		if err := b.rdb.HSet(ctx, key, f, moved).Err(); err != nil {
			t.Fatal(err)
		}
		before := b.rdb.HGetAll(ctx, key).Val()
		args := []any{len(check) / 2}
		for _, x := range check {
			args = append(args, x)
		}
		args = append(args, len(del))
		for _, x := range append(del, set...) {
			args = append(args, x)
		}
		if n, err := layoutRewriteScript.Run(ctx, b.rdb, []string{key}, args...).Int(); err != nil || n != 0 {
			t.Fatalf("stale rewrite: %d %v", n, err)
		}
		if !reflect.DeepEqual(b.rdb.HGetAll(ctx, key).Val(), before) {
			t.Fatal("a stale rewrite changed the hash")
		}
		if n, err := b.store.rewriteBatch(ctx, []string{key}); err != nil || n != 1 {
			t.Fatalf("rewrite: %d %v", n, err)
		}
		got := b.rdb.HGet(ctx, key, "b:"+engine.CompactID(st.Blocks[0].ID)).Val()
		if !strings.HasPrefix(got, "400|500|") {
			t.Fatalf("block 0 after the rewrite: %q", got)
		}
	})
}

// TestLayoutRewriteCluster: on a Redis Cluster of 3 masters the rewrite
// scans every master, so old hashes of customers spread over every
// partition (and so every master) are all rewritten, and every marker set.
func TestLayoutRewriteCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	masters := testenv.StartRedisCluster(t, 3)
	seeds := make([]string, len(masters))
	for i, m := range masters {
		seeds[i] = m.Addr
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: seeds})
	t.Cleanup(func() { _ = rdb.Close() })
	b := bundle{store: NewStore(rdb, "t"+testenv.RandomSuffix()), rdb: rdb, real: true}
	ctx := context.Background()
	parts := map[int]bool{}
	var customers []engine.CustomerKey
	for len(parts) < Partitions {
		c := newCustomer()
		legacyHash(t, b, c, uuid.New())
		parts[Partition(c.CustomerID)] = true
		customers = append(customers, c)
	}
	r, err := b.store.RewriteLayouts(ctx)
	if err != nil || r.Scanned != len(customers) || r.Rewritten != len(customers) {
		t.Fatalf("rewrite of %d hashes: %+v %v", len(customers), r, err)
	}
	if pending, err := b.store.LayoutsPending(ctx); err != nil || len(pending) != 0 {
		t.Fatalf("pending: %v %v", pending, err)
	}
	for _, c := range customers {
		if a := b.snapshot(t, c, t0); a.Balance != 3500 || len(a.Blocks) != 3 {
			t.Fatalf("snapshot after the rewrite: %+v", a)
		}
	}
}
