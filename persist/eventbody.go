package persist

import (
	"strings"

	"github.com/google/uuid"

	"github.com/creditd/creditd/engine"
)

// An event's delivered body opens with five members the row holds in its
// own columns (event_id, event_type, tenant_id, environment, customer_id:
// engine.Envelope's order), some 220 bytes of every credit.consumed row
// (issue 26 item 4). The persister stores a lean body without them (after
// the sequence the insert prepends, as for every row), and every read
// (scanEvent) puts them back from the columns, so the list, the stream and
// the delivery see the bytes Go built. A body is stored lean only when its
// opening is exactly the one the columns rebuild (leanEventBody); any other
// stays whole, and so does every row written before migration 023 or by a
// node of the release before it, which the reader tells apart by the
// member after the sequence (event_id: whole; external_customer_id: lean).

// leanBodyMark is the member a lean body has right after its sequence.
const leanBodyMark = `"external_customer_id":`

// envelopeOpening is the opening of a body of event id, as Go writes it
// (engine.Envelope without a sequence), up to and with the comma before
// external_customer_id.
func envelopeOpening(b []byte, id uuid.UUID, typ engine.EventType, tenant uuid.UUID, env engine.Environment,
	customer *uuid.UUID) []byte {
	b = engine.AppendJSONUUID(append(b, `"event_id":`...), id)
	b = engine.AppendJSONString(append(b, `,"event_type":`...), string(typ))
	b = engine.AppendJSONUUID(append(b, `,"tenant_id":`...), tenant)
	b = engine.AppendJSONString(append(b, `,"environment":`...), string(env))
	b = append(b, `,"customer_id":`...)
	if customer == nil {
		b = append(b, "null"...)
	} else {
		b = engine.AppendJSONUUID(b, *customer)
	}
	return append(b, ',')
}

// leanEventBody is body without the opening the row's columns rebuild,
// when it has exactly that opening; else body.
func leanEventBody(body string, id uuid.UUID, typ engine.EventType, tenant uuid.UUID, env engine.Environment,
	customer *uuid.UUID) string {
	var buf [256]byte
	open := append(buf[:0], '{')
	open = envelopeOpening(open, id, typ, tenant, env, customer)
	if !strings.HasPrefix(body, string(open)) || !strings.HasPrefix(body[len(open):], leanBodyMark) {
		return body
	}
	return "{" + body[len(open):]
}

// wholeEventBody is the delivered body of a stored one: stored itself
// when whole, else with the opening rebuilt from the row's columns after
// its sequence member.
func wholeEventBody(stored string, id uuid.UUID, typ engine.EventType, tenant uuid.UUID, env engine.Environment,
	customer *uuid.UUID) []byte {
	comma := strings.IndexByte(stored, ',')
	if comma < 0 || !strings.HasPrefix(stored, `{"sequence":`) || !strings.HasPrefix(stored[comma+1:], leanBodyMark) {
		return []byte(stored)
	}
	b := make([]byte, 0, len(stored)+200)
	b = append(b, stored[:comma+1]...)
	b = envelopeOpening(b, id, typ, tenant, env, customer)
	return append(b, stored[comma+1:]...)
}
