package lua

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/testenv"
)

// t0 is the fixed "now" of the tests (2026-01-01T00:00:00Z): time comes only
// from the caller, never from the wall clock (invariant 6).
var t0 = time.UnixMilli(1767225600000).UTC()

// bundle is what one test needs on one backend.
type bundle struct {
	store *Store
	rdb   redis.UniversalClient
	real  bool
}

// backend opens a fresh store on miniredis or on the suite's real Redis
// (single or cluster, per testenv).
type backend struct {
	name string
	open func(t *testing.T) bundle
}

var backends = []backend{
	{"miniredis", func(t *testing.T) bundle {
		m := miniredis.RunT(t)
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		t.Cleanup(func() { _ = rdb.Close() })
		return bundle{store: NewStore(rdb, "t"), rdb: rdb}
	}},
	{"redis", func(t *testing.T) bundle {
		rdb, prefix := testenv.Redis(t)
		return bundle{store: NewStore(rdb, prefix), rdb: rdb, real: true}
	}},
}

// eachBackend runs fn as a parallel subtest on every backend.
func eachBackend(t *testing.T, fn func(t *testing.T, b bundle)) {
	t.Helper()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			fn(t, be.open(t))
		})
	}
}

func newCustomer() engine.CustomerKey {
	return engine.CustomerKey{TenantID: uuid.New(), Environment: engine.EnvironmentLive, CustomerID: uuid.New()}
}

func ptr[T any](v T) *T { return &v }

// known installs "customer known, no account" state, as the engine's load
// does for a brand-new customer.
func (b bundle) known(t *testing.T, c engine.CustomerKey) {
	t.Helper()
	ok, err := b.store.LoadAt(context.Background(), engine.AccountState{
		TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
	}, t0)
	if err != nil || !ok {
		t.Fatalf("load empty state: ok=%v err=%v", ok, err)
	}
}

// load writes st as a rebuild would (LoadAt at t0) and fails the test
// unless it was written.
func (b bundle) load(t *testing.T, st engine.AccountState) {
	t.Helper()
	if ok, err := b.store.LoadAt(context.Background(), st, t0); err != nil || !ok {
		t.Fatalf("load: %v %v", ok, err)
	}
}

// grantCmd is a plain grant of amount at now.
func grantCmd(c engine.CustomerKey, amount int64, now time.Time) engine.GrantCommand {
	return engine.GrantCommand{
		CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: now},
		AccountID:     uuid.New(), EntryType: engine.EntryAdjustment, Reason: ptr("test grant"),
		Block: engine.Block{ID: uuid.New(), OriginalAmount: amount, Source: engine.SourceManual},
	}
}

func debitCmd(c engine.CustomerKey, amount int64, now time.Time) engine.DebitCommand {
	return engine.DebitCommand{
		CommandHeader: engine.CommandHeader{OpID: uuid.New(), Customer: c, Now: now},
		Amount:        amount,
		EntryType:     engine.EntryConsumption, Reason: ptr("test debit"),
	}
}

func (b bundle) grant(t *testing.T, cmd engine.GrantCommand) engine.Mutation {
	t.Helper()
	res, err := b.store.Grant(context.Background(), cmd)
	if err != nil {
		t.Fatalf("grant: %v", err)
	}
	return res.Mutation
}

func (b bundle) snapshot(t *testing.T, c engine.CustomerKey, now time.Time) engine.Account {
	t.Helper()
	a, err := b.store.Snapshot(context.Background(), c, now)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return a
}

// outbox decodes every Mutation of c's partition stream.
func (b bundle) outbox(t *testing.T, c engine.CustomerKey) []engine.Mutation {
	t.Helper()
	msgs, err := b.rdb.XRange(context.Background(), b.store.outboxKey(Partition(c.CustomerID)), "-", "+").Result()
	if err != nil {
		t.Fatalf("xrange: %v", err)
	}
	out := make([]engine.Mutation, 0, len(msgs))
	for _, m := range msgs {
		var mu engine.Mutation
		raw, _ := m.Values["m"].(string)
		if err := json.Unmarshal([]byte(raw), &mu); err != nil {
			t.Fatalf("outbox entry %s does not decode: %v: %s", m.ID, err, raw)
		}
		out = append(out, mu)
	}
	return out
}

// dump renders every key a script may touch for c (account hash, outbox,
// expiry zset, op keys of idemKeys), to compare before and after a refusal.
func (b bundle) dump(t *testing.T, c engine.CustomerKey, idemKeys ...string) string {
	t.Helper()
	ctx := context.Background()
	p := Partition(c.CustomerID)
	var sb strings.Builder
	h := b.rdb.HGetAll(ctx, b.store.accountKey(c.CustomerID)).Val()
	fields := make([]string, 0, len(h))
	for k, v := range h {
		fields = append(fields, k+"="+v)
	}
	sort.Strings(fields)
	fmt.Fprintf(&sb, "hash %v\n", fields)
	for _, m := range b.rdb.XRange(ctx, b.store.outboxKey(p), "-", "+").Val() {
		fmt.Fprintf(&sb, "outbox %s %v\n", m.ID, m.Values)
	}
	for _, k := range idemKeys {
		fmt.Fprintf(&sb, "op %q\n", b.rdb.Get(ctx, b.store.opKeyOf(c.CustomerID, k)).Val())
	}
	return sb.String()
}

