package engine

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Import limits (docs/decisions.md): one call stays well inside the
// request timeout.
const (
	MaxImportCustomers = 1000
	MaxImportBlocks    = 100
)

// importReason is the reason of every imported block's ledger entry.
const importReason = "import"

// ImportInput is the body of POST /v1/import (addendum 7).
type ImportInput struct {
	Customers []ImportCustomer `json:"customers"`
	Options   ImportOptions    `json:"options"`
}

// ImportCustomer is one customer to bring over with its credit.
type ImportCustomer struct {
	ExternalID  *string        `json:"external_id"`
	DisplayName *string        `json:"display_name"`
	Metadata    Metadata       `json:"metadata"`
	Credits     []ImportCredit `json:"credits"`
}

// ImportCredit is one block of an imported customer.
type ImportCredit struct {
	Credits   *int64  `json:"credits"`
	ExpiresAt *string `json:"expires_at"`
	Priority  *int64  `json:"priority"`
}

// ImportOptions tune an import. EmitWebhooks is accepted and has no effect:
// an import never emits credit.granted (interface.md Events).
type ImportOptions struct {
	EmitWebhooks bool `json:"emit_webhooks"`
	DryRun       bool `json:"dry_run"`
}

// ImportResult is the 200 body of an import.
type ImportResult struct {
	Created int           `json:"created"`
	Skipped int           `json:"skipped"`
	Errors  []ImportError `json:"errors"`
}

// ImportError says why the customer at Index was not imported.
type ImportError struct {
	Index int    `json:"index"`
	Error string `json:"error"`
}

// Imports brings a tenant's customers and their balances over from another
// system.
type Imports struct {
	customers *Customers
	credits   *Credits
}

// NewImports returns the import service.
func NewImports(customers *Customers, credits *Credits) *Imports {
	return &Imports{customers: customers, credits: credits}
}

// importBlock is a validated ImportCredit.
type importBlock struct {
	credits  int64
	expires  *time.Time
	priority int
}

// validate checks one customer entry and returns its blocks; the error
// names the member (credits[2].priority).
func (c *ImportCustomer) validate(now time.Time) ([]importBlock, error) {
	in := CreateCustomerInput{ExternalID: c.ExternalID, DisplayName: c.DisplayName, Metadata: c.Metadata}
	if err := in.Validate(); err != nil {
		return nil, err
	}
	c.Metadata = in.Metadata // canonical
	if len(c.Credits) > MaxImportBlocks {
		return nil, Invalid("credits", "at most 100 credit blocks per customer")
	}
	out := make([]importBlock, 0, len(c.Credits))
	var total int64
	for j, cr := range c.Credits {
		field := "credits[" + strconv.Itoa(j) + "]"
		if cr.Credits == nil || *cr.Credits < 1 {
			return nil, Invalid(field+".credits", "credits is required and must be >= 1")
		}
		sum, ok := AddChecked(total, *cr.Credits)
		if !ok {
			return nil, Invalid(field+".credits", "the customer's credits would overflow a 64-bit balance")
		}
		total = sum
		b := importBlock{credits: *cr.Credits}
		if cr.Priority != nil {
			if *cr.Priority < 0 || *cr.Priority > MaxPriority {
				return nil, Invalid(field+".priority", "priority must be between 0 and 255")
			}
			b.priority = int(*cr.Priority)
		}
		if cr.ExpiresAt != nil {
			t, err := ParseInstant(field+".expires_at", *cr.ExpiresAt, KindValidation)
			if err != nil {
				return nil, err
			}
			t = t.UTC().Truncate(time.Millisecond)
			if !t.After(now) {
				return nil, Invalid(field+".expires_at", "expires_at must be in the future")
			}
			b.expires = &t
		}
		out = append(out, b)
	}
	return out, nil
}

// Import creates each customer whose external_id is new (an existing one is
// skipped, its credit untouched) with one `migration` block per credit entry
// (ledger type adjustment, reason "import"), and never fires credit.granted.
// A bad entry is reported in errors and never stops the others; dry_run
// validates and counts without writing. Errors (whole call): 422 for a
// missing or oversized customers list.
func (s *Imports) Import(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ImportInput) (ImportResult, error) {
	if in.Customers == nil {
		return ImportResult{}, Invalid("customers", "customers is required")
	}
	if len(in.Customers) > MaxImportCustomers {
		return ImportResult{}, Invalid("customers", "at most 1000 customers per call")
	}
	out := ImportResult{Errors: []ImportError{}}
	now := s.credits.clock.Now()
	seen := make(map[string]bool, len(in.Customers))
	for i := range in.Customers {
		ic := &in.Customers[i]
		blocks, err := ic.validate(now)
		if err != nil {
			out.Errors = append(out.Errors, ImportError{Index: i, Error: errorText(err)})
			continue
		}
		ext := *ic.ExternalID
		if seen[ext] {
			out.Skipped++
			continue
		}
		seen[ext] = true
		if in.Options.DryRun {
			_, err := s.customers.dir.CustomerByExternalID(ctx, scope, ext)
			switch {
			case err == nil:
				out.Skipped++
			case errors.Is(err, ErrNotFound):
				out.Created++
			default:
				return ImportResult{}, err
			}
			continue
		}
		c, err := s.customers.Create(ctx, scope, CreateCustomerInput{ExternalID: ic.ExternalID,
			DisplayName: ic.DisplayName, Metadata: ic.Metadata})
		if e, ok := AsError(err); ok && e.Kind == KindConflict {
			out.Skipped++
			continue
		}
		if err != nil {
			return ImportResult{}, err
		}
		if err := s.grantAll(ctx, c, tenant, idem, i, blocks, now); err != nil {
			if _, ok := AsError(err); !ok {
				return ImportResult{}, err
			}
			out.Errors = append(out.Errors, ImportError{Index: i, Error: errorText(err)})
			continue
		}
		out.Created++
	}
	return out, nil
}

// grantAll writes the blocks of customer i, each under its own key derived
// from the call's, so the Lua idempotency memory tells them apart.
func (s *Imports) grantAll(ctx context.Context, c Customer, tenant Tenant, idem Idempotency, i int, blocks []importBlock, now time.Time) error {
	mc := contextOf(c, tenant)
	mc.Emitter = EmitterImport
	reason := importReason
	for j, b := range blocks {
		cmd := GrantCommand{
			OpID: uuid.Must(uuid.NewV7()), Customer: CustomerKeyOf(c), AccountID: uuid.Must(uuid.NewV7()),
			IdempotencyKey: idem.Key + "#import:" + strconv.Itoa(i) + ":" + strconv.Itoa(j),
			RequestHash:    idem.RequestHash, Now: now,
			EntryType: EntryAdjustment, Reason: &reason, EntryMetadata: Metadata{},
			Block: Block{ID: uuid.Must(uuid.NewV7()), CustomerID: c.ID, OriginalAmount: b.credits,
				Source: SourceMigration, Priority: b.priority, ExpiresAt: b.expires, Metadata: Metadata{}},
			Context: &mc,
		}
		if _, err := withLoad(ctx, s.credits, cmd.Customer, func() (MutationResult, error) { return s.credits.blocks.Grant(ctx, cmd) }); err != nil {
			return err
		}
	}
	return nil
}

// errorText is a domain error as one line naming its field.
func errorText(err error) string {
	if e, ok := AsError(err); ok {
		if e.Field != "" && !strings.HasPrefix(e.Detail, e.Field) {
			return e.Field + ": " + e.Detail
		}
		return e.Detail
	}
	return err.Error()
}
