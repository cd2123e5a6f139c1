package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
)

// node is a JSON value that keeps the order of object members: the
// reference follows the document's own order of paths, properties and
// examples, which a map would lose.
type node struct {
	keys   []string
	fields map[string]*node // object members; nil unless an object
	items  []*node          // array elements
	isArr  bool
	scalar any // string, json.Number, bool or nil
}

// parse reads one JSON document into a node tree.
func parse(doc []byte) (*node, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	n, err := parseValue(d)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("apidoc: trailing data after the document")
	}
	return n, nil
}

func parseValue(d *json.Decoder) (*node, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			n := &node{fields: map[string]*node{}}
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				v, err := parseValue(d)
				if err != nil {
					return nil, err
				}
				key := k.(string)
				n.keys = append(n.keys, key)
				n.fields[key] = v
			}
			_, err := d.Token() // '}'
			return n, err
		case '[':
			n := &node{isArr: true}
			for d.More() {
				v, err := parseValue(d)
				if err != nil {
					return nil, err
				}
				n.items = append(n.items, v)
			}
			_, err := d.Token() // ']'
			return n, err
		}
		return nil, fmt.Errorf("apidoc: unexpected %v", t)
	default:
		return &node{scalar: tok}, nil
	}
}

// get walks object members by key; nil when any is missing.
func (n *node) get(path ...string) *node {
	for _, k := range path {
		if n == nil || n.fields == nil {
			return nil
		}
		n = n.fields[k]
	}
	return n
}

// str is the string value of n, "" for anything else.
func (n *node) str() string {
	if n == nil {
		return ""
	}
	s, _ := n.scalar.(string)
	return s
}

// strs is the string elements of an array node.
func (n *node) strs() []string {
	if n == nil {
		return nil
	}
	var out []string
	for _, it := range n.items {
		out = append(out, it.text())
	}
	return out
}

// text renders a scalar as it reads in prose: strings bare, null as null.
func (n *node) text() string {
	if n == nil {
		return ""
	}
	switch v := n.scalar.(type) {
	case string:
		return v
	case nil:
		if n.fields != nil || n.isArr {
			return string(n.indent(""))
		}
		return "null"
	case bool:
		return strconv.FormatBool(v)
	default:
		return fmt.Sprint(v)
	}
}

// indent renders n as two-space indented JSON in document order.
func (n *node) indent(prefix string) []byte {
	var b bytes.Buffer
	n.write(&b, prefix)
	return b.Bytes()
}

func (n *node) write(b *bytes.Buffer, prefix string) {
	inner := prefix + "  "
	switch {
	case n.fields != nil:
		if len(n.keys) == 0 {
			b.WriteString("{}")
			return
		}
		b.WriteString("{\n")
		for i, k := range n.keys {
			kb, _ := json.Marshal(k)
			b.WriteString(inner)
			b.Write(kb)
			b.WriteString(": ")
			n.fields[k].write(b, inner)
			if i < len(n.keys)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(prefix + "}")
	case n.isArr:
		if len(n.items) == 0 {
			b.WriteString("[]")
			return
		}
		b.WriteString("[\n")
		for i, it := range n.items {
			b.WriteString(inner)
			it.write(b, inner)
			if i < len(n.items)-1 {
				b.WriteByte(',')
			}
			b.WriteByte('\n')
		}
		b.WriteString(prefix + "]")
	default:
		v, _ := json.Marshal(n.scalar)
		b.Write(v)
	}
}
