package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

const reconcileUsage = `Compares every customer's Redis state (version, balance, pending, reserved,
lifetime earned, every block with its remaining credit, priority and instants)
with Postgres, and Postgres' blocks with the sum of its ledger, once the persister
has drained (after a failover the promoted replica may lack the old master's last
writes; a bug or a hand edit may change Redis behind creditd's back). --tenant
(and --environment) limits the pass to one tenant. --repair (alias --fix) reloads
each differing customer from Postgres, fenced on the Redis version compared (a
write since is never overwritten, and the version Redis held is fenced so none of
its ops can reach Postgres later); --confirm reads a differing customer again
before reporting it, so a write the persister has not committed yet is no
difference. A customer Redis holds at a version ahead of Postgres is repaired
only once the outbox has drained (before, its ops are on their way).

The report counts the customers compared, equal, differing and missing in Redis
(loaded from Postgres on first use: no difference), and lists the first --limit
differences with each field that differs and both values. With --json it is one
JSON object; otherwise the last line, the only one starting "reconcile:", is
"reconcile: N customers checked, M differences", M counting the differences left
(after --repair, those it could not mend). Exit status 1 when M > 0.`

// errDifferencesLeft makes the exit status 1 when a pass leaves differences.
var errDifferencesLeft = errors.New("reconcile: differences left")

// backlogReader is what the drain wait needs of the outbox.
type backlogReader interface {
	Partitions() int
	Backlog(ctx context.Context, p int) (count int64, oldestMS int64, err error)
}

// reconcileCmd runs one reconcile pass on REDIS_URL and DATABASE_URL;
// bad arguments are refused before anything connects.
func reconcileCmd() *cobra.Command {
	var f reconcileFlags
	c := &cobra.Command{
		Use:   "reconcile",
		Short: "Compare every customer's Redis state with Postgres; --repair reloads the differing ones",
		Long:  reconcileUsage,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts, err := f.args()
			if err != nil {
				return err
			}
			return withStores(func(ctx context.Context, ledger *persist.Store, store *lua.Store) error {
				return runReconcile(ctx, ledger, store, store, opts, cmd.OutOrStdout(), cmd.ErrOrStderr())
			})
		},
	}
	f.register(c.Flags())
	return c
}

// reconcileArgs are the parsed flags of `creditd reconcile`.
type reconcileArgs struct {
	pass  engine.ReconcileOptions
	drain time.Duration
	json  bool
}

// reconcileFlags are the flags as given, before they are checked.
type reconcileFlags struct {
	repair, fix, json     bool
	tenant, environment   string
	limit, page           int
	drain, confirmWaiting time.Duration
}

func (f *reconcileFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&f.repair, "repair", false, "reload each differing customer from Postgres, fenced on the Redis version compared")
	fs.BoolVar(&f.fix, "fix", false, "the same as --repair (its earlier name)")
	fs.StringVar(&f.tenant, "tenant", "", "compare only this tenant's customers (a tenant id)")
	fs.StringVar(&f.environment, "environment", "", "compare only this environment's customers (live or sandbox)")
	fs.BoolVar(&f.json, "json", false, "print the report as one JSON object")
	fs.IntVar(&f.limit, "limit", engine.DefaultReconcileReported, "differing customers listed")
	fs.DurationVar(&f.drain, "drain-timeout", 30*time.Second, "wait up to this for the outbox to drain first (0: no wait)")
	fs.DurationVar(&f.confirmWaiting, "confirm", 2*time.Second, "read a differing customer again after this before reporting it")
	fs.IntVar(&f.page, "page", engine.DefaultReconcilePage, "accounts per page (at most 10000)")
}

// args checks the flags.
func (f reconcileFlags) args() (reconcileArgs, error) {
	if f.limit <= 0 || f.page <= 0 || f.page > 10_000 || f.drain < 0 || f.confirmWaiting < 0 {
		return reconcileArgs{}, errors.New("reconcile: --limit and --page (at most 10000) must be positive, durations not negative")
	}
	var scope engine.ReconcileScope
	if f.tenant != "" {
		id, err := uuid.Parse(f.tenant)
		if err != nil || id == uuid.Nil {
			return reconcileArgs{}, fmt.Errorf("reconcile: --tenant %q is not a tenant id", f.tenant)
		}
		scope.TenantID = id
	}
	if f.environment != "" {
		if scope.Environment = engine.Environment(f.environment); !scope.Environment.Valid() {
			return reconcileArgs{}, fmt.Errorf("reconcile: --environment %q is not live or sandbox", f.environment)
		}
	}
	return reconcileArgs{drain: f.drain, json: f.json, pass: engine.ReconcileOptions{Fix: f.repair || f.fix, Reported: f.limit,
		PageSize: f.page, Confirm: f.confirmWaiting, Scope: scope}}, nil
}

// parseReconcileArgs reads the flags as the command does; usage goes to note.
func parseReconcileArgs(args []string, note io.Writer) (reconcileArgs, error) {
	var f reconcileFlags
	fs := pflag.NewFlagSet("reconcile", pflag.ContinueOnError)
	fs.SetOutput(note)
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return reconcileArgs{}, err
	}
	if fs.NArg() > 0 {
		return reconcileArgs{}, fmt.Errorf("reconcile: unexpected argument %q", fs.Arg(0))
	}
	return f.args()
}

