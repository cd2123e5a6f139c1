package main

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// object is a JSON object that keeps its members in document order, so the
// generated code follows the order openapi.json was written in.
type object struct {
	keys []string
	vals map[string]any
}

// get is the member named k (nil when absent).
func (o *object) get(k string) any {
	if o == nil {
		return nil
	}
	return o.vals[k]
}

// obj is the member named k when it is an object.
func (o *object) obj(k string) *object {
	v, _ := o.get(k).(*object)
	return v
}

// str is the member named k when it is a string.
func (o *object) str(k string) string {
	v, _ := o.get(k).(string)
	return v
}

// list is the member named k when it is an array.
func (o *object) list(k string) []any {
	v, _ := o.get(k).([]any)
	return v
}

// parse decodes a JSON document into *object, []any, string, json.Number,
// bool and nil values.
func parse(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := parseValue(d)
	if err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data after the JSON document")
	}
	return v, nil
}

func parseValue(d *json.Decoder) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := &object{vals: map[string]any{}}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := parseValue(d)
				if err != nil {
					return nil, err
				}
				if _, dup := o.vals[k]; !dup {
					o.keys = append(o.keys, k)
				}
				o.vals[k] = v
			}
			_, err := d.Token() // '}'
			return o, err
		case '[':
			var out []any
			for d.More() {
				v, err := parseValue(d)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
			_, err := d.Token() // ']'
			return out, err
		}
		return nil, fmt.Errorf("unexpected delimiter %v", t)
	default:
		return t, nil
	}
}