// TestScriptsNeedState: every script answers NOSTATE for a customer whose
// state is not in Redis, so the engine loads it first.
func TestScriptsNeedState(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		if _, err := b.store.Grant(ctx, grantCmd(c, 1, t0)); !errors.Is(err, engine.ErrStateMissing) {
			t.Errorf("grant: %v", err)
		}
		if _, err := b.store.Debit(ctx, debitCmd(c, 1, t0)); !errors.Is(err, engine.ErrStateMissing) {
			t.Errorf("debit: %v", err)
		}
		if _, _, err := b.store.Expire(ctx, uuid.New(), c, t0); !errors.Is(err, engine.ErrStateMissing) {
			t.Errorf("expire: %v", err)
		}
		if _, err := b.store.Snapshot(ctx, c, t0); !errors.Is(err, engine.ErrStateMissing) {
			t.Errorf("snapshot: %v", err)
		}
		b.known(t, c)
		a := b.snapshot(t, c, t0)
		if a.ID != "" || !a.UpdatedAt.IsZero() || a.Version != 0 || a.Balance != 0 || a.Blocks == nil {
			t.Errorf("empty account: %+v", a)
		}
		if _, err := b.store.Debit(ctx, debitCmd(c, 1, t0)); !errors.Is(err, engine.ErrNoAccount) {
			t.Errorf("debit without account: %v", err)
		}
		if n := len(b.outbox(t, c)); n != 0 {
			t.Errorf("outbox has %d entries, want 0", n)
		}
	})
}

// TestGrantCreatesAccount: the first grant creates the account and writes
// one block, one entry and exactly one outbox entry that decodes into the
// Mutation the call returned.
func TestGrantCreatesAccount(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		c := newCustomer()
		b.known(t, c)
		cmd := grantCmd(c, 1500, t0)
		cmd.Block.Priority = 3
		cmd.Block.ExpiresAt = ptr(t0.Add(time.Hour))
		cmd.Block.Metadata = engine.Metadata{"plan": json.RawMessage(`"pro"`)}
		cmd.EntryMetadata = engine.Metadata{"by": json.RawMessage(`"ops \"quoted\" <x>"`)}
		cmd.IdempotencyKey = "key \"1\" {weird}"
		cmd.RequestHash = "rh1"
		m := b.grant(t, cmd)

		if m.OpID != cmd.OpID || m.Kind != engine.MutationGrant || m.TenantID != c.TenantID ||
			m.CustomerID != c.CustomerID || m.Environment != c.Environment || m.AtMS != t0.UnixMilli() ||
			m.IdempotencyKey != cmd.IdempotencyKey || m.RequestHash != "rh1" {
			t.Errorf("header: %+v", m)
		}
		wantAcct := engine.MutationAccount{ID: cmd.AccountID.String(), Version: 1, Balance: 1500, LifetimeEarned: 1500}
		if m.Account != wantAcct {
			t.Errorf("account %+v, want %+v", m.Account, wantAcct)
		}
		if len(m.Entries) != 1 || len(m.Blocks) != 1 {
			t.Fatalf("entries %d blocks %d", len(m.Entries), len(m.Blocks))
		}
		e := m.Entries[0]
		if e.Role != engine.RoleMain || e.Delta != 1500 || e.Type != engine.EntryAdjustment ||
			*e.Source != engine.SourceManual || *e.BlockID != cmd.Block.ID || *e.Reason != "test grant" ||
			string(e.Metadata) != `{"by":"ops \"quoted\" \u003cx\u003e"}` {
			t.Errorf("entry %+v meta %s", e, e.Metadata)
		}
		bl := m.Blocks[0]
		if bl.ID != cmd.Block.ID || bl.Original != 1500 || bl.Remaining != 1500 || bl.Priority != 3 ||
			bl.Source != engine.SourceManual || bl.StartsMS != t0.UnixMilli() || bl.CreatedMS != t0.UnixMilli() ||
			bl.ExpiresMS == nil || *bl.ExpiresMS != t0.Add(time.Hour).UnixMilli() || string(bl.Metadata) != `{"plan":"pro"}` {
			t.Errorf("block %+v", bl)
		}
		ob := b.outbox(t, c)
		if len(ob) != 1 {
			t.Fatalf("outbox has %d entries, want 1", len(ob))
		}
		got, _ := json.Marshal(ob[0])
		want, _ := json.Marshal(m)
		if string(got) != string(want) {
			t.Errorf("outbox mutation\n%s\nwant\n%s", got, want)
		}

		a := b.snapshot(t, c, t0)
		if a.ID != cmd.AccountID.String() || a.Version != 1 || a.Balance != 1500 || a.EffectiveBalance != 1500 ||
			a.LifetimeEarned != 1500 || !a.UpdatedAt.Equal(t0) || len(a.Blocks) != 1 {
			t.Errorf("snapshot %+v", a)
		}
		if got := a.Blocks[0]; got.Metadata["plan"] == nil || got.CustomerID != c.CustomerID || !got.StartsAt.Equal(t0) {
			t.Errorf("snapshot block %+v", got)
		}
		// A second grant keeps the account id and adds up.
		m2 := b.grant(t, grantCmd(c, 500, t0.Add(time.Second)))
		if m2.Account.ID != cmd.AccountID.String() || m2.Account.Version != 2 || m2.Account.Balance != 2000 ||
			m2.Account.LifetimeEarned != 2000 {
			t.Errorf("second grant account %+v", m2.Account)
		}
		// No expiry index in Redis: the sweep asks Postgres (issue 10).
		if n := b.rdb.Exists(context.Background(), b.store.legacyExpiryKey(Partition(c.CustomerID))).Val(); n != 0 {
			t.Errorf("a grant wrote the partition's expiry zset")
		}
	})
}

