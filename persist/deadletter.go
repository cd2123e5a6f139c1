package persist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/creditd/creditd/engine"
)

// Dead-letter limits (invariant 11).
const (
	// MaxRetryPasses bounds how often RetryAllDeadLetters looks again for
	// dead letters the running persister added behind the ones it replayed.
	MaxRetryPasses = 10
	// MaxDeadLetterList is the most dead letters one ListDeadLetters returns.
	MaxDeadLetterList = 10000
)

// Letter is one outbox entry the persister sets aside.
type Letter struct {
	// Partition and EntryID name the outbox entry.
	Partition int
	EntryID   string
	// Raw is the entry's bytes: the Mutation's JSON, or what could not be decoded.
	Raw []byte
	// Reason is why it was set aside, for humans.
	Reason string
	// Mutation is the decoded Mutation; nil for an undecodable entry.
	Mutation *engine.Mutation
	// SQLState is Postgres' refusal code; empty when Postgres was not asked.
	SQLState string
	// HeldBy is the unresolved dead letter of the same account this one
	// waits behind; 0 when it was refused itself.
	HeldBy int64
}

// DeadLetters keeps outbox entries that cannot be persisted now. A
// Persister whose writer also implements it sets such entries aside (with
// an alarm) instead of retrying them for ever, and holds each account's
// later Mutations behind them; *Store implements it.
type DeadLetters interface {
	// DeadLetter stores l unresolved and returns its id; a Mutation already
	// set aside and unresolved keeps its row and id.
	DeadLetter(ctx context.Context, l Letter) (int64, error)
	// HeldBehind maps each of customers that has unresolved dead letters to
	// the first of them in replay order.
	HeldBehind(ctx context.Context, customers []uuid.UUID) (map[uuid.UUID]int64, error)
	// UnresolvedDeadLetters counts the dead letters not yet resolved.
	UnresolvedDeadLetters(ctx context.Context) (int64, error)
}

var _ DeadLetters = (*Store)(nil)

// humanText makes s storable as TEXT (no NUL, valid UTF-8): reasons and
// notes are for humans only.
func humanText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "?"), "\x00", "?")
}

// DeadLetter stores one outbox entry in outbox_dead_letters, unresolved,
// once per unresolved Mutation.
func (s *Store) DeadLetter(ctx context.Context, l Letter) (int64, error) {
	raw := l.Raw
	if raw == nil {
		raw = []byte{}
	}
	var opID, tenant, customer *uuid.UUID
	var kind, sqlstate *string
	var version, heldBy *int64
	if m := l.Mutation; m != nil {
		opID, tenant, customer = &m.OpID, &m.TenantID, &m.CustomerID
		k := string(m.Kind)
		kind, version = &k, &m.Account.Version
	}
	if l.SQLState != "" {
		sqlstate = &l.SQLState
	}
	if l.HeldBy != 0 {
		heldBy = &l.HeldBy
	}
	// An entry delivered again (a crash before its ack, a retried batch)
	// finds its Mutation already set aside and keeps that row; so does one
	// whose op a fork repair already applied again (its letter resolved as
	// repaired), which a second letter would only count twice.
	var id int64
	err := s.pool.QueryRow(ctx, `WITH existing AS (
			SELECT id FROM outbox_dead_letters
			WHERE customer_id = $7 AND op_id = $5
			  AND (resolved_at IS NULL OR starts_with(resolution, $12))
			ORDER BY resolved_at IS NULL DESC, id LIMIT 1
		), inserted AS (
			INSERT INTO outbox_dead_letters
				(partition, entry_id, raw, error, op_id, tenant_id, customer_id, kind, account_version, sqlstate, held_by)
			SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11
			WHERE NOT EXISTS (SELECT 1 FROM existing)
			RETURNING id
		)
		SELECT id FROM inserted UNION ALL SELECT id FROM existing`,
		l.Partition, l.EntryID, raw, humanText(l.Reason), opID, tenant, customer, kind, version, sqlstate, heldBy,
		ForkResolutionPrefix).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("persist: dead letter %d/%s: %w", l.Partition, l.EntryID, err)
	}
	return id, nil
}

