package persist

import (
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// registerUUID teaches a connection's type map to encode uuid.UUID as the
// 16 bytes it is. Without it pgx falls back to uuid.UUID's driver.Valuer for
// every value, building a string and an error per element: the bulk of the
// persister's allocations in the issue-6 profile, since Apply sends columns
// of thousands of ids.
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
	if u, ok := value.(uuid.UUID); ok {
		return &uuidEncodePlan{}, pgUUID(u), true
	}
	return nil, nil, false
}

// uuidEncodePlan converts each uuid.UUID before the next plan encodes it.
type uuidEncodePlan struct{ next pgtype.EncodePlan }

// SetNext implements pgtype.WrappedEncodePlanNextSetter.
func (p *uuidEncodePlan) SetNext(next pgtype.EncodePlan) { p.next = next }

// Encode implements pgtype.EncodePlan.
func (p *uuidEncodePlan) Encode(value any, buf []byte) ([]byte, error) {
	return p.next.Encode(pgUUID(value.(uuid.UUID)), buf)
}
