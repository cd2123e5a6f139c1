// Credit history and overage: the ledger of a customer read from Postgres, by
// page and by period.

package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// History pages a customer's ledger newest first; q, which api checked,
// gets the customer here. Errors: 404, 400 (bad cursor).
func (s *Credits) History(ctx context.Context, scope Scope, ref CustomerRef, q HistoryQuery) (Page[LedgerEntry], error) {
	c, err := s.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return Page[LedgerEntry]{}, err
	}
	q.TenantID, q.CustomerID = c.TenantID, c.ID
	s.awaitPersisted(ctx, CustomerKeyOf(c))
	return s.ledger.History(ctx, q)
}

// MaxAsOfEntries bounds the ledger entries a balance at a past instant
// reads on one side of it (docs/limits.md): the walk goes from the first
// entry forwards or from the newest backwards, whichever ends within it.
const MaxAsOfEntries = 100_000

// ErrAsOfTooFar: both sides of the instant reservation more than MaxAsOfEntries
// entries of the customer's ledger.
var ErrAsOfTooFar = errors.New("engine: as_of is further than MaxAsOfEntries ledger entries from both ends")

// PastAccount is what LedgerReader.AccountAt reads: the figures of an
// account at a past instant (Balance, Reserved, Pending, LifetimeEarned and
// Debt, derived from the ledger, the reservations and the blocks) and the
// account's present identity (AccountID, Version, UpdatedAt: "" and zero
// when it has no account row).
type PastAccount struct {
	Balance, Reserved, Pending, LifetimeEarned, Debt int64
	AccountID                                        string
	Version                                          int64
	UpdatedAt                                        time.Time
}

// AccountAsOf answers GET .../credits?as_of=: the customer's balance,
// reserved and pending at instant at, from the Postgres ledger after the
// writes acknowledged before the call have reached it (docs/rules.md
// "Balance at a past instant"). The account's id, version and updated_at
// are today's, blocks is empty, credit_limit_mc is the current setting.
// Errors: 404; 422 naming as_of for an instant in the future or one
// further than MaxAsOfEntries entries from both ends of the ledger.
func (s *Credits) AccountAsOf(ctx context.Context, scope Scope, ref CustomerRef, at time.Time) (Account, error) {
	if at.After(s.clock.Now()) {
		return Account{}, Invalid("as_of", "as_of must not be in the future")
	}
	c, err := s.customers.Resolve(ctx, scope, ref, false)
	if err != nil {
		return Account{}, err
	}
	s.awaitPersisted(ctx, CustomerKeyOf(c))
	p, err := s.ledger.AccountAt(ctx, CustomerKeyOf(c), at, MaxAsOfEntries)
	if errors.Is(err, ErrAsOfTooFar) {
		return Account{}, Invalid("as_of", fmt.Sprintf(
			"as_of is more than %d ledger entries from both the customer's first and newest entry", MaxAsOfEntries))
	}
	if err != nil {
		return Account{}, err
	}
	at = at.UTC()
	return Account{ID: p.AccountID, TenantID: c.TenantID, CustomerID: c.ID, Environment: c.Environment,
		Balance: p.Balance, ReservedBalance: p.Reserved, PendingBalance: p.Pending,
		EffectiveBalance: p.Balance - p.Reserved - p.Pending, LifetimeEarned: p.LifetimeEarned, DebtMC: p.Debt,
		CreditLimitMC: c.CreditLimitMC, Version: p.Version, UpdatedAt: p.UpdatedAt, Blocks: []Block{}, AsOf: &at}, nil
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
	f, err := ParseOptionalTime("from", from, KindValidation)
	if err != nil {
		return rep, err
	}
	t, err := ParseOptionalTime("to", to, KindValidation)
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
	lines, err := s.ledger.Overage(ctx, CustomerKeyOf(c), *f, *t)
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

// ParseOptionalTime reads an optional instant parameter: "" is nil, else
// RFC 3339 (an error of kind naming field).
func ParseOptionalTime(field, v string, kind Kind) (*time.Time, error) {
	if v == "" {
		return nil, nil
	}
	t, err := ParseInstant(field, v, kind)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// HistoryQuery filters a customer's ledger. TenantID is the customer's
// tenant: the reader filters on it too, the shard key of a tenant-sharded
// Postgres (issue 30 item 2).
type HistoryQuery struct {
	TenantID          uuid.UUID
	CustomerID        uuid.UUID
	Type              *EntryType
	Source            *Source
	BillableMetricKey *string
	From, To          *time.Time
	Cursor            string
	Limit             int
}