// HeldBehind maps each of customers with unresolved dead letters to the
// first of them in replay order (account version, then id).
func (s *Store) HeldBehind(ctx context.Context, customers []uuid.UUID) (map[uuid.UUID]int64, error) {
	// A fenced fork's letters (its refused op and those held behind it,
	// all of the forked history) hold nothing: the account was reloaded
	// from Postgres and the ops on it since persist as usual (forks.go).
	rows, err := s.pool.Query(ctx, `SELECT DISTINCT ON (d.customer_id) d.customer_id, d.id
		FROM outbox_dead_letters d
		LEFT JOIN credit_accounts a ON a.customer_id = d.customer_id AND a.tenant_id = d.tenant_id
		WHERE d.resolved_at IS NULL AND d.customer_id = ANY($1)
		  AND NOT COALESCE(d.account_version <= a.fenced_version AND (d.sqlstate = $2 OR EXISTS (
			SELECT 1 FROM outbox_dead_letters h WHERE h.id = d.held_by AND h.sqlstate = $2)), false)
		ORDER BY d.customer_id, d.account_version, d.id`, customers, forkRefused)
	if err != nil {
		return nil, fmt.Errorf("persist: held accounts: %w", err)
	}
	held := map[uuid.UUID]int64{}
	var c uuid.UUID
	var id int64
	_, err = pgx.ForEachRow(rows, []any{&c, &id}, func() error {
		held[c] = id
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("persist: held accounts: %w", err)
	}
	return held, nil
}

// UnresolvedDeadLetters counts the dead letters not yet resolved: the
// readiness alarm and the creditd_dead_letters_unresolved gauge.
func (s *Store) UnresolvedDeadLetters(ctx context.Context) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_dead_letters WHERE resolved_at IS NULL`).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("persist: count dead letters: %w", err)
	}
	return n, nil
}

// DeadLetterRecord is one row of outbox_dead_letters as operators see it.
type DeadLetterRecord struct {
	ID             int64      `json:"id"`
	Partition      int        `json:"partition"`
	EntryID        string     `json:"entry_id"`
	OpID           *uuid.UUID `json:"op_id"`
	TenantID       *uuid.UUID `json:"tenant_id"`
	CustomerID     *uuid.UUID `json:"customer_id"`
	Kind           *string    `json:"kind"`
	AccountVersion *int64     `json:"account_version"`
	SQLState       *string    `json:"sqlstate"`
	HeldBy         *int64     `json:"held_by"`
	Error          string     `json:"error"`
	Retries        int        `json:"retries"`
	RetryError     *string    `json:"retry_error"`
	CreatedAt      time.Time  `json:"created_at"`
	ResolvedAt     *time.Time `json:"resolved_at"`
	Resolution     *string    `json:"resolution"`
}

const deadLetterColumns = `id, partition, entry_id, op_id, tenant_id, customer_id, kind, account_version,
	sqlstate, held_by, error, retries, retry_error, created_at, resolved_at, resolution`

func scanDeadLetter(row pgx.Row) (DeadLetterRecord, error) {
	var r DeadLetterRecord
	err := row.Scan(&r.ID, &r.Partition, &r.EntryID, &r.OpID, &r.TenantID, &r.CustomerID, &r.Kind,
		&r.AccountVersion, &r.SQLState, &r.HeldBy, &r.Error, &r.Retries, &r.RetryError, &r.CreatedAt,
		&r.ResolvedAt, &r.Resolution)
	return r, err
}

// ListDeadLetters returns up to limit unresolved dead letters (at most
// MaxDeadLetterList) in the order a retry replays them, and how many there
// are in all.
func (s *Store) ListDeadLetters(ctx context.Context, limit int) ([]DeadLetterRecord, int64, error) {
	if limit <= 0 || limit > MaxDeadLetterList {
		limit = MaxDeadLetterList
	}
	total, err := s.UnresolvedDeadLetters(ctx)
	if err != nil {
		return nil, 0, err
	}
	rows, err := s.pool.Query(ctx, `SELECT `+deadLetterColumns+` FROM outbox_dead_letters
		WHERE resolved_at IS NULL ORDER BY customer_id NULLS FIRST, account_version, id LIMIT $1`, limit)
	if err != nil {
		return nil, 0, fmt.Errorf("persist: list dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DeadLetterRecord, error) { return scanDeadLetter(r) })
	if err != nil {
		return nil, 0, fmt.Errorf("persist: list dead letters: %w", err)
	}
	return out, total, nil
}

// GetDeadLetter reads one dead letter, resolved or not; engine.ErrNotFound
// when there is none with id.
func (s *Store) GetDeadLetter(ctx context.Context, id int64) (DeadLetterRecord, error) {
	r, err := scanDeadLetter(s.pool.QueryRow(ctx, `SELECT `+deadLetterColumns+` FROM outbox_dead_letters WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetterRecord{}, engine.ErrNotFound
	}
	if err != nil {
		return DeadLetterRecord{}, fmt.Errorf("persist: dead letter %d: %w", id, err)
	}
	return r, nil
}

