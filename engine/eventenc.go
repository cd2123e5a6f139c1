package engine

import (
	"strconv"
	"time"
)

// Every consume's credit.consumed event carries its delivered body, which
// encoding/json wrote by reflection on the persister's path (issue 10).
// appendEnvelopeJSON writes the same bytes by hand for the envelope and
// ConsumedData, and hands anything else (other data, a Sequence, a time
// outside RFC 3339's years) to encoding/json (TestAppendEnvelopeJSON
// holds the two to each other).

// appendEnvelopeJSON appends json.Marshal(env)'s bytes to b, and fails
// where json.Marshal fails.
func appendEnvelopeJSON(b []byte, env *Envelope) ([]byte, error) {
	if y := env.CreatedAt.Year(); env.Sequence != nil || y < 0 || y > 9999 {
		return appendMarshalled(b, env)
	}
	var err error
	b = AppendJSONUUID(append(b, `{"event_id":`...), env.EventID)
	b = append(b, `,"event_type":`...)
	b = AppendJSONString(b, string(env.EventType))
	b = AppendJSONUUID(append(b, `,"tenant_id":`...), env.TenantID)
	b = append(b, `,"environment":`...)
	b = AppendJSONString(b, string(env.Environment))
	b = append(b, `,"customer_id":`...)
	if env.CustomerID == nil {
		b = append(b, "null"...)
	} else {
		b = AppendJSONUUID(b, *env.CustomerID)
	}
	b = append(b, `,"external_customer_id":`...)
	if env.ExternalCustomerID == nil {
		b = append(b, "null"...)
	} else {
		b = AppendJSONString(b, *env.ExternalCustomerID)
	}
	b = append(b, `,"created_at":"`...)
	b = append(env.CreatedAt.AppendFormat(b, time.RFC3339Nano), '"')
	b = append(b, `,"idempotency_key":`...)
	b = AppendJSONString(b, env.IdempotencyKey)
	b = append(b, `,"version":`...)
	if env.Version == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *env.Version, 10)
	}
	b = append(b, `,"data":`...)
	if d, ok := env.Data.(ConsumedData); ok {
		return append(appendConsumedJSON(b, &d), '}'), nil
	}
	if b, err = appendMarshalled(b, env.Data); err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

// appendConsumedJSON appends json.Marshal(d)'s bytes to b.
func appendConsumedJSON(b []byte, d *ConsumedData) []byte {
	b = AppendJSONUUID(append(b, `{"transaction_id":`...), d.TransactionID)
	b = append(b, `,"billable_metric_key":`...)
	if d.BillableMetricKey == nil {
		b = append(b, "null"...)
	} else {
		b = AppendJSONString(b, *d.BillableMetricKey)
	}
	b = append(b, `,"units":`...)
	if d.Units == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *d.Units, 10)
	}
	b = AppendJSONInt(b, `,"credits":`, d.Credits)
	b = AppendJSONInt(b, `,"overage_mc":`, d.OverageMC)
	b = AppendJSONInt(b, `,"balance_after":`, d.BalanceAfter)
	b = append(b, `,"reservation_id":`...)
	if d.ReservationID == nil {
		b = append(b, "null"...)
	} else {
		b = AppendJSONUUID(b, *d.ReservationID)
	}
	if len(d.Items) > 0 {
		b = append(b, `,"items":[`...)
		for i := range d.Items {
			it := &d.Items[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"billable_metric_key":`...)
			b = AppendJSONString(b, it.BillableMetricKey)
			b = AppendJSONInt(b, `,"units":`, it.Units)
			b = append(AppendJSONInt(b, `,"cost":`, it.Cost), '}')
		}
		b = append(b, ']')
	}
	return append(b, '}')
}
