package persist

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// account builds consecutive Mutations of one customer, the way the Lua
// scripts would: each bumps the version and carries the account after it.
type account struct {
	key     engine.CustomerKey
	id      string
	version int64
	balance int64
	earned  int64
	at      time.Time
	blocks  map[uuid.UUID]*engine.MutationBlock
}

func newAccount(s engine.Scope, at time.Time) *account {
	return &account{
		key: engine.CustomerKey{TenantID: s.TenantID, Environment: s.Environment, CustomerID: uuid.New()},
		id:  uuid.NewString(), at: at, blocks: map[uuid.UUID]*engine.MutationBlock{},
	}
}

func (a *account) mutation(kind engine.MutationKind, idem string, entries []engine.MutationEntry, blocks ...engine.MutationBlock) engine.Mutation {
	a.version++
	a.at = a.at.Add(time.Second)
	return engine.Mutation{
		OpID: uuid.New(), Kind: kind, TenantID: a.key.TenantID, CustomerID: a.key.CustomerID,
		Environment: a.key.Environment, IdempotencyKey: idem, RequestHash: "rh-" + idem, AtMS: a.at.UnixMilli(),
		Account: engine.MutationAccount{ID: a.id, Version: a.version, Balance: a.balance, LifetimeEarned: a.earned},
		Entries: entries, Blocks: blocks,
	}
}

// grant adds a block of amount.
func (a *account) grant(idem string, amount int64, expires *time.Time) engine.Mutation {
	b := engine.MutationBlock{ID: uuid.New(), Original: amount, Remaining: amount, Source: engine.SourcePromotional,
		StartsMS: a.at.UnixMilli(), CreatedMS: a.at.UnixMilli(), Metadata: json.RawMessage(`{"campaign":"x"}`)}
	if expires != nil {
		ms := expires.UnixMilli()
		b.ExpiresMS = &ms
	}
	a.blocks[b.ID] = &b
	a.balance += amount
	a.earned += amount
	src := engine.SourcePromotional
	return a.mutation(engine.MutationGrant, idem, []engine.MutationEntry{{
		Role: engine.RoleMain, Delta: amount, Type: engine.EntryAdjustment, Source: &src, BlockID: &b.ID, Reason: ptr("welcome"),
	}}, b)
}

// consume drains amount from block, recording overage on metric.
func (a *account) consume(idem string, block uuid.UUID, amount int64, metric string, overage int64) engine.Mutation {
	b := a.blocks[block]
	b.Remaining -= amount
	a.balance -= amount
	e := engine.MutationEntry{Role: engine.RoleMain, Delta: -amount, Type: engine.EntryConsumption, BlockID: &block,
		Metric: &metric, Units: ptr(int64(1)), Rate: ptr(amount)}
	if overage > 0 {
		e.Overage = &overage
	}
	return a.mutation(engine.MutationDebit, idem, []engine.MutationEntry{e}, *b)
}

