// Command creditd runs the credit-metering service and its operator tools.
// `creditd --help` lists the commands; `creditd` alone is `creditd serve`.
//
// Configuration comes from the environment (docs/spec/addendum.md §11): REDIS_URL,
// DATABASE_URL, CREDITD_ADDR, CREDITD_ADMIN_TOKEN, LOG_LEVEL and the
// CREDITD_* settings of config.go, listed in README.md.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "creditd:", err)
		os.Exit(1)
	}
}

// rootCmd is the command tree. Nothing in it connects to a service before
// a command's RunE: --help, version and completion never touch Redis or
// Postgres, and only serve and `migrate up` apply migrations.
func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "creditd",
		Short: "Multi-tenant credit metering and entitlements",
		Long: `creditd: credit metering on Redis (hot path) and Postgres (system of record).

With no command it runs "creditd serve". Configuration comes from the
environment (REDIS_URL, DATABASE_URL, CREDITD_*; see README.md): a value that
does not parse stops any command with an error naming the variable.`,
		Version:       buildInfo().String(),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE:          func(*cobra.Command, []string) error { return serve() },
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.AddCommand(
		&cobra.Command{
			Use:   "serve",
			Short: "Run the API, the persister, the sweeps and webhook delivery (applies pending migrations first)",
			Long: `Runs creditd. It applies pending migrations first and refuses a database
whose schema is newer than this binary; it logs the effective configuration
(secrets masked) at start.`,
			Args: cobra.NoArgs,
			RunE: func(*cobra.Command, []string) error { return serve() },
		},
		&cobra.Command{
			Use:   "version",
			Short: "Print the version, commit and build date",
			Args:  cobra.NoArgs,
			Run: func(cmd *cobra.Command, _ []string) {
				fmt.Fprintln(cmd.OutOrStdout(), buildInfo())
			},
		},
		&cobra.Command{
			Use:   "rebuild",
			Short: "Rebuild every customer's Redis state from Postgres, with progress",
			Args:  cobra.NoArgs,
			RunE:  func(*cobra.Command, []string) error { return withStores(rebuildOn) },
		},
		migrateCmd(),
		reconcileCmd(),
		exportCmd(),
		deadlettersCmd(onDatabase),
		healthcheckCmd(),
		adminCmd(),
	)
	root.AddCommand(operatorGroups(true)...)
	return root
}
