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

// ImportCustomers is a checked POST /v1/import (docs/spec/addendum.md §7): api has
// checked the call's limits and each row's shape.
type ImportCustomers struct {
	Rows   []ImportRow
	DryRun bool
}

// ImportRow is one customer to bring over with its credit. Err is the row's
// first wrong field when its shape is wrong; Blocks then holds the blocks
// before that field, whose expiry Import still checks first, so the row
// names the same field a single pass would.
type ImportRow struct {
	Customer CreateCustomer
	Blocks   []ImportBlock
	Err      error
}

// ImportBlock is one checked block of an imported customer.
type ImportBlock struct {
	Credits   int64
	ExpiresAt *time.Time // millisecond precision, UTC; nil: never
	Priority  int
	Scope     []string // ScopeKeys of applies_to; nil: every metric
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

// checkExpiry is the row's error: the first block that expires by now,
// else its shape error.
func (r *ImportRow) checkExpiry(now time.Time) error {
	for j, b := range r.Blocks {
		if b.ExpiresAt != nil && !b.ExpiresAt.After(now) {
			return Invalid("credits["+strconv.Itoa(j)+"].expires_at", "expires_at must be in the future")
		}
	}
	return r.Err
}

// Import creates each customer whose external_id is new (an existing one is
// skipped, its credit untouched) with one `migration` block per credit entry
// (ledger type adjustment, reason "import"), and never fires credit.granted.
// Every row is judged on its own: a bad or failing row is reported in errors
// by index and never stops the others. Rows run importWorkers at a time and
// a customer's blocks go to Redis in one pipelined round trip. dry_run
// validates and counts without writing.
func (s *Imports) Import(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ImportCustomers) (ImportResult, error) {
	now := s.credits.now()
	outcome := make([]importOutcome, len(in.Rows))
	seen := make(map[string]bool, len(in.Rows))
	var rows []int
	for i := range in.Rows {
		if err := in.Rows[i].checkExpiry(now); err != nil {
			outcome[i] = importOutcome{err: err}
			continue
		}
		ext := in.Rows[i].Customer.ExternalID
		if seen[ext] {
			outcome[i] = importOutcome{skipped: true}
			continue
		}
		seen[ext] = true
		rows = append(rows, i)
	}

	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(importWorkers, len(rows)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				outcome[i] = s.importOne(ctx, scope, tenant, idem, in, i, now)
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
func (s *Imports) importOne(ctx context.Context, scope Scope, tenant Tenant, idem Idempotency, in ImportCustomers, i int, now time.Time) importOutcome {
	row := &in.Rows[i]
	if in.DryRun {
		_, err := s.customers.ByExternalID(ctx, scope, row.Customer.ExternalID)
		switch {
		case err == nil:
			return importOutcome{skipped: true}
		case errors.Is(err, ErrNotFound):
			return importOutcome{}
		default:
			return importOutcome{err: err}
		}
	}
	c, err := s.customers.Create(ctx, scope, row.Customer)
	if e, ok := AsError(err); ok && e.Kind == KindConflict {
		return importOutcome{skipped: true}
	}
	if err != nil {
		return importOutcome{err: err}
	}
	if err := s.grantAll(ctx, c, tenant, idem, i, row.Blocks, now); err != nil {
		return importOutcome{err: err}
	}
	return importOutcome{}
}

// grantAll writes the blocks of customer i, each under its own key derived
// from the call's, so the Lua idempotency memory tells them apart, all in
// one batch when the block store batches.
func (s *Imports) grantAll(ctx context.Context, c Customer, tenant Tenant, idem Idempotency, i int, blocks []ImportBlock, now time.Time) error {
	mc := contextOf(c, tenant)
	mc.Emitter = EmitterImport
	reason := importReason
	cmds := make([]GrantCommand, len(blocks))
	for j, b := range blocks {
		cmds[j] = GrantCommand{
			CommandHeader: CommandHeader{OpID: uuid.Must(uuid.NewV7()), Customer: CustomerKeyOf(c), IdempotencyKey: idem.Key + "#import:" + strconv.Itoa(i) + ":" + strconv.Itoa(j), RequestHash: idem.RequestHash, Now: now},
			AccountID:     uuid.Must(uuid.NewV7()),
			EntryType:     EntryAdjustment, Reason: &reason, EntryMetadata: Metadata{},
			Block: Block{ID: uuid.Must(uuid.NewV7()), CustomerID: c.ID, OriginalAmount: b.Credits,
				Source: SourceMigration, Priority: b.Priority, ExpiresAt: b.ExpiresAt, Metadata: Metadata{},
				AppliesTo: AppliesToOf(b.Scope)},
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
