package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/creditd/creditd/persist"
)

// migrateCmd is `creditd migrate up|status`: the one place besides serve
// where migrations run, and a read-only look at where the schema stands.
func migrateCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the database migrations (up) or show where the schema stands (status)",
		Long: `Migrations are embedded in the binary and recorded in schema_migrations.
Only "creditd serve" and "creditd migrate up" apply them; every other command
refuses a database whose schema is behind or ahead of this binary. Contract
steps (what only an older release needed) wait for "creditd migrate
contract", except on a fresh database.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return fmt.Errorf("say which: creditd migrate up (apply), creditd migrate contract (finish an upgrade) or creditd migrate status (show)")
		},
	}
	c.AddCommand(&cobra.Command{
		Use:   "up",
		Short: "Apply the pending migrations and exit",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			pool, err := migrateDatabase(ctx, cfg)
			if err != nil {
				return err
			}
			defer pool.Close()
			st, err := persist.Schema(ctx, pool)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "migrations applied: schema at version %d\n", st.Latest)
			return nil
		},
	}, &cobra.Command{
		Use:   "contract",
		Short: "Apply pending migrations and the contract steps an older release needed kept; run once no older node runs",
		Long: `A contract step drops what only the previous release's statements needed
(for 031, the keys without tenant_id that its ON CONFLICT (id) statements name).
Run it once every node runs this release: an older node still running would
stall its persister on the first write after it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withPool(func(ctx context.Context, pool *pgxpool.Pool) error {
				if err := persist.MigrateContract(ctx, pool); err != nil {
					return err
				}
				st, err := persist.Schema(ctx, pool)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "migrations and contract steps applied: schema at version %d\n", st.Latest)
				return nil
			})
		},
	}, &cobra.Command{
		Use:   "status",
		Short: "Show applied, pending and unknown (newer) migrations; changes nothing",
		Long: `Prints the schema version this binary expects and what the database records.
Exit status 1 when the schema does not match this binary (pending or newer).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withPool(func(ctx context.Context, pool *pgxpool.Pool) error {
				st, err := persist.Schema(ctx, pool)
				if err != nil {
					return err
				}
				printSchema(cmd.OutOrStdout(), st)
				return st.Check()
			})
		},
	})
	return c
}

// withPool runs a migrate subcommand on the configuration's Postgres,
// neither schema-checked nor migrated (these commands are what look at and
// finish the schema), until it ends or SIGINT/SIGTERM.
func withPool(run func(ctx context.Context, pool *pgxpool.Pool) error) error {
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := persist.Open(ctx, cfg.DatabaseURL)
	if err != nil {
		return fmt.Errorf("postgres unreachable at %s: %w", redactURLs(cfg.DatabaseURL), err)
	}
	defer pool.Close()
	return run(ctx, pool)
}

// printSchema writes a SchemaStatus for a terminal.
func printSchema(w io.Writer, st persist.SchemaStatus) {
	cur := 0
	if len(st.Applied) > 0 {
		cur = st.Applied[len(st.Applied)-1]
	}
	fmt.Fprintf(w, "binary schema version:   %d\n", st.Latest)
	fmt.Fprintf(w, "database schema version: %d (%d migrations recorded)\n", cur, len(st.Applied))
	for _, p := range st.Pending {
		fmt.Fprintf(w, "pending: %s\n", p)
	}
	for _, u := range st.Unknown {
		fmt.Fprintf(w, "unknown to this binary (newer): %d\n", u)
	}
	for _, c := range st.PendingContract {
		fmt.Fprintf(w, "contract pending (run `creditd migrate contract` once no older node runs): %s\n", c)
	}
	if st.Check() == nil {
		fmt.Fprintln(w, "up to date")
	}
}
