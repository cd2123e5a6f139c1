package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/creditd/creditd/internal/export"
	"github.com/creditd/creditd/persist"
)

const exportUsage = `Writes the ledger and the events of closed months (each tenant's, or
--tenant's) from Postgres (DATABASE_URL) as files a warehouse loads: one file per
table, tenant and month under --out, in Hive-style directories
(<table>/tenant_id=<uuid>/month=<YYYY-MM>/part.<format>), with schema.json (every
column's type and meaning) and manifest.json (every file's rows, bytes and
SHA-256). --from and --to name the first and last month (YYYY-MM); a month not
over yet is refused (its ledger still grows). Rows are streamed, so memory does
not grow with a month's size. A run stopped anywhere can be run again with the
same flags: it skips the files manifest.json lists and writes the rest.`

// exportCmd is `creditd export`; bad flags are refused before anything
// connects.
func exportCmd() *cobra.Command {
	var from, to, tenant, format, out string
	c := &cobra.Command{
		Use:   "export",
		Short: "Write closed months of the ledger and events as Parquet or CSV files for a warehouse (DATABASE_URL)",
		Long:  exportUsage,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := exportOptions(from, to, tenant, format, out, time.Now())
			if err != nil {
				return err
			}
			return withDatabase(func(ctx context.Context, _ config, store *persist.Store) error {
				return runExport(ctx, store, opts, cmd.OutOrStdout())
			})
		},
	}
	f := c.Flags()
	f.StringVar(&from, "from", "", "first month, YYYY-MM (required)")
	f.StringVar(&to, "to", "", "last month, YYYY-MM, over already (required)")
	f.StringVar(&tenant, "tenant", "", "one tenant's id (default: every tenant)")
	f.StringVar(&format, "format", "parquet", "parquet or csv")
	f.StringVar(&out, "out", "", "directory the files go to (required)")
	return c
}

// exportOptions checks the flags.
func exportOptions(from, to, tenant, format, out string, now time.Time) (export.Options, error) {
	o := export.Options{Format: export.Format(format), Dir: out, Now: now}
	var err error
	if o.From, err = parseMonth("--from", from); err != nil {
		return o, err
	}
	if o.To, err = parseMonth("--to", to); err != nil {
		return o, err
	}
	if tenant != "" {
		id, err := uuid.Parse(tenant)
		if err != nil {
			return o, fmt.Errorf("--tenant %q is not a UUID", tenant)
		}
		o.Tenant = &id
	}
	return o, o.Check()
}

// parseMonth reads a YYYY-MM flag.
func parseMonth(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, fmt.Errorf("%s is required (YYYY-MM)", flag)
	}
	t, err := time.Parse("2006-01", v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q: want YYYY-MM", flag, v)
	}
	return t, nil
}

// runExport runs the export and reports each file.
func runExport(ctx context.Context, src export.Source, o export.Options, w io.Writer) error {
	rep, err := export.Run(ctx, src, o)
	for _, f := range rep.Written {
		fmt.Fprintf(w, "wrote %s: %d rows, %d bytes\n", f.Path, f.Rows, f.Bytes)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "export: %d files written, %d already there (%s)\n", len(rep.Written), len(rep.Skipped), o.Dir)
	return nil
}
