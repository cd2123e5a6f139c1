package engine

import (
	"strconv"

	"github.com/google/uuid"
)

// Event ids of an operation (issue 24). Every event a Mutation owes, from
// whichever emitter, takes its id from the operation and an EventSlot:
// EventID(op, slot). Two events of one operation can only share an id if
// they share a slot, so each emitter owns a namespace of slots and no
// emitter picks a number inside another's:
//
//   - eventsMutation: the Mutation's own events (credit.granted or
//     credit.consumed, credit.low_balance, credit.exhausted), three fixed
//     slots; EventsOf and LowBalanceEvent.
//   - eventsExpiry: one credit.expired per expiry entry, indexed by the
//     entry; EventsOf.
//   - eventsThreshold: one credit.threshold_crossed per configured
//     threshold, indexed by the threshold; EvaluateAlerts.
//   - eventsTopup: the one credit.topup_requested; EvaluateAlerts.
//
// A slot's name is what EventID hashes. The mutation and expiry namespaces
// keep the names their events have always had ("event" and a decimal: 0..2
// for the mutation's, 3+i for expiry entry i), so a replay of an operation
// stored before derives the ids that were stored; those two ranges do not
// meet. Every other namespace's names are "event/<namespace>/<index>",
// which no "event"+decimal name equals. The names are distinct, so the ids
// are (up to SHA-1 collisions), and TestEventSlotNamesAreDistinct holds
// every namespace to it. A new emitter adds its namespace here.
type EventSlot struct {
	ns    eventNamespaceKind
	index int
}

// eventNamespaceKind is an emitter's namespace of event slots.
type eventNamespaceKind uint8

const (
	eventsMutation eventNamespaceKind = iota
	eventsExpiry
	eventsThreshold
	eventsTopup
	// eventsBudget: one credit.budget_reached per budget the Mutation
	// reached, indexed by its place in Mutation.Budget.Reached; EventsOf.
	eventsBudget
)

// eventNamespaceNames names the namespaces that use the "event/<name>/<i>"
// form; the mutation and expiry namespaces keep the bare decimal form.
var eventNamespaceNames = [...]string{eventsThreshold: "threshold", eventsTopup: "topup", eventsBudget: "budget"}

// legacyExpiryBase is where expiry slots started in the bare decimal form,
// right after the mutation namespace's three slots.
const legacyExpiryBase = 3

// The Mutation's own slots and the top-up request's slot.
var (
	SlotMain           = EventSlot{eventsMutation, 0} // credit.granted or credit.consumed
	SlotLowBalance     = EventSlot{eventsMutation, 1}
	SlotExhausted      = EventSlot{eventsMutation, 2}
	SlotTopupRequested = EventSlot{eventsTopup, 0}
)

// ExpiredSlot is the slot of the credit.expired of the Mutation's entry
// entry (its index in Mutation.Entries).
func ExpiredSlot(entry int) EventSlot { return EventSlot{eventsExpiry, entry} }

// ThresholdSlot is the slot of the credit.threshold_crossed of threshold i
// of the alert settings (its index in AlertSettings.Thresholds).
func ThresholdSlot(i int) EventSlot { return EventSlot{eventsThreshold, i} }

// BudgetSlot is the slot of the credit.budget_reached of the Mutation's
// budget i (its index in MutationBudget.Reached).
func BudgetSlot(i int) EventSlot { return EventSlot{eventsBudget, i} }

// name is what EventID hashes for s, after the operation id.
func (s EventSlot) name(b []byte) []byte {
	b = append(b, "event"...)
	switch s.ns {
	case eventsMutation:
		return strconv.AppendInt(b, int64(s.index), 10)
	case eventsExpiry:
		return strconv.AppendInt(b, int64(legacyExpiryBase+s.index), 10)
	}
	b = append(b, '/')
	b = append(b, eventNamespaceNames[s.ns]...)
	b = append(b, '/')
	return strconv.AppendInt(b, int64(s.index), 10)
}

// eventNamespace seeds EventID; changing it would re-key every event.
var eventNamespace = uuid.MustParse("3d0b7a5e-52c1-4b8e-a7f4-9a61f0c2d8e3")

// EventID is the id of the event in slot of operation op: name-based, so a
// replayed Mutation derives the same ids and inserts nothing twice.
func EventID(op uuid.UUID, slot EventSlot) uuid.UUID {
	var buf [16 + 16 + 32]byte
	return nameUUID(slot.name(append(append(buf[:0], eventNamespace[:]...), op[:]...)))
}

// A credit.consumed whose ledger entry carries it (a lean consume's:
// persist/carried.go stores no event row for it) takes its id from that
// entry: CarriedEventID(entry), a fixed mask over the entry's id, so the
// entry is found again from the event id alone (EntryOfCarriedEvent:
// redeliver's look-up) without an index of event ids. The mask leaves the
// version and variant bits alone, so the id is a well-formed version 5
// UUID like every other event id, and it is not EventID(op, SlotMain): the
// store keeps each event in one form only, so the two never meet.
var carriedEventMask = [16]byte{0x5e, 0x1a, 0x9c, 0x37, 0xd2, 0x64, 0x00, 0xb8, 0x00, 0x4f, 0x81, 0xe6, 0x2d, 0x73, 0xa9, 0x0c}

// CarriedEventID is the id of the credit.consumed that ledger entry entry
// carries.
func CarriedEventID(entry uuid.UUID) uuid.UUID {
	for i := range entry {
		entry[i] ^= carriedEventMask[i]
	}
	return entry
}

// EntryOfCarriedEvent is the ledger entry that would carry event id
// (CarriedEventID's inverse).
func EntryOfCarriedEvent(id uuid.UUID) uuid.UUID { return CarriedEventID(id) }
