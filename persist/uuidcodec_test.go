package persist

import (
	"bytes"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// TestUUIDEncoding: uuid.UUID and *uuid.UUID, alone and in arrays, binary
// and text, encode through registerUUID's plan exactly as pgx encodes the
// same ids as pgtype.UUID, nil pointers as NULL.
func TestUUIDEncoding(t *testing.T) {
	ours := pgtype.NewMap()
	registerUUID(ours)
	plain := pgtype.NewMap()
	a, b := uuid.New(), uuid.New()
	pg := func(u uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: u, Valid: true} }
	for _, format := range []int16{pgtype.BinaryFormatCode, pgtype.TextFormatCode} {
		for _, tc := range []struct {
			name      string
			oid       uint32
			value     any
			reference any
		}{
			{"uuid", pgtype.UUIDOID, a, pg(a)},
			{"pointer", pgtype.UUIDOID, &a, pg(a)},
			{"nil pointer", pgtype.UUIDOID, (*uuid.UUID)(nil), pgtype.UUID{}},
			{"array", pgtype.UUIDArrayOID, []uuid.UUID{a, b}, []pgtype.UUID{pg(a), pg(b)}},
			{"pointer array", pgtype.UUIDArrayOID, []*uuid.UUID{&a, nil, &b}, []pgtype.UUID{pg(a), {}, pg(b)}},
		} {
			got, err := ours.Encode(tc.oid, format, tc.value, nil)
			if err != nil {
				t.Fatalf("%s (format %d): %v", tc.name, format, err)
			}
			want, err := plain.Encode(tc.oid, format, tc.reference, nil)
			if err != nil {
				t.Fatalf("%s reference (format %d): %v", tc.name, format, err)
			}
			if !bytes.Equal(got, want) || (got == nil) != (want == nil) {
				t.Errorf("%s (format %d): %q, want %q", tc.name, format, got, want)
			}
		}
	}
	// The persister's columns: no allocation per id once the plan is cached.
	ids := []*uuid.UUID{&a, &b, nil, &a}
	buf := make([]byte, 0, 256)
	_, _ = ours.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, ids, buf)
	if n := testing.AllocsPerRun(100, func() {
		_, _ = ours.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, ids, buf)
	}); n > 4 {
		t.Errorf("%v allocations encoding 4 ids, want at most 4 (the array's own)", n)
	}
}
