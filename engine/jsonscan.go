// The JSON scanner every request body passes before it is decoded: depth,
// number, string and duplicate-member limits in one pass with no allocation
// per value. It is one state machine (about 500 lines) kept whole so its
// refusals read side by side; the shapes it checks members against are in
// jsonshape.go.

package engine

import (
	"bytes"
	"strconv"
	"strings"
	"unicode/utf8"
)

// JSON limits every document creditd accepts obeys (docs/limits.md). They
// keep each value inside what Lua (cjson), Go and Postgres jsonb all read the
// same way, and bound the work one body can ask for.
const (
	// MaxJSONDepth bounds nesting of objects and arrays in a request body.
	MaxJSONDepth = 32
	// MaxJSONNumberChars bounds the text of one JSON number.
	MaxJSONNumberChars = 100
	// MaxJSONExponent bounds the written exponent of a JSON number (1e300
	// passes, 1e301 and 1e-301 do not): far inside float64 and Postgres
	// numeric, which refuses 1e-16384 and larger.
	MaxJSONExponent = 300
)

// freeTextMembers are the struct members whose strings may hold tab, line
// feed and carriage return: prose a person writes. Every other string is an
// identifier, enum, time or name and must be one line.
var freeTextMembers = map[string]bool{"reason": true, "description": true, "display_name": true}

// ScanJSON checks one JSON document strictly before anything decodes it:
// grammar; valid UTF-8 in every string; no C0 control character (tab, line
// feed and carriage return only inside free text and free-form values) and
// no surrogate escape that does not pair up; no duplicate member at any
// level; nesting of at most maxDepth objects and arrays; numbers of at most
// MaxJSONNumberChars characters, an exponent within +-MaxJSONExponent and a
// finite float64 value. shape, when not nil, is the Go type the document
// binds to (ShapeOf): a member matching one of its names only when case is
// ignored is refused, since encoding/json would bind it. field prefixes the
// path of the member an error names. Errors are 400, numbers out of range 422.
func ScanJSON(doc []byte, field string, shape *Shape, maxDepth int) error {
	return scanJSON(doc, field, shape, 0, maxDepth)
}

// scanJSON is ScanJSON for a document that sits depth levels down in another
// (a metadata value inside its metadata object).
func scanJSON(doc []byte, field string, shape *Shape, depth, maxDepth int) error {
	s := jsonScanner{doc: doc, depth: depth, maxDepth: maxDepth}
	s.path = s.pathBuf[:0]
	if field != "" {
		s.path = append(s.path, pathElem{key: []byte(field), index: -1})
	}
	s.skipSpace()
	if err := s.value(shape, shape == nil); err != nil {
		return err
	}
	s.skipSpace()
	if s.pos != len(s.doc) {
		return s.syntax("unexpected data after the top-level value")
	}
	return nil
}

// jsonScanner walks one document; path holds the member names and array
// indexes leading to the value being read, rendered only for an error.
type jsonScanner struct {
	doc      []byte
	pos      int
	depth    int
	maxDepth int
	path     []pathElem
	pathBuf  [8]pathElem
}

// pathElem is a member name, or an array index when index >= 0.
type pathElem struct {
	key   []byte
	index int
}