// RetryStatus is what one retry did with one dead letter.
type RetryStatus string

// Retry outcomes.
const (
	// RetryResolved: the Mutation was written and the dead letter resolved
	// in the same transaction.
	RetryResolved RetryStatus = "resolved"
	// RetryAlreadyResolved: someone resolved it first; nothing was written.
	RetryAlreadyResolved RetryStatus = "already_resolved"
	// RetryFailed: Postgres refused it again (or it cannot be decoded); it
	// stays unresolved and Error says why.
	RetryFailed RetryStatus = "failed"
	// RetryHeld: an earlier dead letter of the same account failed, so this
	// one was not tried (replaying it would write the account out of order).
	RetryHeld RetryStatus = "held"
	// RetryNotFound: no dead letter has this id.
	RetryNotFound RetryStatus = "not_found"
)

// RetryOutcome is one dead letter's result of a retry.
type RetryOutcome struct {
	ID         int64       `json:"id"`
	OpID       *uuid.UUID  `json:"op_id"`
	CustomerID *uuid.UUID  `json:"customer_id"`
	Status     RetryStatus `json:"status"`
	Error      string      `json:"error,omitempty"`
}

// RetryOptions tune a retry.
type RetryOptions struct {
	// Repair replaces, before the write, what Postgres can never store in
	// the Mutation's text (NUL becomes U+FFFD, invalid UTF-8 too) and
	// numbers beyond jsonb's range (kept as their text): the money (deltas,
	// balances, versions) is written as Redis has it; Postgres keeps the
	// repaired text. It cannot help a refusal of anything else.
	Repair bool
}

// pendingLetter is a dead letter in a replay plan.
type pendingLetter struct {
	id       int64
	customer *uuid.UUID
	version  *int64
}

// RetryDeadLetters replays the dead letters ids into Postgres, each exactly
// once. An account's unresolved dead letters replay in order (account
// version, then id), so asking for one also replays the ones of its account
// before it; after a failure the account's later ones are held, untried.
// Each replay writes the Mutation (the persister's idempotent, version
// fenced Apply) and marks it resolved in one transaction.
func (s *Store) RetryDeadLetters(ctx context.Context, ids []int64, opts RetryOptions) ([]RetryOutcome, error) {
	var out []RetryOutcome
	var chains [][]pendingLetter
	seen := map[uuid.UUID]bool{}
	asked := map[int64]bool{}
	for _, id := range ids {
		if asked[id] {
			continue
		}
		asked[id] = true
		r, err := s.GetDeadLetter(ctx, id)
		switch {
		case errors.Is(err, engine.ErrNotFound):
			out = append(out, RetryOutcome{ID: id, Status: RetryNotFound})
			continue
		case err != nil:
			return out, err
		case r.ResolvedAt != nil:
			out = append(out, RetryOutcome{ID: id, OpID: r.OpID, CustomerID: r.CustomerID, Status: RetryAlreadyResolved})
			continue
		case r.CustomerID == nil || r.AccountVersion == nil:
			chains = append(chains, []pendingLetter{{id: r.ID}})
			continue
		}
		if seen[*r.CustomerID] {
			continue
		}
		seen[*r.CustomerID] = true
		chain, err := s.chainUpTo(ctx, *r.CustomerID, ids)
		if err != nil {
			return out, err
		}
		chains = append(chains, chain)
	}
	for _, chain := range chains {
		out = append(out, s.replayChain(ctx, chain, opts)...)
	}
	return out, ctx.Err()
}

