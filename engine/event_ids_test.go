package engine

import (
	"strconv"
	"testing"

	"github.com/google/uuid"
)

// allSlots is every slot an operation can use: each namespace over the
// indexes its emitter can reach (an expiry per block of an account, a
// threshold per configured threshold), with room to spare.
func allSlots() []EventSlot {
	slots := []EventSlot{SlotMain, SlotLowBalance, SlotExhausted, SlotTopupRequested}
	for i := range 1000 {
		slots = append(slots, ExpiredSlot(i))
	}
	for i := range 10 * MaxAlertThresholds {
		slots = append(slots, ThresholdSlot(i))
	}
	return slots
}

// TestEventSlotNamesAreDistinct holds the construction in event_ids.go:
// no two slots of any namespaces share a name, so no two events of one
// operation share an id.
func TestEventSlotNamesAreDistinct(t *testing.T) {
	seen := map[string]EventSlot{}
	for _, s := range allSlots() {
		name := string(s.name(nil))
		if prev, ok := seen[name]; ok {
			t.Fatalf("slots %+v and %+v share the name %q", prev, s, name)
		}
		seen[name] = s
	}
	op := uuid.New()
	ids := map[uuid.UUID]bool{}
	for _, s := range allSlots() {
		ids[EventID(op, s)] = true
	}
	if len(ids) != len(allSlots()) {
		t.Fatalf("%d ids for %d slots", len(ids), len(allSlots()))
	}
}

// TestEventIDsOfStoredEventsUnchanged: the Mutation's own events and the
// expiry events keep the ids they were stored under before namespaces
// (EventID over "event" and the old slot number), so a replay of an
// operation stored then derives the stored ids and inserts nothing twice.
func TestEventIDsOfStoredEventsUnchanged(t *testing.T) {
	op := uuid.MustParse("0b8e4a1c-6a3f-4f0e-9d2b-7c1a5e3f9b20")
	old := func(slot int) uuid.UUID {
		return uuid.NewSHA1(eventNamespace, append(append(op[:], "event"...), strconv.Itoa(slot)...))
	}
	tests := []struct {
		name string
		slot EventSlot
		old  int
	}{
		{"main", SlotMain, 0},
		{"low balance", SlotLowBalance, 1},
		{"exhausted", SlotExhausted, 2},
		{"expiry entry 0", ExpiredSlot(0), 3},
		{"expiry entry 7", ExpiredSlot(7), 10},
	}
	for _, tt := range tests {
		if got, want := EventID(op, tt.slot), old(tt.old); got != want {
			t.Errorf("%s: id %s, stored events have %s", tt.name, got, want)
		}
	}
	// A fixed value as well, so a change of the namespace or of the hash
	// input fails here and not only in both halves of the comparison.
	if got, want := EventID(op, SlotMain).String(), "48f9df29-e7aa-59e7-99fb-6e1560020f4b"; got != want {
		t.Errorf("main id %s, want %s", got, want)
	}
}

// TestEventIDIsNameUUID: EventID, hashed on the stack, is uuid.NewSHA1 of
// the namespace and the slot's name for every slot, so no stored id moves.
func TestEventIDIsNameUUID(t *testing.T) {
	op := uuid.MustParse("0b8e4a1c-6a3f-4f0e-9d2b-7c1a5e3f9b20")
	for _, slot := range append(allSlots(), BudgetSlot(0), BudgetSlot(7)) {
		if got, want := EventID(op, slot), uuid.NewSHA1(eventNamespace, slot.name(append([]byte(nil), op[:]...))); got != want {
			t.Errorf("EventID(%v) = %s, want %s", slot, got, want)
		}
	}
}
