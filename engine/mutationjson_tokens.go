// The token readers of the hand-written Mutation decoder (mutationjson.go):
// whitespace, strings, integers, ids and skipping. Each refuses, with
// errSlowPath, any input encoding/json might read differently. It is one
// state machine over one buffer, kept whole in this file (about 450 lines)
// so every fast-path refusal can be read side by side.

package engine

import (
	"encoding/json"
	"strconv"

	"github.com/google/uuid"
)

// mutationDecoder is a cursor over one document.
type mutationDecoder struct {
	b []byte
	i int
	// metric is the last metric name decoded: a consume names its metric
	// in its entry and again in its usage, and both share one string.
	metric string
}

func (d *mutationDecoder) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// next skips white space and reports the byte there (0 at the end).
func (d *mutationDecoder) next() byte {
	d.ws()
	if d.i < len(d.b) {
		return d.b[d.i]
	}
	return 0
}

func (d *mutationDecoder) expect(c byte) error {
	if d.next() != c {
		return errSlowPath
	}
	d.i++
	return nil
}

// object calls member for each member name of an object, the cursor on its
// value.
func (d *mutationDecoder) object(member func(name []byte) error) error {
	if err := d.expect('{'); err != nil {
		return err
	}
	if d.next() == '}' {
		d.i++
		return nil
	}
	for {
		name, err := d.plainString()
		if err != nil {
			return err
		}
		if err := d.expect(':'); err != nil {
			return err
		}
		d.ws()
		if err := member(name); err != nil {
			return err
		}
		switch d.next() {
		case ',':
			d.i++
		case '}':
			d.i++
			return nil
		default:
			return errSlowPath
		}
	}
}

// array calls elem for each element, the cursor on it.
func (d *mutationDecoder) array(elem func() error) error {
	if err := d.expect('['); err != nil {
		return err
	}
	if d.next() == ']' {
		d.i++
		return nil
	}
	for {
		d.ws()
		if err := elem(); err != nil {
			return err
		}
		switch d.next() {
		case ',':
			d.i++
		case ']':
			d.i++
			return nil
		default:
			return errSlowPath
		}
	}
}

// plainString reads a string of printable ASCII without escapes: the text
// is then the bytes themselves, as encoding/json would read them.
func (d *mutationDecoder) plainString() ([]byte, error) {
	if d.next() != '"' {
		return nil, errSlowPath
	}
	start := d.i + 1
	for j := start; j < len(d.b); j++ {
		c := d.b[j]
		switch {
		case c == '"':
			d.i = j + 1
			return d.b[start:j], nil
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, errSlowPath
		}
	}
	return nil, errSlowPath
}

func (d *mutationDecoder) str() (string, error) {
	s, err := d.plainString()
	return string(s), err
}

// word is str for the members that hold one of the domain's fixed words
// (kinds, environments, roles, entry types, sources, policies): those
// come back as the constants themselves, with no string allocated per
// document; any other text is copied as str copies it.
func (d *mutationDecoder) word() (string, error) {
	s, err := d.plainString()
	if err != nil {
		return "", err
	}
	switch string(s) {
	case "consume":
		return string(MutationConsume), nil
	case "grant":
		return string(MutationGrant), nil
	case "debit":
		return string(MutationDebit), nil
	case "expire":
		return string(MutationExpire), nil
	case "reserve":
		return string(MutationReserve), nil
	case "commit":
		return string(MutationCommit), nil
	case "release":
		return string(MutationRelease), nil
	case "gauge":
		return string(MutationGaugeKind), nil
	case "rollover":
		return string(MutationRollover), nil
	case "live":
		return string(EnvironmentLive), nil
	case "sandbox":
		return string(EnvironmentSandbox), nil
	case "main":
		return string(RoleMain), nil
	case "expiry":
		return string(RoleExpiry), nil
	case "consumption":
		return string(EntryConsumption), nil
	case "plan_grant":
		return string(EntryPlanGrant), nil
	case "topup":
		return string(EntryTopup), nil
	case "reservation":
		return string(EntryReservation), nil
	case "adjustment":
		return string(EntryAdjustment), nil
	case "promotional":
		return string(SourcePromotional), nil
	case "compensation":
		return string(SourceCompensation), nil
	case "referral":
		return string(SourceReferral), nil
	case "manual":
		return string(SourceManual), nil
	case "migration":
		return string(SourceMigration), nil
	case "block":
		return string(OveragePolicyBlock), nil
	case "allow":
		return string(OveragePolicyAllow), nil
	case "notify":
		return string(OveragePolicyNotify), nil
	}
	return string(s), nil
}

// metricName is str for a metric name, shared with the last one decoded
// when it is the same.
func (d *mutationDecoder) metricName() (string, error) {
	s, err := d.plainString()
	if err != nil {
		return "", err
	}
	if string(s) != d.metric {
		d.metric = string(s)
	}
	return d.metric, nil
}

// null consumes a null literal when there is one.
func (d *mutationDecoder) null() bool {
	if d.i+4 <= len(d.b) && string(d.b[d.i:d.i+4]) == "null" {
		d.i += 4
		return true
	}
	return false
}

// int reads an integer as encoding/json reads it into an int64: a number
// with a fraction or an exponent is the slow path's (it refuses it there).
func (d *mutationDecoder) int() (int64, error) {
	start := d.i
	j := start
	if j < len(d.b) && d.b[j] == '-' {
		j++
	}
	digits := j
	for j < len(d.b) && d.b[j] >= '0' && d.b[j] <= '9' {
		j++
	}
	if j == digits || (d.b[digits] == '0' && j-digits > 1) {
		return 0, errSlowPath
	}
	if j < len(d.b) {
		switch d.b[j] {
		case '.', 'e', 'E':
			return 0, errSlowPath
		}
	}
	// Up to 18 digits cannot overflow an int64: summed here, with no
	// string made of them; longer ones are strconv's to range-check.
	if j-digits > 18 {
		n, err := strconv.ParseInt(string(d.b[start:j]), 10, 64)
		if err != nil {
			return 0, errSlowPath
		}
		d.i = j
		return n, nil
	}
	var n int64
	for _, c := range d.b[digits:j] {
		n = n*10 + int64(c-'0')
	}
	if digits > start {
		n = -n
	}
	d.i = j
	return n, nil
}

