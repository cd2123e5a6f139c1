package export

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/creditd/creditd/engine"
)

// LedgerRow is a ledger entry as the files hold it: what GET
// /v1/customers/{id}/credits/history shows of it (docs/spec/interface.md,
// Ledger entry), ids as text, instants as UTC microseconds, metadata and
// draws as JSON text.
type LedgerRow struct {
	ID                string  `parquet:"id"`
	TenantID          string  `parquet:"tenant_id"`
	CustomerID        string  `parquet:"customer_id"`
	Environment       string  `parquet:"environment"`
	Delta             int64   `parquet:"delta"`
	Type              string  `parquet:"type"`
	Source            *string `parquet:"source,optional"`
	CreditBlockID     *string `parquet:"credit_block_id,optional"`
	BillableMetricKey *string `parquet:"billable_metric_key,optional"`
	CostUnits         *int64  `parquet:"cost_units,optional"`
	ExchangeRate      *int64  `parquet:"exchange_rate,optional"`
	IdempotencyKey    string  `parquet:"idempotency_key"`
	ReferenceID       *string `parquet:"reference_id,optional"`
	Reason            *string `parquet:"reason,optional"`
	Metadata          string  `parquet:"metadata"`
	CreatedAt         int64   `parquet:"created_at,timestamp(microsecond)"`
	Draws             *string `parquet:"draws,optional"`
}

// ledgerColumns document LedgerRow (schema.json), in its order.
var ledgerColumns = []Column{
	{"id", "string (uuid)", false, "the entry's id"},
	{"tenant_id", "string (uuid)", false, "the tenant"},
	{"customer_id", "string (uuid)", false, "the customer"},
	{"environment", "string", false, "live or sandbox"},
	{"delta", "int64", false, "millicredits; positive credits the balance, negative debits it"},
	{"type", "string", false, "entry type (grant, consumption, expiry, adjustment, ...)"},
	{"source", "string", true, "credit source of a block's entry"},
	{"credit_block_id", "string (uuid)", true, "the block, when one block took the entry"},
	{"billable_metric_key", "string", true, "the metric of a consumption"},
	{"cost_units", "int64", true, "units consumed"},
	{"exchange_rate", "int64", true, "millicredits per unit"},
	{"idempotency_key", "string", false, "the operation's key; empty when it had none"},
	{"reference_id", "string (uuid)", true, "the reservation or operation the entry refers to"},
	{"reason", "string", true, "reason given with a grant or adjustment"},
	{"metadata", "string (JSON object)", false, "the entry's metadata"},
	{"created_at", "timestamp (microsecond, UTC)", false, "when the operation happened"},
	{"draws", "string (JSON array)", true, "[{credit_block_id, amount}] when several blocks paid one debit"},
}

// EventRow is an event as the files hold it: the webhook event resource
// (docs/spec/interface.md, Webhook event) without its delivery attempts,
// with its sequence and account version.
type EventRow struct {
	ID          string  `parquet:"id"`
	Sequence    int64   `parquet:"sequence"`
	EventType   string  `parquet:"event_type"`
	Environment string  `parquet:"environment"`
	CustomerID  *string `parquet:"customer_id,optional"`
	Version     *int64  `parquet:"account_version,optional"`
	Status      string  `parquet:"status"`
	Attempts    int64   `parquet:"attempts"`
	CreatedAt   int64   `parquet:"created_at,timestamp(microsecond)"`
	DeliveredAt *int64  `parquet:"delivered_at,optional,timestamp(microsecond)"`
	Payload     string  `parquet:"payload"`
}

// eventColumns document EventRow (schema.json), in its order.
var eventColumns = []Column{
	{"id", "string (uuid)", false, "the event's id (the webhook-id header)"},
	{"sequence", "int64", false, "its place among the tenant's events, 1, 2, 3, ... with no gap"},
	{"event_type", "string", false, "credit.consumed, credit.granted, ..."},
	{"environment", "string", false, "live or sandbox"},
	{"customer_id", "string (uuid)", true, "the customer, when the event is a customer's"},
	{"account_version", "int64", true, "the customer's account version after the operation"},
	{"status", "string", false, "delivery status when exported: pending, delivered, failed, dead_letter"},
	{"attempts", "int64", false, "delivery attempts so far"},
	{"created_at", "timestamp (microsecond, UTC)", false, "when the event was emitted"},
	{"delivered_at", "timestamp (microsecond, UTC)", true, "when it was delivered"},
	{"payload", "string (JSON object)", false, "the exact body delivered"},
}

