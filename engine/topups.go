package engine

import (
	"context"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Topups are credit a customer paid for (addendum 7). A topup is a grant of
// ledger type and source `topup` through the same Lua grant script as every
// other grant; the topup list is read back from those ledger entries, so the
// ledger stays the one record of money.

// Mutation context emitters (MutationContext.Emitter).
const (
	// EmitterTopup marks a topup grant (credit.granted fires).
	EmitterTopup = "topup"
	// EmitterImport marks an import grant: it never fires credit.granted
	// (interface.md Events).
	EmitterImport = "import"
)

// MaxPaymentReferenceChars bounds a topup's payment_reference.
const MaxPaymentReferenceChars = 255

// TopupInput is the body of POST /v1/customers/{id}/topups.
type TopupInput struct {
	Credits          *int64   `json:"credits"`
	PaymentReference *string  `json:"payment_reference"`
	ExpiresAt        *string  `json:"expires_at"`
	Priority         *int64   `json:"priority"`
	Metadata         Metadata `json:"metadata"`
}

// validate checks the body and returns the block's expiry.
func (in *TopupInput) validate(now time.Time) (*time.Time, error) {
	if in.Credits == nil {
		return nil, Invalid("credits", "credits is required")
	}
	if *in.Credits < 1 {
		return nil, Invalid("credits", "credits must be >= 1")
	}
	if in.PaymentReference != nil && utf8.RuneCountInString(*in.PaymentReference) > MaxPaymentReferenceChars {
		return nil, Invalid("payment_reference", "payment_reference is longer than 255 characters")
	}
	if in.PaymentReference != nil {
		if err := CheckLine("payment_reference", *in.PaymentReference); err != nil {
			return nil, err
		}
	}
	var err error
	if in.Metadata, err = in.Metadata.Canonical("metadata"); err != nil {
		return nil, err
	}
	if in.Priority != nil && (*in.Priority < 0 || *in.Priority > MaxPriority) {
		return nil, Invalid("priority", "priority must be between 0 and 255")
	}
	if in.ExpiresAt == nil {
		return nil, nil
	}
	t, err := ParseInstant("expires_at", *in.ExpiresAt, KindValidation)
	if err != nil {
		return nil, err
	}
	t = t.UTC().Truncate(time.Millisecond)
	if !t.After(now) {
		return nil, Invalid("expires_at", "expires_at must be in the future")
	}
	return &t, nil
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
	Metadata         Metadata   `json:"metadata"`
	IdempotencyKey   string     `json:"idempotency_key"`
	CreatedAt        time.Time  `json:"created_at"`
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
// never creates a customer (Common rules 4 names grants only). Errors: 422,
// 404 (unknown customer), 409 (key reused with another body).
func (s *Topups) Create(ctx context.Context, scope Scope, tenant Tenant, ref CustomerRef, idem Idempotency, in TopupInput) (GrantResult, error) {
	now := s.credits.now()
	expires, err := in.validate(now)
	if err != nil {
		return GrantResult{}, err
	}
	c, err := s.credits.resolve(ctx, scope, ref)
	if err != nil {
		return GrantResult{}, err
	}
	priority := 0
	if in.Priority != nil {
		priority = int(*in.Priority)
	}
	var reason *string
	if in.PaymentReference != nil && *in.PaymentReference != "" {
		reason = in.PaymentReference
	}
	mc := contextOf(c, tenant)
	mc.Emitter = EmitterTopup
	cmd := GrantCommand{
		CommandHeader: headerOf(CustomerKeyOf(c), idem, now),
		AccountID:     uuid.Must(uuid.NewV7()),
		EntryType:     EntryTopup, Reason: reason, EntryMetadata: orEmpty(in.Metadata),
		Block: Block{ID: uuid.Must(uuid.NewV7()), CustomerID: c.ID, OriginalAmount: *in.Credits,
			Source: SourceTopup, Priority: priority, ExpiresAt: expires, Metadata: orEmpty(in.Metadata)},
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
	return s.reader.Topups(ctx, c.ID, cursor, limit)
}
