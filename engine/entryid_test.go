package engine

import (
	"strconv"
	"testing"

	"github.com/google/uuid"
)

// TestEntryIDOnStack: EntryID, computed on the stack, is the name-based
// UUID uuid.NewSHA1 gives, for any op and entry index.
func TestEntryIDOnStack(t *testing.T) {
	for n := 0; n < 200; n++ {
		op := uuid.New()
		for _, i := range []int{0, 1, 9, 10, 31, 12345} {
			if got, want := EntryID(op, i), uuid.NewSHA1(entryNamespace, append(op[:], strconv.Itoa(i)...)); got != want {
				t.Fatalf("EntryID(%s, %d) = %s, want %s", op, i, got, want)
			}
		}
	}
	if a := testing.AllocsPerRun(100, func() { _ = EntryID(uuid.UUID{}, 3) }); a != 0 {
		t.Errorf("EntryID allocates %v times", a)
	}
}
