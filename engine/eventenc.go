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
	b = appendUUIDJSON(append(b, `{"event_id":`...), env.EventID)
	b = append(b, `,"event_type":`...)
	if b, err = appendStringJSON(b, string(env.EventType)); err != nil {
		return nil, err
	}
	b = appendUUIDJSON(append(b, `,"tenant_id":`...), env.TenantID)
	b = append(b, `,"environment":`...)
	if b, err = appendStringJSON(b, string(env.Environment)); err != nil {
		return nil, err
	}
	b = append(b, `,"customer_id":`...)
	if env.CustomerID == nil {
		b = append(b, "null"...)
	} else {
		b = appendUUIDJSON(b, *env.CustomerID)
	}
	b = append(b, `,"external_customer_id":`...)
	if env.ExternalCustomerID == nil {
		b = append(b, "null"...)
	} else if b, err = appendStringJSON(b, *env.ExternalCustomerID); err != nil {
		return nil, err
	}
	b = append(b, `,"created_at":"`...)
	b = append(env.CreatedAt.AppendFormat(b, time.RFC3339Nano), '"')
	b = append(b, `,"idempotency_key":`...)
	if b, err = appendStringJSON(b, env.IdempotencyKey); err != nil {
		return nil, err
	}
	b = append(b, `,"version":`...)
	if env.Version == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *env.Version, 10)
	}
	b = append(b, `,"data":`...)
	if d, ok := env.Data.(ConsumedData); ok {
		b, err = appendConsumedJSON(b, &d)
	} else {
		b, err = appendMarshalled(b, env.Data)
	}
	if err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

// appendConsumedJSON appends json.Marshal(d)'s bytes to b.
func appendConsumedJSON(b []byte, d *ConsumedData) ([]byte, error) {
	var err error
	b = appendUUIDJSON(append(b, `{"transaction_id":`...), d.TransactionID)
	b = append(b, `,"billable_metric_key":`...)
	if d.BillableMetricKey == nil {
		b = append(b, "null"...)
	} else if b, err = appendStringJSON(b, *d.BillableMetricKey); err != nil {
		return nil, err
	}
	b = append(b, `,"units":`...)
	if d.Units == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *d.Units, 10)
	}
	b = appendIntMember(b, `,"credits":`, d.Credits)
	b = appendIntMember(b, `,"overage_mc":`, d.OverageMC)
	b = appendIntMember(b, `,"balance_after":`, d.BalanceAfter)
	b = append(b, `,"reservation_id":`...)
	if d.ReservationID == nil {
		b = append(b, "null"...)
	} else {
		b = appendUUIDJSON(b, *d.ReservationID)
	}
	if len(d.Items) > 0 {
		b = append(b, `,"items":[`...)
		for i := range d.Items {
			it := &d.Items[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"billable_metric_key":`...)
			if b, err = appendStringJSON(b, it.BillableMetricKey); err != nil {
				return nil, err
			}
			b = appendIntMember(b, `,"units":`, it.Units)
			b = append(appendIntMember(b, `,"cost":`, it.Cost), '}')
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}
