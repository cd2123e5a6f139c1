package api

import (
	"encoding/json"
	"strconv"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// The hot routes' bodies are written by appending, not by encoding/json's
// reflection: the bytes are the same as json.NewEncoder(w).Encode(v) would
// write (field order, omitempty, HTML escaping, the trailing newline), which
// TestAppendMatchesEncoder holds them to.

// bytesOut writes body, built in the call's scratch buffer, with status. The
// body is copied (into the response's pooled buffer): fasthttp writes it
// after the call went back to the pool.
func (c *call) bytesOut(status int, body []byte) error {
	c.ctx.Response.SetBody(body)
	c.ctx.SetStatusCode(status)
	c.ctx.Response.Header.SetContentTypeBytes(contentJSON)
	return nil
}

// check writes a check result: appended when it carries no config (whose
// raw JSON encoding/json compacts and escapes), else through json.
func (c *call) check(res *engine.CheckResult) error {
	if res.Config != nil {
		v := *res // a copy, so res itself stays on the handler's stack
		return c.json(200, &v)
	}
	c.out = appendCheck(c.out[:0], res)
	return c.bytesOut(200, c.out)
}

// consumed writes a consume result.
func (c *call) consumed(res *engine.ConsumeResult) error {
	c.out = appendConsume(c.out[:0], res)
	return c.bytesOut(200, c.out)
}

func appendCheck(b []byte, r *engine.CheckResult) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, string(r.Type))
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, r.Allowed)
	b = append(b, `,"customer_id":`...)
	b = appendUUID(b, r.CustomerID)
	b = append(b, `,"billable_metric_key":`...)
	b = appendString(b, r.BillableMetricKey)
	b = appendOptInt(b, `,"units":`, r.Units)
	b = appendOptInt(b, `,"balance":`, r.Balance)
	b = appendOptInt(b, `,"reserved_balance":`, r.ReservedBalance)
	b = appendOptInt(b, `,"pending_balance":`, r.PendingBalance)
	b = appendOptInt(b, `,"effective_balance":`, r.EffectiveBalance)
	b = appendOptInt(b, `,"estimated_cost":`, r.EstimatedCost)
	b = appendOptInt(b, `,"balance_after":`, r.BalanceAfter)
	if r.Enabled != nil {
		b = append(b, `,"enabled":`...)
		b = strconv.AppendBool(b, *r.Enabled)
	}
	b = appendOptInt(b, `,"current":`, r.Current)
	b = appendOptInt(b, `,"cap":`, r.Cap)
	b = appendOptInt(b, `,"headroom":`, r.Headroom)
	b = append(b, `,"subscription_status":`...)
	b = appendStringOrNull(b, r.SubscriptionStatus)
	if r.OveragePolicy != nil {
		b = append(b, `,"overage_policy":`...)
		b = appendString(b, string(*r.OveragePolicy))
	}
	return append(b, "}\n"...)
}

func appendConsume(b []byte, r *engine.ConsumeResult) []byte {
	b = append(b, `{"transaction_id":`...)
	if r.TransactionID == nil {
		b = append(b, "null"...)
	} else {
		b = appendUUID(b, *r.TransactionID)
	}
	b = append(b, `,"customer_id":`...)
	b = appendUUID(b, r.CustomerID)
	b = append(b, `,"billable_metric_key":`...)
	b = appendString(b, r.BillableMetricKey)
	b = appendInt(b, `,"units":`, r.Units)
	b = appendInt(b, `,"cost":`, r.Cost)
	b = appendInt(b, `,"charged":`, r.Charged)
	b = appendInt(b, `,"overage_mc":`, r.OverageMC)
	b = appendInt(b, `,"balance_after":`, r.BalanceAfter)
	b = appendInt(b, `,"effective_balance":`, r.EffectiveBalance)
	b = append(b, `,"reason":`...)
	b = appendStringOrNull(b, r.Reason)
	if len(r.Items) > 0 {
		b = append(b, `,"items":[`...)
		for i, it := range r.Items {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"billable_metric_key":`...)
			b = appendString(b, it.BillableMetricKey)
			b = appendInt(b, `,"units":`, it.Units)
			b = appendInt(b, `,"cost":`, it.Cost)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, "}\n"...)
}

func appendInt(b []byte, name string, v int64) []byte {
	b = append(b, name...)
	return strconv.AppendInt(b, v, 10)
}

func appendOptInt(b []byte, name string, v *int64) []byte {
	if v == nil {
		return b
	}
	return appendInt(b, name, *v)
}

// appendUUID writes u quoted in its canonical form.
func appendUUID(b []byte, u uuid.UUID) []byte {
	const digits = "0123456789abcdef"
	b = append(b, '"')
	for i, x := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, digits[x>>4], digits[x&0xf])
	}
	return append(b, '"')
}

// appendString writes s as a JSON string the way encoding/json does; text
// outside plain printable ASCII (or with <, >, &) goes through json itself.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch < ' ' || ch > '~' || ch == '"' || ch == '\\' || ch == '<' || ch == '>' || ch == '&' {
			return appendStringSlow(b, s)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendStringOrNull writes *s as a JSON string, null when s is nil.
func appendStringOrNull(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return appendString(b, *s)
}

func appendStringSlow(b []byte, s string) []byte {
	enc, err := json.Marshal(s)
	if err != nil {
		return append(b, `""`...)
	}
	return append(b, enc...)
}