func (b *bundle) count(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (b *bundle) accountRow(t *testing.T, customer uuid.UUID) (version, balance int64) {
	t.Helper()
	if err := b.pool.QueryRow(b.ctx, "SELECT version, balance FROM credit_accounts WHERE customer_id = $1", customer).Scan(&version, &balance); err != nil {
		t.Fatal(err)
	}
	return version, balance
}

func (b *bundle) blockRemaining(t *testing.T, id uuid.UUID) int64 {
	t.Helper()
	var n int64
	if err := b.pool.QueryRow(b.ctx, "SELECT remaining_amount FROM credit_blocks WHERE id = $1", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestApplyIdempotent states invariant 3's Postgres half: applying the same
// batch twice, or a batch holding the same Mutation twice, or racing
// Applies of one Mutation, writes each entry and operation exactly once.
func TestApplyIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	g := a.grant("k1", 1000, nil)
	var blockID uuid.UUID
	for id := range a.blocks {
		blockID = id
	}
	d := a.consume("", blockID, 300, "api_call", 0)
	batch := []engine.Mutation{g, d}

	if err := b.store.Apply(b.ctx, batch); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Apply(b.ctx, batch); err != nil {
		t.Fatal(err)
	}
	if err := b.store.Apply(b.ctx, []engine.Mutation{g, g, d, d}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- b.store.Apply(b.ctx, batch)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Apply: %v", err)
		}
	}

	counts := map[string]int{"ledger_entries": 2, "operations": 1, "credit_blocks": 1, "credit_accounts": 1}
	for table, want := range counts {
		if got := b.count(t, table); got != want {
			t.Fatalf("%s has %d rows, want %d", table, got, want)
		}
	}
	if v, bal := b.accountRow(t, a.key.CustomerID); v != 2 || bal != 700 {
		t.Fatalf("account version %d balance %d, want 2 and 700", v, bal)
	}
	var sum int64
	if err := b.pool.QueryRow(b.ctx, "SELECT sum(delta) FROM ledger_entries WHERE customer_id = $1", a.key.CustomerID).Scan(&sum); err != nil {
		t.Fatal(err)
	}
	if sum != 700 || b.blockRemaining(t, blockID) != 700 {
		t.Fatalf("books do not balance: ledger %d, block %d, want 700", sum, b.blockRemaining(t, blockID))
	}
	if err := b.store.Apply(b.ctx, nil); err != nil {
		t.Fatalf("empty Apply: %v", err)
	}
}

// TestApplyVersionFencing states invariant 5: a Mutation older than what
// Postgres holds (a late redelivery) adds its entries but never rolls the
// account or a block back; within one batch the newest version wins.
func TestApplyVersionFencing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	tests := []struct {
		name    string
		batches func(g, d1, d2 engine.Mutation) [][]engine.Mutation
	}{
		{"newer first, older later", func(g, d1, d2 engine.Mutation) [][]engine.Mutation {
			return [][]engine.Mutation{{g, d2}, {d1}}
		}},
		{"out of order in one batch", func(g, d1, d2 engine.Mutation) [][]engine.Mutation {
			return [][]engine.Mutation{{d2, g, d1}}
		}},
		{"oldest last", func(g, d1, d2 engine.Mutation) [][]engine.Mutation {
			return [][]engine.Mutation{{d2}, {d1}, {g}}
		}},
	}
	for _, tc := range tests {
		a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
		g := a.grant("", 1000, nil)
		var blockID uuid.UUID
		for id := range a.blocks {
			blockID = id
		}
		d1 := a.consume("", blockID, 100, "m", 0)
		d2 := a.consume("", blockID, 200, "m", 0)
		for _, batch := range tc.batches(g, d1, d2) {
			if err := b.store.Apply(b.ctx, batch); err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
		}
		if v, bal := b.accountRow(t, a.key.CustomerID); v != 3 || bal != 700 {
			t.Fatalf("%s: account version %d balance %d, want 3 and 700", tc.name, v, bal)
		}
		if rem := b.blockRemaining(t, blockID); rem != 700 {
			t.Fatalf("%s: block remaining %d, want 700", tc.name, rem)
		}
	}
}

