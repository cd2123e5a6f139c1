package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/persist"
)

// TestDeadLettersCommand drives `creditd deadletters` on a real database
// holding one replayable dead letter and one undecodable entry: list says
// how many and shows both (text and --json), retry of the good one writes it and exits 0, a
// second retry writes nothing, retry --all reports the undecodable one and
// exits non-zero, discard resolves it, and bad arguments are refused
// before anything runs.
func TestDeadLettersCommand(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := migratedPool(t, ctx)
	store := persist.NewStore(pool)
	m := engine.Mutation{OpID: uuid.New(), Kind: engine.MutationGrant, TenantID: uuid.New(), CustomerID: uuid.New(),
		Environment: engine.EnvironmentLive, AtMS: time.Now().UnixMilli(),
		Account: engine.MutationAccount{ID: uuid.NewString(), Version: 1, Balance: 5, LifetimeEarned: 5},
		Entries: []engine.MutationEntry{{Role: engine.RoleMain, Delta: 5, Type: engine.EntryAdjustment}}}
	raw, _ := json.Marshal(m)
	good, err := store.DeadLetter(ctx, persist.Letter{EntryID: "1-0", Raw: raw, Reason: "refused", Mutation: &m, SQLState: "23514"})
	if err != nil {
		t.Fatal(err)
	}
	bad, err := store.DeadLetter(ctx, persist.Letter{EntryID: "2-0", Raw: []byte("{nope"), Reason: "undecodable"})
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := runDeadLetters(ctx, store, args, &out)
		return out.String(), err
	}

	out, err := run("list")
	if err != nil || !strings.HasPrefix(out, "2 unresolved dead letters ") || !strings.Contains(out, m.OpID.String()) ||
		!strings.Contains(out, "23514") || !strings.Contains(out, "undecodable") {
		t.Fatalf("list = %v\n%s", err, out)
	}
	out, err = run("list", "--limit", "1")
	if err != nil || !strings.HasPrefix(out, "2 unresolved dead letters ") || !strings.Contains(out, "1 more not shown") {
		t.Fatalf("list --limit 1 = %v\n%s", err, out)
	}
	out, err = run("list", "--json", "--limit", "1")
	var listed struct {
		DeadLetters []persist.DeadLetterRecord `json:"dead_letters"`
		Total       int64                      `json:"total_unresolved"`
	}
	if err != nil || json.Unmarshal([]byte(out), &listed) != nil || listed.Total != 2 || len(listed.DeadLetters) != 1 {
		t.Fatalf("list --json --limit 1 = %v\n%s", err, out)
	}

	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"retry without ids", []string{"retry"}, "ids or --all"},
		{"retry ids and --all", []string{"retry", "--all", "1"}, "ids or --all"},
		{"id not a number", []string{"retry", "x"}, "not a positive integer"},
		{"negative id", []string{"retry", "-3"}, "unknown shorthand flag"},
		{"zero id", []string{"retry", "0"}, "not a positive integer"},
		{"list with ids", []string{"list", "1"}, "unknown command"},
		{"list with --repair", []string{"list", "--repair"}, "unknown flag: --repair"},
		{"discard with --repair", []string{"discard", "1", "--note", "n", "--repair"}, "unknown flag: --repair"},
		{"limit too large", []string{"list", "--limit", "10001"}, "--limit"},
		{"discard without note", []string{"discard", "1"}, "--note"},
		{"unknown", []string{"frobnicate"}, "unknown command"},
	} {
		if _, err := run(tc.args...); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.wantErr)
		}
	}
	if n, _ := store.UnresolvedDeadLetters(ctx); n != 2 {
		t.Fatalf("bad arguments changed something: %d unresolved", n)
	}

	out, err = run("retry", itoa(good), "--json")
	if err != nil || !strings.Contains(out, `"status": "resolved"`) {
		t.Fatalf("retry good = %v\n%s", err, out)
	}
	var entries int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE op_id = $1`, m.OpID).Scan(&entries); err != nil || entries != 1 {
		t.Fatalf("ledger entries of the replayed op = %d, %v", entries, err)
	}
	if out, err = run("retry", itoa(good)); err != nil || !strings.Contains(out, "already_resolved") {
		t.Fatalf("second retry = %v\n%s", err, out)
	}
	if out, err = run("retry", "--all"); !errors.Is(err, errUnresolved) || !strings.Contains(out, "undecodable") {
		t.Fatalf("retry --all with an undecodable entry = %v\n%s", err, out)
	}
	if out, err = run("discard", itoa(bad), "--note", "checked by hand"); err != nil || !strings.Contains(out, "discarded") {
		t.Fatalf("discard = %v\n%s", err, out)
	}
	if out, err = run("list"); err != nil || !strings.Contains(out, "no unresolved dead letters") {
		t.Fatalf("list after = %v\n%s", err, out)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE op_id = $1`, m.OpID).Scan(&entries); err != nil || entries != 1 {
		t.Fatalf("ledger entries of the replayed op after everything = %d, %v", entries, err)
	}

	// A fork repair (persist/forks.go) resolves its letter as repaired:
	// list --repaired shows it with what it became; plain list does not.
	if out, err = run("list", "--repaired"); err != nil || !strings.Contains(out, "no repaired forks") {
		t.Fatalf("list --repaired before = %v\n%s", err, out)
	}
	f := m
	f.OpID, f.CustomerID = uuid.New(), uuid.New()
	fraw, _ := json.Marshal(f)
	forked, err := store.DeadLetter(ctx, persist.Letter{EntryID: "3-0", Raw: fraw, Reason: "forked", Mutation: &f, SQLState: "23F01"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE outbox_dead_letters SET resolved_at = now(), resolution = $2 WHERE id = $1`,
		forked, persist.ForkResolutionPrefix+"re-applied as grant op x at version 1005"); err != nil {
		t.Fatal(err)
	}
	out, err = run("list", "--repaired")
	if err != nil || !strings.HasPrefix(out, "1 forked ops repaired from the ledger") || !strings.Contains(out, f.OpID.String()) ||
		!strings.Contains(out, "re-applied as grant op x") {
		t.Fatalf("list --repaired = %v\n%s", err, out)
	}
	if out, err = run("list"); err != nil || !strings.Contains(out, "no unresolved dead letters") {
		t.Fatalf("list after a repair = %v\n%s", err, out)
	}
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}