// TestGrantStackAfter: a stack_after block starts when the latest-expiring
// live block matching metadata_match ends; without a match it starts now
// (fallback now) or nothing changes (fallback reject).
func TestGrantStackAfter(t *testing.T) {
	t.Parallel()
	hour := time.Hour
	type seedBlock struct {
		meta    string
		expires *time.Duration // from t0; nil means no expiry
	}
	cases := []struct {
		name      string
		seed      []seedBlock
		match     string
		fallback  string
		wantStart time.Duration // from t0
		wantErr   error
	}{
		{"latest match", []seedBlock{{`{"plan":"pro"}`, ptr(hour)}, {`{"plan":"pro","x":1}`, ptr(3 * hour)}, {`{"plan":"basic"}`, ptr(5 * hour)}},
			`{"plan":"pro"}`, "reject", 3 * hour, nil},
		{"nested value", []seedBlock{{`{"t":{"a":[1,2]}}`, ptr(2 * hour)}, {`{"t":{"a":[1]}}`, ptr(4 * hour)}},
			`{"t":{"a":[1,2]}}`, "reject", 2 * hour, nil},
		{"no expiry never matches", []seedBlock{{`{"plan":"pro"}`, nil}}, `{"plan":"pro"}`, "now", 0, nil},
		{"empty match takes any expiring block", []seedBlock{{``, ptr(2 * hour)}, {`{"a":1}`, ptr(hour)}}, `{}`, "reject", 2 * hour, nil},
		{"no match fallback now", []seedBlock{{`{"plan":"basic"}`, ptr(hour)}}, `{"plan":"pro"}`, "now", 0, nil},
		{"no match default fallback", nil, `{"plan":"pro"}`, "", 0, nil},
		{"no match reject", []seedBlock{{`{"plan":"basic"}`, ptr(hour)}}, `{"plan":"pro"}`, "reject", 0, engine.ErrStackNoMatch},
		{"expired block does not match", []seedBlock{{`{"plan":"pro"}`, ptr(time.Duration(0))}}, `{"plan":"pro"}`, "reject", 0, engine.ErrStackNoMatch},
	}
	// Each case also on an account big enough to keep the spend-order index
	// (prelude/layout.lua LAYOUT_MIN_ITEMS), which Go reads the expiring blocks
	// from (bounded.go stackStartIndexed): fillers without expiry never match.
	for _, tc := range cases {
		for _, fillers := range []int{0, 8} {
			t.Run(fmt.Sprintf("%s/%d fillers", tc.name, fillers), func(t *testing.T) {
				t.Parallel()
				eachBackend(t, func(t *testing.T, b bundle) {
					c := newCustomer()
					b.known(t, c)
					for i := 0; i < fillers; i++ {
						cmd := grantCmd(c, 100, t0.Add(-time.Minute))
						cmd.Block.Metadata = engine.Metadata{"filler": json.RawMessage("1")}
						b.grant(t, cmd)
					}
					for _, s := range tc.seed {
						cmd := grantCmd(c, 100, t0.Add(-time.Minute))
						if s.expires != nil {
							cmd.Block.ExpiresAt = ptr(t0.Add(*s.expires))
						}
						if s.meta != "" {
							_ = json.Unmarshal([]byte(s.meta), &cmd.Block.Metadata)
						}
						b.grant(t, cmd)
					}
					var match engine.Metadata
					_ = json.Unmarshal([]byte(tc.match), &match)
					cmd := grantCmd(c, 700, t0)
					cmd.DurationSeconds = 600
					cmd.StackAfter = &engine.StackAfter{MetadataMatch: match, Fallback: tc.fallback}
					before := b.dump(t, c)
					res, err := b.store.Grant(context.Background(), cmd)
					if tc.wantErr != nil {
						if !errors.Is(err, tc.wantErr) {
							t.Fatalf("err %v, want %v", err, tc.wantErr)
						}
						if after := b.dump(t, c); after != before {
							t.Errorf("refused grant changed state:\n%s\n->\n%s", before, after)
						}
						return
					}
					if err != nil {
						t.Fatalf("grant: %v", err)
					}
					m := res.Mutation
					nb := m.Blocks[len(m.Blocks)-1]
					wantStart := t0.Add(tc.wantStart).UnixMilli()
					if nb.StartsMS != wantStart || nb.ExpiresMS == nil || *nb.ExpiresMS != wantStart+600_000 {
						t.Errorf("block starts %d expires %v, want %d +600s", nb.StartsMS, nb.ExpiresMS, wantStart)
					}
					a := b.snapshot(t, c, t0)
					wantPending := int64(0)
					if tc.wantStart > 0 {
						wantPending = 700
					}
					if a.PendingBalance != wantPending || m.Account.Pending != wantPending ||
						a.EffectiveBalance != a.Balance-wantPending {
						t.Errorf("pending %d (mutation %d), want %d; account %+v", a.PendingBalance, m.Account.Pending, wantPending, a)
					}
				})
			})
		}
	}
}

