package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/internal/export"
	"github.com/creditd/creditd/internal/testenv"
	"github.com/creditd/creditd/persist"
)

// TestExportRoundTrip writes two closed months of a ledger (grants,
// consumes drawn from two blocks, their events, a consume event carried by
// its ledger entry) as Parquet with parquet-go, reads every file back with
// Apache Arrow's Parquet reader (another implementation) and compares
// every row with the ledger and the events in Postgres; checks the
// manifest's counts and checksums; runs again and writes nothing (resume);
// writes the same as CSV; and refuses a month not over yet.
func TestExportRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := migratedPool(t, ctx)
	store := persist.NewStore(pool)
	tenant := uuid.New()
	if _, err := pool.Exec(ctx, `INSERT INTO tenants (id, name) VALUES ($1, 'export')`, tenant); err != nil {
		t.Fatal(err)
	}
	sept := time.Date(2026, 9, 14, 10, 0, 0, 0, time.UTC)
	oct := time.Date(2026, 10, 2, 8, 30, 0, 0, time.UTC)
	var ms []engine.Mutation
	for i, at := range []time.Time{sept, oct} {
		c := exportCustomer{id: uuid.New(), blocks: []uuid.UUID{uuid.New(), uuid.New()}, balance: 1_000_000}
		if _, err := pool.Exec(ctx, `INSERT INTO customers (id, tenant_id, environment, external_id) VALUES ($1, $2, 'live', $3)`,
			c.id, tenant, fmt.Sprintf("cust-%d", i)); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, c.grant(tenant, at))
		for j := range 3 {
			ms = append(ms, c.consume(tenant, at.Add(time.Duration(j+1)*time.Minute), fmt.Sprintf("cust-%d", i)))
		}
	}
	// The grants' events are completed in SQL, so a batch holding one
	// carries no event: the consumes go in a batch of their own.
	var grants, consumes []engine.Mutation
	for _, m := range ms {
		if m.Kind == engine.MutationGrant {
			grants = append(grants, m)
		} else {
			consumes = append(consumes, m)
		}
	}
	for _, batch := range [][]engine.Mutation{grants, consumes} {
		if err := store.Apply(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	var carried int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE tenant_id = $1 AND event_sequence IS NOT NULL`,
		tenant).Scan(&carried); err != nil {
		t.Fatal(err)
	}
	if carried == 0 {
		t.Fatal("no consume event is carried by its ledger entry: the export's merge of the two forms is not tried")
	}

	now := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)
	dir := t.TempDir()
	opts, err := exportOptions("2026-09", "2026-10", tenant.String(), "parquet", dir, now)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := runExport(ctx, store, opts, &out); err != nil {
		t.Fatal(err)
	}
	man := readManifestFile(t, dir)
	if len(man.Files) != 4 {
		t.Fatalf("manifest lists %d files, want 4 (2 tables x 2 months):\n%s", len(man.Files), out.String())
	}
	for _, f := range man.Files {
		from, _ := time.Parse("2006-01", f.Month)
		to := from.AddDate(0, 1, 0)
		b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(f.Path)))
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != f.SHA256 || int64(len(b)) != f.Bytes {
			t.Errorf("%s: %d bytes, sha256 %x; manifest says %d, %s", f.Path, len(b), sum, f.Bytes, f.SHA256)
		}
		got := readParquetRows(t, filepath.Join(dir, filepath.FromSlash(f.Path)))
		var want []map[string]string
		switch f.Table {
		case "ledger_entries":
			err = store.ExportLedger(ctx, tenant, from, to, func(e engine.LedgerEntry) error {
				want = append(want, ledgerWant(e))
				return nil
			})
		case "events":
			err = store.ExportEvents(ctx, tenant, from, to, func(e engine.Event) error {
				want = append(want, eventWant(e))
				return nil
			})
		}
		if err != nil {
			t.Fatal(err)
		}
		if int64(len(got)) != f.Rows || len(got) != len(want) || len(want) == 0 {
			t.Fatalf("%s: %d rows read, manifest %d, Postgres %d", f.Path, len(got), f.Rows, len(want))
		}
		for i := range want {
			for k, v := range want[i] {
				if got[i][k] != v {
					t.Errorf("%s row %d: %s = %q, Postgres has %q", f.Path, i, k, got[i][k], v)
				}
			}
		}
	}
	// The ledger files hold every entry of the two months, once.
	var entries int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM ledger_entries WHERE tenant_id = $1`, tenant).Scan(&entries); err != nil {
		t.Fatal(err)
	}
	var exported int64
	for _, f := range man.Files {
		if f.Table == "ledger_entries" {
			exported += f.Rows
		}
	}
	if exported != entries {
		t.Errorf("ledger files hold %d rows, the ledger %d", exported, entries)
	}

	// Resume: a second run writes nothing; a file the manifest lost is
	// written again, the same bytes.
	out.Reset()
	if err := runExport(ctx, store, opts, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "0 files written, 4 already there") {
		t.Errorf("second run: %s", out.String())
	}
	lost := man.Files[len(man.Files)-1]
	man.Files = man.Files[:len(man.Files)-1]
	writeManifestFile(t, dir, man)
	out.Reset()
	if err := runExport(ctx, store, opts, &out); err != nil {
		t.Fatal(err)
	}
	again := readManifestFile(t, dir)
	if len(again.Files) != 4 || again.Files[3].SHA256 != lost.SHA256 {
		t.Errorf("after losing %s from the manifest: %d files, last %+v, want it again as %s", lost.Path, len(again.Files), again.Files[len(again.Files)-1], lost.SHA256)
	}

	// CSV: the same rows, with a header.
	csvDir := t.TempDir()
	copts, err := exportOptions("2026-09", "2026-10", tenant.String(), "csv", csvDir, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := runExport(ctx, store, copts, &out); err != nil {
		t.Fatal(err)
	}
	for _, f := range readManifestFile(t, csvDir).Files {
		recs := readCSV(t, filepath.Join(csvDir, filepath.FromSlash(f.Path)))
		if int64(len(recs)-1) != f.Rows {
			t.Errorf("%s: %d CSV records after the header, manifest %d", f.Path, len(recs)-1, f.Rows)
		}
		if recs[0][0] != "id" {
			t.Errorf("%s: header %v", f.Path, recs[0])
		}
	}

	for _, bad := range []struct{ from, to, format string }{
		{"2026-10", "2026-11", "parquet"}, // November is not over
		{"2026-10", "2026-09", "parquet"}, // to before from
		{"2026-09", "2026-10", "xml"},
		{"2026-9", "2026-10", "csv"},
	} {
		if _, err := exportOptions(bad.from, bad.to, "", bad.format, dir, now); err == nil {
			t.Errorf("export --from %s --to %s --format %s: no error", bad.from, bad.to, bad.format)
		}
	}
}

// readParquetRows reads a file with Arrow's Parquet reader, every value
// as text, by column name.
func readParquetRows(t *testing.T, path string) []map[string]string {
	t.Helper()
	pf, err := file.OpenParquetFile(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer pf.Close()
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		t.Fatal(err)
	}
	tbl, err := fr.ReadTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.Release()
	rows := make([]map[string]string, tbl.NumRows())
	for i := range rows {
		rows[i] = map[string]string{}
	}
	for c := 0; c < int(tbl.NumCols()); c++ {
		col := tbl.Column(c)
		name := col.Name()
		i := 0
		for _, chunk := range col.Data().Chunks() {
			for j := 0; j < chunk.Len(); j++ {
				rows[i][name] = arrowText(t, chunk, j)
				i++
			}
		}
	}
	return rows
}

// arrowText is value j of a column as the comparison writes it: "" for
// null, an instant as RFC 3339 UTC with microseconds.
func arrowText(t *testing.T, a arrow.Array, j int) string {
	if a.IsNull(j) {
		return ""
	}
	switch v := a.(type) {
	case *array.String:
		return v.Value(j)
	case *array.Int64:
		return fmt.Sprint(v.Value(j))
	case *array.Timestamp:
		return v.Value(j).ToTime(arrow.Microsecond).UTC().Format(time.RFC3339Nano)
	}
	t.Fatalf("column type %s not read", a.DataType())
	return ""
}

func ledgerWant(e engine.LedgerEntry) map[string]string {
	opt := func(p *string) string {
		if p == nil {
			return ""
		}
		return *p
	}
	num := func(p *int64) string {
		if p == nil {
			return ""
		}
		return fmt.Sprint(*p)
	}
	id := func(p *uuid.UUID) string {
		if p == nil {
			return ""
		}
		return p.String()
	}
	src := ""
	if e.Source != nil {
		src = string(*e.Source)
	}
	draws := ""
	if len(e.Draws) > 0 {
		b, _ := json.Marshal(e.Draws)
		draws = string(b)
	}
	return map[string]string{"id": e.ID.String(), "tenant_id": e.TenantID.String(), "customer_id": e.CustomerID.String(),
		"environment": string(e.Environment), "delta": fmt.Sprint(e.Delta), "type": string(e.Type), "source": src,
		"credit_block_id": id(e.CreditBlockID), "billable_metric_key": opt(e.BillableMetricKey),
		"cost_units": num(e.CostUnits), "exchange_rate": num(e.ExchangeRate), "idempotency_key": e.IdempotencyKey,
		"reference_id": id(e.ReferenceID), "reason": opt(e.Reason),
		"created_at": e.CreatedAt.UTC().Format(time.RFC3339Nano), "draws": draws}
}

func eventWant(e engine.Event) map[string]string {
	customer := ""
	if e.CustomerID != nil {
		customer = e.CustomerID.String()
	}
	version := ""
	if e.Version != nil {
		version = fmt.Sprint(*e.Version)
	}
	return map[string]string{"id": e.ID.String(), "sequence": fmt.Sprint(*e.Sequence), "event_type": string(e.EventType),
		"environment": string(e.Environment), "customer_id": customer, "account_version": version,
		"status": string(e.Status), "attempts": fmt.Sprint(e.Attempts),
		"created_at": e.CreatedAt.UTC().Format(time.RFC3339Nano), "payload": string(e.Payload)}
}

func readManifestFile(t *testing.T, dir string) export.Manifest {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m export.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func writeManifestFile(t *testing.T, dir string, m export.Manifest) {
	t.Helper()
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readCSV(t *testing.T, path string) [][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// exportCustomer makes a customer's grant and lean consumes at given
// instants.
type exportCustomer struct {
	id      uuid.UUID
	blocks  []uuid.UUID
	version int64
	balance int64
	n       int
}

func (c *exportCustomer) grant(tenant uuid.UUID, at time.Time) engine.Mutation {
	c.version++
	src := engine.Source("purchase")
	ms := at.UnixMilli()
	m := engine.Mutation{OpID: uuid.New(), Kind: engine.MutationGrant, TenantID: tenant, CustomerID: c.id,
		Environment: engine.EnvironmentLive, IdempotencyKey: "g-" + c.id.String(), AtMS: ms,
		Account: engine.MutationAccount{ID: uuid.NewString(), Version: c.version, Balance: c.balance, LifetimeEarned: c.balance}}
	for _, b := range c.blocks {
		m.Entries = append(m.Entries, engine.MutationEntry{Role: engine.RoleMain, Delta: c.balance / 2, Type: engine.EntryTopup, Source: &src, BlockID: &b})
		m.Blocks = append(m.Blocks, engine.MutationBlock{ID: b, Original: c.balance / 2, Remaining: c.balance / 2, Source: src, StartsMS: ms, CreatedMS: ms})
	}
	return m
}

func (c *exportCustomer) consume(tenant uuid.UUID, at time.Time, external string) engine.Mutation {
	c.version++
	c.n++
	before := c.balance
	c.balance -= 300
	metric := "tokens"
	units, rate := int64(3), int64(100)
	ms := at.UnixMilli()
	m := engine.Mutation{OpID: uuid.New(), Kind: engine.MutationConsume, TenantID: tenant, CustomerID: c.id,
		Environment: engine.EnvironmentLive, IdempotencyKey: fmt.Sprintf("c-%s-%d", c.id, c.n), RequestHash: "h", AtMS: ms,
		Account:         engine.MutationAccount{Version: c.version, Balance: c.balance},
		Context:         &engine.MutationContext{ExternalID: external, Policy: engine.OveragePolicyBlock},
		EffectiveBefore: &before,
		Usage:           &engine.MutationUsage{Metric: metric, Units: units, Cost: 300, Charged: 300}}
	m.Entries = []engine.MutationEntry{{Role: engine.RoleMain, Delta: -300, Type: engine.EntryConsumption, Metric: &metric,
		Units: &units, Rate: &rate, Draws: []engine.EntryDraw{{BlockID: c.blocks[0], Amount: 100}, {BlockID: c.blocks[1], Amount: 200}}}}
	for _, b := range c.blocks {
		m.Blocks = append(m.Blocks, engine.MutationBlock{ID: b, Original: 500_000, Remaining: c.balance / 2, Source: "purchase", StartsMS: ms, CreatedMS: ms})
	}
	return m
}

// migratedPool is a pool on a fresh test database with every migration
// applied, closed when the test ends.
func migratedPool(t *testing.T, ctx context.Context) *pgxpool.Pool {
	t.Helper()
	pool, err := persist.Open(ctx, testenv.Database(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := persist.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	return pool
}
