package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"time"
)

// The hostile-input generator: valid request bodies as JSON trees whose
// leaves are raw JSON text, so a mutation can put anything on the wire
// (raw invalid UTF-8, raw NUL, numbers no float64 reservations, duplicate keys)
// that encoding/json would refuse to produce.

// jnode is one JSON value: an object (keys are raw JSON text, quotes
// included, so a key can be hostile too), an array or a raw leaf.
type jnode struct {
	kind  byte // 'o' object, 'a' array, 'v' raw leaf
	keys  []string
	vals  []*jnode
	items []*jnode
	raw   string
}

// jobj builds an object from name, value pairs; values are *jnode or Go
// values (encoded with encoding/json).
func jobj(kv ...any) *jnode {
	n := &jnode{kind: 'o'}
	for i := 0; i+1 < len(kv); i += 2 {
		n.keys = append(n.keys, quoteJSON(kv[i].(string)))
		n.vals = append(n.vals, jv(kv[i+1]))
	}
	return n
}

// jarr builds an array.
func jarr(items ...any) *jnode {
	n := &jnode{kind: 'a'}
	for _, it := range items {
		n.items = append(n.items, jv(it))
	}
	return n
}

// rawv is a leaf sent exactly as written.
func rawv(s string) *jnode { return &jnode{kind: 'v', raw: s} }

// jv turns a Go value into a tree (maps with sorted keys).
func jv(v any) *jnode {
	switch x := v.(type) {
	case *jnode:
		return x
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		n := &jnode{kind: 'o'}
		for _, k := range keys {
			n.keys = append(n.keys, quoteJSON(k))
			n.vals = append(n.vals, jv(x[k]))
		}
		return n
	case []any:
		return jarr(x...)
	default:
		b, err := json.Marshal(x)
		if err != nil {
			panic(err)
		}
		return &jnode{kind: 'v', raw: string(b)}
	}
}

func quoteJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// clone copies a tree deeply.
func (n *jnode) clone() *jnode {
	c := &jnode{kind: n.kind, raw: n.raw, keys: append([]string(nil), n.keys...)}
	for _, v := range n.vals {
		c.vals = append(c.vals, v.clone())
	}
	for _, v := range n.items {
		c.items = append(c.items, v.clone())
	}
	return c
}

// encode writes the tree as JSON text (raw leaves and keys as they are).
func (n *jnode) encode(b *bytes.Buffer) {
	switch n.kind {
	case 'o':
		b.WriteByte('{')
		for i := range n.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(n.keys[i])
			b.WriteByte(':')
			n.vals[i].encode(b)
		}
		b.WriteByte('}')
	case 'a':
		b.WriteByte('[')
		for i, it := range n.items {
			if i > 0 {
				b.WriteByte(',')
			}
			it.encode(b)
		}
		b.WriteByte(']')
	default:
		b.WriteString(n.raw)
	}
}

func (n *jnode) bytes() []byte {
	var b bytes.Buffer
	n.encode(&b)
	return b.Bytes()
}

// get finds the member name (unquoted) of an object, or nil.
func (n *jnode) get(name string) *jnode {
	q := quoteJSON(name)
	for i, k := range n.keys {
		if k == q {
			return n.vals[i]
		}
	}
	return nil
}

// slot is one place in a tree a mutation may change: the member key of
// an object.
type slot struct {
	parent *jnode
	index  int
	path   string
	inMeta bool // inside free-form metadata (any JSON number is fine there)
}

func (s slot) name() string {
	var k string
	_ = json.Unmarshal([]byte(s.parent.keys[s.index]), &k)
	return k
}

func (s slot) val() *jnode { return s.parent.vals[s.index] }

