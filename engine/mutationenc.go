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
	b = appendUUIDJSON(b, m.OpID)
	b = append(b, `,"kind":`...)
	if b, err = appendStringJSON(b, string(m.Kind)); err != nil {
		return nil, err
	}
	b = append(b, `,"tenant":`...)
	b = appendUUIDJSON(b, m.TenantID)
	b = append(b, `,"customer":`...)
	b = appendUUIDJSON(b, m.CustomerID)
	b = append(b, `,"env":`...)
	if b, err = appendStringJSON(b, string(m.Environment)); err != nil {
		return nil, err
	}
	b = append(b, `,"idem":`...)
	if b, err = appendStringJSON(b, m.IdempotencyKey); err != nil {
		return nil, err
	}
	b = append(b, `,"rh":`...)
	if b, err = appendStringJSON(b, m.RequestHash); err != nil {
		return nil, err
	}
	b = append(b, `,"at":`...)
	b = strconv.AppendInt(b, m.AtMS, 10)
	b = append(b, `,"account":{"id":`...)
	a := &m.Account
	if b, err = appendStringJSON(b, a.ID); err != nil {
		return nil, err
	}
	b = appendIntMember(b, `,"version":`, a.Version)
	b = appendIntMember(b, `,"balance":`, a.Balance)
	b = appendIntMember(b, `,"reserved":`, a.Reserved)
	b = appendIntMember(b, `,"pending":`, a.Pending)
	b = appendIntMember(b, `,"lifetime_earned":`, a.LifetimeEarned)
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
		b = append(b, `,"ctx":{"ext":`...)
		if b, err = appendStringJSON(b, c.ExternalID); err != nil {
			return nil, err
		}
		b = appendIntMember(b, `,"th":`, c.ThresholdMC)
		if c.Policy != "" {
			b = append(b, `,"policy":`...)
			if b, err = appendStringJSON(b, string(c.Policy)); err != nil {
				return nil, err
			}
		}
		if c.Emitter != "" {
			b = append(b, `,"emitter":`...)
			if b, err = appendStringJSON(b, c.Emitter); err != nil {
				return nil, err
			}
		}
		b = append(b, '}')
	}
	if m.EffectiveBefore != nil {
		b = appendIntMember(b, `,"eb":`, *m.EffectiveBefore)
	}
	if u := m.Usage; u != nil {
		if b, err = appendUsageJSON(b, u); err != nil {
			return nil, err
		}
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
	return append(b, '}'), nil
}

func appendEntryJSON(b []byte, e *MutationEntry) ([]byte, error) {
	var err error
	b = append(b, `{"role":`...)
	if b, err = appendStringJSON(b, string(e.Role)); err != nil {
		return nil, err
	}
	b = appendIntMember(b, `,"delta":`, e.Delta)
	b = append(b, `,"type":`...)
	if b, err = appendStringJSON(b, string(e.Type)); err != nil {
		return nil, err
	}
	b = append(b, `,"source":`...)
	if e.Source == nil {
		b = append(b, "null"...)
	} else if b, err = appendStringJSON(b, string(*e.Source)); err != nil {
		return nil, err
	}
	b = append(b, `,"block":`...)
	if e.BlockID == nil {
		b = append(b, "null"...)
	} else {
		b = appendUUIDJSON(b, *e.BlockID)
	}
	if e.Metric != nil {
		b = append(b, `,"metric":`...)
		if b, err = appendStringJSON(b, *e.Metric); err != nil {
			return nil, err
		}
	}
	if e.Units != nil {
		b = appendIntMember(b, `,"units":`, *e.Units)
	}
	if e.Rate != nil {
		b = appendIntMember(b, `,"rate":`, *e.Rate)
	}
	if e.Ref != nil {
		b = appendUUIDJSON(append(b, `,"ref":`...), *e.Ref)
	}
	if e.Overage != nil {
		b = appendIntMember(b, `,"overage":`, *e.Overage)
	}
	if e.Reason != nil {
		b = append(b, `,"reason":`...)
		if b, err = appendStringJSON(b, *e.Reason); err != nil {
			return nil, err
		}
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
			b = appendUUIDJSON(append(b, `{"b":`...), d.BlockID)
			b = append(appendIntMember(b, `,"d":`, d.Amount), '}')
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

func appendBlockJSON(b []byte, k *MutationBlock) ([]byte, error) {
	var err error
	b = appendUUIDJSON(append(b, `{"id":`...), k.ID)
	b = appendIntMember(b, `,"original":`, k.Original)
	b = appendIntMember(b, `,"remaining":`, k.Remaining)
	b = appendIntMember(b, `,"priority":`, int64(k.Priority))
	b = append(b, `,"source":`...)
	if b, err = appendStringJSON(b, string(k.Source)); err != nil {
		return nil, err
	}
	b = appendIntMember(b, `,"starts":`, k.StartsMS)
	b = append(b, `,"expires":`...)
	if k.ExpiresMS == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *k.ExpiresMS, 10)
	}
	b = appendIntMember(b, `,"created":`, k.CreatedMS)
	if len(k.Metadata) > 0 {
		if b, err = appendMarshalled(append(b, `,"meta":`...), k.Metadata); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

func appendUsageJSON(b []byte, u *MutationUsage) ([]byte, error) {
	var err error
	b = append(b, `,"usage":{"metric":`...)
	if b, err = appendStringJSON(b, u.Metric); err != nil {
		return nil, err
	}
	b = appendIntMember(b, `,"units":`, u.Units)
	b = appendIntMember(b, `,"cost":`, u.Cost)
	b = appendIntMember(b, `,"charged":`, u.Charged)
	b = appendIntMember(b, `,"overage":`, u.Overage)
	if u.Refused {
		b = append(b, `,"refused":true`...)
	}
	if u.ReservationID != nil {
		b = appendUUIDJSON(append(b, `,"reservation":`...), *u.ReservationID)
	}
	if len(u.Items) > 0 {
		b = append(b, `,"items":[`...)
		for i := range u.Items {
			it := &u.Items[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"billable_metric_key":`...)
			if b, err = appendStringJSON(b, it.Metric); err != nil {
				return nil, err
			}
			b = appendIntMember(b, `,"units":`, it.Units)
			b = append(appendIntMember(b, `,"cost":`, it.Cost), '}')
		}
		b = append(b, ']')
	}
	return append(b, '}'), nil
}

func appendIntMember(b []byte, name string, n int64) []byte {
	return strconv.AppendInt(append(b, name...), n, 10)
}

// appendUUIDJSON writes id as encoding/json does (its MarshalText, quoted).
func appendUUIDJSON(b []byte, id uuid.UUID) []byte {
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

// appendStringJSON writes s quoted: as it is when no byte of it needs
// escaping (printable ASCII other than the quote, the backslash and the
// three encoding/json escapes for HTML), else as encoding/json writes it.
func appendStringJSON(b []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return appendMarshalled(b, s)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), nil
}

// appendMarshalled appends json.Marshal(v).
func appendMarshalled(b []byte, v any) ([]byte, error) {
	text, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, text...), nil
}
