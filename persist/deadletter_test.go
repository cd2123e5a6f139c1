package persist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"github.com/creditd/creditd/engine"
)

// logBuffer is a zerolog sink safe for the persister's goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// refuseReason makes Postgres refuse (23514) every ledger entry whose
// reason is reason, as a stand-in for any value the door let through and
// the system of record refuses.
func (b *bundle) refuseReason(t *testing.T, reason string) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE ledger_entries ADD CONSTRAINT test_refuse
		CHECK (reason IS DISTINCT FROM '`+reason+`') NOT VALID`); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) acceptAll(t *testing.T) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE ledger_entries DROP CONSTRAINT test_refuse`); err != nil {
		t.Fatal(err)
	}
}

// runPersister runs a Persister on ob until the test ends.
func (b *bundle) runPersister(t *testing.T, ob *fakeOutbox, log zerolog.Logger) *Persister {
	t.Helper()
	per := NewPersister(ob, b.store, PersisterConfig{Consumer: "c", Block: 5 * time.Millisecond}, log)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- per.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return per
}

func (b *bundle) drain(t *testing.T, per *Persister) {
	t.Helper()
	if err := per.Drain(b.ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// wantBooks asserts Postgres holds account a exactly as the model says:
// the account row's version and balance, each block's remaining amount,
// and a ledger whose deltas sum to the balance with entries ledger entries.
func (b *bundle) wantBooks(t *testing.T, a *account, entries int) {
	t.Helper()
	if v, bal := b.accountRow(t, a.key.CustomerID); v != a.version || bal != a.balance {
		t.Errorf("account row: version %d balance %d, want %d and %d", v, bal, a.version, a.balance)
	}
	var n int
	var sum int64
	if err := b.pool.QueryRow(b.ctx, `SELECT count(*), COALESCE(SUM(delta), 0) FROM ledger_entries WHERE customer_id = $1`,
		a.key.CustomerID).Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	if n != entries || sum != a.balance {
		t.Errorf("ledger: %d entries summing to %d, want %d summing to %d", n, sum, entries, a.balance)
	}
	for id, blk := range a.blocks {
		if got := b.blockRemaining(t, id); got != blk.Remaining {
			t.Errorf("block %s: remaining %d, want %d", id, got, blk.Remaining)
		}
	}
}

func statuses(out []RetryOutcome) string {
	parts := make([]string, len(out))
	for i, o := range out {
		parts[i] = fmt.Sprintf("%d:%s", o.ID, o.Status)
	}
	return strings.Join(parts, " ")
}

// TestDeadLetterHoldAlarmAndRetry states invariant 12's "a dead letter is
// an alarm" on the persister and the operator's retry: a Mutation Postgres
// refuses is set aside with an error log naming its op, tenant, customer
// and SQLSTATE, counts as unresolved, and holds its account's later
// Mutations behind it, so Postgres keeps that account balanced at the
// version before it while other accounts move on. A retry while Postgres
// still refuses changes nothing and says why; once it accepts, a retry
// replays the account's dead letters in version order, each exactly once,
// leaving the books exactly as Redis had them; a second retry writes nothing.
func TestDeadLetterHoldAlarmAndRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	b.refuseReason(t, "refuse-me")
	now := time.Now().UTC().Truncate(time.Millisecond)
	a, other := newAccount(live, now), newAccount(live, now)
	g1 := a.grant("g1", 500, nil)
	g2 := a.grant("g2", 300, nil)
	g2.Entries[0].Reason = ptr("refuse-me")
	c3 := a.consume("", *g1.Entries[0].BlockID, 200, "api_call", 0)
	g4 := a.grant("g4", 100, nil)
	ob := newFakeOutbox(1)
	ob.add(0, g1, other.grant("o1", 7, nil), g2, c3, other.grant("o2", 8, nil), g4)

	var logs logBuffer
	per := b.runPersister(t, ob, zerolog.New(&logs))
	b.drain(t, per)

	// The alarm: counted, logged with what an operator needs.
	if n, err := b.store.UnresolvedDeadLetters(b.ctx); err != nil || n != 3 {
		t.Fatalf("unresolved = %d, %v; want 3 (g2 refused, c3 and g4 held)", n, err)
	}
	if st := per.Stats(); st.DeadLettered != 3 {
		t.Fatalf("DeadLettered = %d, want 3", st.DeadLettered)
	}
	for _, want := range []string{`"level":"error"`, `"op_id":"` + g2.OpID.String() + `"`, `"tenant_id":"` + live.TenantID.String() + `"`,
		`"customer_id":"` + a.key.CustomerID.String() + `"`, `"sqlstate":"23514"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %s:\n%s", want, logs.String())
		}
	}
	// Held, not half-written: a stays balanced at version 1; other moved on.
	if v, bal := b.accountRow(t, a.key.CustomerID); v != 1 || bal != 500 {
		t.Errorf("account a in Postgres: version %d balance %d, want 1 and 500", v, bal)
	}
	if v, bal := b.accountRow(t, other.key.CustomerID); v != other.version || bal != other.balance {
		t.Errorf("account other: version %d balance %d, want %d and %d", v, bal, other.version, other.balance)
	}
	list, total, err := b.store.ListDeadLetters(b.ctx, 10)
	if err != nil || total != 3 || len(list) != 3 {
		t.Fatalf("ListDeadLetters = %d of %d, %v", len(list), total, err)
	}
	for i, want := range []engine.Mutation{g2, c3, g4} {
		r := list[i]
		if r.OpID == nil || *r.OpID != want.OpID || r.CustomerID == nil || *r.CustomerID != a.key.CustomerID ||
			r.Kind == nil || *r.Kind != string(want.Kind) || r.ResolvedAt != nil {
			t.Fatalf("list[%d] = %+v, want op %s", i, r, want.OpID)
		}
	}
	if list[0].SQLState == nil || *list[0].SQLState != "23514" || list[1].HeldBy == nil || *list[1].HeldBy != list[0].ID {
		t.Fatalf("list = %+v", list)
	}
	ids := []int64{list[0].ID, list[1].ID, list[2].ID}
	// Delivered again (a crash before the ack): the same row, not a second.
	if id, err := b.store.DeadLetter(b.ctx, Letter{EntryID: "again", Raw: []byte("{}"), Mutation: &c3}); err != nil || id != ids[1] {
		t.Fatalf("DeadLetter of c3 again = %d, %v; want %d", id, err, ids[1])
	}
	// An op a fork repair applied again: delivered again, its resolved
	// letter stands for it (no second letter, no second alarm).
	if ok, err := b.store.resolveForkLetter(b.ctx, ids[2], "re-applied in a test"); err != nil || !ok {
		t.Fatalf("resolveForkLetter = %v, %v", ok, err)
	}
	if id, err := b.store.DeadLetter(b.ctx, Letter{EntryID: "again", Raw: []byte("{}"), Mutation: &g4}); err != nil || id != ids[2] {
		t.Fatalf("DeadLetter of repaired g4 again = %d, %v; want %d", id, err, ids[2])
	}
	if n, err := b.store.UnresolvedDeadLetters(b.ctx); err != nil || n != 2 {
		t.Fatalf("unresolved after g4's redelivery = %d, %v; want 2", n, err)
	}
	if _, err := b.pool.Exec(b.ctx, `UPDATE outbox_dead_letters SET resolved_at = NULL, resolution = NULL WHERE id = $1`, ids[2]); err != nil {
		t.Fatal(err)
	}

	// Postgres still refuses: nothing changes, the refusal is reported and
	// kept, and the account's later dead letters are not tried.
	out, err := b.store.RetryAllDeadLetters(b.ctx, RetryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(out); got != fmt.Sprintf("%d:failed %d:held %d:held", ids[0], ids[1], ids[2]) ||
		!strings.Contains(out[0].Error, "23514") {
		t.Fatalf("retry while refused = %s (%+v)", got, out)
	}
	if r, _ := b.store.GetDeadLetter(b.ctx, ids[0]); r.Retries != 1 || r.RetryError == nil || r.ResolvedAt != nil {
		t.Fatalf("after a failed retry: %+v", r)
	}
	b.wantBooks(t, &account{key: a.key, version: 1, balance: 500}, 1)

	// Postgres accepts again. Retrying c3 replays g2 first, then c3; g4
	// stays, and holds the account's next Mutation behind it.
	b.acceptAll(t)
	out, err = b.store.RetryDeadLetters(b.ctx, []int64{ids[1]}, RetryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(out); got != fmt.Sprintf("%d:resolved %d:resolved", ids[0], ids[1]) {
		t.Fatalf("retry c3 = %s", got)
	}
	if v, _ := b.accountRow(t, a.key.CustomerID); v != 3 {
		t.Fatalf("account a at version %d after replaying g2 and c3, want 3", v)
	}
	g5 := a.grant("g5", 40, nil)
	ob.add(0, g5)
	b.drain(t, per)
	if n, _ := b.store.UnresolvedDeadLetters(b.ctx); n != 2 {
		t.Fatalf("unresolved = %d, want 2 (g4 and g5 held behind it)", n)
	}
	out, err = b.store.RetryAllDeadLetters(b.ctx, RetryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].ID != ids[2] || out[0].Status != RetryResolved || out[1].Status != RetryResolved ||
		*out[1].OpID != g5.OpID {
		t.Fatalf("retry all = %s", statuses(out))
	}
	b.wantBooks(t, a, 5)
	if n, _ := b.store.UnresolvedDeadLetters(b.ctx); n != 0 {
		t.Fatalf("unresolved = %d after the replay", n)
	}

	// The hold is lifted: the next Mutation goes straight to Postgres.
	g6 := a.grant("g6", 2, nil)
	ob.add(0, g6)
	b.drain(t, per)
	b.wantBooks(t, a, 6)
	if st := per.Stats(); st.DeadLettered != 4 {
		t.Fatalf("DeadLettered = %d after the hold was lifted, want 4", st.DeadLettered)
	}

	// Exactly once: retrying again writes nothing.
	if out, err := b.store.RetryAllDeadLetters(b.ctx, RetryOptions{}); err != nil || len(out) != 0 {
		t.Fatalf("second retry all = %s, %v", statuses(out), err)
	}
	out, err = b.store.RetryDeadLetters(b.ctx, append(ids, 999999, ids[0]), RetryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := statuses(out); got != fmt.Sprintf("%d:already_resolved %d:already_resolved %d:already_resolved 999999:not_found", ids[0], ids[1], ids[2]) {
		t.Fatalf("retry of resolved ids = %s", got)
	}
	b.wantBooks(t, a, 6)
}

// TestDeadLetterRetryRace: two operators retrying the same dead letters at
// once write each Mutation once; every dead letter is resolved by exactly
// one of them.
func TestDeadLetterRetryRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	b.refuseReason(t, "refuse-me")
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	first := a.grant("r1", 10, nil)
	first.Entries[0].Reason = ptr("refuse-me")
	ob := newFakeOutbox(1)
	ob.add(0, first, a.grant("r2", 20, nil), a.grant("r3", 30, nil), a.grant("r4", 40, nil))
	per := b.runPersister(t, ob, quietLog())
	b.drain(t, per)
	b.acceptAll(t)

	var wg sync.WaitGroup
	results := make([][]RetryOutcome, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := b.store.RetryAllDeadLetters(b.ctx, RetryOptions{})
			if err != nil {
				t.Error(err)
			}
			results[i] = out
		}()
	}
	wg.Wait()
	resolved := map[int64]int{}
	for _, out := range results {
		for _, o := range out {
			switch o.Status {
			case RetryResolved:
				resolved[o.ID]++
			case RetryAlreadyResolved:
			default:
				t.Errorf("outcome %+v", o)
			}
		}
	}
	if len(resolved) != 4 {
		t.Fatalf("resolved %v, want 4 dead letters", resolved)
	}
	for id, n := range resolved {
		if n != 1 {
			t.Errorf("dead letter %d resolved %d times", id, n)
		}
	}
	b.wantBooks(t, a, 4)
}

// TestDeadLetterUndecodable: an entry that is not a Mutation can never be
// replayed (a retry says so and keeps it, the alarm stays) until an
// operator discards it with a note.
func TestDeadLetterUndecodable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ob := newFakeOutbox(1)
	ob.addBad(0, "{not json")
	per := b.runPersister(t, ob, quietLog())
	b.drain(t, per)
	list, _, err := b.store.ListDeadLetters(b.ctx, 10)
	if err != nil || len(list) != 1 || list[0].CustomerID != nil {
		t.Fatalf("list = %+v, %v", list, err)
	}
	id := list[0].ID
	out, err := b.store.RetryAllDeadLetters(b.ctx, RetryOptions{})
	if err != nil || len(out) != 1 || out[0].Status != RetryFailed || !strings.Contains(out[0].Error, "undecodable") {
		t.Fatalf("retry = %+v, %v", out, err)
	}
	if n, _ := b.store.UnresolvedDeadLetters(b.ctx); n != 1 {
		t.Fatalf("unresolved = %d after a failed retry", n)
	}
	if err := b.store.DiscardDeadLetter(b.ctx, 999999, "x"); !errors.Is(err, engine.ErrNotFound) {
		t.Fatalf("discard of an unknown id = %v", err)
	}
	if err := b.store.DiscardDeadLetter(b.ctx, id, "garbage from a test \x00"); err != nil {
		t.Fatal(err)
	}
	r, err := b.store.GetDeadLetter(b.ctx, id)
	if err != nil || r.ResolvedAt == nil || r.Resolution == nil || *r.Resolution != "discarded: garbage from a test ?" {
		t.Fatalf("after discard: %+v, %v", r, err)
	}
	if n, _ := b.store.UnresolvedDeadLetters(b.ctx); n != 0 {
		t.Fatalf("unresolved = %d after discard", n)
	}
	if out, err := b.store.RetryDeadLetters(b.ctx, []int64{id}, RetryOptions{}); err != nil || statuses(out) != fmt.Sprintf("%d:already_resolved", id) {
		t.Fatalf("retry after discard = %s, %v", statuses(out), err)
	}
}

// countingDeadLetters counts the persister's held-account look-ups.
type countingDeadLetters struct {
	*Store
	lookups atomic.Int64
}

func (c *countingDeadLetters) HeldBehind(ctx context.Context, customers []uuid.UUID) (map[uuid.UUID]int64, error) {
	c.lookups.Add(1)
	return c.Store.HeldBehind(ctx, customers)
}

// TestPersisterHoldLookupOnlyWhileUnresolved: with no unresolved dead
// letter the persister writes batches without looking accounts up (the
// hold costs the hot path nothing); a refusal turns the look-up on at once,
// so the account's next Mutation is held; once a retry resolves it, the
// re-count turns the look-up off again.
func TestPersisterReservationLookupOnlyWhileUnresolved(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	w := &countingDeadLetters{Store: b.store}
	ob := newFakeOutbox(1)
	per := NewPersister(ob, w, PersisterConfig{Consumer: "c", Block: 5 * time.Millisecond, HoldRefresh: 5 * time.Millisecond}, quietLog())
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- per.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitHold := func(want bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); per.mayHold.Load() != want; {
			if time.Now().After(deadline) {
				t.Fatalf("mayHold stayed %v", !want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitHold(false)

	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	before := w.lookups.Load()
	ob.add(0, a.grant("q1", 1, nil), a.grant("q2", 2, nil))
	b.drain(t, per)
	if n := w.lookups.Load() - before; n != 0 {
		t.Fatalf("%d held-account look-ups with no dead letter", n)
	}

	b.refuseReason(t, "refuse-me")
	bad := a.grant("q3", 3, nil)
	bad.Entries[0].Reason = ptr("refuse-me")
	ob.add(0, bad)
	b.drain(t, per)
	ob.add(0, a.grant("q4", 4, nil))
	b.drain(t, per)
	if n, _ := b.store.UnresolvedDeadLetters(b.ctx); n != 2 || w.lookups.Load() == before {
		t.Fatalf("unresolved = %d, look-ups %d: q4 was not held behind q3", n, w.lookups.Load()-before)
	}

	b.acceptAll(t)
	if out, err := b.store.RetryAllDeadLetters(b.ctx, RetryOptions{}); err != nil || len(out) != 2 {
		t.Fatalf("retry = %s, %v", statuses(out), err)
	}
	waitHold(false)
	b.wantBooks(t, a, 4)
}

// TestDeadLetterMigrationBackfill: migration 011 names the Mutation of a
// dead letter stored before it (from raw, even with a NUL escape inside,
// which jsonb would refuse) and leaves an undecodable one unnamed, so
// both are listed and the named one replays in its account's order.
func TestDeadLetterMigrationBackfill(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	m := a.grant("old", 5, nil)
	m.Entries[0].Metadata = json.RawMessage(`{"x":"\u0000"}`)
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range [][]byte{raw, []byte("\xff{not json")} {
		if _, err := b.pool.Exec(b.ctx, `INSERT INTO outbox_dead_letters (partition, entry_id, raw, error) VALUES (0, '1-0', $1, 'old')`, r); err != nil {
			t.Fatal(err)
		}
	}
	body, err := migrationFiles.ReadFile("migrations/011_dead_letter_alarm.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	start, end := strings.Index(string(body), "DO $$"), strings.Index(string(body), "END $$;")
	if start < 0 || end < 0 {
		t.Fatal("migration 011 has no backfill block")
	}
	if _, err := b.pool.Exec(b.ctx, string(body)[start:end+len("END $$;")]); err != nil {
		t.Fatal(err)
	}
	list, _, err := b.store.ListDeadLetters(b.ctx, 10)
	if err != nil || len(list) != 2 {
		t.Fatalf("list = %+v, %v", list, err)
	}
	garbage, named := list[0], list[1]
	if garbage.CustomerID != nil || garbage.OpID != nil {
		t.Errorf("undecodable row was named: %+v", garbage)
	}
	if named.OpID == nil || *named.OpID != m.OpID || named.CustomerID == nil || *named.CustomerID != m.CustomerID ||
		named.TenantID == nil || *named.TenantID != m.TenantID || named.Kind == nil || *named.Kind != string(m.Kind) ||
		named.AccountVersion == nil || *named.AccountVersion != m.Account.Version {
		t.Errorf("backfilled row = %+v, want op %s of customer %s", named, m.OpID, m.CustomerID)
	}
}

// TestFitsNumeric: the numbers a repair keeps are the ones Postgres'
// numeric (jsonb) takes: up to 131,072 digits before the point and 16,383
// after.
func TestFitsNumeric(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    string
		want bool
	}{
		{"0", true}, {"-0.0", true}, {"12345.678", true}, {"1e131071", true}, {"1e131072", false},
		{"9.99e131071", true}, {"1e999999", false}, {"-1e999999", false}, {"1e-16383", true},
		{"1e-16384", false}, {"0.000123", true}, {"0.5e131072", true}, {"0.5e131073", false},
		{"0e999999", true}, {"1e99999999999", false}, {"100e-2", true},
	} {
		if got := fitsNumeric(tc.n); got != tc.want {
			t.Errorf("fitsNumeric(%s) = %v, want %v", tc.n, got, tc.want)
		}
	}
}

// TestRepairText: a repair replaces NUL and invalid UTF-8 in strings and
// keys, turns out-of-range numbers into their text, and keeps every other
// number's exact text.
func TestRepairText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{"a":"x\u0000y","n":12345678901234567890123,"m":-7}`, `{"a":"x` + "\uFFFD" + `y","m":-7,"n":12345678901234567890123}`},
		{`{"k\u0000":{"deep":[1e999999,"` + "\xff" + `"]}}`, `{"k` + "\uFFFD" + `":{"deep":["1e999999","` + "\uFFFD" + `"]}}`},
		{`{"s":"\ud800 lone"}`, `{"s":"` + "\uFFFD" + ` lone"}`},
		{`{"ok":"plain","f":1.5}`, `{"f":1.5,"ok":"plain"}`},
	} {
		got, changed, err := repairText([]byte(tc.in))
		if err != nil || string(got) != tc.want || changed != (tc.want != `{"f":1.5,"ok":"plain"}`) {
			t.Errorf("repairText(%q) = %s, %v, %v; want %s", tc.in, got, changed, err, tc.want)
		}
	}
	if _, _, err := repairText([]byte("{not json")); err == nil {
		t.Error("repairText accepted undecodable input")
	}
}