// TestApplyLargeBatch writes 500 mutations of 100 customers in one call.
func TestApplyLargeBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, sandbox := b.tenant(t)
	var batch []engine.Mutation
	for i := range 100 {
		s := live
		if i%2 == 1 {
			s = sandbox
		}
		a := newAccount(s, time.Now().UTC().Truncate(time.Millisecond))
		for j := range 5 {
			batch = append(batch, a.grant(uuid.NewString()[:j+1], 10, nil))
		}
	}
	if err := b.store.Apply(b.ctx, batch); err != nil {
		t.Fatal(err)
	}
	if n := b.count(t, "ledger_entries"); n != 500 {
		t.Fatalf("%d entries, want 500", n)
	}
	if n, err := b.store.CountAccounts(b.ctx); err != nil || n != 100 {
		t.Fatalf("CountAccounts = %d, %v", n, err)
	}
	// The rebuild's reader cuts: 3 ids, ascending, each a quarter further.
	cuts, err := b.store.AccountIDCuts(b.ctx, 4)
	if err != nil || len(cuts) != 3 {
		t.Fatalf("AccountIDCuts = %v, %v", cuts, err)
	}
	for k, c := range cuts {
		var below int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM credit_accounts WHERE customer_id < $1`, c).Scan(&below); err != nil || below != 25*(k+1) {
			t.Fatalf("cut %d has %d accounts below it (%v), want %d", k, below, err, 25*(k+1))
		}
	}
}

func TestApplyCanceledWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Now())
	ctx, cancel := contextCanceled(b)
	defer cancel()
	if err := b.store.Apply(ctx, []engine.Mutation{a.grant("k", 5, nil)}); err == nil || !errors.Is(err, ctx.Err()) {
		t.Fatalf("Apply on a canceled context: %v", err)
	}
	if n := b.count(t, "ledger_entries"); n != 0 {
		t.Fatalf("%d entries after a failed Apply", n)
	}
}

// consumeAcross drains amounts from blocks in one debit entry with Draws
// (the one ledger row per consume of issue 10).
func (a *account) consumeAcross(idem string, blocks []uuid.UUID, amounts []int64) engine.Mutation {
	e := engine.MutationEntry{Role: engine.RoleMain, Type: engine.EntryConsumption, Metric: ptr("tokens"), Units: ptr(int64(1))}
	var changed []engine.MutationBlock
	for i, id := range blocks {
		b := a.blocks[id]
		b.Remaining -= amounts[i]
		a.balance -= amounts[i]
		e.Delta -= amounts[i]
		e.Draws = append(e.Draws, engine.EntryDraw{BlockID: id, Amount: amounts[i]})
		changed = append(changed, *b)
	}
	e.Rate = ptr(-e.Delta)
	return a.mutation(engine.MutationConsume, idem, []engine.MutationEntry{e}, changed...)
}

// TestApplyDraws states that a debit several blocks paid is one ledger row
// whose draws history shows in order, next to entries of one block (the
// scripts before issue 10), and that a replay in the same or a later batch
// writes none twice.
func TestApplyDraws(t *testing.T) {
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	g1, g2 := a.grant("g1", 1000, nil), a.grant("g2", 500, nil)
	b1, b2 := g1.Blocks[0].ID, g2.Blocks[0].ID
	across := a.consumeAcross("c1", []uuid.UUID{b1, b2}, []int64{1000, 200})
	single := a.consume("c2", b2, 50, "tokens", 0)
	oneDraw := a.consumeAcross("c3", []uuid.UUID{b2}, []int64{50})
	batch := []engine.Mutation{g1, g2, across, single, across, oneDraw}
	for range 2 {
		if err := b.store.Apply(b.ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	if n := b.count(t, "ledger_entries"); n != 5 {
		t.Fatalf("ledger rows = %d, want 5 (two grants, one debit of two blocks, two of one)", n)
	}
	if r1, r2 := b.blockRemaining(t, b1), b.blockRemaining(t, b2); r1 != 0 || r2 != 200 {
		t.Fatalf("remaining = %d, %d; want 0, 200", r1, r2)
	}
	p, err := b.store.History(b.ctx, engine.HistoryQuery{TenantID: a.key.TenantID, CustomerID: a.key.CustomerID, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	byID := map[uuid.UUID]engine.LedgerEntry{}
	for _, e := range p.Data {
		sum += e.Delta
		byID[e.ID] = e
	}
	if _, bal := b.accountRow(t, a.key.CustomerID); sum != bal || bal != 200 {
		t.Fatalf("sum of deltas %d, balance %d; want both 200", sum, bal)
	}
	got := byID[engine.EntryID(across.OpID, 0)]
	want := []engine.LedgerDraw{{CreditBlockID: b1, Amount: 1000}, {CreditBlockID: b2, Amount: 200}}
	if got.CreditBlockID != nil || got.Delta != -1200 || len(got.Draws) != 2 || got.Draws[0] != want[0] || got.Draws[1] != want[1] {
		t.Fatalf("debit of two blocks = block %v delta %d draws %+v; want no block, -1200, %+v", got.CreditBlockID, got.Delta, got.Draws, want)
	}
	for _, m := range []engine.Mutation{single, oneDraw} {
		one := byID[engine.EntryID(m.OpID, 0)]
		if one.CreditBlockID == nil || *one.CreditBlockID != b2 || one.Draws != nil {
			t.Fatalf("debit of one block = block %v draws %+v; want %s and no draws", one.CreditBlockID, one.Draws, b2)
		}
	}
	if fromMutation := across.LedgerEntries(engine.RoleMain)[0]; len(fromMutation.Draws) != 2 || fromMutation.Draws[1] != want[1] {
		t.Fatalf("Mutation's ledger entry draws = %+v, want %+v", fromMutation.Draws, want)
	}
}