// TestDebitSpendOrder: a debit drains started blocks by priority, then
// soonest expiry (no expiry last), then oldest, then id; blocks not started
// yet are not touched, and each touched block gets one entry.
func TestDebitSpendOrder(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		c := newCustomer()
		b.known(t, c)
		mk := func(name string, amount int64, prio int, created time.Duration, expires *time.Duration) engine.GrantCommand {
			cmd := grantCmd(c, amount, t0.Add(created))
			cmd.Block.Priority = prio
			cmd.Block.Metadata = engine.Metadata{"n": json.RawMessage(`"` + name + `"`)}
			if expires != nil {
				cmd.Block.ExpiresAt = ptr(t0.Add(*expires))
			}
			return cmd
		}
		grants := []engine.GrantCommand{
			mk("p1-noexp", 100, 1, -5*time.Minute, nil),
			mk("p0-noexp-old", 100, 0, -4*time.Minute, nil),
			mk("p0-noexp-new", 100, 0, -3*time.Minute, nil),
			mk("p0-exp2h", 100, 0, -2*time.Minute, ptr(2*time.Hour)),
			mk("p0-exp1h", 100, 0, -1*time.Minute, ptr(time.Hour)),
			mk("p5-exp", 100, 5, -6*time.Minute, ptr(time.Minute)),
		}
		name := map[uuid.UUID]string{}
		for _, g := range grants {
			b.grant(t, g)
			name[g.Block.ID] = string(g.Block.Metadata["n"])
		}
		// A stacked block (starts in 2h) must never be spent now.
		st := grantCmd(c, 1000, t0)
		st.DurationSeconds = 60
		st.StackAfter = &engine.StackAfter{MetadataMatch: engine.Metadata{"n": json.RawMessage(`"p0-exp2h"`)}, Fallback: "reject"}
		b.grant(t, st)

		res, err := b.store.Debit(context.Background(), debitCmd(c, 450, t0))
		if err != nil {
			t.Fatalf("debit: %v", err)
		}
		var got []string
		for _, e := range res.Mutation.Entries {
			got = append(got, fmt.Sprintf("%s:%d", name[*e.BlockID], e.Delta))
		}
		want := []string{`"p0-exp1h":-100`, `"p0-exp2h":-100`, `"p0-noexp-old":-100`, `"p0-noexp-new":-100`, `"p1-noexp":-50`}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("draws %v, want %v", got, want)
		}
		m := res.Mutation
		if m.Kind != engine.MutationDebit || m.Account.Version != 8 || m.Account.Balance != 1150 || m.Account.Pending != 1000 {
			t.Errorf("account %+v", m.Account)
		}
		if *m.Entries[0].Source != engine.SourceManual || m.Entries[0].Type != engine.EntryConsumption || *m.Entries[0].Reason != "test debit" {
			t.Errorf("entry %+v", m.Entries[0])
		}
		if len(m.Blocks) != 5 || m.Blocks[4].Remaining != 50 || m.Blocks[0].Remaining != 0 {
			t.Errorf("blocks %+v", m.Blocks)
		}
		// Emptied blocks leave the hash; the half-drained one stays.
		a := b.snapshot(t, c, t0)
		if len(a.Blocks) != 3 || a.Balance != 1150 || a.EffectiveBalance != 150 {
			t.Errorf("after debit: %+v", a)
		}
		// Emptied blocks take their metadata field ("m:<id>") with them.
		fields, _ := b.rdb.HKeys(context.Background(), b.store.accountKey(c.CustomerID)).Result()
		var plain, metas int
		for _, f := range fields {
			if strings.HasPrefix(f, "m:") {
				metas++
			} else {
				plain++
			}
		}
		// 4 account fields (id v le ua; no "rs" while nothing is reserved)
		// and the 3 blocks left.
		if plain != 4+3 || metas > 3 {
			t.Errorf("hash has %d fields and %d metadata fields, want 7 and at most 3", plain, metas)
		}
		// cmd.Source overrides the blocks' own source.
		d := debitCmd(c, 10, t0)
		d.Source = ptr(engine.SourceCompensation)
		res, err = b.store.Debit(context.Background(), d)
		if err != nil || *res.Mutation.Entries[0].Source != engine.SourceCompensation {
			t.Errorf("debit with source: %v %+v", err, res.Mutation.Entries)
		}
	})
}