// TestDeadLetterRepair: Mutations refused for text Postgres cannot store
// (a NUL in metadata, 22P05) or a number beyond jsonb's range (22003), the
// issue 9 poison, fail a plain retry for ever; a retry with Repair writes
// them and the one held behind them, with the money exactly as Redis had
// it and the offending values replaced, and records that it repaired.
func TestDeadLetterRepair(t *testing.T) {
	t.Parallel()
	b := setup(t)
	live, _ := b.tenant(t)
	a := newAccount(live, time.Now().UTC().Truncate(time.Millisecond))
	nul := a.grant("n1", 10, nil)
	nul.Entries[0].Metadata = json.RawMessage(`{"note":"a\u0000b"}`)
	huge := a.grant("n2", 20, nil)
	huge.Entries[0].Metadata = json.RawMessage(`{"n":1e999999}`)
	ob := newFakeOutbox(1)
	ob.add(0, nul, huge, a.grant("n3", 30, nil))
	per := b.runPersister(t, ob, quietLog())
	b.drain(t, per)
	list, _, err := b.store.ListDeadLetters(b.ctx, 10)
	if err != nil || len(list) != 3 || list[0].SQLState == nil || *list[0].SQLState != "22P05" {
		t.Fatalf("dead letters = %+v, %v", list, err)
	}

	out, err := b.store.RetryAllDeadLetters(b.ctx, RetryOptions{})
	if err != nil || len(out) != 3 || out[0].Status != RetryFailed || !strings.Contains(out[0].Error, "22P05") {
		t.Fatalf("plain retry = %+v, %v", out, err)
	}
	out, err = b.store.RetryAllDeadLetters(b.ctx, RetryOptions{Repair: true})
	if err != nil || statuses(out) != fmt.Sprintf("%d:resolved %d:resolved %d:resolved", list[0].ID, list[1].ID, list[2].ID) {
		t.Fatalf("retry with repair = %s (%+v), %v", statuses(out), out, err)
	}
	b.wantBooks(t, a, 3)
	var note, n string
	if err := b.pool.QueryRow(b.ctx, `SELECT metadata->>'note' FROM ledger_entries WHERE op_id = $1`, nul.OpID).Scan(&note); err != nil || note != "a\uFFFDb" {
		t.Errorf("repaired note = %q, %v", note, err)
	}
	if err := b.pool.QueryRow(b.ctx, `SELECT metadata->>'n' FROM ledger_entries WHERE op_id = $1`, huge.OpID).Scan(&n); err != nil || n != "1e999999" {
		t.Errorf("repaired number = %q, %v", n, err)
	}
	r, err := b.store.GetDeadLetter(b.ctx, list[0].ID)
	if err != nil || r.Resolution == nil || !strings.Contains(*r.Resolution, "repaired") {
		t.Errorf("resolution = %+v, %v", r.Resolution, err)
	}
	if r, _ := b.store.GetDeadLetter(b.ctx, list[2].ID); r.Resolution == nil || *r.Resolution != "replayed" {
		t.Errorf("the held grant needed no repair, resolution = %v", r.Resolution)
	}
}
