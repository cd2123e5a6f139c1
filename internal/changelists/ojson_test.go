package changelists

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
)

// jnode is a JSON value that keeps its members' order, so api/openapi.json
// can be edited as a document and written back byte for byte as it was
// (a map would reorder it and turn every edit into a rewrite).
type jnode struct {
	kind byte // '{', '[' or 0 for a scalar
	keys []string
	vals []*jnode
	raw  string // a scalar's JSON text
}

func parseJSON(b []byte) (*jnode, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	n, err := readJSON(d)
	if err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("json: text after the value")
	}
	return n, nil
}

func mustJSON(s string) *jnode {
	n, err := parseJSON([]byte(s))
	if err != nil {
		panic(err)
	}
	return n
}

func readJSON(d *json.Decoder) (*jnode, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch v := tok.(type) {
	case json.Delim:
		n := &jnode{kind: byte(v)}
		for d.More() {
			if n.kind == '{' {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				n.keys = append(n.keys, k.(string))
			}
			c, err := readJSON(d)
			if err != nil {
				return nil, err
			}
			n.vals = append(n.vals, c)
		}
		if _, err := d.Token(); err != nil {
			return nil, err
		}
		return n, nil
	case string:
		return &jnode{raw: quote(v)}, nil
	case json.Number:
		return &jnode{raw: v.String()}, nil
	case bool:
		return &jnode{raw: strconv.FormatBool(v)}, nil
	case nil:
		return &jnode{raw: "null"}, nil
	}
	return nil, fmt.Errorf("json: unexpected token %v", tok)
}

// quote writes s as Python's json.dumps does (ensure_ascii): the form
// api/openapi.json is kept in.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"':
			b.WriteString(`\"`)
		case r == '\\':
			b.WriteString(`\\`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\b':
			b.WriteString(`\b`)
		case r == '\f':
			b.WriteString(`\f`)
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		case r < 0x80:
			b.WriteRune(r)
		case r > 0xffff:
			r1, r2 := utf16.EncodeRune(r)
			fmt.Fprintf(&b, `\u%04x\u%04x`, r1, r2)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// encode writes n indented by two spaces a level, as json.dumps(indent=2).
func (n *jnode) encode() []byte {
	var b bytes.Buffer
	n.write(&b, 0)
	b.WriteByte('\n')
	return b.Bytes()
}

func (n *jnode) write(b *bytes.Buffer, depth int) {
	if n.kind == 0 {
		b.WriteString(n.raw)
		return
	}
	open, end := "{", "}"
	if n.kind == '[' {
		open, end = "[", "]"
	}
	if len(n.vals) == 0 {
		b.WriteString(open + end)
		return
	}
	b.WriteString(open)
	for i, v := range n.vals {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('\n')
		b.WriteString(strings.Repeat("  ", depth+1))
		if n.kind == '{' {
			b.WriteString(quote(n.keys[i]))
			b.WriteString(": ")
		}
		v.write(b, depth+1)
	}
	b.WriteByte('\n')
	b.WriteString(strings.Repeat("  ", depth))
	b.WriteString(end)
}

// at is the member at path (object keys, or array indexes in decimal); nil
// when there is none.
func (n *jnode) at(path ...string) *jnode {
	cur := n
	for _, p := range path {
		if cur == nil {
			return nil
		}
		switch cur.kind {
		case '{':
			next := (*jnode)(nil)
			for i, k := range cur.keys {
				if k == p {
					next = cur.vals[i]
				}
			}
			cur = next
		case '[':
			i, err := strconv.Atoi(p)
			if err != nil || i < 0 || i >= len(cur.vals) {
				return nil
			}
			cur = cur.vals[i]
		default:
			return nil
		}
	}
	return cur
}

// set puts member key into object n: in place when it exists, else after
// member after ("" or absent: at the end).
func (n *jnode) set(key string, v *jnode, after string) {
	for i, k := range n.keys {
		if k == key {
			n.vals[i] = v
			return
		}
	}
	at := len(n.keys)
	for i, k := range n.keys {
		if k == after {
			at = i + 1
		}
	}
	n.keys = append(n.keys[:at], append([]string{key}, n.keys[at:]...)...)
	n.vals = append(n.vals[:at], append([]*jnode{v}, n.vals[at:]...)...)
}

// insertAfter puts v into array n after the element whose JSON text is
// after (absent: at the end).
func (n *jnode) insertAfter(after string, v *jnode) {
	at := len(n.vals)
	for i, e := range n.vals {
		if e.kind == 0 && e.raw == after {
			at = i + 1
		}
	}
	n.vals = append(n.vals[:at], append([]*jnode{v}, n.vals[at:]...)...)
}