// TestDebitInsufficientChangesNothing: a debit above the effective balance
// (pending and reserved credit do not count) is refused and leaves every key
// it could touch byte for byte as it was (invariant 9).
func TestDebitInsufficientChangesNothing(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		acctID := uuid.New().String()
		exp := t0.Add(-time.Second).UnixMilli() // due: the refusal must not expire it either
		later := t0.Add(time.Hour).UnixMilli()
		_, err := b.store.LoadAt(ctx, engine.AccountState{
			TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
			AccountID: acctID, Version: 4, Reserved: 30, LifetimeEarned: 1000, UpdatedAtMS: t0.UnixMilli() - 1000,
			Blocks: []engine.MutationBlock{
				{ID: uuid.New(), Original: 100, Remaining: 100, Source: engine.SourceManual, StartsMS: t0.UnixMilli() - 5000, CreatedMS: t0.UnixMilli() - 5000},
				{ID: uuid.New(), Original: 50, Remaining: 50, Source: engine.SourceManual, StartsMS: t0.UnixMilli() - 5000, CreatedMS: t0.UnixMilli() - 5000, ExpiresMS: &exp},
				{ID: uuid.New(), Original: 500, Remaining: 500, Source: engine.SourceManual, StartsMS: later, CreatedMS: t0.UnixMilli() - 5000, ExpiresMS: ptr(later + 1000)},
			},
		}, t0)
		if err != nil {
			t.Fatal(err)
		}
		a := b.snapshot(t, c, t0)
		if a.Balance != 600 || a.PendingBalance != 500 || a.ReservedBalance != 30 || a.EffectiveBalance != 70 {
			t.Fatalf("seeded account %+v", a)
		}
		before := b.dump(t, c, "k1")
		for _, amount := range []int64{71, 100, 600, math.MaxInt64} {
			d := debitCmd(c, amount, t0)
			d.IdempotencyKey, d.RequestHash = "k1", "h"
			if _, err := b.store.Debit(ctx, d); !errors.Is(err, engine.ErrInsufficientCredits) {
				t.Errorf("debit %d: %v, want insufficient", amount, err)
			}
		}
		if after := b.dump(t, c, "k1"); after != before {
			t.Errorf("refused debit changed state:\n%s\n->\n%s", before, after)
		}
		res, err := b.store.Debit(ctx, debitCmd(c, 70, t0))
		if err != nil {
			t.Fatalf("debit of exactly the effective balance: %v", err)
		}
		// The due block is expired on the way: one expiry entry, then the draw.
		m := res.Mutation
		if len(m.Entries) != 2 || m.Entries[0].Role != engine.RoleExpiry || m.Entries[0].Delta != -50 ||
			m.Entries[0].Type != engine.EntryExpiry || m.Entries[1].Delta != -70 || m.Account.Balance != 530 || m.Account.Version != 5 {
			t.Errorf("mutation %+v", m)
		}
	})
}

// TestExpiryAtExactInstant: a block stops counting at its expires_at; the
// expiry sweep finds it from that instant and Expire records it once.
func TestExpiryAtExactInstant(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		exp := t0.Add(time.Hour)
		g := grantCmd(c, 300, t0)
		g.Block.ExpiresAt = &exp
		g.Block.Source = engine.SourcePromotional
		b.grant(t, g)
		b.grant(t, grantCmd(c, 5, t0))

		if a := b.snapshot(t, c, exp.Add(-time.Millisecond)); a.Balance != 305 {
			t.Errorf("1 ms before expiry balance %d, want 305", a.Balance)
		}
		if a := b.snapshot(t, c, exp); a.Balance != 5 || len(a.Blocks) != 1 {
			t.Errorf("at expiry balance %d blocks %d, want 5 and 1", a.Balance, len(a.Blocks))
		}
		if _, ok, err := b.store.Expire(ctx, uuid.New(), c, exp.Add(-time.Millisecond)); err != nil || ok {
			t.Fatalf("expire before expires_at: ok=%v err=%v, want a no-op", ok, err)
		}
		if _, err := b.store.Debit(ctx, debitCmd(c, 6, exp)); !errors.Is(err, engine.ErrInsufficientCredits) {
			t.Errorf("debit at expiry: %v", err)
		}
		op := uuid.New()
		res, ok, err := b.store.Expire(ctx, op, c, exp)
		if err != nil || !ok {
			t.Fatalf("expire: ok=%v err=%v", ok, err)
		}
		m := res.Mutation
		if m.OpID != op || m.Kind != engine.MutationExpire || len(m.Entries) != 1 || m.Entries[0].Delta != -300 ||
			*m.Entries[0].Source != engine.SourcePromotional || *m.Entries[0].BlockID != g.Block.ID ||
			m.Entries[0].Role != engine.RoleExpiry || len(m.Blocks) != 1 || m.Blocks[0].Remaining != 0 ||
			m.Account.Version != 3 || m.Account.Balance != 5 {
			t.Errorf("expire mutation %+v", m)
		}
		before := b.dump(t, c)
		if _, ok, err := b.store.Expire(ctx, uuid.New(), c, exp.Add(time.Hour)); ok || err != nil {
			t.Errorf("second expire ok=%v err=%v, want a no-op", ok, err)
		}
		if after := b.dump(t, c); after != before {
			t.Errorf("no-op expire changed state")
		}
		if n := len(b.outbox(t, c)); n != 3 {
			t.Errorf("outbox has %d entries, want 3 (2 grants, 1 expire)", n)
		}
	})
}