// slotKind classifies a member by its valid value and its name.
func (s slot) kind() string {
	v, name := s.val(), s.name()
	switch {
	case v.kind == 'o' && (strings.Contains(name, "metadata") || name == "config"):
		return "meta"
	case v.kind == 'o' || v.kind == 'a':
		return "struct"
	case strings.HasPrefix(v.raw, `"`):
		var str string
		_ = json.Unmarshal([]byte(v.raw), &str)
		if _, err := time.Parse(time.RFC3339Nano, str); err == nil {
			return "time"
		}
		return "str"
	case v.raw == "true" || v.raw == "false":
		return "bool"
	case v.raw == "null":
		return "null"
	default:
		return "int"
	}
}

// slots lists every object member of the tree, depth first.
func (n *jnode) slots(path string, inMeta bool) []slot {
	var out []slot
	switch n.kind {
	case 'o':
		for i := range n.keys {
			s := slot{parent: n, index: i, inMeta: inMeta}
			s.path = strings.TrimPrefix(path+"."+s.name(), ".")
			out = append(out, s)
			out = append(out, n.vals[i].slots(s.path, inMeta || s.kind() == "meta")...)
		}
	case 'a':
		for i, it := range n.items {
			out = append(out, it.slots(fmt.Sprintf("%s[%d]", path, i), inMeta)...)
		}
	}
	return out
}

// hostileValue is one hostile JSON fragment; reject means the issue
// requires a 4xx for it wherever it appears.
type hostileValue struct {
	label  string
	raw    string
	reject bool
}

var (
	// hostileStrings replace a string member.
	hostileStrings = []hostileValue{
		{"esc-NUL", `"a\u0000b"`, true},
		{"esc-NUL-only", `"\u0000"`, true},
		{"esc-C0-01", `"x\u0001"`, true},
		{"esc-C0-1f", `"\u001fy"`, true},
		{"raw-NUL", "\"a\x00b\"", true},
		{"raw-C0-01", "\"a\x01b\"", true},
		{"raw-xff", "\"a\xffb\"", true},
		{"raw-truncated-utf8", "\"ab\xe2\x82\"", true},
		{"raw-overlong-utf8", "\"\xc0\xaf\"", true},
		{"raw-surrogate-utf8", "\"\xed\xa0\x80\"", true},
		{"lone-surrogate-esc", `"\ud800"`, false},
		{"lone-low-surrogate-esc", `"x\udc00"`, false},
		{"tab-newline", `"a\tb\nc"`, false},
		{"unicode-ok", `"ünï€😀"`, false},
		{"oversize-3KiB", `"` + strings.Repeat("k", 3000) + `"`, false},
		{"oversize-1MiB", `"` + strings.Repeat("m", 1<<20) + `"`, false},
		{"not-a-string", `12`, false},
	}
	// hostileNumbers replace an integer member.
	hostileNumbers = []hostileValue{
		{"1e999999", `1e999999`, true},
		{"-1e999999", `-1e999999`, true},
		{"1e-999999", `1e-999999`, true},
		{"2^63", `9223372036854775808`, true},
		{"-2^63-1", `-9223372036854775809`, true},
		{"0.5", `0.5`, true},
		{"-0.5", `-0.5`, true},
		{"string-1", `"1"`, true},
		{"1e400", `1e400`, true},
		{"huge-digits", strings.Repeat("9", 400), true},
	}
	// hostileTimes replace a date-time member.
	hostileTimes = []hostileValue{
		{"year0-offset", `"0000-01-01T00:00:00+23:59"`, true},
		{"year1-to-year0", `"0001-01-01T00:00:00+23:59"`, true},
		{"year10000", `"10000-01-01T00:00:00Z"`, true},
		{"year9999-to-10000", `"9999-12-31T23:59:59-23:59"`, true},
		{"time-NUL", `"2030-01-01T00:00:00Z\u0000"`, true},
		{"time-raw-xff", "\"2030-01-01T00:00:00Z\xff\"", true},
	}
)

// deep is n nested arrays, the innermost holding 1.
func deep(n int) string {
	return strings.Repeat("[", n) + "1" + strings.Repeat("]", n)
}

// deepObj is n nested objects {"a":{"a":...}}.
func deepObj(n int) string {
	return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n)
}

