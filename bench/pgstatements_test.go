package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestShortenStatement(t *testing.T) {
	tests := []struct {
		name, in string
		n        int
		want     string
	}{
		{"whitespace collapsed", "SELECT customer_id, mutation\n\t  FROM operations   WHERE x = $1 ", 80, "SELECT customer_id, mutation FROM operations WHERE x = $1"},
		{"exactly n kept whole", "abcde", 5, "abcde"},
		{"cut at n", "abcdef", 5, "abcde…"},
		// Runes, not bytes: a cut never splits a character.
		{"cut in runes", "µµµµµµ", 3, "µµµ…"},
		{"empty", " \n ", 10, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := shortenStatement(tc.in, tc.n); got != tc.want {
				t.Errorf("shortenStatement(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
			}
		})
	}
}

// TestStatementGist: the verb and table of the outermost statement, not of
// a CTE's body, a column list or a string.
func TestStatementGist(t *testing.T) {
	tests := []struct{ name, q, want string }{
		{"applied-ops look-up", "SELECT customer_id, mutation FROM operations WHERE tenant_id = $1 AND idempotency_key = $2", "SELECT FROM operations"},
		{"function call", "SELECT credit_fork_check($1::uuid[], $2::bigint[])", "SELECT credit_fork_check"},
		{"event insert after CTEs", `WITH e AS (SELECT p.id FROM unnest($1::uuid[]) AS p(id)), bumped AS (
			INSERT INTO event_sequences AS s (tenant_id, next) SELECT 1 ON CONFLICT (tenant_id) DO UPDATE SET next = s.next + 1 RETURNING s.next)
			INSERT INTO webhook_events (id, payload) SELECT e.id, '{"a":(' FROM e ON CONFLICT (id) DO NOTHING`, "INSERT INTO webhook_events"},
		{"upsert", "INSERT INTO credit_accounts AS a (customer_id, balance) SELECT * FROM unnest($1) ON CONFLICT (customer_id) DO UPDATE SET balance = EXCLUDED.balance", "UPSERT credit_accounts"},
		{"claim", "WITH cand AS (SELECT id FROM webhook_events FOR UPDATE SKIP LOCKED) UPDATE webhook_events SET status = $1 WHERE id IN (SELECT id FROM cand)", "UPDATE webhook_events"},
		{"copy, quoted", `copy "ledger_entries" ( "id", "op_id" ) from stdin binary`, "COPY ledger_entries"},
		{"delete", "DELETE FROM operations WHERE created_at < $1", "DELETE FROM operations"},
		{"select for update", "SELECT version FROM credit_accounts WHERE customer_id = $1 FOR UPDATE", "SELECT FROM credit_accounts"},
		{"utility", "COMMIT", "COMMIT"},
		{"empty", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := statementGist(tc.q); got != tc.want {
				t.Errorf("statementGist = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestStatementPerOp(t *testing.T) {
	tests := []struct {
		name                  string
		calls, rows           int64
		totalMS, ops          float64
		callsPerOp, meanUS    float64
		totalUSPerOp, rowsPer float64
	}{
		// 2000 calls in 1000 ops taking 30 ms in all: 2 per op, 15 µs
		// each, 30 µs per op.
		{"two per op", 2000, 2000, 30, 1000, 2, 15, 30, 1},
		// The persister's COPY: one call per 50 ops, 50 rows a call.
		{"batched", 20, 1000, 4, 1000, 0.02, 200, 4, 50},
		{"no calls", 0, 0, 0, 1000, 0, 0, 0, 0},
		{"no ops", 10, 5, 1, 0, 0, 100, 0, 0.5},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := statementPerOp("q", false, tc.calls, tc.rows, tc.totalMS, tc.ops)
			for _, c := range []struct {
				what      string
				got, want float64
			}{{"calls/op", s.CallsPerOp, tc.callsPerOp}, {"mean µs", s.MeanUS, tc.meanUS},
				{"total µs/op", s.TotalUSPerOp, tc.totalUSPerOp}, {"rows/call", s.RowsPerCall, tc.rowsPer}} {
				if math.Abs(c.got-c.want) > 1e-9 {
					t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
				}
			}
		})
	}
}

// TestTopStatements: rows of one text (two users, or whitespace apart)
// merge; nested statements stay apart and out of the per-op total; the
// top is by total time.
func TestTopStatements(t *testing.T) {
	rows := []pgStatRow{
		{query: "SELECT customer_id, mutation FROM operations WHERE tenant_id = $1 AND idempotency_key = $2", toplevel: true, calls: 1000, totalMS: 12, rows: 0},
		{query: "SELECT customer_id,  mutation\nFROM operations WHERE tenant_id = $1 AND idempotency_key = $2", toplevel: true, calls: 1000, totalMS: 12, rows: 0},
		{query: "COMMIT", toplevel: true, calls: 40, totalMS: 20},
		{query: "INSERT INTO events VALUES ($1)", toplevel: false, calls: 100, totalMS: 50, rows: 100},
		{query: "BEGIN", toplevel: true, calls: 40, totalMS: 0.4},
	}
	top, usPerOp, distinct := topStatements(rows, 2000, 3)
	if distinct != 4 {
		t.Errorf("distinct = %d, want 4", distinct)
	}
	// Top-level: 12 + 12 + 20 + 0.4 ms over 2000 ops.
	if want := 44.4 * 1000 / 2000; math.Abs(usPerOp-want) > 1e-9 {
		t.Errorf("µs per op = %v, want %v", usPerOp, want)
	}
	if len(top) != 3 {
		t.Fatalf("top has %d statements, want 3: %+v", len(top), top)
	}
	if !top[0].Nested || !strings.HasPrefix(top[0].Query, "INSERT INTO events") || top[0].Gist != "INSERT INTO events" {
		t.Errorf("top[0] = %+v, want the nested insert", top[0])
	}
	if top[1].Calls != 2000 || top[1].CallsPerOp != 1 || math.Abs(top[1].MeanUS-12) > 1e-9 {
		t.Errorf("top[1] = %+v, want the merged look-up: 2000 calls, 1 per op, 12 µs each", top[1])
	}
	if got := len([]rune(top[1].Query)); got != pgstatQueryChars+1 {
		t.Errorf("look-up text has %d characters, want %d and the cut mark: %q", got, pgstatQueryChars+1, top[1].Query)
	}
	if top[2].Query != "COMMIT" {
		t.Errorf("top[2] = %q, want COMMIT", top[2].Query)
	}
}

func TestPGStatementsMarkdown(t *testing.T) {
	consume := PGStatementsRun{Scenario: "consume", Unit: "consume", DrainSeconds: 0.4, StatementUSPerOp: 45, Distinct: 12,
		Run: &RunResult{Offered: 1000, Achieved: 998, OK: 10000},
		CPU: CPUSample{"postgres": 2, "creditd": 3, "redis-server": 1},
		Top: []PGStatement{
			{Query: "SELECT customer_id, mutation FROM operations WHERE tenant_id = $1 AND idempotency_key = $2", Gist: "SELECT FROM operations", CallsPerOp: 1, MeanUS: 12, TotalUSPerOp: 12, RowsPerCall: 0},
			{Query: "COPY ledger_entries (a|b) FROM STDIN", Gist: "COPY ledger_entries", CallsPerOp: 0.02, MeanUS: 500, TotalUSPerOp: 10, RowsPerCall: 50},
			{Query: "INSERT INTO x", Gist: "INSERT INTO x", Nested: true, CallsPerOp: 1, MeanUS: 3, TotalUSPerOp: 3, RowsPerCall: 1},
			{Query: "SELECT 1", Gist: "SELECT 1", CallsPerOp: 0.1, MeanUS: 10, TotalUSPerOp: 1, RowsPerCall: 1},
			{Query: "SELECT version FROM credit_accounts", Gist: "SELECT FROM credit_accounts", CallsPerOp: 2, MeanUS: 0.25, TotalUSPerOp: 0.5, RowsPerCall: 1},
		}}
	r := &PGStatementsResult{Setting: "a private cluster", Runs: []PGStatementsRun{consume, {Scenario: "check", Unit: "check", Error: "boom"}}}
	var sb strings.Builder
	w := func(f string, a ...any) { fmt.Fprintf(&sb, f, a...) }
	pgStatementsMarkdown(w, r)
	out := sb.String()
	for _, want := range []string{
		"## Postgres statements per op", "measured on a private cluster",
		"### consume (per consume)", "**45 µs of statement time per consume** in 12 distinct statements",
		"Postgres 200 µs, creditd 300, Redis 100",
		"| SELECT FROM operations | `SELECT customer_id, mutation FROM operations WHERE tenant_id = $1 AND idempotency_key = $2` | 1.000 | 12.0 | 12.0 | 0.00 |",
		"| COPY ledger_entries | `COPY ledger_entries (a\\|b) FROM STDIN` | 0.020 | 500.0 | 10.0 | 50.00 |",
		"`INSERT INTO x` (nested)",
		"### check (per check)", "Not measured: boom.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("section lacks %q:\n%s", want, out)
		}
	}
	floor := pgStatementsFloor(r, "consume")
	if !strings.Contains(floor, "at 1000/s): 45 µs of statement time per op") || !strings.Contains(floor, "SELECT FROM operations 12.0 µs (1.000 per op x 12 µs); COPY ledger_entries 10.0 µs") ||
		!strings.Contains(floor, "INSERT INTO x (nested) 3.0 µs (1.000 per op x 3 µs); also once or more per op: SELECT FROM credit_accounts 0.5 µs (2.00 per op x 0 µs). ") ||
		strings.Contains(floor, "SELECT 1") {
		t.Errorf("floor sentence = %q", floor)
	}
	if pgStatementsFloor(r, "check") != "" || pgStatementsFloor(nil, "consume") != "" {
		t.Error("a scenario not measured has a floor sentence")
	}
	now, measured := pgStatementsGoal(r)
	if !measured || !strings.Contains(now, "consume 45 µs (12 statements), check not measured; consume's most: SELECT FROM operations 12.0 µs per op") {
		t.Errorf("goal = %q, %v", now, measured)
	}
	if now, measured := pgStatementsGoal(&PGStatementsResult{Error: "initdb failed"}); measured || now != "failed: initdb failed" {
		t.Errorf("failed goal = %q, %v", now, measured)
	}
}
