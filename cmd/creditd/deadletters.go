package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/creditd/creditd/persist"
)

const deadLettersLong = `A dead letter is an acknowledged mutation missing from Postgres: an alarm
(creditd_dead_letters_unresolved, the CreditdDeadLetters alert, a warning under
dead_letters in /readyz, a banner in the operator's console) until every one is
resolved; the nodes keep serving meanwhile. These commands work straight on
DATABASE_URL; a running creditd notices within a second.`

// deadLetterStore is what the deadletters command needs of persist.Store.
type deadLetterStore interface {
	ListDeadLetters(ctx context.Context, limit int) ([]persist.DeadLetterRecord, int64, error)
	ListRepairedForks(ctx context.Context, limit int) ([]persist.DeadLetterRecord, int64, error)
	RetryDeadLetters(ctx context.Context, ids []int64, opts persist.RetryOptions) ([]persist.RetryOutcome, error)
	RetryAllDeadLetters(ctx context.Context, opts persist.RetryOptions) ([]persist.RetryOutcome, error)
	DiscardDeadLetter(ctx context.Context, id int64, note string) error
}

// errUnresolved is returned when a retry leaves dead letters unresolved.
var errUnresolved = errors.New("dead letters left unresolved")

// deadLettersOn opens the store a deadletters command works on and runs fn
// on it; bad arguments are refused before it is called.
type deadLettersOn func(fn func(ctx context.Context, store deadLetterStore) error) error

// onDatabase is deadLettersOn for the command line: DATABASE_URL, schema
// checked, never migrated.
func onDatabase(fn func(ctx context.Context, store deadLetterStore) error) error {
	return withDatabase(func(ctx context.Context, _ config, store *persist.Store) error { return fn(ctx, store) })
}

