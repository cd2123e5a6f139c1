package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/creditd/creditd/engine"
	"github.com/creditd/creditd/lua"
	"github.com/creditd/creditd/persist"
)

const reconcileUsage = `usage: creditd reconcile [--fix] [--limit N] [--drain-timeout D] [--confirm D] [--page N]
  Compares every customer's Redis state (version, blocks with their remaining
  credit, reserved, lifetime earned) with Postgres, and Postgres' blocks with
  the sum of its ledger, once the persister has drained (after a failover the
  promoted replica may lack the old master's last writes).
  --fix              reload each diverged customer from Postgres, fenced on the
                     Redis version compared (a write since is never overwritten)
  --limit N          list the first N differing customers (default 20)
  --drain-timeout D  wait up to D for the outbox to drain first (default 30s; 0: no wait)
  --confirm D        read a differing customer again after D before reporting it,
                     so a write the persister has not committed yet is no difference
                     (default 2s)
  --page N           accounts per page (default 500)
The last line, the only one starting "reconcile:", is "reconcile: N customers checked,
M differences", M counting the differences left (after --fix, those it could not mend);
exit status 1 when M > 0.`

// errDifferencesLeft makes the exit status 1 when a pass leaves differences.
var errDifferencesLeft = errors.New("reconcile: differences left")

// backlogReader is what the drain wait needs of the outbox.
type backlogReader interface {
	Partitions() int
	Backlog(ctx context.Context, p int) (count int64, oldestMS int64, err error)
}

// reconcile runs one reconcile pass on REDIS_URL and DATABASE_URL; bad
// arguments are refused before anything connects.
func reconcile(args []string) error {
	if len(args) > 0 && (args[0] == "help" || args[0] == "-h" || args[0] == "--help") {
		fmt.Println(reconcileUsage)
		return nil
	}
	opts, err := parseReconcileArgs(args, os.Stderr)
	if err != nil {
		return err
	}
	return withStores(func(ctx context.Context, ledger *persist.Store, store *lua.Store) error {
		return runReconcile(ctx, ledger, store, store, opts, os.Stdout, os.Stderr)
	})
}

// reconcileArgs are the parsed flags of `creditd reconcile`.
type reconcileArgs struct {
	pass  engine.ReconcileOptions
	drain time.Duration
}

// parseReconcileArgs reads the flags; usage goes to note.
func parseReconcileArgs(args []string, note io.Writer) (reconcileArgs, error) {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(note)
	fix := fs.Bool("fix", false, "reload diverged customers from Postgres")
	limit := fs.Int("limit", engine.DefaultReconcileReported, "differing customers listed")
	drain := fs.Duration("drain-timeout", 30*time.Second, "wait for the outbox to drain")
	confirm := fs.Duration("confirm", 2*time.Second, "read a differing customer again after this")
	pageSize := fs.Int("page", engine.DefaultReconcilePage, "accounts per page")
	fs.Usage = func() { fmt.Fprintln(note, reconcileUsage) }
	if err := fs.Parse(args); err != nil {
		return reconcileArgs{}, err
	}
	if fs.NArg() > 0 {
		return reconcileArgs{}, fmt.Errorf("reconcile: unexpected argument %q", fs.Arg(0))
	}
	if *limit <= 0 || *pageSize <= 0 || *pageSize > 10_000 || *drain < 0 || *confirm < 0 {
		return reconcileArgs{}, errors.New("reconcile: --limit and --page (at most 10000) must be positive, durations not negative")
	}
	return reconcileArgs{drain: *drain, pass: engine.ReconcileOptions{Fix: *fix, Reported: *limit, PageSize: *pageSize,
		Confirm: *confirm}}, nil
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
	rep, err := engine.Reconcile(ctx, src, store, opts.pass)
	if err != nil {
		return err
	}
	for _, d := range rep.First {
		fmt.Fprintln(out, d)
	}
	if rep.Found > int64(len(rep.First)) {
		fmt.Fprintf(out, "... and %d more\n", rep.Found-int64(len(rep.First)))
	}
	kinds := ""
	for _, k := range []engine.Divergence{engine.DivergenceVersion, engine.DivergenceBlocks, engine.DivergenceReserved,
		engine.DivergenceEarned, engine.DivergenceAccountID, engine.DivergenceLedger} {
		if n := rep.ByKind[k]; n > 0 {
			kinds += fmt.Sprintf(" %s=%d", k, n)
		}
	}
	if kinds != "" {
		kinds = " (" + kinds[1:] + ")"
	}
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
