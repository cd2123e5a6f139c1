// Grants and adjustments: adding a credit block to a customer's account, or
// moving its balance by hand, with their inputs, validation and answers.

package engine

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"
)

// GrantCredits is a checked grant. Whether ExpiresAt is still in the
// future is Grant's to say, before StackErr: a stack_after sent without
// duration_seconds, which the answer names only once the expiry has passed
// its check.
type GrantCredits struct {
	Credits         int64
	Source          Source
	Reason          string
	Priority        int
	ExpiresAt       *time.Time // millisecond precision, UTC; nil: see DurationSeconds
	DurationSeconds int64      // 0: none
	StackAfter      *StackAfter
	Metadata        Metadata // canonical; nil: none
	// Scope is the metric keys the block pays for (ScopeKeys), nil: every
	// metric.
	Scope    []string
	StackErr error
}

// ValidateSourceReason checks the source and reason a grant or adjust
// names (422 naming the first wrong one).
func ValidateSourceReason(source, reason *string) error {
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

// AdjustCredits is a checked adjust: a Delta other than 0, a grant source
// and a reason.
type AdjustCredits struct {
	Delta    int64
	Source   Source
	Reason   string
	Metadata Metadata // canonical; nil: none
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
func (s *Credits) Grant(ctx context.Context, scope Scope, ref CustomerRef, idem Idempotency, in GrantCredits) (GrantResult, error) {
	now := s.clock.Now()
	if in.ExpiresAt != nil && !in.ExpiresAt.After(now) {
		return GrantResult{}, Invalid("expires_at", "expires_at must be in the future")
	}
	if in.StackErr != nil {
		return GrantResult{}, in.StackErr
	}
	expires := in.ExpiresAt
	if in.StackAfter == nil && in.DurationSeconds > 0 {
		t := now.Add(time.Duration(in.DurationSeconds) * time.Second)
		expires = &t
	}
	c, err := s.resolver().Resolve(ctx, scope, ref, true)
	if err != nil {
		return GrantResult{}, err
	}
	reason := in.Reason
	cmd := GrantCommand{
		CommandHeader: headerOf(CustomerKeyOf(c), idem, now),
		AccountID:     uuid.Must(uuid.NewV7()),
		EntryType:     EntryAdjustment,
		Reason:        &reason,
		EntryMetadata: orEmpty(in.Metadata),
		Block: Block{
			ID:             uuid.Must(uuid.NewV7()),
			CustomerID:     c.ID,
			OriginalAmount: in.Credits,
			Source:         in.Source,
			Priority:       in.Priority,
			ExpiresAt:      expires,
			Metadata:       orEmpty(in.Metadata),
			AppliesTo:      AppliesToOf(in.Scope),
		},
		DurationSeconds: in.DurationSeconds,
		StackAfter:      in.StackAfter,
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
func (s *Credits) Adjust(ctx context.Context, scope Scope, ref CustomerRef, idem Idempotency, in AdjustCredits) (AdjustResult, error) {
	c, err := s.adjustCustomer(ctx, scope, ref)
	if err != nil {
		return AdjustResult{}, err
	}
	now := s.clock.Now()
	key := CustomerKeyOf(c)
	src := in.Source
	reason := in.Reason
	var res MutationResult
	if in.Delta > 0 {
		cmd := GrantCommand{
			CommandHeader: headerOf(key, idem, now),
			AccountID:     uuid.Must(uuid.NewV7()),
			EntryType:     EntryAdjustment, Reason: &reason, EntryMetadata: orEmpty(in.Metadata),
			Block: Block{ID: uuid.Must(uuid.NewV7()), CustomerID: c.ID, OriginalAmount: in.Delta,
				Source: src, Metadata: orEmpty(in.Metadata)},
		}
		res, err = withLoad(ctx, s, key, func() (MutationResult, error) { return s.blocks.Grant(ctx, cmd) })
	} else {
		if in.Delta == minInt64 {
			return AdjustResult{}, ErrOverflow
		}
		cmd := DebitCommand{
			CommandHeader: headerOf(key, idem, now),
			Amount:        -in.Delta,
			EntryType:     EntryAdjustment, Source: &src, Reason: &reason, EntryMetadata: orEmpty(in.Metadata),
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
	c, err := s.resolver().Resolve(ctx, scope, ref, false)
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
// docs/limits.md). lua/prelude/bounds.lua MAX_LIVE_BLOCKS enforces it atomically.
const MaxLiveBlocks = 100

// ErrTooManyBlocks refuses a grant, topup, rollover or plan grant that would
// give the customer more than MaxLiveBlocks live blocks: a 409 (a state
// limit, like insufficient credit), nothing written.
var ErrTooManyBlocks = &Error{Kind: KindConflict, Field: "credits",
	Detail: "the customer already holds 100 live credit blocks, the most allowed; spend or expire some before granting more"}