func (d *mutationDecoder) intPtr() (*int64, error) {
	if d.null() {
		return nil, nil
	}
	n, err := d.int()
	return &n, err
}

func (d *mutationDecoder) strPtr() (*string, error) {
	if d.null() {
		return nil, nil
	}
	s, err := d.str()
	return &s, err
}

func (d *mutationDecoder) uuid() (uuid.UUID, error) {
	s, err := d.plainString()
	if err != nil {
		return uuid.Nil, err
	}
	u, err := uuid.ParseBytes(s)
	if err != nil {
		return uuid.Nil, errSlowPath
	}
	return u, nil
}

// storedID is an id in either form an account hash keeps it
// (ParseStoredID): block ids come out of the hash into the Mutation.
func (d *mutationDecoder) storedID() (uuid.UUID, error) {
	s, err := d.plainString()
	if err != nil {
		return uuid.Nil, err
	}
	if len(s) != CompactIDLen {
		u, err := uuid.ParseBytes(s)
		if err != nil {
			return uuid.Nil, errSlowPath
		}
		return u, nil
	}
	u, ok := compactID(s)
	if !ok {
		return uuid.Nil, errSlowPath
	}
	return u, nil
}

// compactID is ParseStoredID of a compact form, read from the document's
// bytes with no string made of them.
func compactID(s []byte) (uuid.UUID, bool) {
	var id uuid.UUID
	n, err := storedIDEncoding.Decode(id[:], s)
	return id, err == nil && n == len(id)
}

// accountID is StoredIDText of the string there: a compact id comes out
// as UUID text without its compact form copied first.
func (d *mutationDecoder) accountID() (string, error) {
	s, err := d.plainString()
	if err != nil {
		return "", err
	}
	if len(s) == CompactIDLen {
		if id, ok := compactID(s); ok {
			return id.String(), nil
		}
	}
	return string(s), nil
}

func (d *mutationDecoder) uuidPtr() (*uuid.UUID, error) {
	if d.null() {
		return nil, nil
	}
	u, err := d.uuid()
	return &u, err
}

// raw captures one value as json.RawMessage keeps it: its bytes as
// written. null is the slow path's (RawMessage keeps "null" there).
func (d *mutationDecoder) raw() (json.RawMessage, error) {
	start := d.i
	if err := d.skip(0); err != nil {
		return nil, err
	}
	if string(d.b[start:d.i]) == "null" {
		return nil, errSlowPath
	}
	// A copy, as encoding/json keeps: the caller may reuse data.
	return append(json.RawMessage(nil), d.b[start:d.i]...), nil
}

// skip passes over one value, checking its grammar as encoding/json's
// scanner does (so a RawMessage it keeps is one encoding/json would keep).
func (d *mutationDecoder) skip(depth int) error {
	if depth > 10000 {
		return errSlowPath
	}
	switch c := d.next(); {
	case c == '{':
		return d.object(func([]byte) error { return d.skip(depth + 1) })
	case c == '[':
		return d.array(func() error { return d.skip(depth + 1) })
	case c == '"':
		return d.skipString()
	case c == 't':
		return d.literal("true")
	case c == 'f':
		return d.literal("false")
	case c == 'n':
		return d.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return d.skipNumber()
	}
	return errSlowPath
}

func (d *mutationDecoder) literal(word string) error {
	if d.i+len(word) <= len(d.b) && string(d.b[d.i:d.i+len(word)]) == word {
		d.i += len(word)
		return nil
	}
	return errSlowPath
}

// skipString passes over a string whose escapes are valid; its other bytes
// are taken as they are (encoding/json's scanner does not check UTF-8).
func (d *mutationDecoder) skipString() error {
	for j := d.i + 1; j < len(d.b); j++ {
		switch c := d.b[j]; {
		case c == '"':
			d.i = j + 1
			return nil
		case c < 0x20:
			return errSlowPath
		case c == '\\':
			j++
			if j >= len(d.b) {
				return errSlowPath
			}
			switch d.b[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(d.b) {
					return errSlowPath
				}
				for _, h := range d.b[j+1 : j+5] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return errSlowPath
					}
				}
				j += 4
			default:
				return errSlowPath
			}
		}
	}
	return errSlowPath
}

// skipNumber passes over a number of JSON's grammar.
func (d *mutationDecoder) skipNumber() error {
	j := d.i
	digits := func() int {
		k := j
		for j < len(d.b) && d.b[j] >= '0' && d.b[j] <= '9' {
			j++
		}
		return j - k
	}
	if j < len(d.b) && d.b[j] == '-' {
		j++
	}
	first := j
	n := digits()
	if n == 0 || (d.b[first] == '0' && n > 1) {
		return errSlowPath
	}
	if j < len(d.b) && d.b[j] == '.' {
		j++
		if digits() == 0 {
			return errSlowPath
		}
	}
	if j < len(d.b) && (d.b[j] == 'e' || d.b[j] == 'E') {
		j++
		if j < len(d.b) && (d.b[j] == '+' || d.b[j] == '-') {
			j++
		}
		if digits() == 0 {
			return errSlowPath
		}
	}
	d.i = j
	return nil
}