func manyKeys(n int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%05d":"v"`, i)
	}
	b.WriteByte('}')
	return b.String()
}

// hostileMetadata replaces a metadata object (or stack_after.metadata_match,
// a static config) whole.
var hostileMetadata = []hostileValue{
	{"meta-val-NUL", `{"a":"\u0000"}`, true},
	{"meta-key-NUL", `{"\u0000":1}`, true},
	{"meta-key-C0", `{"a\u0002":1}`, true},
	{"meta-val-raw-xff", "{\"a\":\"\xff\"}", true},
	{"meta-key-raw-xff", "{\"\xfe\":1}", true},
	{"meta-nested-NUL", `{"a":{"b":["ok","\u0000"]}}`, true},
	{"meta-num-1e999999", `{"a":1e999999}`, true},
	{"meta-num--1e999999", `{"a":-1e999999}`, true},
	{"meta-num-1e-999999", `{"a":1e-999999}`, false},
	{"meta-num-400-digits", `{"a":` + strings.Repeat("9", 400) + `}`, false},
	{"meta-lone-surrogate", `{"a":"\ud800"}`, false},
	{"meta-deep-1000-arrays", `{"a":` + deep(1000) + `}`, true},
	{"meta-deep-1000-objects", deepObj(1000), true},
	{"meta-oversize-1MiB", `{"a":"` + strings.Repeat("x", 1<<20) + `"}`, true},
	{"meta-5000-keys", manyKeys(5000), true},
	{"meta-dup-key", `{"a":1,"a":2}`, true},
	{"meta-not-object", `["a"]`, true},
	{"meta-string", `"a"`, true},
}

// mutation is one hostile change applied to a valid request.
type mutation struct {
	label  string
	reject bool
	// caseKey and caseVal: a case-variant twin of member caseKey was added
	// with value caseVal; a 2xx must not have read it.
	caseKey string
	caseOld string
}