func ledgerRowOf(e engine.LedgerEntry) LedgerRow {
	r := LedgerRow{ID: e.ID.String(), TenantID: e.TenantID.String(), CustomerID: e.CustomerID.String(),
		Environment: string(e.Environment), Delta: e.Delta, Type: string(e.Type),
		BillableMetricKey: e.BillableMetricKey, CostUnits: e.CostUnits, ExchangeRate: e.ExchangeRate,
		IdempotencyKey: e.IdempotencyKey, Reason: e.Reason, Metadata: "{}", CreatedAt: e.CreatedAt.UnixMicro()}
	if e.Source != nil {
		s := string(*e.Source)
		r.Source = &s
	}
	if e.CreditBlockID != nil {
		s := e.CreditBlockID.String()
		r.CreditBlockID = &s
	}
	if e.ReferenceID != nil {
		s := e.ReferenceID.String()
		r.ReferenceID = &s
	}
	if len(e.Metadata) > 0 {
		if b, err := json.Marshal(e.Metadata); err == nil {
			r.Metadata = string(b)
		}
	}
	if len(e.Draws) > 0 {
		if b, err := json.Marshal(e.Draws); err == nil {
			s := string(b)
			r.Draws = &s
		}
	}
	return r
}

func eventRowOf(e engine.Event) EventRow {
	r := EventRow{ID: e.ID.String(), EventType: string(e.EventType), Environment: string(e.Environment),
		Version: e.Version, Status: string(e.Status), Attempts: int64(e.Attempts), CreatedAt: e.CreatedAt.UnixMicro(),
		Payload: string(e.Payload)}
	if e.Sequence != nil {
		r.Sequence = *e.Sequence
	}
	if e.CustomerID != nil {
		s := e.CustomerID.String()
		r.CustomerID = &s
	}
	if e.DeliveredAt != nil {
		us := e.DeliveredAt.UnixMicro()
		r.DeliveredAt = &us
	}
	return r
}

// sink is one file's writer of rows.
type sink interface {
	add(row any) error
	close() error
}

// RowGroupRows bounds a Parquet row group (what the writer buffers before
// it writes), so a month of any size is written in bounded memory.
const RowGroupRows = 8192

func newSink(format Format, table string, w io.Writer) (sink, error) {
	switch format {
	case FormatParquet:
		switch table {
		case "ledger_entries":
			return &parquetSink[LedgerRow]{w: parquet.NewGenericWriter[LedgerRow](w, parquet.MaxRowsPerRowGroup(RowGroupRows))}, nil
		case "events":
			return &parquetSink[EventRow]{w: parquet.NewGenericWriter[EventRow](w, parquet.MaxRowsPerRowGroup(RowGroupRows))}, nil
		}
	case FormatCSV:
		cols := ledgerColumns
		if table == "events" {
			cols = eventColumns
		}
		c := &csvSink{w: csv.NewWriter(w)}
		header := make([]string, len(cols))
		for i, col := range cols {
			header[i] = col.Name
		}
		return c, c.w.Write(header)
	}
	return nil, fmt.Errorf("export: no %s writer for %s", format, table)
}

// parquetSink buffers a few rows per Write call.
type parquetSink[T any] struct {
	w   *parquet.GenericWriter[T]
	buf []T
}

func (p *parquetSink[T]) add(row any) error {
	p.buf = append(p.buf, row.(T))
	if len(p.buf) < 256 {
		return nil
	}
	return p.flush()
}

func (p *parquetSink[T]) flush() error {
	if len(p.buf) == 0 {
		return nil
	}
	_, err := p.w.Write(p.buf)
	p.buf = p.buf[:0]
	return err
}

func (p *parquetSink[T]) close() error {
	if err := p.flush(); err != nil {
		return err
	}
	return p.w.Close()
}

// csvSink writes RFC 4180 CSV with a header; a null is an empty field, an
// instant RFC 3339 with microseconds, UTC.
type csvSink struct{ w *csv.Writer }

func (c *csvSink) add(row any) error {
	switch r := row.(type) {
	case LedgerRow:
		return c.w.Write([]string{r.ID, r.TenantID, r.CustomerID, r.Environment, strconv.FormatInt(r.Delta, 10), r.Type,
			text(r.Source), text(r.CreditBlockID), text(r.BillableMetricKey), number(r.CostUnits), number(r.ExchangeRate),
			r.IdempotencyKey, text(r.ReferenceID), text(r.Reason), r.Metadata, instant(r.CreatedAt), text(r.Draws)})
	case EventRow:
		var delivered string
		if r.DeliveredAt != nil {
			delivered = instant(*r.DeliveredAt)
		}
		return c.w.Write([]string{r.ID, strconv.FormatInt(r.Sequence, 10), r.EventType, r.Environment, text(r.CustomerID),
			number(r.Version), r.Status, strconv.FormatInt(r.Attempts, 10), instant(r.CreatedAt), delivered, r.Payload})
	}
	return fmt.Errorf("export: no CSV row for %T", row)
}

func (c *csvSink) close() error {
	c.w.Flush()
	return c.w.Error()
}

func text(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func number(n *int64) string {
	if n == nil {
		return ""
	}
	return strconv.FormatInt(*n, 10)
}

func instant(us int64) string {
	return time.UnixMicro(us).UTC().Format("2006-01-02T15:04:05.000000Z07:00")
}
