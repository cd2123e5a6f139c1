package engine

import (
	"testing"

	"github.com/google/uuid"
)

// TestEntryIDOnStack: the response's entry id is EntryID, the id the
// persister writes, for any op and entry index.
func TestEntryIDOnStack(t *testing.T) {
	for n := 0; n < 200; n++ {
		op := uuid.New()
		for _, i := range []int{0, 1, 9, 10, 31, 12345} {
			if got, want := entryID(op, i), EntryID(op, i); got != want {
				t.Fatalf("entryID(%s, %d) = %s, want %s", op, i, got, want)
			}
		}
	}
	if a := testing.AllocsPerRun(100, func() { _ = entryID(uuid.UUID{}, 3) }); a != 0 {
		t.Errorf("entryID allocates %v times", a)
	}
}
