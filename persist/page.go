package persist

import (
	"encoding/base64"
	"encoding/binary"
	"time"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// cursorVersion leads every cursor, so a later format can tell old cursors
// from new ones instead of misreading them.
const cursorVersion byte = 1

// cursorLen is version + created_at (Unix µs, Postgres' precision) + id.
const cursorLen = 1 + 8 + 16

// cursorOpVersion leads a cursor that also holds the row's op_id (the
// ledger's history orders entries of one instant by their operation),
// cursorOpLen long.
const (
	cursorOpVersion byte = 2
	cursorOpLen          = cursorLen + 16
)

// errInvalidCursor is the 400 of docs/spec/interface.md Common rules 2.
var errInvalidCursor = engine.BadRequest("cursor", "invalid cursor")

// pageKey is the position of a row in a newest-first (created_at, id) order.
type pageKey struct {
	at time.Time
	id uuid.UUID
	// op, when withOp, sorts between at and id (History).
	op     uuid.UUID
	withOp bool
}

// encodeCursor makes the opaque cursor that resumes after k.
func encodeCursor(k pageKey) string {
	var b [cursorOpLen]byte
	b[0] = cursorVersion
	binary.BigEndian.PutUint64(b[1:9], uint64(k.at.UnixMicro()))
	copy(b[9:cursorLen], k.id[:])
	if !k.withOp {
		return base64.RawURLEncoding.EncodeToString(b[:cursorLen])
	}
	b[0] = cursorOpVersion
	copy(b[cursorLen:], k.op[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// decodeCursor reads a cursor; an empty one means the first page (ok false).
// Anything undecodable is engine.BadRequest("cursor", ...).
func decodeCursor(s string) (k pageKey, ok bool, err error) {
	if s == "" {
		return pageKey{}, false, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	switch {
	case err != nil:
		return pageKey{}, false, errInvalidCursor
	case len(b) == cursorLen && b[0] == cursorVersion:
	case len(b) == cursorOpLen && b[0] == cursorOpVersion:
		copy(k.op[:], b[cursorLen:])
		k.withOp = true
	default:
		return pageKey{}, false, errInvalidCursor
	}
	k.at = time.UnixMicro(int64(binary.BigEndian.Uint64(b[1:9]))).UTC()
	copy(k.id[:], b[9:cursorLen])
	return k, true, nil
}

// pageOf trims rows fetched with limit+1 to one page and sets the cursor of
// its last row when more follow. Data is never nil, so it renders as [].
func pageOf[T any](rows []T, limit int, key func(T) pageKey) engine.Page[T] {
	if rows == nil {
		rows = []T{}
	}
	if len(rows) <= limit {
		return engine.Page[T]{Data: rows}
	}
	rows = rows[:limit]
	return engine.Page[T]{Data: rows, HasMore: true, NextCursor: encodeCursor(key(rows[len(rows)-1]))}
}