// mutate changes body (a clone) by one hostile mutation picked by rng; it
// returns the new wire bytes (nil body: wire is raw) and what was done.
func mutate(rng *rand.Rand, body *jnode) ([]byte, mutation) {
	b := body.clone()
	all := b.slots("", false)
	pick := func(kinds ...string) []slot {
		var out []slot
		for _, s := range all {
			k := s.kind()
			for _, want := range kinds {
				if k == want {
					out = append(out, s)
				}
			}
		}
		return out
	}
	classes := []string{"str", "int", "time", "meta", "dup", "case", "body", "meta-insert"}
	for tries := 0; tries < 20; tries++ {
		switch classes[rng.IntN(len(classes))] {
		case "str":
			ss := pick("str")
			if len(ss) == 0 {
				continue
			}
			s := ss[rng.IntN(len(ss))]
			h := hostileStrings[rng.IntN(len(hostileStrings))]
			s.parent.vals[s.index] = rawv(h.raw)
			return b.bytes(), mutation{label: s.path + "=" + h.label, reject: h.reject}
		case "int":
			ss := pick("int")
			if len(ss) == 0 {
				continue
			}
			s := ss[rng.IntN(len(ss))]
			h := hostileNumbers[rng.IntN(len(hostileNumbers))]
			s.parent.vals[s.index] = rawv(h.raw)
			// In metadata only numbers jsonb cannot hold must be refused.
			reject := h.reject && (!s.inMeta || strings.HasSuffix(h.label, "1e999999"))
			return b.bytes(), mutation{label: s.path + "=" + h.label, reject: reject}
		case "time":
			ss := pick("time")
			if len(ss) == 0 {
				continue
			}
			s := ss[rng.IntN(len(ss))]
			h := hostileTimes[rng.IntN(len(hostileTimes))]
			s.parent.vals[s.index] = rawv(h.raw)
			return b.bytes(), mutation{label: s.path + "=" + h.label, reject: h.reject}
		case "meta":
			ss := pick("meta")
			if len(ss) == 0 {
				continue
			}
			s := ss[rng.IntN(len(ss))]
			h := hostileMetadata[rng.IntN(len(hostileMetadata))]
			s.parent.vals[s.index] = rawv(h.raw)
			return b.bytes(), mutation{label: s.path + "=" + h.label, reject: h.reject}
		case "meta-insert":
			// A hostile value next to good ones inside a metadata object.
			ss := pick("meta")
			if len(ss) == 0 {
				continue
			}
			s := ss[rng.IntN(len(ss))]
			h := hostileStrings[rng.IntN(len(hostileStrings))]
			if h.label == "not-a-string" {
				continue
			}
			m := s.val()
			if m.kind != 'o' {
				continue
			}
			m.keys = append(m.keys, `"hx"`)
			m.vals = append(m.vals, rawv(h.raw))
			return b.bytes(), mutation{label: s.path + ".hx=" + h.label, reject: h.reject}
		case "dup":
			// {"units":1,"units":-100}: a duplicate key is a 400 (scope 1).
			ss := pick("int", "str", "meta")
			if len(ss) == 0 {
				continue
			}
			s := ss[rng.IntN(len(ss))]
			dupVal := map[string]string{"int": "-100", "str": `"dup"`, "meta": `{"dup":true}`}[s.kind()]
			s.parent.keys = append(s.parent.keys, s.parent.keys[s.index])
			s.parent.vals = append(s.parent.vals, rawv(dupVal))
			return b.bytes(), mutation{label: s.path + "=dup-key", reject: true}
		case "case":
			// {"units":1,"UNITS":2}: names are case-sensitive, so a 2xx
			// must have read the lower-case member.
			ss := pick("int", "str")
			if len(ss) == 0 {
				continue
			}
			s := ss[rng.IntN(len(ss))]
			if s.inMeta {
				continue // metadata keys are free-form: "PLAN" is another key
			}
			name := s.name()
			var twin string
			if s.kind() == "int" {
				var n int64
				if err := json.Unmarshal([]byte(s.val().raw), &n); err != nil {
					continue
				}
				twin = fmt.Sprint(n + 1)
			} else {
				twin = `"CASEVARIANT"`
			}
			s.parent.keys = append(s.parent.keys, quoteJSON(strings.ToUpper(name)))
			s.parent.vals = append(s.parent.vals, rawv(twin))
			return b.bytes(), mutation{label: s.path + "=case-variant-twin", caseKey: s.path, caseOld: s.val().raw}
		case "body":
			valid := b.bytes()
			bodies := []struct {
				label string
				wire  []byte
			}{
				{"body-trailing-garbage", append(append([]byte{}, valid...), "x"...)},
				{"body-two-objects", append(append([]byte{}, valid...), valid...)},
				{"body-bom", append([]byte("\xef\xbb\xbf"), valid...)},
				{"body-raw-NUL-after-brace", append([]byte("{\x00"), valid[1:]...)},
				{"body-truncated", valid[:len(valid)/2]},
				{"body-array", []byte("[" + string(valid) + "]")},
				{"body-null", []byte("null")},
				{"body-deep-extra-member", append([]byte(`{"zz_extra":`+deep(1000)+`,`), valid[1:]...)},
				{"body-raw-xff-key", append([]byte("{\"\xff\":1,"), valid[1:]...)},
			}
			pb := bodies[rng.IntN(len(bodies))]
			if pb.label == "body-raw-xff-key" && len(valid) < 3 {
				continue
			}
			return pb.wire, mutation{label: pb.label, reject: pb.label != "body-deep-extra-member"}
		}
	}
	return b.bytes(), mutation{label: "unchanged"}
}

// hostileSegments replace one path segment (customer id, metric key, id).
var hostileSegments = []hostileValue{
	{"path-%00", "%00", true},
	{"path-a%00b", "a%00b", true},
	{"path-%ff", "%ff", true},
	{"path-%c3%28", "%c3%28", true},
	{"path-%01", "x%01", true},
	{"path-%ed%a0%80", "%ed%a0%80", true},
	{"path-3000-chars", strings.Repeat("p", 3000), false},
}
