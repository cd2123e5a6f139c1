// Package export writes the system of record's closed months as files a
// warehouse loads (issue 30 item 3): `creditd export`.
//
// One file per table, tenant and month, under Hive-style directories
// (<table>/tenant_id=<uuid>/month=<YYYY-MM>/part.<format>), so a warehouse
// that reads partitioned directories (DuckDB, Spark, BigQuery external
// tables, Athena) takes tenant and month from the path; a schema document
// (schema.json) and a manifest (manifest.json) with every file's rows,
// bytes and SHA-256 sit at the top. Rows are streamed from the source to
// the file (Parquet row groups of RowGroupRows), so memory does not grow
// with a month's size. A run is resumable: a file is written under a
// temporary name, renamed when whole, then added to the manifest, so a
// run stopped anywhere leaves only whole, listed files (and perhaps a
// temporary one, replaced next time), and the next run skips what the
// manifest lists.
package export

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// Source is what an export reads: the system of record (persist.Store).
type Source interface {
	// ExportTenants lists the tenants with ledger entries in [from, to)
	// (tenant alone when set), sorted.
	ExportTenants(ctx context.Context, tenant *uuid.UUID, from, to time.Time) ([]uuid.UUID, error)
	// ExportLedger hands each ledger entry of tenant created in [from, to)
	// to each, in a stable order.
	ExportLedger(ctx context.Context, tenant uuid.UUID, from, to time.Time, each func(engine.LedgerEntry) error) error
	// ExportEvents hands each event of tenant created in [from, to) to
	// each, by sequence.
	ExportEvents(ctx context.Context, tenant uuid.UUID, from, to time.Time, each func(engine.Event) error) error
}

// Format is a file format an export writes.
type Format string

const (
	FormatParquet Format = "parquet"
	FormatCSV     Format = "csv"
)

// Options are one export's.
type Options struct {
	// From and To are the first and the last month exported (any instant
	// in them), UTC.
	From, To time.Time
	// Tenant, when set, limits the export to one tenant.
	Tenant *uuid.UUID
	Format Format
	// Dir is where the files go; created when missing.
	Dir string
	// Now decides which months are closed (zero: the clock).
	Now time.Time
}

// Tables are the tables an export writes, in the order it writes them.
var Tables = []string{"ledger_entries", "events"}

// Manifest is manifest.json: what an export has written, so far.
type Manifest struct {
	// Version is the manifest's layout, 1.
	Version int    `json:"version"`
	Format  Format `json:"format"`
	// Files are the whole files written, in the order they were.
	Files []File `json:"files"`
}

