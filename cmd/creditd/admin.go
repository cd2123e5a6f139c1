package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/persist"
)

const operatorModes = `With CREDITD_URL set (for example http://127.0.0.1:8080) the command goes
through that creditd's /admin/v1 API with CREDITD_ADMIN_TOKEN. With --direct it
works straight on DATABASE_URL instead (no running creditd needed; it does not
reach Redis, so running nodes see a change within their caches' lifetimes, a
revoked key within 7 s, not at once as through the API). One of the two is
required.`

// operatorGroups builds the tenant, key, webhook and rate-limit commands;
// withDirect adds the --direct flag to each (the admin group carries one
// flag for all of them instead).
func operatorGroups(withDirect bool) []*cobra.Command {
	tenant := &cobra.Command{Use: "tenant", Short: "Create, show and list tenants", Long: "Tenants.\n\n" + operatorModes}
	tenant.AddCommand(&cobra.Command{
		Use: "create NAME", Short: "Create a tenant with a live and a sandbox key (shown once)", Args: cobra.ExactArgs(1),
		RunE: operate(func(args []string) (operation, error) {
			return func(ctx context.Context, op operator) (any, error) { return op.CreateTenant(ctx, args[0]) }, nil
		}),
	}, &cobra.Command{
		Use: "get TENANT_ID", Short: "Show a tenant and its configuration", Args: cobra.ExactArgs(1),
		RunE: operate(func(args []string) (operation, error) {
			id, err := parseID("TENANT_ID", args[0])
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, op operator) (any, error) { return op.GetTenant(ctx, id) }, nil
		}),
	}, tenantListCmd())

	key := &cobra.Command{Use: "key", Short: "Issue, list and revoke API keys", Long: "API keys.\n\n" + operatorModes}
	key.AddCommand(&cobra.Command{
		Use: "create TENANT_ID live|sandbox", Short: "Issue an API key (its text is shown once)", Args: cobra.ExactArgs(2),
		ValidArgsFunction: func(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
			if len(args) == 1 {
				return []string{string(engine.EnvironmentLive), string(engine.EnvironmentSandbox)}, cobra.ShellCompDirectiveNoFileComp
			}
			return nil, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: operate(func(args []string) (operation, error) {
			id, err := parseID("TENANT_ID", args[0])
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, op operator) (any, error) {
				return op.CreateKey(ctx, id, engine.Environment(args[1]))
			}, nil
		}),
	}, &cobra.Command{
		Use: "revoke TENANT_ID KEY_ID", Short: "Revoke an API key (401 at once on this creditd)", Args: cobra.ExactArgs(2),
		RunE: operate(func(args []string) (operation, error) {
			id, err := parseID("TENANT_ID", args[0])
			if err != nil {
				return nil, err
			}
			k, err := parseID("KEY_ID", args[1])
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, op operator) (any, error) { return op.RevokeKey(ctx, id, k) }, nil
		}),
	}, keyListCmd())

	webhook := &cobra.Command{Use: "webhook", Short: "Set, rotate or remove a tenant's webhook", Long: "Webhooks.\n\n" + operatorModes}
	webhook.AddCommand(&cobra.Command{
		Use: "set TENANT_ID URL", Short: "Set the webhook URL (creates the whsec_ signing secret)", Args: cobra.ExactArgs(2),
		RunE: operate(func(args []string) (operation, error) {
			id, err := parseID("TENANT_ID", args[0])
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, op operator) (any, error) { return op.SetWebhook(ctx, id, args[1]) }, nil
		}),
	}, &cobra.Command{
		Use: "rotate TENANT_ID", Short: "Rotate the signing secret", Args: cobra.ExactArgs(1),
		RunE: operate(func(args []string) (operation, error) {
			id, err := parseID("TENANT_ID", args[0])
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, op operator) (any, error) { return op.RotateSecret(ctx, id) }, nil
		}),
	}, &cobra.Command{
		Use: "delete TENANT_ID", Short: "Remove the URL and the secret", Args: cobra.ExactArgs(1),
		RunE: operate(func(args []string) (operation, error) {
			id, err := parseID("TENANT_ID", args[0])
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context, op operator) (any, error) { return op.DeleteWebhook(ctx, id) }, nil
		}),
	})

	rateLimit := &cobra.Command{
		Use: "rate-limit TENANT_ID PER_SECOND BURST", Short: "Set the per-key token bucket of a tenant",
		Long: "Sets the token bucket every API key of the tenant draws from.\n\n" + operatorModes, Args: cobra.ExactArgs(3),
		RunE: operate(func(args []string) (operation, error) {
			id, err := parseID("TENANT_ID", args[0])
			if err != nil {
				return nil, err
			}
			ps, err := strconv.Atoi(args[1])
			if err != nil {
				return nil, fmt.Errorf("PER_SECOND %q is not a whole number", args[1])
			}
			burst, err := strconv.Atoi(args[2])
			if err != nil {
				return nil, fmt.Errorf("BURST %q is not a whole number", args[2])
			}
			return func(ctx context.Context, op operator) (any, error) { return op.SetRateLimit(ctx, id, ps, burst) }, nil
		}),
	}
	groups := []*cobra.Command{tenant, key, webhook, rateLimit}
	if withDirect {
		for _, g := range groups {
			addDirectFlag(g)
		}
	}
	return groups
}

