package persist

import (
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestCursorRoundTrip: a cursor gives back the key it was made of, with
// the op id when the page's order has one (History) and without it
// otherwise; a cursor made before History ordered by op id still reads.
func TestCursorRoundTrip(t *testing.T) {
	at := time.Date(2026, 11, 30, 1, 7, 3, 311000000, time.UTC)
	id, op := uuid.MustParse("cc5316ad-ab01-5fe9-a3fc-eefb459a1e37"), uuid.MustParse("01a229fd-b80f-7291-9c24-6b41395eb022")
	for _, tc := range []struct {
		name string
		key  pageKey
	}{
		{"without op", pageKey{at: at, id: id}},
		{"with op", pageKey{at: at, id: id, op: op, withOp: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok, err := decodeCursor(encodeCursor(tc.key))
			if err != nil || !ok {
				t.Fatalf("decode: %v %v", ok, err)
			}
			if !got.at.Equal(tc.key.at) || got.id != tc.key.id || got.op != tc.key.op || got.withOp != tc.key.withOp {
				t.Errorf("got %+v, want %+v", got, tc.key)
			}
		})
	}
	if len(encodeCursor(pageKey{at: at, id: id})) == len(encodeCursor(pageKey{at: at, id: id, op: op, withOp: true})) {
		t.Error("a cursor with an op id is as long as one without")
	}
}