// deadlettersCmd is `creditd deadletters list|retry|discard` on the store
// on opens.
func deadlettersCmd(on deadLettersOn) *cobra.Command {
	c := &cobra.Command{
		Use:   "deadletters",
		Short: "List, replay or discard the mutations Postgres refused (DATABASE_URL)",
		Long:  deadLettersLong,
	}

	var limit int
	var listJSON, repaired bool
	list := &cobra.Command{
		Use:   "list",
		Short: "Unresolved dead letters, in the order retry replays them (--repaired: the forked ops creditd applied again)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit <= 0 || limit > persist.MaxDeadLetterList {
				return fmt.Errorf("--limit must be 1..%d", persist.MaxDeadLetterList)
			}
			return on(func(ctx context.Context, store deadLetterStore) error {
				if repaired {
					recs, total, err := store.ListRepairedForks(ctx, limit)
					if err != nil {
						return err
					}
					if listJSON {
						return writeJSON(cmd.OutOrStdout(), map[string]any{"dead_letters": recs, "total_repaired": total})
					}
					printRepairedForks(cmd.OutOrStdout(), recs, total)
					return nil
				}
				recs, total, err := store.ListDeadLetters(ctx, limit)
				if err != nil {
					return err
				}
				if listJSON {
					return writeJSON(cmd.OutOrStdout(), map[string]any{"dead_letters": recs, "total_unresolved": total})
				}
				printDeadLetters(cmd.OutOrStdout(), recs, total)
				return nil
			})
		},
	}
	list.Flags().IntVar(&limit, "limit", 100, "dead letters to list")
	list.Flags().BoolVar(&listJSON, "json", false, "print JSON")
	list.Flags().BoolVar(&repaired, "repaired", false, "list the forked ops repaired from the ledger instead, latest first (resolved: no action needed)")

	var all, repair, retryJSON bool
	retry := &cobra.Command{
		Use:   "retry ID... | --all",
		Short: "Replay into Postgres, each exactly once",
		Long: `Replays dead letters into Postgres, each exactly once; an account's earlier dead
letters replay first, in version order. --repair first replaces text Postgres
cannot store (NUL, invalid UTF-8 -> U+FFFD) and numbers beyond its range (kept
as text); money and versions are written unchanged. Exit status 1 when any is
left unresolved.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := deadLetterIDs(args)
			if err != nil {
				return err
			}
			if all == (len(ids) > 0) {
				return errors.New("retry takes dead letter ids or --all")
			}
			return on(func(ctx context.Context, store deadLetterStore) error {
				var out []persist.RetryOutcome
				if all {
					out, err = store.RetryAllDeadLetters(ctx, persist.RetryOptions{Repair: repair})
				} else {
					out, err = store.RetryDeadLetters(ctx, ids, persist.RetryOptions{Repair: repair})
				}
				if retryJSON {
					if jerr := writeJSON(cmd.OutOrStdout(), map[string]any{"outcomes": out}); jerr != nil {
						return jerr
					}
				} else {
					printOutcomes(cmd.OutOrStdout(), out)
				}
				if err != nil {
					return err
				}
				for _, o := range out {
					if o.Status != persist.RetryResolved && o.Status != persist.RetryAlreadyResolved {
						return errUnresolved
					}
				}
				return nil
			})
		},
	}
	retry.Flags().BoolVar(&all, "all", false, "replay every unresolved dead letter")
	retry.Flags().BoolVar(&repair, "repair", false, "replace what Postgres cannot store first (text, out-of-range numbers)")
	retry.Flags().BoolVar(&retryJSON, "json", false, "print JSON")

	var note string
	discard := &cobra.Command{
		Use:   "discard ID --note TEXT",
		Short: "Resolve WITHOUT writing (an entry that can never be replayed, dealt with by hand); the note is kept",
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := deadLetterIDs(args)
			if err != nil {
				return err
			}
			if len(ids) != 1 || strings.TrimSpace(note) == "" {
				return errors.New("discard takes one id and a --note")
			}
			return on(func(ctx context.Context, store deadLetterStore) error {
				if err := store.DiscardDeadLetter(ctx, ids[0], note); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "dead letter %d discarded (resolved without writing it)\n", ids[0])
				return nil
			})
		},
	}
	discard.Flags().StringVar(&note, "note", "", "why it is discarded (kept with it)")
	c.AddCommand(list, retry, discard)
	return c
}

// deadLetterIDs reads positive dead letter ids.
func deadLetterIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return nil, fmt.Errorf("dead letter id %q is not a positive integer", a)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// runDeadLetters runs `creditd deadletters ARGS...` on store, writing to w.
func runDeadLetters(ctx context.Context, store deadLetterStore, args []string, w io.Writer) error {
	c := deadlettersCmd(func(fn func(ctx context.Context, store deadLetterStore) error) error { return fn(ctx, store) })
	c.SetArgs(args)
	c.SetOut(w)
	c.SetErr(io.Discard)
	c.SilenceUsage, c.SilenceErrors = true, true
	return c.ExecuteContext(ctx)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printDeadLetters writes recs as a table: what an operator needs to find
// the customer and decide.
func printDeadLetters(w io.Writer, recs []persist.DeadLetterRecord, total int64) {
	if total == 0 {
		fmt.Fprintln(w, "no unresolved dead letters")
		return
	}
	// The count first: it is what the alarm (creditd_dead_letters_unresolved)
	// says, and what a runbook compares before and after a retry.
	plural := "s"
	if total == 1 {
		plural = ""
	}
	fmt.Fprintf(w, "%d unresolved dead letter%s (acknowledged mutations missing from Postgres)\n", total, plural)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tOP\tTENANT\tCUSTOMER\tKIND\tVERSION\tSQLSTATE\tRETRIES\tWHEN\tERROR")
	for _, r := range recs {
		errText := r.Error
		if r.RetryError != nil {
			errText = "retry: " + *r.RetryError
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, orDash(r.OpID), orDash(r.TenantID),
			orDash(r.CustomerID), orDash(r.Kind), orDash(r.AccountVersion), orDash(r.SQLState), r.Retries,
			r.CreatedAt.UTC().Format(time.RFC3339), oneLine(errText))
	}
	_ = tw.Flush()
	if int64(len(recs)) < total {
		fmt.Fprintf(w, "%d more not shown (--limit)\n", total-int64(len(recs)))
	}
}

// printRepairedForks writes the dead letters a fork repair resolved: what
// each forked op became (its resolution), so an operator can answer a
// customer's question about it without acting.
func printRepairedForks(w io.Writer, recs []persist.DeadLetterRecord, total int64) {
	if total == 0 {
		fmt.Fprintln(w, "no repaired forks")
		return
	}
	fmt.Fprintf(w, "%d forked ops repaired from the ledger (resolved; nothing to do)\n", total)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tOP\tTENANT\tCUSTOMER\tKIND\tVERSION\tREPAIRED\tRESOLUTION")
	for _, r := range recs {
		when := "-"
		if r.ResolvedAt != nil {
			when = r.ResolvedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, orDash(r.OpID), orDash(r.TenantID),
			orDash(r.CustomerID), orDash(r.Kind), orDash(r.AccountVersion), when, oneLine(orDash(r.Resolution)))
	}
	_ = tw.Flush()
	if int64(len(recs)) < total {
		fmt.Fprintf(w, "%d more not shown (--limit)\n", total-int64(len(recs)))
	}
}

func printOutcomes(w io.Writer, out []persist.RetryOutcome) {
	if len(out) == 0 {
		fmt.Fprintln(w, "nothing to retry")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tOP\tCUSTOMER\tSTATUS\tERROR")
	for _, o := range out {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", o.ID, orDash(o.OpID), orDash(o.CustomerID), o.Status, oneLine(o.Error))
	}
	_ = tw.Flush()
}

// orDash prints a nullable column, "-" for NULL.
func orDash[T any](v *T) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprint(*v)
}

// oneLine keeps a table row on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
