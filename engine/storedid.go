package engine

import (
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
)

// Account hashes in Redis keep block ids and the account id in a compact
// 22-character form instead of the 36-character UUID text (issue 10: a
// customer with 3 blocks holds four ids; 14 bytes each). The scripts treat
// ids as opaque strings, so the form is chosen by Go (lua/load.go and the
// wrappers that hand a new id to a script) and undone by Go wherever an id
// comes back out of Redis: the account hash read path (ParseCompactID, the
// only form a hash keeps: hashes of the layouts before are rewritten once
// before a node of this release serves, lua/layout_fence.go, issue 29)
// and the Mutation JSON the scripts write (DecodeMutation, ParseStoredID).
// Postgres, the ledger, the API and the persisted operations only ever see
// UUID text.

// storedIDAlphabet is base64url's alphabet in ASCII order, so the compact
// forms of two ids compare bytewise as their UUID texts do: lua/prelude/spend_order.lua
// breaks spend-order ties on the id string, as engine.SpendOrder does on
// ID.String().
const storedIDAlphabet = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"

// storedIDEncoding is the compact form's encoding: 16 bytes, 22 characters,
// no padding; Strict refuses a last character with stray low bits, so one
// id has exactly one compact form.
var storedIDEncoding = base64.NewEncoding(storedIDAlphabet).WithPadding(base64.NoPadding).Strict()

// CompactIDLen is the length of CompactID's form.
const CompactIDLen = 22

// CompactID is id in the compact form account hashes keep.
func CompactID(id uuid.UUID) string { return storedIDEncoding.EncodeToString(id[:]) }

// ParseCompactID reads an id as an account hash keeps it (CompactID's
// form, nothing else).
func ParseCompactID(s string) (uuid.UUID, error) {
	var id uuid.UUID
	if len(s) != CompactIDLen {
		return uuid.Nil, fmt.Errorf("invalid compact id %q", s)
	}
	if n, err := storedIDEncoding.Decode(id[:], []byte(s)); err != nil || n != len(id) {
		return uuid.Nil, fmt.Errorf("invalid compact id %q", s)
	}
	return id, nil
}

// ParseStoredID reads an id as a Mutation document holds it: the compact
// form (CompactID) where a script wrote it from the account hash, UUID
// text where Go wrote it (AppendMutationJSON: the operations table, dead
// letters, and a script's Mutation of a lease or reservation id).
func ParseStoredID(s string) (uuid.UUID, error) {
	if len(s) != CompactIDLen {
		return uuid.Parse(s)
	}
	return ParseCompactID(s)
}

// StoredIDText is a Mutation's account id as UUID text: s itself unless it
// is in the compact form ("" stays "": an account not created yet; UUID
// text: a Mutation Go wrote).
func StoredIDText(s string) string {
	if len(s) != CompactIDLen {
		return s
	}
	id, err := ParseStoredID(s)
	if err != nil {
		return s
	}
	return id.String()
}

// storedID is a uuid.UUID decoded from either form a Mutation document
// holds (ParseStoredID): compact from a script, UUID text from Go.
type storedID uuid.UUID

// UnmarshalText reads either stored form.
func (s *storedID) UnmarshalText(b []byte) error {
	id, err := ParseStoredID(string(b))
	if err != nil {
		return err
	}
	*s = storedID(id)
	return nil
}

// UnmarshalJSON is encoding/json's decoding of b with its id in either
// stored form: a script writes a block's id as the account hash keeps it,
// Go (AppendMutationJSON) as UUID text.
func (b *MutationBlock) UnmarshalJSON(data []byte) error {
	type plain MutationBlock
	x := struct {
		*plain
		ID *storedID `json:"id"`
	}{plain: (*plain)(b), ID: (*storedID)(&b.ID)}
	return json.Unmarshal(data, &x)
}

// UnmarshalJSON is encoding/json's decoding of w with its block id in
// either stored form.
func (w *EntryDraw) UnmarshalJSON(data []byte) error {
	type plain EntryDraw
	x := struct {
		*plain
		BlockID *storedID `json:"b"`
	}{plain: (*plain)(w), BlockID: (*storedID)(&w.BlockID)}
	return json.Unmarshal(data, &x)
}

// UnmarshalJSON is encoding/json's decoding of e with its block id in
// either stored form.
func (e *MutationEntry) UnmarshalJSON(data []byte) error {
	type plain MutationEntry
	x := struct {
		*plain
		BlockID *storedID `json:"block"`
	}{plain: (*plain)(e), BlockID: (*storedID)(e.BlockID)}
	if err := json.Unmarshal(data, &x); err != nil {
		return err
	}
	e.BlockID = (*uuid.UUID)(x.BlockID)
	return nil
}

// UnmarshalJSON is encoding/json's decoding of a with its id as UUID text
// whichever form the account hash keeps it in (StoredIDText).
func (a *MutationAccount) UnmarshalJSON(data []byte) error {
	type plain MutationAccount
	if err := json.Unmarshal(data, (*plain)(a)); err != nil {
		return err
	}
	a.ID = StoredIDText(a.ID)
	return nil
}