// TestIdempotentReplay: a retried key returns the first Mutation and
// changes nothing; the same key with another request hash is refused
// (invariant 4).
func TestIdempotentReplay(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		b.known(t, c)
		g := grantCmd(c, 100, t0)
		g.IdempotencyKey, g.RequestHash = "grant-1", "hash-a"
		first := b.grant(t, g)

		retry := g
		retry.OpID, retry.Block.ID, retry.Now = uuid.New(), uuid.New(), t0.Add(time.Minute)
		before := b.dump(t, c, "grant-1")
		res, err := b.store.Grant(ctx, retry)
		if err != nil || !res.Replayed || res.Mutation.OpID != first.OpID || res.Mutation.Blocks[0].ID != first.Blocks[0].ID {
			t.Fatalf("replay: %v %+v", err, res)
		}
		retry.RequestHash = "hash-b"
		if _, err := b.store.Grant(ctx, retry); !errors.Is(err, engine.ErrIdempotencyMismatch) {
			t.Errorf("other body: %v", err)
		}
		// The key is per customer and shared by grant and debit.
		d := debitCmd(c, 10, t0)
		d.IdempotencyKey, d.RequestHash = "grant-1", "hash-x"
		if _, err := b.store.Debit(ctx, d); !errors.Is(err, engine.ErrIdempotencyMismatch) {
			t.Errorf("debit reusing a grant key: %v", err)
		}
		if after := b.dump(t, c, "grant-1"); after != before {
			t.Errorf("replay changed state:\n%s\n->\n%s", before, after)
		}

		d = debitCmd(c, 10, t0)
		d.IdempotencyKey, d.RequestHash = "debit-1", "hash-d"
		r1, err := b.store.Debit(ctx, d)
		if err != nil || r1.Replayed {
			t.Fatal(err)
		}
		d.OpID = uuid.New()
		r2, err := b.store.Debit(ctx, d)
		if err != nil || !r2.Replayed || r2.Mutation.OpID != r1.Mutation.OpID {
			t.Errorf("debit replay: %v %+v", err, r2)
		}
		if a := b.snapshot(t, c, t0); a.Balance != 90 || a.Version != 2 {
			t.Errorf("account %+v, want balance 90 version 2", a)
		}
		if n := len(b.outbox(t, c)); n != 2 {
			t.Errorf("outbox has %d entries, want 2", n)
		}
		ttl := b.rdb.PTTL(ctx, b.store.opKeyOf(c.CustomerID, "debit-1")).Val()
		if ttl <= OpRetention-time.Minute || ttl > OpRetention {
			t.Errorf("op key TTL %s, want about %s", ttl, OpRetention)
		}
	})
}

// TestGrantOverflow: balances stay inside int64 (invariant 7): a grant up
// to MaxInt64 is fine, one more millicredit is refused and changes nothing.
func TestGrantOverflow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		c := newCustomer()
		b.known(t, c)
		m := b.grant(t, grantCmd(c, math.MaxInt64, t0))
		if m.Account.Balance != math.MaxInt64 || m.Account.LifetimeEarned != math.MaxInt64 || m.Blocks[0].Remaining != math.MaxInt64 {
			t.Errorf("max grant %+v", m.Account)
		}
		before := b.dump(t, c)
		if _, err := b.store.Grant(context.Background(), grantCmd(c, 1, t0)); !errors.Is(err, engine.ErrOverflow) {
			t.Errorf("grant past int64: %v", err)
		}
		if after := b.dump(t, c); after != before {
			t.Errorf("refused grant changed state")
		}
		res, err := b.store.Debit(context.Background(), debitCmd(c, math.MaxInt64-1, t0))
		if err != nil || res.Mutation.Account.Balance != 1 || res.Mutation.Entries[0].Delta != -(math.MaxInt64-1) {
			t.Errorf("big debit: %v %+v", err, res.Mutation.Account)
		}
		// Lifetime earned alone overflows too, though the balance would fit.
		if _, err := b.store.Grant(context.Background(), grantCmd(c, 1, t0)); !errors.Is(err, engine.ErrOverflow) {
			t.Errorf("lifetime earned past int64: %v", err)
		}
	})
}

