// Grants and adjustments: adding a credit block to a customer's account, or\nmoving its balance by hand, with their inputs, validation and answers.
package engine

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"
)

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
		CommandHeader: headerOf(CustomerKeyOf(c), idem, now),
		AccountID:     uuid.Must(uuid.NewV7()),
		EntryType:     EntryAdjustment,
		Reason:        in.Reason,
		EntryMetadata: orEmpty(in.Metadata),
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
			CommandHeader: headerOf(key, idem, now),
			AccountID:     uuid.Must(uuid.NewV7()),
			EntryType:     EntryAdjustment, Reason: in.Reason, EntryMetadata: orEmpty(in.Metadata),
			Block: Block{ID: uuid.Must(uuid.NewV7()), CustomerID: c.ID, OriginalAmount: *in.Delta,
				Source: src, Metadata: orEmpty(in.Metadata)},
		}
		res, err = withLoad(ctx, s, key, func() (MutationResult, error) { return s.blocks.Grant(ctx, cmd) })
	} else {
		if *in.Delta == minInt64 {
			return AdjustResult{}, ErrOverflow
		}
		cmd := DebitCommand{
			CommandHeader: headerOf(key, idem, now),
			Amount:        -*in.Delta,
			EntryType:     EntryAdjustment, Source: &src, Reason: in.Reason, EntryMetadata: orEmpty(in.Metadata),
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
	other, oerr := s.customers.ByID(ctx, id)
	if oerr == nil && (other.TenantID != scope.TenantID || other.Environment != scope.Environment) {
		return Customer{}, BadRequest("customer_id", "customer_id belongs to another tenant or environment")
	}
	return c, err
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
