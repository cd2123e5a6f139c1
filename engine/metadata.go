package engine

import (
	"bytes"
	"encoding/json"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Metadata limits (docs/limits.md): metadata rides in Redis hashes, Lua
// mutations and Postgres jsonb, so its size is bounded where it enters.
const (
	// MaxMetadataBytes bounds the canonical encoding of one metadata object.
	// Redis's Lua hashes every byte of each string a script makes or reads,
	// so metadata's size is what a script call on a customer at every cap
	// pays (docs/decisions.md, "Metadata of 4 KiB").
	MaxMetadataBytes = 4 * 1024
	// MaxMetadataKeys bounds the members of any object in metadata.
	MaxMetadataKeys = 50
	// MaxMetadataDepth bounds nesting: the metadata object is level 1.
	MaxMetadataDepth = 5
	// MaxMetadataKeyChars bounds every member name in metadata.
	MaxMetadataKeyChars = 40
	// MaxMetadataStringChars bounds every string value in metadata.
	MaxMetadataStringChars = 500
)

// Canonical checks m against the metadata rules and returns it re-encoded
// canonically (members sorted, no insignificant space, numbers as written),
// so what Lua, Redis and Postgres store is exactly what was checked. field
// names m in errors ("metadata", "stack_after.metadata_match"). A nil m stays
// nil ("not given"). Errors: 400 for text that is not clean UTF-8 or
// repeats a member, 422 for a value past a limit.
func (m Metadata) Canonical(field string) (Metadata, error) {
	if m == nil {
		return nil, nil
	}
	if len(m) > MaxMetadataKeys {
		return nil, Invalid(field, field+" has more than "+strconv.Itoa(MaxMetadataKeys)+" keys")
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make(Metadata, len(m))
	size := 2 // {}
	for i, k := range keys {
		if err := checkMetadataKey(field, k); err != nil {
			return nil, err
		}
		name := field + "." + k
		raw := bytes.TrimSpace(m[k])
		if len(raw) == 0 {
			return nil, BadRequest(name, name+" is not a JSON value")
		}
		if err := scanJSON(raw, name, nil, 1, MaxMetadataDepth); err != nil {
			return nil, err
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, BadRequest(name, name+" is not a JSON value")
		}
		if err := checkMetadataValue(name, v); err != nil {
			return nil, err
		}
		enc, err := canonicalJSON(numbersAsStored(v))
		if err != nil {
			return nil, BadRequest(name, name+" is not a JSON value")
		}
		out[k] = enc
		size += len(strconv.Quote(k)) + 1 + len(enc)
		if i > 0 {
			size++
		}
		if size > MaxMetadataBytes {
			return nil, Invalid(field, field+" is larger than "+strconv.Itoa(MaxMetadataBytes)+" bytes encoded")
		}
	}
	return out, nil
}

// checkMetadataKey refuses an empty, long or unclean member name; the error
// names the object holding it since the name itself may not be printable.
func checkMetadataKey(field, k string) error {
	if k == "" {
		return Invalid(field, field+" has an empty key")
	}
	if !cleanText(k, false) {
		return BadRequest(field, field+" has a key that is not valid UTF-8 text without control characters")
	}
	if utf8.RuneCountInString(k) > MaxMetadataKeyChars {
		return Invalid(field, field+" has a key longer than "+strconv.Itoa(MaxMetadataKeyChars)+" characters")
	}
	return nil
}

// checkMetadataValue walks a decoded value (strings, json.Number, bools,
// nil, []any, map[string]any) for the per-string and per-object limits.
func checkMetadataValue(name string, v any) error {
	switch x := v.(type) {
	case string:
		if utf8.RuneCountInString(x) > MaxMetadataStringChars {
			return Invalid(name, name+" is longer than "+strconv.Itoa(MaxMetadataStringChars)+" characters")
		}
	case []any:
		for i, e := range x {
			if err := checkMetadataValue(name+"["+strconv.Itoa(i)+"]", e); err != nil {
				return err
			}
		}
	case map[string]any:
		if len(x) > MaxMetadataKeys {
			return Invalid(name, name+" has more than "+strconv.Itoa(MaxMetadataKeys)+" keys")
		}
		for k, e := range x {
			if err := checkMetadataKey(name, k); err != nil {
				return err
			}
			if err := checkMetadataValue(name+"."+k, e); err != nil {
				return err
			}
		}
	}
	return nil
}

// CanonicalValue re-encodes one stored JSON value canonically without the
// limits of the door: rebuild reads metadata back from Postgres (jsonb orders
// members by length and writes numbers its own way) and must reproduce the
// bytes the door wrote, even for values stored before a limit existed.
func CanonicalValue(raw json.RawMessage) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	return canonicalJSON(numbersAsStored(v))
}

// numbersAsStored rewrites every json.Number of a decoded value into the
// text Postgres numeric prints for it, so a value keeps its bytes across a
// round trip through jsonb (1e2 comes back as 100, -0 as 0).
func numbersAsStored(v any) any {
	switch x := v.(type) {
	case json.Number:
		return json.Number(numericText(string(x)))
	case []any:
		for i, e := range x {
			x[i] = numbersAsStored(e)
		}
	case map[string]any:
		for k, e := range x {
			x[k] = numbersAsStored(e)
		}
	}
	return v
}

// numericText is the output of Postgres numeric_out(numeric_in(s)) for a
// JSON number s: plain positional notation, as many fraction digits as the
// written scale (fraction digits minus exponent, at least 0), no negative
// zero. s must be a valid JSON number whose exponent the door bounded.
func numericText(s string) string {
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	mant, exp := s, 0
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		mant = s[:i]
		e, err := strconv.Atoi(strings.TrimPrefix(s[i+1:], "+"))
		if err != nil {
			return s
		}
		exp = e
	}
	intPart, frac := mant, ""
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		intPart, frac = mant[:i], mant[i+1:]
	}
	digits := intPart + frac
	point := len(intPart) + exp // digits before the decimal point
	scale := len(frac) - exp
	if scale < 0 {
		scale = 0
	}
	// Pad so the point falls inside the digits and scale digits follow it.
	if point < 0 {
		digits = strings.Repeat("0", -point) + digits
		point = 0
	}
	if need := point + scale; len(digits) < need {
		digits += strings.Repeat("0", need-len(digits))
	}
	whole := strings.TrimLeft(digits[:point], "0")
	if whole == "" {
		whole = "0"
	}
	out := whole
	if scale > 0 {
		out += "." + digits[point:point+scale]
	}
	if neg && strings.Trim(out, "0.") != "" {
		out = "-" + out
	}
	return out
}