// fieldName renders the path as the API names fields: a.b[2].c.
func (s *jsonScanner) fieldName() string {
	var b strings.Builder
	for i, p := range s.path {
		if p.index >= 0 {
			b.WriteString("[" + strconv.Itoa(p.index) + "]")
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.Write(p.key)
	}
	return b.String()
}

// syntax is a grammar error: it names no field, since the document's
// structure past this point is unknown.
func (s *jsonScanner) syntax(what string) error {
	return BadRequest("", "the JSON is not valid at byte "+strconv.Itoa(s.pos)+": "+what)
}

func (s *jsonScanner) refuse(detail string) error {
	f := s.fieldName()
	if f == "" {
		return BadRequest("", "the JSON "+detail)
	}
	return BadRequest(f, f+" "+detail)
}

func (s *jsonScanner) skipSpace() {
	for s.pos < len(s.doc) {
		switch s.doc[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// value reads one JSON value bound to shape; multiline says whether its
// strings may hold tab, line feed and carriage return.
func (s *jsonScanner) value(shape *Shape, multiline bool) error {
	if s.pos >= len(s.doc) {
		return s.syntax("unexpected end of the document")
	}
	switch c := s.doc[s.pos]; {
	case c == '{':
		return s.object(shape)
	case c == '[':
		return s.array(shape)
	case c == '"':
		_, err := s.str(false, multiline)
		return err
	case c == '-' || (c >= '0' && c <= '9'):
		return s.number()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return s.syntax("unexpected character")
}

func (s *jsonScanner) literal(word string) error {
	if string(s.doc[s.pos:min(len(s.doc), s.pos+len(word))]) != word {
		return s.syntax("unexpected character")
	}
	s.pos += len(word)
	return nil
}

func (s *jsonScanner) enter() error {
	s.depth++
	if s.depth > s.maxDepth {
		return s.refuse("is nested deeper than " + strconv.Itoa(s.maxDepth) + " levels of objects and arrays")
	}
	return nil
}

// open steps into an object or array (past its opening character) and
// reports whether it is empty, in which case it is already closed.
func (s *jsonScanner) open(closer byte) (empty bool, err error) {
	if err := s.enter(); err != nil {
		return false, err
	}
	s.pos++
	s.skipSpace()
	if s.pos < len(s.doc) && s.doc[s.pos] == closer {
		s.pos++
		s.depth--
		return true, nil
	}
	return false, nil
}

// next reads what follows a member or element: a ',' (more to come) or
// the closer (done, and the container is left).
func (s *jsonScanner) next(closer byte) (done bool, err error) {
	s.skipSpace()
	if s.pos >= len(s.doc) {
		return false, s.syntax("unexpected end of the document")
	}
	switch s.doc[s.pos] {
	case ',':
		s.pos++
		return false, nil
	case closer:
		s.pos++
		s.depth--
		return true, nil
	}
	return false, s.syntax("expected ',' or '" + string(closer) + "'")
}

func (s *jsonScanner) object(shape *Shape) error {
	if empty, err := s.open('}'); empty || err != nil {
		return err
	}
	var seen memberSet
	for {
		s.skipSpace()
		if s.pos >= len(s.doc) || s.doc[s.pos] != '"' {
			return s.syntax("expected a member name")
		}
		key, err := s.str(true, false)
		if err != nil {
			return err
		}
		s.path = append(s.path, pathElem{key: key, index: -1})
		if !seen.add(key) {
			return s.refuse("is given more than once")
		}
		child, multiline, err := shape.member(key)
		if err != nil {
			f := s.fieldName()
			return BadRequest(f, err.Error())
		}
		s.skipSpace()
		if s.pos >= len(s.doc) || s.doc[s.pos] != ':' {
			return s.syntax("expected ':' after a member name")
		}
		s.pos++
		s.skipSpace()
		if err := s.value(child, multiline); err != nil {
			return err
		}
		s.path = s.path[:len(s.path)-1]
		if done, err := s.next('}'); done || err != nil {
			return err
		}
	}
}

func (s *jsonScanner) array(shape *Shape) error {
	if empty, err := s.open(']'); empty || err != nil {
		return err
	}
	elem, multiline := shape.element()
	for i := 0; ; i++ {
		s.path = append(s.path, pathElem{index: i})
		s.skipSpace()
		if err := s.value(elem, multiline); err != nil {
			return err
		}
		s.path = s.path[:len(s.path)-1]
		if done, err := s.next(']'); done || err != nil {
			return err
		}
	}
}

// str reads a string at s.pos (the opening quote); it returns the decoded
// text only for member names (key), which need it: a slice of the document
// unless an escape made a copy necessary.
func (s *jsonScanner) str(key, multiline bool) ([]byte, error) {
	s.pos++ // "
	start := s.pos
	var b []byte // decoded key, built only once an escape appears
	escaped := false
	for s.pos < len(s.doc) {
		c := s.doc[s.pos]
		switch {
		case c == '"':
			var out []byte
			if key {
				if escaped {
					out = b
				} else {
					out = s.doc[start:s.pos]
				}
			}
			s.pos++
			return out, nil
		case c < 0x20:
			return nil, s.textError(key, "holds a raw control character")
		case c == '\\':
			if key && !escaped {
				b = append(b, s.doc[start:s.pos]...)
				escaped = true
			}
			r, err := s.escape(key, multiline)
			if err != nil {
				return nil, err
			}
			if key {
				b = utf8.AppendRune(b, r)
			}
		case c < utf8.RuneSelf:
			if escaped {
				b = append(b, c)
			}
			s.pos++
		default:
			r, size := utf8.DecodeRune(s.doc[s.pos:])
			if r == utf8.RuneError && size <= 1 {
				return nil, s.textError(key, "is not valid UTF-8")
			}
			if escaped {
				b = append(b, s.doc[s.pos:s.pos+size]...)
			}
			s.pos += size
		}
	}
	return nil, s.syntax("unterminated string")
}

// escape reads one backslash escape and returns the rune it stands for.
func (s *jsonScanner) escape(key, multiline bool) (rune, error) {
	if s.pos+1 >= len(s.doc) {
		return 0, s.syntax("unterminated string")
	}
	c := s.doc[s.pos+1]
	s.pos += 2
	var r rune
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		r = '\b'
	case 'f':
		r = '\f'
	case 'n':
		r = '\n'
	case 'r':
		r = '\r'
	case 't':
		r = '\t'
	case 'u':
		v, ok := s.hex4()
		if !ok {
			return 0, s.syntax("bad \\u escape")
		}
		r = v
		switch {
		case r >= 0xDC00 && r <= 0xDFFF:
			return 0, s.textError(key, "holds an unpaired surrogate escape")
		case r >= 0xD800 && r <= 0xDBFF:
			if s.pos+1 >= len(s.doc) || s.doc[s.pos] != '\\' || s.doc[s.pos+1] != 'u' {
				return 0, s.textError(key, "holds an unpaired surrogate escape")
			}
			s.pos += 2
			lo, ok := s.hex4()
			if !ok {
				return 0, s.syntax("bad \\u escape")
			}
			if lo < 0xDC00 || lo > 0xDFFF {
				return 0, s.textError(key, "holds an unpaired surrogate escape")
			}
			return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), nil
		}
	default:
		return 0, s.syntax("bad escape")
	}
	if r < 0x20 && !(multiline && !key && (r == '\t' || r == '\n' || r == '\r')) {
		return 0, s.textError(key, "holds a control character")
	}
	return r, nil
}

func (s *jsonScanner) hex4() (rune, bool) {
	if s.pos+4 > len(s.doc) {
		return 0, false
	}
	var v rune
	for _, c := range s.doc[s.pos : s.pos+4] {
		v <<= 4
		switch {
		case c >= '0' && c <= '9':
			v |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			v |= rune(c-'a') + 10
		case c >= 'A' && c <= 'F':
			v |= rune(c-'A') + 10
		default:
			return 0, false
		}
	}
	s.pos += 4
	return v, true
}

// textError names the string's member; a bad member name is named by the
// object holding it, since its own text cannot be shown.
func (s *jsonScanner) textError(key bool, what string) error {
	if key {
		return s.refuse("has a member name that " + what)
	}
	return s.refuse(what)
}

// number reads one number, checking its grammar and its range.
func (s *jsonScanner) number() error {
	start := s.pos
	if s.doc[s.pos] == '-' {
		s.pos++
	}
	switch {
	case s.pos < len(s.doc) && s.doc[s.pos] == '0':
		s.pos++
	case s.pos < len(s.doc) && s.doc[s.pos] >= '1' && s.doc[s.pos] <= '9':
		s.digits()
	default:
		return s.syntax("bad number")
	}
	if s.pos < len(s.doc) && s.doc[s.pos] == '.' {
		s.pos++
		if s.digits() == 0 {
			return s.syntax("bad number")
		}
	}
	exp := 0
	if s.pos < len(s.doc) && (s.doc[s.pos] == 'e' || s.doc[s.pos] == 'E') {
		s.pos++
		neg := false
		if s.pos < len(s.doc) && (s.doc[s.pos] == '+' || s.doc[s.pos] == '-') {
			neg = s.doc[s.pos] == '-'
			s.pos++
		}
		from := s.pos
		if s.digits() == 0 {
			return s.syntax("bad number")
		}
		for _, d := range s.doc[from:s.pos] {
			if exp <= MaxJSONExponent {
				exp = exp*10 + int(d-'0')
			}
		}
		if neg {
			exp = -exp
		}
	}
	text := s.doc[start:s.pos]
	if len(text) > MaxJSONNumberChars || exp > MaxJSONExponent || exp < -MaxJSONExponent {
		return s.numberRange()
	}
	if _, err := strconv.ParseFloat(string(text), 64); err != nil {
		return s.numberRange()
	}
	return nil
}

func (s *jsonScanner) numberRange() error {
	f := s.fieldName()
	subject := "a number"
	if f != "" {
		subject = f
	}
	return Invalid(f, subject+" must be a number of at most 100 characters, with an exponent within +-300, that fits a 64-bit float")
}

func (s *jsonScanner) digits() int {
	n := 0
	for s.pos < len(s.doc) && s.doc[s.pos] >= '0' && s.doc[s.pos] <= '9' {
		s.pos++
		n++
	}
	return n
}

// memberSet finds duplicate member names: a short inline list for the
// usual small object, a map once it grows.
type memberSet struct {
	few  [12][]byte
	n    int
	many map[string]struct{}
}

func (m *memberSet) add(k []byte) bool {
	if m.many != nil {
		if _, dup := m.many[string(k)]; dup {
			return false
		}
		m.many[string(k)] = struct{}{}
		return true
	}
	for _, f := range m.few[:m.n] {
		if bytes.Equal(f, k) {
			return false
		}
	}
	if m.n < len(m.few) {
		m.few[m.n] = k
		m.n++
		return true
	}
	m.many = make(map[string]struct{}, 4*len(m.few))
	for _, f := range m.few {
		m.many[string(f)] = struct{}{}
	}
	m.many[string(k)] = struct{}{}
	return true
}
