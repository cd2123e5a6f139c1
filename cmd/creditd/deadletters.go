package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/creditd/creditd/persist"
)

const deadLettersUsage = `usage: creditd deadletters COMMAND
  list [--json] [--limit N]       unresolved dead letters, in the order retry replays them
  retry ID... | --all [--json] [--repair]
                                  replay into Postgres, each exactly once; an account's
                                  earlier dead letters replay first, in version order.
                                  --repair first replaces text Postgres cannot store (NUL,
                                  invalid UTF-8 -> U+FFFD) and numbers beyond its range
                                  (kept as text); money and versions are written unchanged
  discard ID --note TEXT          resolve WITHOUT writing (an entry that can never be
                                  replayed, dealt with by hand); the note is kept

A dead letter is an acknowledged mutation missing from Postgres: /readyz fails
until every one is resolved. Exit status is 1 when a retry leaves any unresolved.`

// deadLetterStore is what the deadletters command needs of persist.Store.
type deadLetterStore interface {
	ListDeadLetters(ctx context.Context, limit int) ([]persist.DeadLetterRecord, int64, error)
	RetryDeadLetters(ctx context.Context, ids []int64, opts persist.RetryOptions) ([]persist.RetryOutcome, error)
	RetryAllDeadLetters(ctx context.Context, opts persist.RetryOptions) ([]persist.RetryOutcome, error)
	DiscardDeadLetter(ctx context.Context, id int64, note string) error
}

// deadlettersCmd is `creditd deadletters list|retry|discard`, straight on
// the database; a running creditd notices within a second. The
// subcommands parse their own flags (runDeadLetters, tested as is), and
// refuse bad arguments before anything connects.
func deadlettersCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "deadletters",
		Short: "List, replay or discard the mutations Postgres refused (DATABASE_URL)",
		Long:  deadLettersUsage,
	}
	for _, sub := range []struct{ use, short string }{
		{"list [--json] [--limit N]", "Unresolved dead letters, in the order retry replays them"},
		{"retry ID... | --all [--json] [--repair]", "Replay into Postgres, each exactly once"},
		{"discard ID --note TEXT", "Resolve WITHOUT writing; the note is kept"},
	} {
		c.AddCommand(&cobra.Command{
			Use: sub.use, Short: sub.short, Long: deadLettersUsage,
			DisableFlagParsing: true,
			RunE: func(cmd *cobra.Command, args []string) error {
				for _, a := range args {
					if a == "-h" || a == "--help" || a == "-help" {
						return cmd.Help()
					}
				}
				args = append([]string{cmd.Name()}, args...)
				if _, err := parseDeadLetters(args); err != nil {
					return err
				}
				return withDatabase(func(ctx context.Context, _ config, store *persist.Store) error {
					return runDeadLetters(ctx, store, args, cmd.OutOrStdout())
				})
			},
		})
	}
	return c
}

// errUnresolved is returned when a retry leaves dead letters unresolved.
var errUnresolved = errors.New("dead letters left unresolved")

// deadLettersRequest is a parsed deadletters command.
type deadLettersRequest struct {
	cmd    string
	ids    []int64
	asJSON bool
	limit  int
	all    bool
	note   string
	repair bool
}

// parseDeadLetters reads args (the subcommand first) and refuses what no
// subcommand accepts.
func parseDeadLetters(args []string) (deadLettersRequest, error) {
	fs := flag.NewFlagSet("deadletters "+args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	asJSON := fs.Bool("json", false, "")
	limit := fs.Int("limit", 100, "")
	all := fs.Bool("all", false, "")
	note := fs.String("note", "", "")
	repair := fs.Bool("repair", false, "")
	if err := fs.Parse(reorderFlags(args[1:])); err != nil {
		return deadLettersRequest{}, fmt.Errorf("%v\n%s", err, deadLettersUsage)
	}
	ids := make([]int64, 0, fs.NArg())
	for _, a := range fs.Args() {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return deadLettersRequest{}, fmt.Errorf("dead letter id %q is not a positive integer\n%s", a, deadLettersUsage)
		}
		ids = append(ids, id)
	}
	r := deadLettersRequest{cmd: args[0], ids: ids, asJSON: *asJSON, limit: *limit, all: *all, note: *note, repair: *repair}
	switch r.cmd {
	case "list":
		if len(ids) > 0 || *all || *note != "" || *repair {
			return r, fmt.Errorf("list takes only --json and --limit\n%s", deadLettersUsage)
		}
		if *limit <= 0 || *limit > persist.MaxDeadLetterList {
			return r, fmt.Errorf("--limit must be 1..%d", persist.MaxDeadLetterList)
		}
	case "retry":
		if *all == (len(ids) > 0) {
			return r, fmt.Errorf("retry takes dead letter ids or --all\n%s", deadLettersUsage)
		}
	case "discard":
		if len(ids) != 1 || strings.TrimSpace(*note) == "" || *all || *repair {
			return r, fmt.Errorf("discard takes one id and a --note\n%s", deadLettersUsage)
		}
	default:
		return r, fmt.Errorf("unknown deadletters command %q\n%s", args[0], deadLettersUsage)
	}
	return r, nil
}

// runDeadLetters is the deadletters command on store, writing to w.
func runDeadLetters(ctx context.Context, store deadLetterStore, args []string, w io.Writer) error {
	r, err := parseDeadLetters(args)
	if err != nil {
		return err
	}
	switch r.cmd {
	case "list":
		recs, total, err := store.ListDeadLetters(ctx, r.limit)
		if err != nil {
			return err
		}
		if r.asJSON {
			return writeJSON(w, map[string]any{"dead_letters": recs, "total_unresolved": total})
		}
		printDeadLetters(w, recs, total)
		return nil
	case "retry":
		var out []persist.RetryOutcome
		var err error
		if r.all {
			out, err = store.RetryAllDeadLetters(ctx, persist.RetryOptions{Repair: r.repair})
		} else {
			out, err = store.RetryDeadLetters(ctx, r.ids, persist.RetryOptions{Repair: r.repair})
		}
		if r.asJSON {
			if jerr := writeJSON(w, map[string]any{"outcomes": out}); jerr != nil {
				return jerr
			}
		} else {
			printOutcomes(w, out)
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
	default: // discard
		if err := store.DiscardDeadLetter(ctx, r.ids[0], r.note); err != nil {
			return err
		}
		fmt.Fprintf(w, "dead letter %d discarded (resolved without writing it)\n", r.ids[0])
		return nil
	}
}

// reorderFlags puts flags before positional ids, so `retry 3 --json` parses
// as `retry --json 3` (package flag stops at the first non-flag).
func reorderFlags(args []string) []string {
	var flags, rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--limit" || a == "-limit" || a == "--note" || a == "-note":
			flags = append(flags, a)
			if i+1 < len(args) {
				i++
				flags = append(flags, args[i])
			}
		case strings.HasPrefix(a, "-"):
			flags = append(flags, a)
		default:
			rest = append(rest, a)
		}
	}
	return append(flags, rest...)
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