// canonicalJSON encodes a decoded value: object members sorted (as
// encoding/json sorts map keys), no HTML escaping, numbers as given.
func canonicalJSON(v any) (json.RawMessage, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return json.RawMessage(bytes.TrimRight(b.Bytes(), "\n")), nil
}

// cleanText reports whether s is valid UTF-8 without C0 control characters;
// multiline lets tab, line feed and carriage return through.
func cleanText(s string, multiline bool) bool {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 && !(multiline && (c == '\t' || c == '\n' || c == '\r')) {
				return false
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size <= 1 {
			return false
		}
		i += size
	}
	return true
}

// CheckLine refuses (400) a one-line input (a path or query parameter, an
// identifier) that is not valid UTF-8 or holds a C0 control character:
// Postgres refuses NUL and bad UTF-8 in text, and an identifier with a line
// break could not be named in a path.
func CheckLine(field, v string) error {
	if cleanText(v, false) {
		return nil
	}
	return BadRequest(field, field+" must be valid UTF-8 text without control characters")
}

// CheckText is CheckLine for free text (reasons, descriptions), where tab,
// line feed and carriage return are allowed.
func CheckText(field, v string) error {
	if cleanText(v, true) {
		return nil
	}
	return BadRequest(field, field+" must be valid UTF-8 text without control characters other than tab and line breaks")
}

// ParseInstant reads an RFC 3339 date-time for field. A malformed one is an
// error of kind (400 for query parameters, 422 for most bodies, as each
// endpoint always answered); one outside years 0001-9999, as written or in
// UTC, is a 400: Go cannot encode it back to JSON and Postgres and the
// clients' libraries disagree on it.
func ParseInstant(field, v string, kind Kind) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, &Error{Kind: kind, Field: field, Detail: field + " must be an RFC 3339 date-time"}
	}
	if y, uy := t.Year(), t.UTC().Year(); y < 1 || y > 9999 || uy < 1 || uy > 9999 {
		return time.Time{}, BadRequest(field, field+" must be a date-time between years 0001 and 9999 (UTC)")
	}
	return t, nil
}

func orEmpty(m Metadata) Metadata {
	if m == nil {
		return Metadata{}
	}
	return m
}
