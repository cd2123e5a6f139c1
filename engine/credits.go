package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// Grant and adjust limits (interface.md Credits and Limits).
const (
	MaxDurationSeconds = 315360000
	MaxPriority        = 255
	// AppliedRetention is how far back a load reads a customer's applied
	// operations (AccountState.Applied). Redis no longer gets op keys from
	// them (Postgres answers retries, AppliedOps); the persist reader still
	// derives its finalized-holds cutoff from it.
	AppliedRetention = 7 * 24 * time.Hour
	// readYourWritesWait bounds how long a ledger read waits for the
	// write-behind persister to reach the version Redis already shows.
	readYourWritesWait = 2 * time.Second
)

// Credits grants, adjusts and reads customers' credit. Money moves only
// through the BlockStore (atomic Lua); reads of history come from Postgres.
type Credits struct {
	customers *Customers
	blocks    BlockStore
	ledger    LedgerReader
	clock     Clock
	loads     singleLoad
	// hurry, when set, tells the local persister a read is waiting for its
	// next commit, so it ends its group-commit linger at once.
	hurry func()
	// reloads counts state loads from Postgres (after a NOSTATE reply or
	// for a sweep), for the creditd_nostate_reloads_total metric.
	reloads atomic.Uint64
}

// NewCredits returns the credit service.
func NewCredits(customers *Customers, blocks BlockStore, ledger LedgerReader, clock Clock) *Credits {
	return &Credits{customers: customers, blocks: blocks, ledger: ledger, clock: clock}
}

// Reloads is how many times this process loaded a customer's state from
// Postgres into the block store because the store had none (NOSTATE).
func (s *Credits) Reloads() uint64 { return s.reloads.Load() }

// SetPersistHurry wires the local persister's hurry signal (cmd wires it;
// without it a read-your-writes wait also ends, only later).
func (s *Credits) SetPersistHurry(hurry func()) { s.hurry = hurry }

// GrantInput is the body of the grant endpoints.
type GrantInput struct {
	Credits         *int64          `json:"credits"`
	Source          *string         `json:"source"`
	Reason          *string         `json:"reason"`
	ExpiresAt       *string         `json:"expires_at"`
	DurationSeconds *int64          `json:"duration_seconds"`
	StackAfter      *StackAfterBody `json:"stack_after"`
	Priority        *int64          `json:"priority"`
	Metadata        Metadata        `json:"metadata"`
}

// StackAfterBody is the stack_after object of a grant body.
type StackAfterBody struct {
	MetadataMatch Metadata `json:"metadata_match"`
	Fallback      *string  `json:"fallback"`
}

// validate checks the body and returns the block's expiry and stacking.
func (in *GrantInput) validate(now time.Time) (expires *time.Time, stack *StackAfter, err error) {
	if in.Credits == nil {
		return nil, nil, Invalid("credits", "credits is required")
	}
	if *in.Credits < 1 {
		return nil, nil, Invalid("credits", "credits must be >= 1")
	}
	if err := validateSourceReason(in.Source, in.Reason); err != nil {
		return nil, nil, err
	}
	if in.Priority != nil && (*in.Priority < 0 || *in.Priority > MaxPriority) {
		return nil, nil, Invalid("priority", "priority must be between 0 and 255")
	}
	if in.ExpiresAt != nil && in.DurationSeconds != nil {
		return nil, nil, Invalid("expires_at", "give expires_at or duration_seconds, not both")
	}
	if in.DurationSeconds != nil && (*in.DurationSeconds < 1 || *in.DurationSeconds > MaxDurationSeconds) {
		return nil, nil, Invalid("duration_seconds", "duration_seconds must be between 1 and 315360000")
	}
	if in.Metadata, err = in.Metadata.Canonical("metadata"); err != nil {
		return nil, nil, err
	}
	if in.ExpiresAt != nil {
		t, perr := ParseInstant("expires_at", *in.ExpiresAt, KindValidation)
		if perr != nil {
			return nil, nil, perr
		}
		t = t.UTC().Truncate(time.Millisecond)
		if !t.After(now) {
			return nil, nil, Invalid("expires_at", "expires_at must be in the future")
		}
		expires = &t
	}
	if in.StackAfter != nil {
		if in.DurationSeconds == nil {
			return nil, nil, Invalid("duration_seconds", "stack_after requires duration_seconds")
		}
		if in.StackAfter.MetadataMatch == nil {
			return nil, nil, Invalid("stack_after.metadata_match", "stack_after.metadata_match is required")
		}
		if in.StackAfter.MetadataMatch, err = in.StackAfter.MetadataMatch.Canonical("stack_after.metadata_match"); err != nil {
			return nil, nil, err
		}
		fb := FallbackNow
		if in.StackAfter.Fallback != nil {
			fb = *in.StackAfter.Fallback
		}
		if fb != FallbackNow && fb != FallbackReject {
			return nil, nil, Invalid("stack_after.fallback", "stack_after.fallback must be now or reject")
		}
		stack = &StackAfter{MetadataMatch: in.StackAfter.MetadataMatch, Fallback: fb}
	} else if in.DurationSeconds != nil {
		t := now.Add(time.Duration(*in.DurationSeconds) * time.Second)
		expires = &t
	}
	return expires, stack, nil
}

