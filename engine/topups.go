package engine

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Topups are credit a customer paid for (docs/spec/addendum.md §7). A topup is a grant of
// ledger type and source `topup` through the same Lua grant script as every
// other grant; the topup list is read back from those ledger entries, so the
// ledger stays the one record of money.

// Mutation context emitters (MutationContext.Emitter).
const (
	// EmitterTopup marks a topup grant (credit.granted fires).
	EmitterTopup = "topup"
	// EmitterImport marks an import grant: it never fires credit.granted
	// (docs/spec/interface.md Events).
	EmitterImport = "import"
)

// MaxPaymentReferenceChars bounds a topup's payment_reference.
const MaxPaymentReferenceChars = 255

// CreateTopup is a checked POST /v1/customers/{id}/topups; whether its
// expiry is still in the future is the one check left to Create.
type CreateTopup struct {
	Credits          int64
	PaymentReference *string    // nil: none
	ExpiresAt        *time.Time // millisecond precision, UTC; nil: never
	Priority         int
	Metadata         Metadata // canonical; nil: none
	Scope            []string // ScopeKeys of applies_to; nil: every metric
}

// Topup is one topup as GET /v1/customers/{id}/topups lists it: its ledger
// entry (id is the transaction id) and the block it created.
type Topup struct {
	ID               uuid.UUID  `json:"id"`
	CustomerID       uuid.UUID  `json:"customer_id"`
	Credits          int64      `json:"credits"`
	PaymentReference *string    `json:"payment_reference"`
	CreditBlockID    *uuid.UUID `json:"credit_block_id"`
	ExpiresAt        *time.Time `json:"expires_at"`
	Priority         int        `json:"priority"`
	// AppliesTo is the scope of the block the topup made (nil: every metric).
	AppliesTo      *AppliesTo `json:"applies_to"`
	Metadata       Metadata   `json:"metadata"`
	IdempotencyKey string     `json:"idempotency_key"`
	CreatedAt      time.Time  `json:"created_at"`
}

// Topups records paid credit.
type Topups struct {
	credits *Credits
	reader  TopupReader
}

// NewTopups returns the topup service.
func NewTopups(credits *Credits, reader TopupReader) *Topups {
	return &Topups{credits: credits, reader: reader}
}

// Create grants a topup block: ledger type and source `topup`, the
// payment_reference as the entry's reason, credit.granted fired. A topup
// never creates a customer (Common rules 4 names grants only). Errors: 422
// (an expiry not in the future), 404 (unknown customer), 409 (key reused
// with another body).
func (s *Topups) Create(ctx context.Context, scope Scope, tenant Tenant, ref CustomerRef, idem Idempotency, in CreateTopup) (GrantResult, error) {
	now := s.credits.now()
	if in.ExpiresAt != nil && !in.ExpiresAt.After(now) {
		return GrantResult{}, Invalid("expires_at", "expires_at must be in the future")
	}
	c, err := s.credits.resolve(ctx, scope, ref)
	if err != nil {
		return GrantResult{}, err
	}
	mc := contextOf(c, tenant)
	mc.Emitter = EmitterTopup
	cmd := GrantCommand{
		CommandHeader: headerOf(CustomerKeyOf(c), idem, now),
		AccountID:     uuid.Must(uuid.NewV7()),
		EntryType:     EntryTopup, Reason: in.PaymentReference, EntryMetadata: orEmpty(in.Metadata),
		Block: Block{ID: uuid.Must(uuid.NewV7()), CustomerID: c.ID, OriginalAmount: in.Credits,
			Source: SourceTopup, Priority: in.Priority, ExpiresAt: in.ExpiresAt, Metadata: orEmpty(in.Metadata),
			AppliesTo: AppliesToOf(in.Scope)},
		Context: &mc,
	}
	res, err := s.credits.grant(ctx, cmd)
	if err != nil {
		return GrantResult{}, err
	}
	return grantResult(res.Mutation), nil
}

// List pages the customer's topups newest first; it never creates a
// customer. Errors: 404, 400 (bad cursor).
func (s *Topups) List(ctx context.Context, scope Scope, ref CustomerRef, cursor string, limit int) (Page[Topup], error) {
	c, err := s.credits.resolve(ctx, scope, ref)
	if err != nil {
		return Page[Topup]{}, err
	}
	s.credits.awaitPersisted(ctx, CustomerKeyOf(c))
	return s.reader.Topups(ctx, CustomerKeyOf(c), cursor, limit)
}
