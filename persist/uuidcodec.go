package persist

import (
	"bytes"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// registerUUID teaches a connection's type map to encode uuid.UUID and
// *uuid.UUID as the 16 bytes a uuid is. Without it pgx falls back to
// uuid.UUID's driver.Valuer for every value, building a string, an error
// and a text scan per element: the bulk of the persister's allocations in
// the issue-6 profile, since Apply sends columns of thousands of ids. A
// *uuid.UUID (the entries' block and ref, the events' customer and entry)
// needs its own case: pgx never dereferences a pointer whose type is a
// driver.Valuer, so it went the Valuer way until issue 26.
func registerUUID(m *pgtype.Map) {
	m.TryWrapEncodePlanFuncs = append([]pgtype.TryWrapEncodePlanFunc{tryWrapUUID}, m.TryWrapEncodePlanFuncs...)
}

// pgUUID is a uuid.UUID pgx's UUID codec encodes natively.
type pgUUID uuid.UUID

// UUIDValue implements pgtype.UUIDValuer.
func (u pgUUID) UUIDValue() (pgtype.UUID, error) {
	return pgtype.UUID{Bytes: u, Valid: true}, nil
}

func tryWrapUUID(value any) (pgtype.WrappedEncodePlanNextSetter, any, bool) {
	switch value.(type) {
	case uuid.UUID, *uuid.UUID:
		// The next plan is found for a pgUUID whatever value holds: a
		// nil *uuid.UUID is NULL before any plan runs (pgx's nil check).
		return &uuidEncodePlan{}, pgUUID{}, true
	}
	return nil, nil, false
}

// uuidEncodePlan converts each uuid.UUID or *uuid.UUID before the next plan
// encodes it.
type uuidEncodePlan struct {
	next pgtype.EncodePlan
	// raw: next writes a uuid as its 16 bytes (the binary format), so
	// Encode appends them itself and skips boxing a pgUUID per value.
	raw bool
}

// rawProbe is a uuid with distinct bytes, to tell the binary plan from
// the text one.
var rawProbe = pgUUID{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}

// SetNext implements pgtype.WrappedEncodePlanNextSetter.
func (p *uuidEncodePlan) SetNext(next pgtype.EncodePlan) {
	p.next = next
	out, err := next.Encode(rawProbe, nil)
	p.raw = err == nil && bytes.Equal(out, rawProbe[:])
}

// Encode implements pgtype.EncodePlan.
func (p *uuidEncodePlan) Encode(value any, buf []byte) ([]byte, error) {
	var u uuid.UUID
	switch v := value.(type) {
	case uuid.UUID:
		u = v
	case *uuid.UUID:
		if v == nil {
			return nil, nil // NULL
		}
		u = *v
	}
	if p.raw {
		return append(buf, u[:]...), nil
	}
	return p.next.Encode(pgUUID(u), buf)
}
