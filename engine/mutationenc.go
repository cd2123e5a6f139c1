package engine

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/google/uuid"
)

// The persister stores every Mutation as a jsonb document (the operations
// table), which encoding/json wrote by reflection: a few microseconds of
// creditd's CPU per consume (issue 10). AppendMutationJSON writes the same
// bytes by hand. What it does not write itself it hands to encoding/json
// piece by piece: a string that needs escaping, metadata (which
// encoding/json compacts and checks), a reservation or a gauge; so it
// never has to mirror encoding/json's escaping rules, only its member
// order and omissions (TestAppendMutationJSONMatchesMarshal holds the two
// to each other).

// AppendMutationJSON appends json.Marshal(m)'s bytes to dst, and fails
// where json.Marshal fails.
func AppendMutationJSON(dst []byte, m *Mutation) ([]byte, error) {
	var err error
	b := append(dst, `{"op":`...)
	b = AppendJSONUUID(b, m.OpID)
	b = append(b, `,"kind":`...)
	b = AppendJSONString(b, string(m.Kind))
	b = append(b, `,"tenant":`...)
	b = AppendJSONUUID(b, m.TenantID)
	b = append(b, `,"customer":`...)
	b = AppendJSONUUID(b, m.CustomerID)
	b = append(b, `,"env":`...)
	b = AppendJSONString(b, string(m.Environment))
	b = append(b, `,"idem":`...)
	b = AppendJSONString(b, m.IdempotencyKey)
	b = append(b, `,"rh":`...)
	b = AppendJSONString(b, m.RequestHash)
	b = append(b, `,"at":`...)
	b = strconv.AppendInt(b, m.AtMS, 10)
	b = append(b, `,"account":{"id":`...)
	a := &m.Account
	b = AppendJSONString(b, a.ID)
	b = AppendJSONInt(b, `,"version":`, a.Version)
	b = AppendJSONInt(b, `,"balance":`, a.Balance)
	b = AppendJSONInt(b, `,"reserved":`, a.Reserved)
	b = AppendJSONInt(b, `,"pending":`, a.Pending)
	b = AppendJSONInt(b, `,"lifetime_earned":`, a.LifetimeEarned)
	if a.Debt != 0 {
		b = AppendJSONInt(b, `,"debt":`, a.Debt)
	}
	b = append(b, `},"entries":`...)
	if m.Entries == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range m.Entries {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendEntryJSON(b, &m.Entries[i]); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	}
	b = append(b, `,"blocks":`...)
	if m.Blocks == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range m.Blocks {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendBlockJSON(b, &m.Blocks[i]); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	}
	if c := m.Context; c != nil {
		b = AppendMutationContextJSON(append(b, `,"ctx":`...), c)
	}
	if m.EffectiveBefore != nil {
		b = AppendJSONInt(b, `,"eb":`, *m.EffectiveBefore)
	}
	if u := m.Usage; u != nil {
		b = appendUsageJSON(b, u)
	}
	if m.Reservation != nil {
		if b, err = appendMarshalled(append(b, `,"res":`...), m.Reservation); err != nil {
			return nil, err
		}
	}
	if m.Gauge != nil {
		if b, err = appendMarshalled(append(b, `,"gauge":`...), m.Gauge); err != nil {
			return nil, err
		}
	}
	if m.Budget != nil {
		if b, err = appendMarshalled(append(b, `,"budget":`...), m.Budget); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

func appendEntryJSON(b []byte, e *MutationEntry) ([]byte, error) {
	var err error
	b = append(b, `{"role":`...)
	b = AppendJSONString(b, string(e.Role))
	b = AppendJSONInt(b, `,"delta":`, e.Delta)
	b = append(b, `,"type":`...)
	b = AppendJSONString(b, string(e.Type))
	b = append(b, `,"source":`...)
	if e.Source == nil {
		b = append(b, "null"...)
	} else {
		b = AppendJSONString(b, string(*e.Source))
	}
	b = append(b, `,"block":`...)
	if e.BlockID == nil {
		b = append(b, "null"...)
	} else {
		b = AppendJSONUUID(b, *e.BlockID)
	}
	if e.Metric != nil {
		b = append(b, `,"metric":`...)
		b = AppendJSONString(b, *e.Metric)
	}
	if e.Units != nil {
		b = AppendJSONInt(b, `,"units":`, *e.Units)
	}
	if e.Rate != nil {
		b = AppendJSONInt(b, `,"rate":`, *e.Rate)
	}
	if e.Ref != nil {
		b = AppendJSONUUID(append(b, `,"ref":`...), *e.Ref)
	}
	if e.Overage != nil {
		b = AppendJSONInt(b, `,"overage":`, *e.Overage)
	}
	if e.Reason != nil {
		b = append(b, `,"reason":`...)
		b = AppendJSONString(b, *e.Reason)
	}
	if len(e.Metadata) > 0 {
		if b, err = appendMarshalled(append(b, `,"meta":`...), e.Metadata); err != nil {
			return nil, err
		}
	}
	if len(e.Draws) > 0 {
		b = append(b, `,"draws":[`...)
		for i, d := range e.Draws {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendJSONUUID(append(b, `{"b":`...), d.BlockID)
			b = append(AppendJSONInt(b, `,"d":`, d.Amount), '}')
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

func appendBlockJSON(b []byte, k *MutationBlock) ([]byte, error) {
	var err error
	b = AppendJSONUUID(append(b, `{"id":`...), k.ID)
	b = AppendJSONInt(b, `,"original":`, k.Original)
	b = AppendJSONInt(b, `,"remaining":`, k.Remaining)
	b = AppendJSONInt(b, `,"priority":`, int64(k.Priority))
	b = append(b, `,"source":`...)
	b = AppendJSONString(b, string(k.Source))
	b = AppendJSONInt(b, `,"starts":`, k.StartsMS)
	b = append(b, `,"expires":`...)
	if k.ExpiresMS == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *k.ExpiresMS, 10)
	}
	b = AppendJSONInt(b, `,"created":`, k.CreatedMS)
	if len(k.Metadata) > 0 {
		if b, err = appendMarshalled(append(b, `,"meta":`...), k.Metadata); err != nil {
			return nil, err
		}
	}
	if len(k.Scope) > 0 {
		b = append(b, `,"scope":[`...)
		for i, s := range k.Scope {
			if i > 0 {
				b = append(b, ',')
			}
			b = AppendJSONString(b, s)
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

func appendUsageJSON(b []byte, u *MutationUsage) []byte {
	b = append(b, `,"usage":{"metric":`...)
	b = AppendJSONString(b, u.Metric)
	b = AppendJSONInt(b, `,"units":`, u.Units)
	b = AppendJSONInt(b, `,"cost":`, u.Cost)
	b = AppendJSONInt(b, `,"charged":`, u.Charged)
	b = AppendJSONInt(b, `,"overage":`, u.Overage)
	if u.Pool != 0 {
		b = AppendJSONInt(b, `,"pool":`, u.Pool)
	}
	if u.Refused {
		b = append(b, `,"refused":true`...)
	}
	if u.ReservationID != nil {
		b = AppendJSONUUID(append(b, `,"reservation":`...), *u.ReservationID)
	}
	if len(u.Items) > 0 {
		b = append(b, `,"items":[`...)
		for i := range u.Items {
			it := &u.Items[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"billable_metric_key":`...)
			b = AppendJSONString(b, it.Metric)
			b = AppendJSONInt(b, `,"units":`, it.Units)
			b = append(AppendJSONInt(b, `,"cost":`, it.Cost), '}')
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// AppendMutationContextJSON appends json.Marshal(c)'s bytes to b (a
// MutationContext always marshals): a Mutation's "ctx" member, and the
// ctx argument of every money script (lua/argv.go newHotHead).
func AppendMutationContextJSON(b []byte, c *MutationContext) []byte {
	b = append(b, `{"ext":`...)
	b = AppendJSONString(b, c.ExternalID)
	b = AppendJSONInt(b, `,"th":`, c.ThresholdMC)
	if c.Policy != "" {
		b = append(b, `,"policy":`...)
		b = AppendJSONString(b, string(c.Policy))
	}
	if c.LimitMC != 0 {
		b = AppendJSONInt(b, `,"lim":`, c.LimitMC)
	}
	if c.BudgetArg != "" {
		b = append(b, `,"bud":`...)
		b = AppendJSONString(b, c.BudgetArg)
	}
	if c.Emitter != "" {
		b = append(b, `,"emitter":`...)
		b = AppendJSONString(b, c.Emitter)
	}
	return append(b, '}')
}

// AppendJSONInt appends name (the member's key text, e.g. `,"units":`)
// and n: the one integer-member writer of the hand-written JSON encoders
// (here, the event bodies and the API's hot answers).
func AppendJSONInt(b []byte, name string, n int64) []byte {
	return strconv.AppendInt(append(b, name...), n, 10)
}

// AppendJSONUUID writes id as encoding/json does (its MarshalText, quoted).
func AppendJSONUUID(b []byte, id uuid.UUID) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i, c := range id {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b = append(b, '-')
		}
		b = append(b, hex[c>>4], hex[c&0x0f])
	}
	return append(b, '"')
}

// AppendJSONString writes s quoted: as it is when no byte of it needs
// escaping (printable ASCII other than the quote, the backslash and the
// three encoding/json escapes for HTML), else as encoding/json writes it.
func AppendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			text, _ := json.Marshal(s) // a string always marshals
			return append(b, text...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendMarshalled appends json.Marshal(v).
func appendMarshalled(b []byte, v any) ([]byte, error) {
	text, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, text...), nil
}