func validateSourceReason(source, reason *string) error {
	if source == nil || *source == "" {
		return Invalid("source", "source is required")
	}
	if !Source(*source).ValidGrantSource() {
		return Invalid("source", "source must be promotional, compensation, referral, manual or migration")
	}
	if reason == nil || strings.TrimSpace(*reason) == "" {
		return Invalid("reason", "reason is required")
	}
	return CheckText("reason", *reason)
}

// AdjustInput is the body of the adjust endpoints.
type AdjustInput struct {
	Delta    *int64   `json:"delta"`
	Source   *string  `json:"source"`
	Reason   *string  `json:"reason"`
	Metadata Metadata `json:"metadata"`
}

// Idempotency names the HTTP idempotency key of a request and the
// fingerprint of its body.
type Idempotency struct {
	Key         string
	RequestHash string
	// CheckedAt is when (wall clock) a Postgres look-up found no operation
	// under Key (a usage batch looks its events up at once); zero when
	// none was made.
	CheckedAt time.Time
}

// AccountSummary is the account member of grant and adjust responses.
type AccountSummary struct {
	CustomerID       uuid.UUID `json:"customer_id"`
	Balance          int64     `json:"balance"`
	ReservedBalance  int64     `json:"reserved_balance"`
	PendingBalance   int64     `json:"pending_balance"`
	EffectiveBalance int64     `json:"effective_balance"`
	LifetimeEarned   int64     `json:"lifetime_earned"`
	Version          int64     `json:"version"`
}

// GrantResult is the 201 body of a grant.
type GrantResult struct {
	Transaction LedgerEntry    `json:"transaction"`
	Block       Block          `json:"block"`
	Account     AccountSummary `json:"account"`
}

// AdjustResult is the 200 body of an adjust.
type AdjustResult struct {
	Transactions []LedgerEntry  `json:"transactions"`
	Block        *Block         `json:"block"`
	Account      AccountSummary `json:"account"`
}

// Grant adds one block to a customer, creating the customer when a lenient
// id names nobody. Errors: 422 (validation, overflow), 400 (cross-tenant),
// 404 (strict external id), 409 (stack_after reject, key reused).
func (s *Credits) Grant(ctx context.Context, scope Scope, ref CustomerRef, idem Idempotency, in GrantInput) (GrantResult, error) {
	now := s.clock.Now()
	expires, stack, err := in.validate(now)
	if err != nil {
		return GrantResult{}, err
	}
	c, err := s.customers.Resolve(ctx, scope, ref, true)
	if err != nil {
		return GrantResult{}, err
	}
	priority := 0
	if in.Priority != nil {
		priority = int(*in.Priority)
	}
	var duration int64
	if in.DurationSeconds != nil {
		duration = *in.DurationSeconds
	}
	cmd := GrantCommand{
		OpID:           uuid.Must(uuid.NewV7()),
		Customer:       CustomerKeyOf(c),
		AccountID:      uuid.Must(uuid.NewV7()),
		IdempotencyKey: idem.Key,
		RequestHash:    idem.RequestHash,
		Now:            now,
		EntryType:      EntryAdjustment,
		Reason:         in.Reason,
		EntryMetadata:  orEmpty(in.Metadata),
		Block: Block{
			ID:             uuid.Must(uuid.NewV7()),
			CustomerID:     c.ID,
			OriginalAmount: *in.Credits,
			Source:         Source(*in.Source),
			Priority:       priority,
			ExpiresAt:      expires,
			Metadata:       orEmpty(in.Metadata),
		},
		DurationSeconds: duration,
		StackAfter:      stack,
	}
	res, err := withLoad(ctx, s, cmd.Customer, func() (MutationResult, error) { return s.blocks.Grant(ctx, cmd) })
	if err != nil {
		return GrantResult{}, err
	}
	return grantResult(res.Mutation), nil
}

