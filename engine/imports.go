package engine

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Import limits (docs/limits.md): one call stays well inside the request
// timeout and its idempotency claim. A customer's blocks never pass
// MaxLiveBlocks.
const (
	MaxImportCustomers   = 1000
	MaxImportBlocks      = MaxLiveBlocks
	MaxImportTotalBlocks = 10000
	// importWorkers customers are imported at once.
	importWorkers = 8
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
		return nil, Invalid("credits", "at most "+strconv.Itoa(MaxImportBlocks)+" credit blocks per customer")
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
// Every row is judged on its own: a bad or failing row is reported in errors
// by index and never stops the others. Rows run importWorkers at a time and
// a customer's blocks go to Redis in one pipelined round trip. dry_run
// validates and counts without writing. Errors (whole call): 422 for a
// missing or oversized customers list.
func (s *Imports) Import(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ImportInput) (ImportResult, error) {
	if in.Customers == nil {
		return ImportResult{}, Invalid("customers", "customers is required")
	}
	if len(in.Customers) > MaxImportCustomers {
		return ImportResult{}, Invalid("customers", "at most 1000 customers per call")
	}
	total := 0
	for i := range in.Customers {
		total += len(in.Customers[i].Credits)
	}
	if total > MaxImportTotalBlocks {
		return ImportResult{}, Invalid("customers", "at most 10000 credit blocks per call, over all customers")
	}
	now := s.credits.now()
	type row struct {
		index  int
		blocks []importBlock
	}
	outcome := make([]importOutcome, len(in.Customers))
	seen := make(map[string]bool, len(in.Customers))
	var rows []row
	for i := range in.Customers {
		ic := &in.Customers[i]
		blocks, err := ic.validate(now)
		if err != nil {
			outcome[i] = importOutcome{err: err}
			continue
		}
		ext := *ic.ExternalID
		if seen[ext] {
			outcome[i] = importOutcome{skipped: true}
			continue
		}
		seen[ext] = true
		rows = append(rows, row{index: i, blocks: blocks})
	}

	next := make(chan row)
	var wg sync.WaitGroup
	for w := 0; w < min(importWorkers, len(rows)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range next {
				outcome[r.index] = s.importOne(ctx, scope, tenant, idem, in, r.index, r.blocks, now)
			}
		}()
	}
	for _, r := range rows {
		next <- r
	}
	close(next)
	wg.Wait()

	out := ImportResult{Errors: []ImportError{}}
	for i, o := range outcome {
		switch {
		case o.err != nil:
			out.Errors = append(out.Errors, ImportError{Index: i, Error: errorText(o.err)})
		case o.skipped:
			out.Skipped++
		default:
			out.Created++
		}
	}
	return out, nil
}

// importOutcome is what became of one row: created (the zero value),
// skipped, or an error.
type importOutcome struct {
	skipped bool
	err     error
}

// importOne imports row i: its customer, then its blocks.
func (s *Imports) importOne(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ImportInput, i int, blocks []importBlock, now time.Time) importOutcome {
	ic := &in.Customers[i]
	if in.Options.DryRun {
		_, err := s.customers.ByExternalID(ctx, scope, *ic.ExternalID)
		switch {
		case err == nil:
			return importOutcome{skipped: true}
		case errors.Is(err, ErrNotFound):
			return importOutcome{}
		default:
			return importOutcome{err: err}
		}
	}
	c, err := s.customers.Create(ctx, scope, CreateCustomerInput{ExternalID: ic.ExternalID,
		DisplayName: ic.DisplayName, Metadata: ic.Metadata})
	if e, ok := AsError(err); ok && e.Kind == KindConflict {
		return importOutcome{skipped: true}
	}
	if err != nil {
		return importOutcome{err: err}
	}
	if err := s.grantAll(ctx, c, tenant, idem, i, blocks, now); err != nil {
		return importOutcome{err: err}
	}
	return importOutcome{}
}

// grantAll writes the blocks of customer i, each under its own key derived
// from the call's, so the Lua idempotency memory tells them apart, all in
// one batch when the block store batches.
func (s *Imports) grantAll(ctx context.Context, c Customer, tenant Tenant, idem Idempotency, i int, blocks []importBlock, now time.Time) error {
	mc := contextOf(c, tenant)
	mc.Emitter = EmitterImport
	reason := importReason
	cmds := make([]GrantCommand, len(blocks))
	for j, b := range blocks {
		cmds[j] = GrantCommand{
			CommandHeader: CommandHeader{OpID: uuid.Must(uuid.NewV7()), Customer: CustomerKeyOf(c), IdempotencyKey: idem.Key + "#import:" + strconv.Itoa(i) + ":" + strconv.Itoa(j), RequestHash: idem.RequestHash, Now: now},
			AccountID:     uuid.Must(uuid.NewV7()),
			EntryType:     EntryAdjustment, Reason: &reason, EntryMetadata: Metadata{},
			Block: Block{ID: uuid.Must(uuid.NewV7()), CustomerID: c.ID, OriginalAmount: b.credits,
				Source: SourceMigration, Priority: b.priority, ExpiresAt: b.expires, Metadata: Metadata{}},
			Context: &mc,
		}
	}
	return s.credits.grantNewCustomer(ctx, c, cmds)
}

// errorText is a row's error as one line naming its field; a store failure
// says only "internal error", never its Go text.
func errorText(err error) string {
	if msg, public := ItemErrorText(err); public {
		return msg
	}
	return "internal error"
}