// adminCmd keeps `creditd admin tenant create ...` and friends working: the
// same commands as the top-level tenant, key, webhook and rate-limit.
func adminCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "admin",
		Short: "The operator commands (tenant, key, webhook, rate-limit) under their former name",
		Long:  "creditd admin X is creditd X.\n\n" + operatorModes,
	}
	addDirectFlag(c)
	c.AddCommand(operatorGroups(false)...)
	return c
}

func addDirectFlag(c *cobra.Command) {
	c.PersistentFlags().Bool("direct", false, "work straight on DATABASE_URL instead of CREDITD_URL's admin API")
}

// isDirect reads --direct, wherever up the tree it was declared.
func isDirect(cmd *cobra.Command) bool {
	f := cmd.Flag("direct")
	return f != nil && f.Value.String() == "true"
}

// operation is one operator call, its arguments already checked.
type operation func(ctx context.Context, op operator) (any, error)

// operate turns an argument parser into a RunE: bad arguments are refused
// before anything connects; then it picks the admin API or the database
// (operatorModes) and prints the result as indented JSON.
func operate(parse func(args []string) (operation, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		run, err := parse(args)
		if err != nil {
			return err
		}
		return withOperator(cmd, func(ctx context.Context, op operator, _ lister) error {
			out, err := run(ctx, op)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), out)
		})
	}
}

// withOperator runs fn with the operator --direct or CREDITD_URL asks for;
// the lister is nil over the admin API.
func withOperator(cmd *cobra.Command, fn func(ctx context.Context, op operator, list lister) error) error {
	if isDirect(cmd) {
		return withDatabase(func(ctx context.Context, cfg config, store *persist.Store) error {
			return fn(ctx, newDirectOperator(store, cfg.AllowPrivate), directLister{store})
		})
	}
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	if cfg.URL == "" {
		return fmt.Errorf("%s needs CREDITD_URL (a running creditd's admin API, with CREDITD_ADMIN_TOKEN) or --direct (DATABASE_URL)", cmd.CommandPath())
	}
	api, err := newAdminAPI(cfg.URL, cfg.AdminToken)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return fn(ctx, api, api)
}

func tenantListCmd() *cobra.Command {
	var after string
	var limit int
	var asJSON bool
	c := &cobra.Command{
		Use: "list", Short: "List tenants, oldest first (through CREDITD_URL, or --direct: DATABASE_URL)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cursor := uuid.Nil
			if after != "" {
				var err error
				if cursor, err = parseID("--after", after); err != nil {
					return err
				}
			}
			if limit <= 0 || limit > persist.MaxTenantList {
				return fmt.Errorf("--limit must be 1..%d", persist.MaxTenantList)
			}
			return withOperator(cmd, func(ctx context.Context, _ operator, list lister) error {
				cfgs, err := list.ListTenants(ctx, cursor, limit)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), map[string]any{"tenants": cfgs})
				}
				printTenants(cmd.OutOrStdout(), cfgs, limit)
				return nil
			})
		},
	}
	c.Flags().StringVar(&after, "after", "", "list the tenants after this id (the last one of the previous page)")
	c.Flags().IntVar(&limit, "limit", 100, "tenants to list")
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func keyListCmd() *cobra.Command {
	var asJSON bool
	c := &cobra.Command{
		Use: "list TENANT_ID", Short: "List a tenant's API keys, revoked ones included (through CREDITD_URL, or --direct: DATABASE_URL)",
		Long: "Lists id, environment, creation and revocation of each key; the key text is never stored, so it is not shown.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID("TENANT_ID", args[0])
			if err != nil {
				return err
			}
			return withOperator(cmd, func(ctx context.Context, _ operator, list lister) error {
				keys, err := list.ListAPIKeys(ctx, id)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), map[string]any{"api_keys": keys})
				}
				printKeys(cmd.OutOrStdout(), keys)
				return nil
			})
		},
	}
	c.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return c
}

func parseID(name, v string) (uuid.UUID, error) {
	id, err := uuid.Parse(v)
	if err != nil {
		return uuid.Nil, fmt.Errorf("%s %q is not a UUID", name, v)
	}
	return id, nil
}

// printJSON writes v indented; raw JSON from the admin API is re-indented.
func printJSON(w io.Writer, v any) error {
	if raw, ok := v.(json.RawMessage); ok {
		var buf bytes.Buffer
		if err := json.Indent(&buf, raw, "", "  "); err != nil {
			return err
		}
		buf.WriteByte('\n')
		_, err := w.Write(buf.Bytes())
		return err
	}
	return writeJSON(w, v)
}

func printTenants(w io.Writer, ts []engine.TenantConfig, limit int) {
	if len(ts) == 0 {
		fmt.Fprintln(w, "no tenants")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tCREATED\tRATE LIMIT\tWEBHOOK")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/s burst %d\t%s\n", t.ID, oneLine(t.Name), t.CreatedAt.UTC().Format(time.RFC3339),
			t.RateLimitPerSecond, t.RateLimitBurst, orDash(t.WebhookURL))
	}
	_ = tw.Flush()
	if len(ts) == limit {
		fmt.Fprintf(w, "more may follow: --after %s\n", ts[len(ts)-1].ID)
	}
}

func printKeys(w io.Writer, keys []engine.APIKey) {
	if len(keys) == 0 {
		fmt.Fprintln(w, "no api keys")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tENVIRONMENT\tCREATED\tREVOKED")
	for _, k := range keys {
		rev := "-"
		if k.RevokedAt != nil {
			rev = k.RevokedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.ID, k.Environment, k.CreatedAt.UTC().Format(time.RFC3339), rev)
	}
	_ = tw.Flush()
}