// Adjust adds (one new block) or removes (drains blocks in spend order)
// credit. A lenient id never creates a customer here. Errors: 422, 400
// (cross-tenant id), 404 (unknown customer; negative delta without an
// account), 409 (insufficient-credits with nothing changed, key reused).
func (s *Credits) Adjust(ctx context.Context, scope Scope, ref CustomerRef, idem Idempotency, in AdjustInput) (AdjustResult, error) {
	if in.Delta == nil || *in.Delta == 0 {
		return AdjustResult{}, Invalid("delta", "delta is required and must not be 0")
	}
	if err := validateSourceReason(in.Source, in.Reason); err != nil {
		return AdjustResult{}, err
	}
	var err error
	if in.Metadata, err = in.Metadata.Canonical("metadata"); err != nil {
		return AdjustResult{}, err
	}
	c, err := s.adjustCustomer(ctx, scope, ref)
	if err != nil {
		return AdjustResult{}, err
	}
	now := s.clock.Now()
	key := CustomerKeyOf(c)
	src := Source(*in.Source)
	var res MutationResult
	if *in.Delta > 0 {
		cmd := GrantCommand{
			OpID: uuid.Must(uuid.NewV7()), Customer: key, AccountID: uuid.Must(uuid.NewV7()),
			IdempotencyKey: idem.Key, RequestHash: idem.RequestHash, Now: now,
			EntryType: EntryAdjustment, Reason: in.Reason, EntryMetadata: orEmpty(in.Metadata),
			Block: Block{ID: uuid.Must(uuid.NewV7()), CustomerID: c.ID, OriginalAmount: *in.Delta,
				Source: src, Metadata: orEmpty(in.Metadata)},
		}
		res, err = withLoad(ctx, s, key, func() (MutationResult, error) { return s.blocks.Grant(ctx, cmd) })
	} else {
		if *in.Delta == minInt64 {
			return AdjustResult{}, ErrOverflow
		}
		cmd := DebitCommand{
			OpID: uuid.Must(uuid.NewV7()), Customer: key, IdempotencyKey: idem.Key,
			RequestHash: idem.RequestHash, Now: now, Amount: -*in.Delta,
			EntryType: EntryAdjustment, Source: &src, Reason: in.Reason, EntryMetadata: orEmpty(in.Metadata),
		}
		res, err = withLoad(ctx, s, key, func() (MutationResult, error) { return s.blocks.Debit(ctx, cmd) })
	}
	if err != nil {
		return AdjustResult{}, err
	}
	return adjustResult(res.Mutation), nil
}

// adjustCustomer resolves an adjust's customer without creating one. The
// spec lists "400 cross-tenant customer_id" for adjust as for grant: a UUID
// naming another tenant's (or environment's) customer is a 400 like grant's,
// while an id naming nobody stays a 404.
func (s *Credits) adjustCustomer(ctx context.Context, scope Scope, ref CustomerRef) (Customer, error) {
	c, err := s.customers.Resolve(ctx, scope, ref, false)
	if e, ok := AsError(err); !ok || e.Kind != KindNotFound || ref.Strict {
		return c, err
	}
	id, perr := uuid.Parse(ref.Value)
	if perr != nil {
		return c, err
	}
	other, oerr := s.customers.dir.CustomerByID(ctx, id)
	if oerr == nil && (other.TenantID != scope.TenantID || other.Environment != scope.Environment) {
		return Customer{}, BadRequest("customer_id", "customer_id belongs to another tenant or environment")
	}
	return c, err
}

const minInt64 = -1 << 63

// Account reads a customer's balance snapshot; it never creates a customer.
func (s *Credits) Account(ctx context.Context, scope Scope, ref CustomerRef, includeBlocks bool) (Account, error) {
	c, err := s.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return Account{}, err
	}
	key := CustomerKeyOf(c)
	var acct Account
	_, err = withLoad(ctx, s, key, func() (MutationResult, error) {
		var e error
		acct, e = s.blocks.Snapshot(ctx, key, s.clock.Now())
		return MutationResult{}, e
	})
	if err != nil {
		return Account{}, err
	}
	acct.TenantID, acct.CustomerID, acct.Environment = c.TenantID, c.ID, c.Environment
	if !includeBlocks || acct.Blocks == nil {
		acct.Blocks = []Block{}
	}
	return acct, nil
}

