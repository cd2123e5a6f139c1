package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// TestCopyBinaryRoundTrip writes n copies of a row as COPY binary and
// reads the first back: the fields are the row's, NULL stays NULL, and
// every unique column differs between copies.
func TestCopyBinaryRoundTrip(t *testing.T) {
	row := [][]byte{bytes.Repeat([]byte{7}, 16), nil, []byte("idem-key"), {0, 0, 0, 0, 0, 0, 0, 9}, []byte(`{"a":1}`)}
	ft := &pgFloorTable{fields: row, unique: map[int]string{0: "uuid", 2: "text", 3: "bigint"}}
	var seq uint64 = 41
	data := ft.copyData(3, &seq)
	if seq != 44 {
		t.Fatalf("seq = %d after 3 rows, want 44", seq)
	}
	if !bytes.HasSuffix(data, []byte{0xff, 0xff}) {
		t.Fatalf("stream does not end with the -1 trailer: % x", data[len(data)-4:])
	}
	got, err := parseCopyBinaryRow(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(row) {
		t.Fatalf("%d fields, want %d", len(got), len(row))
	}
	tests := []struct {
		name string
		i    int
		same bool
	}{{"uuid varied", 0, false}, {"null kept", 1, true}, {"text varied", 2, false}, {"bigint varied", 3, false}, {"jsonb kept", 4, true}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if eq := bytes.Equal(got[tc.i], row[tc.i]) && (got[tc.i] == nil) == (row[tc.i] == nil); eq != tc.same {
				t.Errorf("field %d = %q, row's %q: same = %v, want %v", tc.i, got[tc.i], row[tc.i], eq, tc.same)
			}
		})
	}
	if string(got[2]) != "idem-key~16" { // 42 in base 36
		t.Errorf("text field = %q, want idem-key~16", got[2])
	}
	if len(got[0]) != 16 {
		t.Errorf("uuid field has %d bytes", len(got[0]))
	}
	if n := encodedLen(row); n != 2+5*4+16+8+8+7 {
		t.Errorf("encodedLen = %d", n)
	}
}

// TestParseCopyBinaryRowRejects refuses what is not a COPY binary row.
func TestParseCopyBinaryRowRejects(t *testing.T) {
	head := append(append([]byte{}, copyBinarySignature...), make([]byte, 8)...)
	tests := []struct {
		name    string
		in      []byte
		wantErr bool
		fields  int
	}{
		{"text", []byte("a\tb\n"), true, 0},
		{"no row", append(append([]byte{}, head...), 0xff, 0xff), false, 0},
		{"short field", append(append([]byte{}, head...), 0, 1, 0, 0, 0, 9, 1), true, 0},
		{"one null field", append(append([]byte{}, head...), 0, 1, 0xff, 0xff, 0xff, 0xff), false, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseCopyBinaryRow(tc.in)
			if (err != nil) != tc.wantErr || len(f) != tc.fields {
				t.Errorf("got %d fields, err %v; want %d fields, error %v", len(f), err, tc.fields, tc.wantErr)
			}
		})
	}
	// The partition key stays (the row's month); a type nothing varies is
	// refused.
	if f, err := uniqueField("timestamp with time zone", []byte{1}, 1); err != nil || len(f) != 1 || f[0] != 1 {
		t.Errorf("a timestamp key column: %v %v, want it kept as it was", f, err)
	}
	if _, err := uniqueField("boolean", []byte{1}, 1); err == nil {
		t.Error("a unique boolean column was varied")
	}
}