// File is one written file.
type File struct {
	// Path is the file's, relative to the export directory, with '/'.
	Path     string    `json:"path"`
	Table    string    `json:"table"`
	TenantID uuid.UUID `json:"tenant_id"`
	// Month is YYYY-MM; the file holds what was created in that UTC month.
	Month  string `json:"month"`
	Rows   int64  `json:"rows"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// Report is what a run did.
type Report struct {
	Written, Skipped []File
}

// manifestName and schemaName are the export directory's two documents.
const (
	manifestName = "manifest.json"
	schemaName   = "schema.json"
)

// Months are the UTC months from from's to to's, both included.
func Months(from, to time.Time) []time.Time {
	var out []time.Time
	m := monthOf(from)
	for last := monthOf(to); !m.After(last); m = m.AddDate(0, 1, 0) {
		out = append(out, m)
	}
	return out
}

// monthOf is the first instant of t's UTC month.
func monthOf(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// Check refuses options an export cannot run: a month not closed yet
// (the ledger of the month under way still grows, so its file would not
// be final), To before From, an unknown format, no directory.
func (o Options) Check() error {
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	switch {
	case o.Dir == "":
		return errors.New("export: --out is required")
	case o.Format != FormatParquet && o.Format != FormatCSV:
		return fmt.Errorf("export: --format %q: want parquet or csv", o.Format)
	case o.From.IsZero() || o.To.IsZero():
		return errors.New("export: --from and --to are required")
	case monthOf(o.To).Before(monthOf(o.From)):
		return fmt.Errorf("export: --to %s is before --from %s", monthOf(o.To).Format("2006-01"), monthOf(o.From).Format("2006-01"))
	case !monthOf(o.To).Before(monthOf(now)):
		return fmt.Errorf("export: month %s is not closed yet: export up to %s", monthOf(o.To).Format("2006-01"),
			monthOf(now).AddDate(0, -1, 0).Format("2006-01"))
	}
	return nil
}

// Run exports every table of every tenant and month of o into o.Dir,
// skipping the files its manifest lists already.
func Run(ctx context.Context, src Source, o Options) (Report, error) {
	var rep Report
	if err := o.Check(); err != nil {
		return rep, err
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return rep, fmt.Errorf("export: %w", err)
	}
	man, err := readManifest(o.Dir, o.Format)
	if err != nil {
		return rep, err
	}
	if err := writeSchema(o.Dir); err != nil {
		return rep, err
	}
	done := map[string]File{}
	for _, f := range man.Files {
		done[f.Path] = f
	}
	for _, month := range Months(o.From, o.To) {
		end := month.AddDate(0, 1, 0)
		tenants, err := src.ExportTenants(ctx, o.Tenant, month, end)
		if err != nil {
			return rep, err
		}
		for _, tenant := range tenants {
			for _, table := range Tables {
				rel := filePath(table, tenant, month, o.Format)
				if f, ok := done[rel]; ok {
					rep.Skipped = append(rep.Skipped, f)
					continue
				}
				f, err := writeFile(ctx, src, o, table, tenant, month, rel)
				if err != nil {
					return rep, err
				}
				man.Files = append(man.Files, f)
				if err := writeManifest(o.Dir, man); err != nil {
					return rep, err
				}
				rep.Written = append(rep.Written, f)
			}
		}
	}
	return rep, nil
}

// filePath is where table's file of tenant and month goes, relative to
// the export directory.
func filePath(table string, tenant uuid.UUID, month time.Time, format Format) string {
	return fmt.Sprintf("%s/tenant_id=%s/month=%s/part.%s", table, tenant, month.Format("2006-01"), format)
}

// writeFile writes one file under a temporary name, then renames it.
func writeFile(ctx context.Context, src Source, o Options, table string, tenant uuid.UUID, month time.Time, rel string) (File, error) {
	path := filepath.Join(o.Dir, filepath.FromSlash(rel))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return File{}, fmt.Errorf("export: %w", err)
	}
	tmp := path + ".tmp"
	out, err := os.Create(tmp)
	if err != nil {
		return File{}, fmt.Errorf("export: %w", err)
	}
	defer os.Remove(tmp) // gone once renamed; a leftover after an error
	sum := sha256.New()
	counted := &countingWriter{w: io.MultiWriter(out, sum)}
	rows, err := writeTable(ctx, src, o.Format, counted, table, tenant, month, month.AddDate(0, 1, 0))
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return File{}, fmt.Errorf("export: %s: %w", rel, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return File{}, fmt.Errorf("export: %w", err)
	}
	return File{Path: rel, Table: table, TenantID: tenant, Month: month.Format("2006-01"), Rows: rows,
		Bytes: counted.n, SHA256: hex.EncodeToString(sum.Sum(nil))}, nil
}

// writeTable streams table's rows of tenant in [from, to) into w.
func writeTable(ctx context.Context, src Source, format Format, w io.Writer, table string, tenant uuid.UUID,
	from, to time.Time) (int64, error) {
	sink, err := newSink(format, table, w)
	if err != nil {
		return 0, err
	}
	var n int64
	switch table {
	case "ledger_entries":
		err = src.ExportLedger(ctx, tenant, from, to, func(e engine.LedgerEntry) error {
			n++
			return sink.add(ledgerRowOf(e))
		})
	case "events":
		err = src.ExportEvents(ctx, tenant, from, to, func(e engine.Event) error {
			n++
			return sink.add(eventRowOf(e))
		})
	default:
		err = fmt.Errorf("export: no table %q", table)
	}
	if cerr := sink.close(); err == nil {
		err = cerr
	}
	return n, err
}

// countingWriter counts what passes through.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// readManifest reads dir's manifest, or starts one; a manifest of another
// format is refused (one directory holds one format).
func readManifest(dir string, format Format) (Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if errors.Is(err, os.ErrNotExist) {
		return Manifest{Version: 1, Format: format, Files: []File{}}, nil
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("export: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Manifest{}, fmt.Errorf("export: %s: %w", manifestName, err)
	}
	if m.Format != format {
		return Manifest{}, fmt.Errorf("export: %s holds a %s export; use another --out for %s", dir, m.Format, format)
	}
	return m, nil
}

// writeManifest replaces dir's manifest whole (written aside, renamed).
func writeManifest(dir string, m Manifest) error {
	return writeJSON(filepath.Join(dir, manifestName), m)
}

// writeJSON writes v to path indented, whole or not at all.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	return nil
}

// Schema is schema.json: each table's columns.
type Schema struct {
	Version int                 `json:"version"`
	Tables  map[string][]Column `json:"tables"`
}

// Column is one column of a table: its name, its type in the files
// (Parquet's logical type; CSV writes the same values as text) and what it
// reservations.
type Column struct {
	Name     string `json:"name"`
	Type     string `json:"type"`
	Nullable bool   `json:"nullable"`
	Doc      string `json:"doc"`
}

// writeSchema writes the schema document.
func writeSchema(dir string) error {
	tables := map[string][]Column{"ledger_entries": ledgerColumns, "events": eventColumns}
	return writeJSON(filepath.Join(dir, schemaName), Schema{Version: 1, Tables: tables})
}