// HistoryInput is the query of the history endpoint.
type HistoryInput struct {
	Type, Source, BillableMetricKey string
	From, To                        string
	Cursor                          string
	Limit                           int
}

// History pages a customer's ledger newest first. Errors: 404, 400 (bad
// from/to or cursor).
func (s *Credits) History(ctx context.Context, scope Scope, ref CustomerRef, in HistoryInput) (Page[LedgerEntry], error) {
	q := HistoryQuery{Cursor: in.Cursor, Limit: in.Limit}
	var err error
	if q.From, err = parseOptionalTime("from", in.From, KindBadRequest); err != nil {
		return Page[LedgerEntry]{}, err
	}
	if q.To, err = parseOptionalTime("to", in.To, KindBadRequest); err != nil {
		return Page[LedgerEntry]{}, err
	}
	if in.Type != "" {
		t := EntryType(in.Type)
		q.Type = &t
	}
	if in.Source != "" {
		src := Source(in.Source)
		q.Source = &src
	}
	if in.BillableMetricKey != "" {
		q.BillableMetricKey = &in.BillableMetricKey
	}
	c, err := s.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return Page[LedgerEntry]{}, err
	}
	q.CustomerID = c.ID
	s.awaitPersisted(ctx, CustomerKeyOf(c))
	return s.ledger.History(ctx, q)
}

// OverageReport is the 200 body of the overage endpoint.
type OverageReport struct {
	Data           []OverageLine `json:"data"`
	TotalOverageMC int64         `json:"total_overage_mc"`
	// Period is the window asked for, as the client wrote it (periodText).
	Period struct {
		From string `json:"from"`
		To   string `json:"to"`
	} `json:"period"`
}