// floorsFixture is a run with a ceiling, check, consume, reserve and the
// floors scenario, its figures chosen so every sum is known.
func floorsFixture() *Results {
	r := &Results{Machine: Machine{CPUs: 2}}
	r.RedisBenchmark = &RedisBench{RPS: 100000}
	r.Ceiling = &ScenarioResult{Run: &RunResult{OK: 1000, Offered: 1000, Latency: Latency{P99: 2.5}}, Max: 40000,
		CPU: CPUSample{"ceiling server": 0.028, "redis-server": 0.012}}
	r.PGBench = []PGBench{{Name: "spread", TPS: 8000}, {Name: "hot", TPS: 2500}}
	r.Scenarios = []ScenarioResult{
		{Name: "check", Run: &RunResult{OK: 1000}, CPU: CPUSample{"creditd": 0.030, "redis-server": 0.008, "postgres": 0.002},
			Redis: []RedisCalls{{Command: "fcall", CallsPerOp: 1, UsecPerCall: 4}}},
		{Name: "consume", Run: &RunResult{OK: 1000, Offered: 4000}, CPU: CPUSample{"creditd": 0.160, "redis-server": 0.090, "postgres": 0.070},
			Redis: []RedisCalls{{Command: "fcall", CallsPerOp: 1, UsecPerCall: 70}, {Command: "xreadgroup", CallsPerOp: 0.2, UsecPerCall: 5}},
			PG:    &PGStats{InsertedPerOp: 3, UpdatedPerOp: 2, Tables: []PGTable{{Name: "credit_accounts", Updated: 1}, {Name: "credit_blocks", Updated: 1}}}},
		{Name: "reserve", Run: &RunResult{OK: 1000}, CPU: CPUSample{"creditd": 1.0, "redis-server": 0.5, "postgres": 0.7},
			Redis: []RedisCalls{{Command: "fcall", CallsPerOp: 2, UsecPerCall: 150}},
			PG:    &PGStats{InsertedPerOp: 6, UpdatedPerOp: 4}},
	}
	r.Floors = &FloorsResult{
		Sample: FloorSample{AccountFields: 7, AccountBytes: 210, OutboxEntryBytes: 900, OpRecordBytes: 120, ClaimBytes: 12},
		Server: &FloorServerRun{Run: &RunResult{OK: 1000, Offered: 4000}, ServerUSPerRequest: 40, RedisUSPerRequest: 20,
			PostgresUSPerRequest: 50, LookupBackends: 8, LookupBackendUSPerRequest: 5, FcallUSPerCall: 15},
		Postgres: &PGFloorRun{GroupSize: 110, GroupSource: "test", AccountsPerOp: 1, BlocksPerOp: 1, Groups: 10, Ops: 1100,
			PostgresUSPerOp: 33, BackendUSPerOp: 31, StatementUSPerOp: map[string]float64{"COMMIT": 20}},
	}
	r.PGStatements = &PGStatementsResult{
		Runs: []PGStatementsRun{{Scenario: "consume", Run: &RunResult{OK: 1000, Offered: 1000}, CPU: CPUSample{"postgres": 0.090},
			StatementUSPerOp: 57, Top: []PGStatement{{Gist: "COPY ledger_entries", TotalUSPerOp: 12, CallsPerOp: 0.01, MeanUS: 1200, RowsPerCall: 110}}}},
		Floor: &PGFloorRun{Ops: 1100, PostgresUSPerOp: 25, BackendUSPerOp: 22, PGStatUSPerOp: 30,
			PGStatTop: []PGStatement{{Gist: "COPY ledger_entries", TotalUSPerOp: 9}}},
	}
	return r
}