// chainUpTo is customer's unresolved dead letters in replay order, up to
// the last of them named in ids.
func (s *Store) chainUpTo(ctx context.Context, customer uuid.UUID, ids []int64) ([]pendingLetter, error) {
	chain, err := s.unresolved(ctx, `AND customer_id = $1`, customer)
	if err != nil {
		return nil, err
	}
	want := map[int64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	last := -1
	for i, l := range chain {
		if want[l.id] {
			last = i
		}
	}
	return chain[:last+1], nil
}

// unresolved lists unresolved dead letters matching the SQL condition
// cond, in replay order.
func (s *Store) unresolved(ctx context.Context, cond string, args ...any) ([]pendingLetter, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, customer_id, account_version FROM outbox_dead_letters
		WHERE resolved_at IS NULL `+cond+` ORDER BY customer_id NULLS FIRST, account_version, id`, args...)
	if err != nil {
		return nil, fmt.Errorf("persist: unresolved dead letters: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pendingLetter, error) {
		var l pendingLetter
		err := r.Scan(&l.id, &l.customer, &l.version)
		return l, err
	})
	if err != nil {
		return nil, fmt.Errorf("persist: unresolved dead letters: %w", err)
	}
	return out, nil
}

// RetryAllDeadLetters replays every unresolved dead letter as
// RetryDeadLetters does. A running persister may set more aside behind
// the ones being replayed (it holds an account until its dead letters are
// resolved), so it looks again, up to MaxRetryPasses times, until a pass
// finds none it has not tried.
func (s *Store) RetryAllDeadLetters(ctx context.Context, opts RetryOptions) ([]RetryOutcome, error) {
	var out []RetryOutcome
	tried := map[int64]bool{}
	stuck := map[uuid.UUID]int64{} // accounts whose replay failed, by the failed dead letter
	for range MaxRetryPasses {
		all, err := s.unresolved(ctx, "")
		if err != nil {
			return out, err
		}
		var chains [][]pendingLetter
		for _, l := range all {
			if tried[l.id] {
				continue
			}
			tried[l.id] = true
			switch {
			case l.customer == nil || l.version == nil:
				chains = append(chains, []pendingLetter{l})
			case stuck[*l.customer] != 0:
				out = append(out, RetryOutcome{ID: l.id, CustomerID: l.customer, Status: RetryHeld,
					Error: fmt.Sprintf("held behind dead letter %d, which failed", stuck[*l.customer])})
			case len(chains) > 0 && sameCustomer(chains[len(chains)-1][0], l):
				chains[len(chains)-1] = append(chains[len(chains)-1], l)
			default:
				chains = append(chains, []pendingLetter{l})
			}
		}
		if len(chains) == 0 {
			break
		}
		for _, chain := range chains {
			res := s.replayChain(ctx, chain, opts)
			for _, r := range res {
				if r.Status == RetryFailed && chain[0].customer != nil {
					stuck[*chain[0].customer] = r.ID
				}
			}
			out = append(out, res...)
		}
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
	}
	return out, nil
}

func sameCustomer(a, b pendingLetter) bool {
	return a.customer != nil && b.customer != nil && *a.customer == *b.customer
}

// replayChain replays one account's dead letters in order, stopping at the
// first that fails: the rest are held.
func (s *Store) replayChain(ctx context.Context, chain []pendingLetter, opts RetryOptions) []RetryOutcome {
	out := make([]RetryOutcome, 0, len(chain))
	for i, l := range chain {
		r := s.replay(ctx, l.id, opts)
		out = append(out, r)
		if r.Status != RetryFailed {
			continue
		}
		for _, rest := range chain[i+1:] {
			out = append(out, RetryOutcome{ID: rest.id, CustomerID: rest.customer, Status: RetryHeld,
				Error: fmt.Sprintf("held behind dead letter %d, which failed", l.id)})
		}
		break
	}
	return out
}

// replay writes dead letter id's Mutation and resolves it in one
// transaction, under the row's lock: two retries at once write it once, and
// a retry of a resolved one writes nothing. When Postgres refuses it again
// the refusal is recorded on the row, which stays unresolved.
func (s *Store) replay(ctx context.Context, id int64, opts RetryOptions) RetryOutcome {
	out := RetryOutcome{ID: id}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var raw []byte
		var resolved *time.Time
		err := tx.QueryRow(ctx, `SELECT raw, op_id, customer_id, resolved_at FROM outbox_dead_letters
			WHERE id = $1 FOR UPDATE`, id).Scan(&raw, &out.OpID, &out.CustomerID, &resolved)
		if errors.Is(err, pgx.ErrNoRows) {
			out.Status = RetryNotFound
			return nil
		}
		if err != nil {
			return err
		}
		if resolved != nil {
			out.Status = RetryAlreadyResolved
			return nil
		}
		resolution := "replayed"
		if opts.Repair {
			fixed, changed, err := repairText(raw)
			if err != nil {
				return s.recordRetryFailure(ctx, tx, &out, fmt.Errorf("undecodable outbox entry: it can only be discarded: %v", err))
			}
			// fixed means the same as raw but for what was replaced.
			raw = fixed
			if changed {
				resolution = "replayed, repaired: text and numbers Postgres refuses were replaced"
			}
		}
		var m engine.Mutation
		if err := engine.DecodeMutation(raw, &m); err != nil || m.OpID == uuid.Nil {
			if err == nil {
				err = errors.New("no op id")
			}
			return s.recordRetryFailure(ctx, tx, &out, fmt.Errorf("undecodable outbox entry: it can only be discarded: %v", err))
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		alerts, err := s.beforeApply(ctx, sp, []engine.Mutation{m})
		if err != nil {
			return err
		}
		if err := applyIn(ctx, sp, []engine.Mutation{m}, alerts, s.shape()); err != nil {
			if rerr := sp.Rollback(ctx); rerr != nil {
				return rerr
			}
			if !refusedData(err) {
				return err
			}
			return s.recordRetryFailure(ctx, tx, &out, err)
		}
		if err := sp.Commit(ctx); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE outbox_dead_letters
			SET resolved_at = now(), resolution = $2, retries = retries + 1, retry_error = NULL
			WHERE id = $1`, id, resolution)
		out.Status = RetryResolved
		return err
	})
	if err != nil {
		// Not the data (connection, timeout): nothing changed, try again later.
		out.Status, out.Error = RetryFailed, err.Error()
	}
	return out
}