// periodText is how the overage answer writes a bound of its window: the
// client's own text when it is already UTC (ends in Z), so a client that
// compares the echo with what it sent (a toISOString() value such as
// ...T00:00:00.000Z) finds it unchanged; an offset form is written in UTC.
func periodText(raw string, t time.Time) string {
	if strings.HasSuffix(raw, "Z") {
		return raw
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// Overage sums a customer's overage per metric in [from, to). Errors: 422
// (missing or invalid from/to, to not after from), 404.
func (s *Credits) Overage(ctx context.Context, scope Scope, ref CustomerRef, from, to string) (OverageReport, error) {
	var rep OverageReport
	if from == "" {
		return rep, Invalid("from", "from is required")
	}
	if to == "" {
		return rep, Invalid("to", "to is required")
	}
	f, err := parseOptionalTime("from", from, KindValidation)
	if err != nil {
		return rep, err
	}
	t, err := parseOptionalTime("to", to, KindValidation)
	if err != nil {
		return rep, err
	}
	if !t.After(*f) {
		return rep, Invalid("to", "to must be after from")
	}
	c, err := s.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return rep, err
	}
	s.awaitPersisted(ctx, CustomerKeyOf(c))
	lines, err := s.ledger.Overage(ctx, c.ID, *f, *t)
	if err != nil {
		return rep, err
	}
	if lines == nil {
		lines = []OverageLine{}
	}
	rep.Data = lines
	for _, l := range lines {
		if sum, ok := AddChecked(rep.TotalOverageMC, l.OverageMC); ok {
			rep.TotalOverageMC = sum
		}
	}
	rep.Period.From, rep.Period.To = periodText(from, *f), periodText(to, *t)
	return rep, nil
}

// awaitPersisted gives ledger reads read-your-writes: it waits (bounded)
// until Postgres holds the account version Redis shows, so a history read
// right after a grant sees the grant.
func (s *Credits) awaitPersisted(ctx context.Context, c CustomerKey) {
	vr, ok := s.ledger.(VersionReader)
	if !ok {
		return
	}
	acct, err := s.blocks.Snapshot(ctx, c, s.clock.Now())
	if err != nil || acct.Version == 0 {
		return
	}
	deadline := time.Now().Add(readYourWritesWait)
	for {
		v, err := vr.PersistedVersion(ctx, c.CustomerID)
		if err != nil || v >= acct.Version || time.Now().After(deadline) {
			return
		}
		if s.hurry != nil {
			s.hurry()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func parseOptionalTime(field, v string, kind Kind) (*time.Time, error) {
	if v == "" {
		return nil, nil
	}
	t, err := ParseInstant(field, v, kind)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// Load installs one customer's state from Postgres into the block store; the
// store's version fence makes a stale load harmless.
func (s *Credits) Load(ctx context.Context, c CustomerKey) error {
	return s.loads.do(c.CustomerID, func() error {
		s.reloads.Add(1)
		now := s.clock.Now()
		st, ok, err := s.ledger.AccountState(ctx, c, now.Add(-AppliedRetention))
		if err != nil {
			return err
		}
		if !ok {
			st = AccountState{TenantID: c.TenantID, CustomerID: c.CustomerID, Environment: c.Environment}
		}
		_, err = s.blocks.Load(ctx, st)
		return err
	})
}

// withLoad runs op, and once more after loading the customer from Postgres
// when the block store has no state for it.
func withLoad(ctx context.Context, s *Credits, c CustomerKey, op func() (MutationResult, error)) (MutationResult, error) {
	res, err := op()
	if !errors.Is(err, ErrStateMissing) {
		return res, err
	}
	if err := s.Load(ctx, c); err != nil {
		return MutationResult{}, err
	}
	return op()
}

// singleLoad lets one goroutine per customer load while the others wait for
// its result (one loader at a time per customer, issue 2 scope 8).
type singleLoad struct {
	mu       sync.Mutex
	inFlight map[uuid.UUID]*loadCall
}

type loadCall struct {
	done chan struct{}
	err  error
}

func (l *singleLoad) do(id uuid.UUID, fn func() error) error {
	l.mu.Lock()
	if l.inFlight == nil {
		l.inFlight = map[uuid.UUID]*loadCall{}
	}
	if c, ok := l.inFlight[id]; ok {
		l.mu.Unlock()
		<-c.done
		return c.err
	}
	c := &loadCall{done: make(chan struct{})}
	l.inFlight[id] = c
	l.mu.Unlock()
	c.err = fn()
	l.mu.Lock()
	delete(l.inFlight, id)
	l.mu.Unlock()
	close(c.done)
	return c.err
}

func grantResult(m Mutation) GrantResult {
	var out GrantResult
	mains := m.LedgerEntries(RoleMain)
	if len(mains) > 0 {
		out.Transaction = mains[0]
		if b := findBlock(m, mains[0].CreditBlockID); b != nil {
			out.Block = *b
		}
	}
	out.Account = summary(m)
	return out
}

func adjustResult(m Mutation) AdjustResult {
	out := AdjustResult{Transactions: m.LedgerEntries(RoleMain), Account: summary(m)}
	if len(out.Transactions) == 1 && out.Transactions[0].Delta > 0 {
		out.Block = findBlock(m, out.Transactions[0].CreditBlockID)
	}
	return out
}

func findBlock(m Mutation, id *uuid.UUID) *Block {
	if id == nil {
		return nil
	}
	for _, b := range m.Blocks {
		if b.ID == *id {
			blk := b.Block(m.CustomerID)
			return &blk
		}
	}
	return nil
}

func summary(m Mutation) AccountSummary {
	a := m.Account
	return AccountSummary{
		CustomerID: m.CustomerID, Balance: a.Balance, ReservedBalance: a.Reserved,
		PendingBalance: a.Pending, EffectiveBalance: a.Balance - a.Reserved - a.Pending,
		LifetimeEarned: a.LifetimeEarned, Version: a.Version,
	}
}

func orEmpty(m Metadata) Metadata {
	if m == nil {
		return Metadata{}
	}
	return m
}

// MaxLiveBlocks bounds the live (unexpired, nonzero) credit blocks of one
// customer (invariant 13): every money script reads and orders them, so
// the cap keeps its Redis time under 1 ms (bench scenario "worst",
// docs/limits.md). lua/prelude.lua MAX_LIVE_BLOCKS enforces it atomically.
const MaxLiveBlocks = 100

// ErrTooManyBlocks refuses a grant, topup, rollover or plan grant that would
// give the customer more than MaxLiveBlocks live blocks: a 409 (a state
// limit, like insufficient credit), nothing written.
var ErrTooManyBlocks = &Error{Kind: KindConflict, Field: "credits",
	Detail: "the customer already holds 100 live credit blocks, the most allowed; spend or expire some before granting more"}