// runReconcile waits for the outbox to drain, runs the pass and prints its
// report to out (progress notes to note).
func runReconcile(ctx context.Context, src engine.ReconcileSource, store engine.ReconcileStore, outbox backlogReader,
	opts reconcileArgs, out, note io.Writer) error {
	if opts.drain > 0 {
		if left, err := waitDrained(ctx, outbox, opts.drain); err != nil {
			return err
		} else if left > 0 {
			fmt.Fprintf(note, "outbox: %d entries still pending after %s; differences they explain are confirmed after %s\n",
				left, opts.drain, opts.pass.Confirm)
		}
	}
	start := time.Now()
	pass := opts.pass
	pass.Drained = func(ctx context.Context) (bool, error) {
		left, err := waitDrained(ctx, outbox, 0)
		return left == 0, err
	}
	rep, err := engine.Reconcile(ctx, src, store, pass)
	if err != nil {
		return err
	}
	if opts.json {
		if err := json.NewEncoder(out).Encode(reportJSON(rep, time.Since(start))); err != nil {
			return err
		}
		if rep.Remaining() > 0 {
			return errDifferencesLeft
		}
		return nil
	}
	for _, d := range rep.First {
		fmt.Fprintln(out, d)
		for _, f := range d.Fields {
			fmt.Fprintf(out, "  %s: redis %s, postgres %s\n", f.Field, f.Redis, f.Postgres)
		}
	}
	if rep.Found > int64(len(rep.First)) {
		fmt.Fprintf(out, "... and %d more\n", rep.Found-int64(len(rep.First)))
	}
	kinds := ""
	for _, k := range []engine.Divergence{engine.DivergenceVersion, engine.DivergenceBlocks, engine.DivergenceReserved,
		engine.DivergenceEarned, engine.DivergenceDebt, engine.DivergenceAccountID, engine.DivergenceLedger} {
		if n := rep.ByKind[k]; n > 0 {
			kinds += fmt.Sprintf(" %s=%d", k, n)
		}
	}
	if kinds != "" {
		kinds = " (" + kinds[1:] + ")"
	}
	fmt.Fprintf(out, "compared: %d, equal: %d, differing: %d, missing in redis: %d, repaired: %d\n",
		rep.Checked, rep.Equal, rep.Found, rep.NotLoaded, rep.Fixed)
	// Only the last line starts with "reconcile:", for scripts that look for it.
	fmt.Fprintf(out, "differing customers: %d%s, reloaded from postgres: %d, not in redis (loaded on use): %d, in %s\n",
		rep.Found, kinds, rep.Fixed, rep.NotLoaded, time.Since(start).Round(time.Millisecond))
	fmt.Fprintf(out, "reconcile: %d customers checked, %d differences\n", rep.Checked, rep.Remaining())
	if rep.Remaining() > 0 {
		return errDifferencesLeft
	}
	return nil
}

// drainPoll is how often waitDrained looks at the outbox.
const drainPoll = 100 * time.Millisecond

// waitDrained waits until every outbox partition is empty or timeout
// passes, and returns the entries left.
func waitDrained(ctx context.Context, outbox backlogReader, timeout time.Duration) (int64, error) {
	deadline := time.Now().Add(timeout)
	for {
		var left int64
		for p := range outbox.Partitions() {
			n, _, err := outbox.Backlog(ctx, p)
			if err != nil {
				return 0, fmt.Errorf("reconcile: outbox backlog: %w", err)
			}
			left += n
		}
		if left == 0 || time.Now().After(deadline) {
			return left, nil
		}
		select {
		case <-ctx.Done():
			return left, ctx.Err()
		case <-time.After(drainPoll):
		}
	}
}

// reconcileJSON is the report --json prints.
type reconcileJSON struct {
	Compared        int64                  `json:"compared"`
	Equal           int64                  `json:"equal"`
	Differing       int64                  `json:"differing"`
	MissingInRedis  int64                  `json:"missing_in_redis"`
	Repaired        int64                  `json:"repaired"`
	Remaining       int64                  `json:"remaining"`
	ByKind          map[string]int64       `json:"by_kind"`
	Differences     []reconcileDifferenceJ `json:"differences"`
	DurationSeconds float64                `json:"duration_seconds"`
}

// reconcileDifferenceJ is one differing customer in the --json report.
type reconcileDifferenceJ struct {
	CustomerID      string                   `json:"customer_id"`
	TenantID        string                   `json:"tenant_id"`
	Environment     string                   `json:"environment"`
	Kinds           []string                 `json:"kinds"`
	RedisVersion    int64                    `json:"redis_version"`
	PostgresVersion int64                    `json:"postgres_version"`
	Repaired        bool                     `json:"repaired"`
	Fields          []engine.FieldDifference `json:"fields"`
}

// reportJSON is rep as --json prints it (empty lists, not null).
func reportJSON(rep engine.ReconcileReport, took time.Duration) reconcileJSON {
	out := reconcileJSON{Compared: rep.Checked, Equal: rep.Equal, Differing: rep.Found, MissingInRedis: rep.NotLoaded,
		Repaired: rep.Fixed, Remaining: rep.Remaining(), ByKind: map[string]int64{},
		Differences: []reconcileDifferenceJ{}, DurationSeconds: took.Seconds()}
	for k, n := range rep.ByKind {
		out.ByKind[string(k)] = n
	}
	for _, d := range rep.First {
		j := reconcileDifferenceJ{CustomerID: d.Customer.CustomerID.String(), TenantID: d.Customer.TenantID.String(),
			Environment: string(d.Customer.Environment), Kinds: []string{}, RedisVersion: d.StoreVersion,
			PostgresVersion: d.PostgresVersion, Repaired: d.Fixed, Fields: d.Fields}
		for _, k := range d.Kinds {
			j.Kinds = append(j.Kinds, string(k))
		}
		if j.Fields == nil {
			j.Fields = []engine.FieldDifference{}
		}
		out.Differences = append(out.Differences, j)
	}
	return out
}
