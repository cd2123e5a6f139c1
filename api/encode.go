package api

import (
	"strconv"
	"time"

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
	b = engine.AppendJSONString(b, string(r.Type))
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, r.Allowed)
	b = append(b, `,"customer_id":`...)
	b = engine.AppendJSONUUID(b, r.CustomerID)
	b = append(b, `,"billable_metric_key":`...)
	b = engine.AppendJSONString(b, r.BillableMetricKey)
	b = appendOptInt(b, `,"units":`, r.Units)
	b = appendOptInt(b, `,"balance":`, r.Balance)
	b = appendOptInt(b, `,"reserved_balance":`, r.ReservedBalance)
	b = appendOptInt(b, `,"pending_balance":`, r.PendingBalance)
	b = appendOptInt(b, `,"effective_balance":`, r.EffectiveBalance)
	b = appendOptInt(b, `,"credit_limit_mc":`, r.CreditLimitMC)
	b = appendOptInt(b, `,"available_mc":`, r.AvailableMC)
	b = appendOptInt(b, `,"budget_remaining_mc":`, r.BudgetRemainingMC)
	b = appendOptInt(b, `,"pool_available_mc":`, r.PoolAvailableMC)
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
		b = engine.AppendJSONString(b, string(*r.OveragePolicy))
	}
	return append(b, "}\n"...)
}

func appendConsume(b []byte, r *engine.ConsumeResult) []byte {
	b = append(b, `{"transaction_id":`...)
	if r.TransactionID == nil {
		b = append(b, "null"...)
	} else {
		b = engine.AppendJSONUUID(b, *r.TransactionID)
	}
	b = append(b, `,"customer_id":`...)
	b = engine.AppendJSONUUID(b, r.CustomerID)
	b = append(b, `,"billable_metric_key":`...)
	b = appendStringOrNull(b, r.BillableMetricKey)
	if r.Units == nil {
		b = append(b, `,"units":null`...)
	} else {
		b = engine.AppendJSONInt(b, `,"units":`, *r.Units)
	}
	b = engine.AppendJSONInt(b, `,"cost":`, r.Cost)
	b = engine.AppendJSONInt(b, `,"charged":`, r.Charged)
	b = engine.AppendJSONInt(b, `,"overage_mc":`, r.OverageMC)
	if r.PoolMC != 0 {
		b = engine.AppendJSONInt(b, `,"pool_mc":`, r.PoolMC)
	}
	b = engine.AppendJSONInt(b, `,"balance_after":`, r.BalanceAfter)
	b = engine.AppendJSONInt(b, `,"effective_balance":`, r.EffectiveBalance)
	b = append(b, `,"reason":`...)
	b = appendStringOrNull(b, r.Reason)
	if len(r.Items) > 0 {
		b = append(b, `,"items":[`...)
		for i, it := range r.Items {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"billable_metric_key":`...)
			b = engine.AppendJSONString(b, it.BillableMetricKey)
			b = engine.AppendJSONInt(b, `,"units":`, it.Units)
			b = engine.AppendJSONInt(b, `,"cost":`, it.Cost)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	if r.Dry {
		b = append(b, `,"dry_run":true,"draws":[`...)
		for i, d := range r.Draws {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"credit_block_id":`...)
			b = engine.AppendJSONUUID(b, d.BlockID)
			b = engine.AppendJSONInt(b, `,"amount":`, d.Amount)
			b = append(b, '}')
		}
		b = append(b, `],"events":[`...)
		for i, e := range r.Events {
			if i > 0 {
				b = append(b, ',')
			}
			b = engine.AppendJSONString(b, string(e))
		}
		b = append(b, ']')
	}
	return append(b, "}\n"...)
}

func appendOptInt(b []byte, name string, v *int64) []byte {
	if v == nil {
		return b
	}
	return engine.AppendJSONInt(b, name, *v)
}

// appendStringOrNull writes *s as a JSON string, null when s is nil.
func appendStringOrNull(b []byte, s *string) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return engine.AppendJSONString(b, *s)
}

// appended writes res with status: appended by appendTo when plain (the
// route's common answer), else through json (what the appender does not
// write: metadata and items, whose raw JSON encoding/json compacts and
// escapes, or a lease).
func appended[T any](c *call, status int, res *T, plain bool, appendTo func([]byte, *T) []byte) error {
	if !plain {
		return c.json(status, res)
	}
	c.out = appendTo(c.out[:0], res)
	return c.bytesOut(status, c.out)
}