// TestLoadFenced: Load installs state only over an older version (invariant
// 5), writes no op key for applied mutations (a retry after a rebuild
// replays from Postgres, AppliedOps, invariant 4), and keeps an existing
// hash for a "no account" state.
func TestLoadFenced(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		c := newCustomer()
		exp := t0.Add(time.Hour).UnixMilli()
		block := func(remaining int64) engine.MutationBlock {
			return engine.MutationBlock{ID: uuid.MustParse("00000000-0000-4000-8000-000000000001"), Original: 1000,
				Remaining: remaining, Priority: 2, Source: engine.SourceReferral, StartsMS: t0.UnixMilli() - 10,
				ExpiresMS: &exp, CreatedMS: t0.UnixMilli() - 10, Metadata: json.RawMessage(`{ "a" : 1 }`)}
		}
		applied := engine.Mutation{OpID: uuid.New(), Kind: engine.MutationGrant, TenantID: c.TenantID,
			CustomerID: c.CustomerID, Environment: c.Environment, IdempotencyKey: "old-key", RequestHash: "rh",
			AtMS: t0.Add(-time.Hour).UnixMilli(), Entries: []engine.MutationEntry{}, Blocks: []engine.MutationBlock{}}
		tooOld := applied
		tooOld.OpID, tooOld.IdempotencyKey, tooOld.AtMS = uuid.New(), "too-old", t0.Add(-OpRetention).UnixMilli()
		st := func(v, remaining int64) engine.AccountState {
			return engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
				AccountID: "acct-1", Version: v, LifetimeEarned: 1000, UpdatedAtMS: t0.UnixMilli() - 10,
				Blocks: []engine.MutationBlock{block(remaining)}, Applied: []engine.Mutation{applied, tooOld}}
		}
		cases := []struct {
			state       engine.AccountState
			wantWritten bool
			wantVersion int64
			wantBalance int64
		}{
			{st(5, 800), true, 5, 800},
			{st(3, 100), false, 5, 800},
			{st(5, 100), false, 5, 800},
			{engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}, false, 5, 800},
			{st(7, 600), true, 7, 600},
		}
		for i, tc := range cases {
			ok, err := b.store.LoadAt(ctx, tc.state, t0)
			if err != nil || ok != tc.wantWritten {
				t.Fatalf("load %d: ok=%v err=%v, want %v", i, ok, err, tc.wantWritten)
			}
			a := b.snapshot(t, c, t0)
			if a.Version != tc.wantVersion || a.Balance != tc.wantBalance || a.ID != "acct-1" {
				t.Errorf("load %d: account %+v", i, a)
			}
		}
		a := b.snapshot(t, c, t0)
		if len(a.Blocks) != 1 || a.Blocks[0].Priority != 2 || a.Blocks[0].Source != engine.SourceReferral ||
			a.Blocks[0].ExpiresAt == nil || a.Blocks[0].ExpiresAt.UnixMilli() != exp || string(a.Blocks[0].Metadata["a"]) != "1" {
			t.Errorf("loaded block %+v", a.Blocks)
		}
		for _, k := range []string{"old-key", "too-old"} {
			if n := b.rdb.Exists(ctx, b.store.opKeyOf(c.CustomerID, k)).Val(); n != 0 {
				t.Errorf("load wrote the op key of %s", k)
			}
		}
		b.store.WithAppliedOps(fakeApplied{applied})
		g := grantCmd(c, 1, t0)
		g.IdempotencyKey, g.RequestHash = "old-key", "rh"
		res, err := b.store.Grant(ctx, g)
		if err != nil || !res.Replayed || res.Mutation.OpID != applied.OpID {
			t.Errorf("retry after rebuild: %v %+v", err, res)
		}
		if a := b.snapshot(t, c, t0); a.Version != 7 {
			t.Errorf("retry after rebuild moved the account to version %d", a.Version)
		}
		if n := b.rdb.Exists(ctx, b.store.legacyExpiryKey(Partition(c.CustomerID))).Val(); n != 0 {
			t.Errorf("a load wrote the partition's expiry zset")
		}
	})
}

// TestAccountMemory logs the Redis memory of a customer with three blocks,
// so a change of the block encoding shows its cost (target <= 500 bytes).
func TestAccountMemory(t *testing.T) {
	t.Parallel()
	b := backends[1].open(t)
	c := newCustomer()
	b.known(t, c)
	for i := range 3 {
		g := grantCmd(c, 100_000, t0)
		g.Block.ExpiresAt = ptr(t0.Add(30 * 24 * time.Hour))
		g.Block.Priority = i
		b.grant(t, g)
	}
	n, err := b.rdb.MemoryUsage(context.Background(), b.store.accountKey(c.CustomerID)).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MEMORY USAGE of an account with 3 blocks: %d bytes", n)
	if n > 600 {
		t.Errorf("account uses %d bytes, far above the 500-byte target", n)
	}
}

// TestLoadBatch: a pipelined batch load writes each state that is newer
// than Redis and leaves newer Redis state alone, like Load (invariant 5).
func TestLoadBatch(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		b.store.WithClock(fixedClock(t0))
		state := func(c engine.CustomerKey, v, remaining int64) engine.AccountState {
			return engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment,
				AccountID: "acct", Version: v, LifetimeEarned: remaining, UpdatedAtMS: t0.UnixMilli(),
				Blocks: []engine.MutationBlock{{ID: uuid.New(), Original: remaining, Remaining: remaining,
					Source: engine.SourceManual, StartsMS: t0.UnixMilli(), CreatedMS: t0.UnixMilli()}}}
		}
		fresh, ahead := newCustomer(), newCustomer()
		if ok, err := b.store.LoadAt(ctx, state(ahead, 9, 900), t0); err != nil || !ok {
			t.Fatalf("seed: %v %v", ok, err)
		}
		got, err := b.store.LoadBatch(ctx, []engine.AccountState{state(fresh, 3, 300), state(ahead, 4, 400)})
		if err != nil || len(got) != 2 || !got[0] || got[1] {
			t.Fatalf("LoadBatch = %v, %v; want [true false]", got, err)
		}
		if a := b.snapshot(t, fresh, t0); a.Balance != 300 || a.Version != 3 {
			t.Errorf("fresh account %+v", a)
		}
		if a := b.snapshot(t, ahead, t0); a.Balance != 900 || a.Version != 9 {
			t.Errorf("newer Redis state was overwritten: %+v", a)
		}
	})
}

type fixedClock time.Time

func (c fixedClock) Now() time.Time { return time.Time(c) }

