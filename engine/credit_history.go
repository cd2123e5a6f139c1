// Credit history and overage: the ledger of a customer read from Postgres, by
// page and by period.

package engine

import (
	"context"
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

// HistoryQuery filters a customer's ledger.
type HistoryQuery struct {
	CustomerID        uuid.UUID
	Type              *EntryType
	Source            *Source
	BillableMetricKey *string
	From, To          *time.Time
	Cursor            string
	Limit             int
}