func appendReserve(b []byte, r *engine.ReserveResult) []byte {
	b = append(b, `{"id":`...)
	b = engine.AppendJSONUUID(b, r.ID)
	b = append(b, `,"customer_id":`...)
	b = engine.AppendJSONUUID(b, r.CustomerID)
	b = append(b, `,"billable_metric_key":`...)
	b = engine.AppendJSONString(b, r.BillableMetricKey)
	b = engine.AppendJSONInt(b, `,"estimated_units":`, r.EstimatedUnits)
	b = engine.AppendJSONInt(b, `,"estimated_cost":`, r.EstimatedCost)
	b = append(b, `,"environment":`...)
	b = engine.AppendJSONString(b, string(r.Environment))
	b = append(b, `,"status":`...)
	b = engine.AppendJSONString(b, string(r.Status))
	b = appendJSONTime(append(b, `,"expires_at":`...), r.ExpiresAt)
	b = appendReservationAccount(append(b, `,"account":`...), &r.Account)
	// Only empty metadata comes here (appended's plain): a reservation
	// made without any has an empty object, not null.
	if r.Metadata == nil {
		b = append(b, `,"metadata":null`...)
	} else {
		b = append(b, `,"metadata":{}`...)
	}
	b = appendJSONTime(append(b, `,"created_at":`...), r.CreatedAt)
	return append(b, "}\n"...)
}

func appendCommit(b []byte, r *engine.CommitResult) []byte {
	b = append(b, `{"reservation_id":`...)
	b = engine.AppendJSONUUID(b, r.ReservationID)
	b = append(b, `,"status":`...)
	b = engine.AppendJSONString(b, string(r.Status))
	b = engine.AppendJSONInt(b, `,"estimated_units":`, r.EstimatedUnits)
	b = engine.AppendJSONInt(b, `,"actual_units":`, r.ActualUnits)
	b = engine.AppendJSONInt(b, `,"estimated_cost":`, r.EstimatedCost)
	b = engine.AppendJSONInt(b, `,"actual_cost":`, r.ActualCost)
	b = engine.AppendJSONInt(b, `,"released":`, r.Released)
	tx := &r.Transaction
	b = append(b, `,"transaction":{"id":`...)
	b = engine.AppendJSONUUID(b, tx.ID)
	if tx.CustomerID != nil {
		b = engine.AppendJSONUUID(append(b, `,"customer_id":`...), *tx.CustomerID)
	}
	b = engine.AppendJSONInt(b, `,"delta":`, tx.Delta)
	b = append(b, `,"type":`...)
	b = engine.AppendJSONString(b, string(tx.Type))
	if tx.BillableMetricKey != nil {
		b = engine.AppendJSONString(append(b, `,"billable_metric_key":`...), *tx.BillableMetricKey)
	}
	if tx.CostUnits != nil {
		b = engine.AppendJSONInt(b, `,"cost_units":`, *tx.CostUnits)
	}
	if tx.ReferenceID != nil {
		b = engine.AppendJSONUUID(append(b, `,"reference_id":`...), *tx.ReferenceID)
	}
	b = appendJSONTime(append(b, `,"created_at":`...), tx.CreatedAt)
	b = appendReservationAccount(append(b, `},"account":`...), &r.Account)
	b = engine.AppendJSONInt(b, `,"settled_units":`, r.SettledUnits)
	b = engine.AppendJSONInt(b, `,"settled_cost":`, r.SettledCost)
	b = engine.AppendJSONInt(b, `,"remaining_cost":`, r.RemainingCost)
	return append(b, "}\n"...)
}

func appendReservationAccount(b []byte, a *engine.ReservationAccount) []byte {
	b = engine.AppendJSONInt(b, `{"balance":`, a.Balance)
	b = engine.AppendJSONInt(b, `,"reserved_balance":`, a.ReservedBalance)
	b = engine.AppendJSONInt(b, `,"effective_balance":`, a.EffectiveBalance)
	return append(b, '}')
}

// appendJSONTime writes t as time.Time's MarshalJSON does (RFC 3339 with
// nanoseconds, quoted); the routes' times are the service clock's, inside
// the years MarshalJSON accepts.
func appendJSONTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}

func appendGauge(b []byte, r *engine.GaugeResult) []byte {
	b = append(b, `{"billable_metric_key":`...)
	b = engine.AppendJSONString(b, r.BillableMetricKey)
	b = engine.AppendJSONInt(b, `,"current":`, r.Current)
	b = engine.AppendJSONInt(b, `,"cap":`, r.Cap)
	b = strconv.AppendBool(append(b, `,"allowed":`...), r.Allowed)
	b = engine.AppendJSONInt(b, `,"headroom":`, r.Headroom)
	return append(b, "}\n"...)
}