// TestFloorTables decomposes each missed CPU goal by component against
// the floor for the same work, and says what the floors' sum means.
func TestFloorTables(t *testing.T) {
	r := floorsFixture()
	var sb strings.Builder
	r.floorsMarkdown(func(f string, a ...any) { fmt.Fprintf(&sb, f, a...) })
	out := sb.String()
	for _, want := range []string{
		"#### Logic-free replicas of today's round trips (floors scenario; not a floor of the design",
		"**check** (CPU µs per check;",
		"| creditd | 30 µs | 28 µs | +2 µs |",
		// consume: creditd 160 vs 40, Redis 90 vs 20, Postgres 70 vs 25 (the
		// private cluster's writes) + 5 (the look-up's own backends).
		"**consume** (CPU µs per consume;",
		"| creditd | 160 µs | 40 µs | +120 µs |",
		"| Redis | 90 µs | 20 µs | +70 µs | scripts 70 µs per consume (1.00 FCALL x 70.0 µs) against the floor script's 15 µs",
		"so 55 µs per consume of logic in the scripts",
		"so 270 µs per create+commit of logic in the scripts",
		// pg-statements: the real path and the floor on the private cluster.
		"on that private cluster the persister's real path (with creditd's look-ups) costs 57 µs of statement time and 90 µs of Postgres CPU per consume, the floor's writes 30 µs and 25 µs (its own backend 22 µs), most in COPY ledger_entries 9.0 µs",
		"The same Postgres floor on pg-statements' private cluster (no one else's work): 30 µs of statement time and 25 µs of Postgres CPU per consume; the tables use this figure.",
		"The look-up costs the floor server's own 8 backends 5 µs per request (the whole server 50 µs in that window, others' work included); the tables use the former.",
		"33 µs of Postgres CPU per op (every process of the server; the floor's own backend alone 31 µs)",
		"xreadgroup 0.20 x 5 µs",
		"| Postgres | 70 µs | 30 µs | +40 µs |",
		"| all | 320 µs | 90 µs | +230 µs | |",
		"The replicas alone sum to 90 µs > the 60 µs goal: today's round trips cost more than the goal with no logic at all. creditd's replica alone, 40 µs, is over its 30 µs share of the goal. Redis's replica alone, 20 µs, is over its 15 µs share of the goal. Postgres's replica alone, 30 µs, is over its 15 µs share of the goal.\n",
		// reserve: 2 round trips; Postgres 25/5 µs per row x 10 rows + 2 look-ups of 5.
		"**reserve + commit** (CPU µs per create+commit;",
		"| creditd | 1000 µs | 80 µs |",
		"| Postgres | 700 µs | 60 µs |",
		"The replicas sum to 180 µs <= the 250 µs goal: 70 µs are left for the logic.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	// No missed CPU or throughput row gets a floors note: issue 26 has no
	// "floor for the same work" escape.
	tests := []struct{ goal, want string }{
		{"consume CPU per op, all processes", ""},
		{"reserve + commit CPU", ""},
		{"check CPU per op", ""},
		{"consume throughput / Postgres-only (spread)", ""},
		{"consume throughput / Postgres-only (hot)", ""},
		{"usage CPU per event", ""},
		{"check throughput / raw Redis EVALSHA", "the ceiling server (HTTP + one round trip) reaches 0.40x"},
		{"check p99 in creditd's own histogram at 70 % of max", "the ceiling server's client p99 at its 70 % run: 2.500 ms"},
	}
	for _, tc := range tests {
		if got := r.goalCeiling(tc.goal); !strings.Contains(got, tc.want) || (tc.want == "" && got != "") {
			t.Errorf("goalCeiling(%q) = %q, want %q", tc.goal, got, tc.want)
		}
	}
}

// TestFloorTablesWithoutFloors leaves the consume tables out when the
// floors scenario did not run, and writes them without a ceiling.
func TestFloorTablesWithoutFloors(t *testing.T) {
	r := floorsFixture()
	r.Floors = nil
	for _, tb := range r.floorTables() {
		if tb.title != "check" {
			t.Errorf("table %q without the floors scenario", tb.title)
		}
	}
	r = floorsFixture()
	r.Ceiling = nil
	var sb strings.Builder
	r.floorsMarkdown(func(f string, a ...any) { fmt.Fprintf(&sb, f, a...) })
	if out := sb.String(); !strings.Contains(out, "**consume** (CPU µs per consume;") || strings.Contains(out, "**check**") {
		t.Errorf("floors without the ceiling:\n%s", out)
	}
}

// TestFloorsFailureReported names a failed floors scenario in the report.
func TestFloorsFailureReported(t *testing.T) {
	r := &Results{Floors: &FloorsResult{Error: "no consume outbox entry caught during the burst"}}
	var sb strings.Builder
	r.floorsMarkdown(func(f string, a ...any) { fmt.Fprintf(&sb, f, a...) })
	if want := "The floors scenario failed: no consume outbox entry caught during the burst."; !strings.Contains(sb.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, sb.String())
	}
}

// TestPGFloorParams takes the group size from pg-statements' consume run
// and the rows per op from the consume scenario, with defaults without.
func TestPGFloorParams(t *testing.T) {
	tests := []struct {
		name       string
		res        *Results
		group      int
		accounts   float64
		fromPGStat bool
	}{
		{"measured", floorsFixture(), 110, 1, true},
		{"nothing measured", &Results{}, floorGroupDefault, 1, false},
	}
	tests[0].res.Scenarios[1].PG.Tables[0].Updated = 0.6
	tests[0].accounts = 0.6
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := (&Bench{res: tc.res}).pgFloorParams()
			if p.GroupSize != tc.group || p.AccountsPerOp != tc.accounts || strings.Contains(p.GroupSource, "pg-statements'") != tc.fromPGStat {
				t.Errorf("group %d (%s), accounts %.2f per op; want %d, %.2f, from pg-statements %v", p.GroupSize, p.GroupSource, p.AccountsPerOp, tc.group, tc.accounts, tc.fromPGStat)
			}
		})
	}
}