// TestLoadBatchManyPerPartition: a batch larger than one load.lua call per
// partition (loadBatchMax) lands every state on its own hash with its own
// gauges and no op key (Postgres answers retries of its applied
// operations), and each account is fenced on its own: the ones Redis holds
// at a newer version keep it (invariant 5).
func TestLoadBatchManyPerPartition(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		b.store.WithClock(fixedClock(t0))
		const n = Partitions * loadBatchMax * 3 / 2 // about 75 per partition: two calls each
		var states []engine.AccountState
		var keys []engine.CustomerKey
		for i := 0; i < n; i++ {
			c := newCustomer()
			keys = append(keys, c)
			rem := int64(100 + i)
			states = append(states, engine.AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID,
				Environment: c.Environment, AccountID: "acct", Version: 3, LifetimeEarned: rem, UpdatedAtMS: t0.UnixMilli(),
				Blocks: []engine.MutationBlock{{ID: uuid.New(), Original: rem, Remaining: rem,
					Source: engine.SourceManual, StartsMS: t0.UnixMilli(), CreatedMS: t0.UnixMilli()}},
				Applied: []engine.Mutation{{OpID: uuid.New(), IdempotencyKey: fmt.Sprintf("op-%d", i), AtMS: t0.UnixMilli()}},
				Gauges:  map[string]int64{"seats": int64(i)}})
		}
		// Every seventh account is already newer in Redis.
		for i := 0; i < n; i += 7 {
			st := states[i]
			st.Version, st.LifetimeEarned, st.Blocks = 9, 5, []engine.MutationBlock{{ID: uuid.New(), Original: 5, Remaining: 5,
				Source: engine.SourceManual, StartsMS: t0.UnixMilli(), CreatedMS: t0.UnixMilli()}}
			st.Applied, st.Gauges = nil, nil
			if ok, err := b.store.LoadAt(ctx, st, t0); err != nil || !ok {
				t.Fatalf("seed %d: %v %v", i, ok, err)
			}
		}
		got, err := b.store.LoadBatch(ctx, states)
		if err != nil || len(got) != n {
			t.Fatalf("LoadBatch: %d replies, %v", len(got), err)
		}
		for i, c := range keys {
			a := b.snapshot(t, c, t0)
			opKey := b.rdb.Exists(ctx, b.store.opKeyOf(c.CustomerID, fmt.Sprintf("op-%d", i))).Val()
			if i%7 == 0 {
				if got[i] || a.Version != 9 || a.Balance != 5 || opKey != 0 {
					t.Errorf("account %d: loaded %v, %+v, op key %d; want the newer Redis state kept", i, got[i], a, opKey)
				}
				continue
			}
			if !got[i] || a.Version != 3 || a.Balance != int64(100+i) || opKey != 0 {
				t.Errorf("account %d: loaded %v, %+v, op key %d; want version 3, balance %d and no op key", i, got[i], a, opKey, 100+i)
			}
		}
	})
}

// TestBlockTextsRemembered holds the library's remembered block texts
// (prelude/blocks.lua block_dec, block_seen) to what the hash holds: two
// customers whose blocks are the same texts but for their ids charge
// one after the other, a drained block's new text is read back by the
// next charge, and after each charge every block the Mutation names is
// the customer's own and agrees with the hash as Go reads it.
func TestBlockTextsRemembered(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b bundle) {
		ctx := context.Background()
		a, aIDs := b.funded(t) // 60 at priority 0, 40 at priority 1
		o, oIDs := b.funded(t)
		own := map[engine.CustomerKey][2]uuid.UUID{a: aIDs, o: oIDs}
		steps := []struct {
			c     engine.CustomerKey
			units int64
			want  [2]int64 // remaining of the two blocks after the charge
		}{
			{a, 10, [2]int64{50, 40}},
			{o, 10, [2]int64{50, 40}},
			{a, 10, [2]int64{40, 40}},
			{a, 10, [2]int64{30, 40}}, // a text the last charge wrote, read back
			{o, 10, [2]int64{40, 40}},
			{a, 35, [2]int64{0, 35}}, // drains the first block, then the second
			{o, 40, [2]int64{0, 40}}, // to exactly zero
			{a, 5, [2]int64{0, 30}},
			{o, 1, [2]int64{0, 39}},
		}
		for i, st := range steps {
			res, err := b.store.Consume(ctx, consumeCmd(st.c, st.units, perUnitTerms(1), engine.OveragePolicyBlock, t0))
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			ids := own[st.c]
			for _, mb := range res.Mutation.Blocks {
				k := slices.Index(ids[:], mb.ID)
				if k < 0 {
					t.Fatalf("step %d: the Mutation names block %s, not one of the customer's", i, mb.ID)
				}
				if mb.Remaining != st.want[k] || mb.Original != [2]int64{60, 40}[k] {
					t.Errorf("step %d: block %d in the Mutation: remaining %d of %d, want %d of %d", i, k, mb.Remaining, mb.Original, st.want[k], [2]int64{60, 40}[k])
				}
			}
			got := map[uuid.UUID]engine.Block{}
			for _, blk := range b.snapshot(t, st.c, t0).Blocks {
				got[blk.ID] = blk
			}
			for k, id := range ids {
				blk, ok := got[id]
				if st.want[k] == 0 {
					if ok && blk.RemainingAmount != 0 {
						t.Errorf("step %d: block %d holds %d in the hash, want it drained", i, k, blk.RemainingAmount)
					}
					continue
				}
				if !ok || blk.RemainingAmount != st.want[k] || blk.OriginalAmount != [2]int64{60, 40}[k] || blk.Priority != k {
					t.Errorf("step %d: block %d in the hash: %+v, want remaining %d of %d at priority %d", i, k, blk, st.want[k], [2]int64{60, 40}[k], k)
				}
			}
		}
	})
}