// recordRetryFailure notes on the locked row that a retry failed and why.
func (s *Store) recordRetryFailure(ctx context.Context, tx pgx.Tx, out *RetryOutcome, cause error) error {
	out.Status, out.Error = RetryFailed, cause.Error()
	_, err := tx.Exec(ctx, `UPDATE outbox_dead_letters SET retries = retries + 1, retry_error = $2,
		sqlstate = COALESCE($3, sqlstate) WHERE id = $1`, out.ID, humanText(cause.Error()), nullable(sqlState(cause)))
	return err
}

// DiscardDeadLetter resolves dead letter id without writing it, with the
// operator's note: for an entry that can never be replayed (undecodable)
// and that an operator has dealt with by hand. engine.ErrNotFound when
// there is none; discarding a resolved one changes nothing.
func (s *Store) DiscardDeadLetter(ctx context.Context, id int64, note string) error {
	tag, err := s.pool.Exec(ctx, `UPDATE outbox_dead_letters
		SET resolved_at = now(), resolution = 'discarded: ' || $2
		WHERE id = $1 AND resolved_at IS NULL`, id, humanText(note))
	if err != nil {
		return fmt.Errorf("persist: discard dead letter %d: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		if _, err := s.GetDeadLetter(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Postgres' numeric (and so jsonb's number) bounds: digits before and
// after the decimal point.
const (
	numericMaxBefore = 131072
	numericMaxAfter  = 16383
)

// repairText re-encodes a Mutation's JSON with every string (keys too) free
// of NUL and valid UTF-8, and every number Postgres' numeric cannot hold
// turned into its text, so a Mutation refused for those alone can be
// written; changed says whether anything was replaced. Numbers that fit
// keep their exact text.
func repairText(raw []byte) (fixed []byte, changed bool, err error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false, err
	}
	// The decoder already turned invalid UTF-8 and lone surrogate escapes
	// into U+FFFD: look at the input to notice them (a valid surrogate pair
	// counts too; changed only labels the resolution).
	changed = !utf8.Valid(raw) || surrogateEscape.Match(raw)
	fixed, err = json.Marshal(repairValue(v, &changed))
	return fixed, changed, err
}

// surrogateEscape is a JSON \uD800-\uDFFF escape.
var surrogateEscape = regexp.MustCompile(`(?i)\\ud[89a-f][0-9a-f]{2}`)

func repairValue(v any, changed *bool) any {
	switch x := v.(type) {
	case string:
		return repairString(x, changed)
	case json.Number:
		if !fitsNumeric(string(x)) {
			*changed = true
			return string(x)
		}
		return x
	case []any:
		for i := range x {
			x[i] = repairValue(x[i], changed)
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[repairString(k, changed)] = repairValue(e, changed)
		}
		return out
	}
	return v
}

// repairString drops what TEXT refuses: NUL becomes U+FFFD (invalid UTF-8
// already did, in the decoder).
func repairString(s string, changed *bool) string {
	if !strings.Contains(s, "\x00") {
		return s
	}
	*changed = true
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

// fitsNumeric reports whether JSON number n is within Postgres' numeric
// range (jsonb refuses the rest with SQLSTATE 22003).
func fitsNumeric(n string) bool {
	mant, exp := strings.TrimPrefix(n, "-"), int64(0)
	if i := strings.IndexAny(mant, "eE"); i >= 0 {
		e, err := strconv.ParseInt(mant[i+1:], 10, 32)
		if err != nil {
			return false
		}
		mant, exp = mant[:i], e
	}
	whole, frac, _ := strings.Cut(mant, ".")
	whole = strings.TrimLeft(whole, "0")
	// point is where the decimal point falls in digits, the significant ones.
	digits, point := whole+frac, int64(len(whole))+exp
	if whole == "" {
		sig := strings.TrimLeft(frac, "0")
		digits, point = sig, point-int64(len(frac)-len(sig))
	}
	digits = strings.TrimRight(digits, "0")
	if digits == "" {
		return true
	}
	return point <= numericMaxBefore && int64(len(digits))-point <= numericMaxAfter
}

// malformedEntry is how an Outbox reports an entry it cannot decode
// (lua.MalformedEntryError), seen through errors.As without importing lua.
type malformedEntry interface {
	OutboxEntryID() string
	RawEntry() []byte
}

// refusedData reports whether Postgres refused err's statement for its
// data (SQLSTATE classes 22 data exception and 23 integrity violation):
// retrying the same rows can never succeed. Everything else (connection,
// timeout, serialization, a schema not migrated) may pass on a retry.
func refusedData(err error) bool {
	code := sqlState(err)
	return strings.HasPrefix(code, "22") || strings.HasPrefix(code, "23")
}

// sqlState is Postgres' error code in err, empty when err is not Postgres'.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return ""
	}
	return pgErr.Code
}
