// JSON shapes: the member names each Go request type binds, computed once per
// type by reflection, so the scanner (jsonscan.go) can refuse a member that
// differs from a known one only in case.

package engine

import (
	"reflect"
	"strconv"
	"strings"
	"sync"
)

// shapeKind says how a Go type reads JSON.
type shapeKind uint8

const (
	// shapeOpaque: free-form JSON (json.RawMessage, any, a type with its
	// own UnmarshalJSON); strings inside may be multi-line.
	shapeOpaque shapeKind = iota
	// shapeScalar: a string, number or boolean.
	shapeScalar
	// shapeStruct: an object whose members are the struct's json names.
	shapeStruct
	// shapeList: a slice, array or map, every element of one shape.
	shapeList
)

// Shape is the JSON form of a Go type as encoding/json binds it: the exact
// member names of each struct, so a member that only differs in case is
// refused instead of silently bound.
type Shape struct {
	kind    shapeKind
	members map[string]*Shape
	names   []string
	elem    *Shape
}

var (
	shapes          sync.Map // reflect.Type -> *Shape
	jsonUnmarshaler = reflect.TypeFor[interface{ UnmarshalJSON([]byte) error }]()
)

// ShapeOf is the shape of t (pointers followed), computed once per type; a
// nil t has no shape (anything goes).
func ShapeOf(t reflect.Type) *Shape {
	if t == nil {
		return nil
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v, ok := shapes.Load(t); ok {
		return v.(*Shape)
	}
	// Built whole before it is shared, so no reader sees it half filled.
	v, _ := shapes.LoadOrStore(t, buildShape(t, map[reflect.Type]*Shape{}))
	return v.(*Shape)
}

// buildShape builds the shape of t; building holds the shapes under
// construction, so a recursive type ends.
func buildShape(t reflect.Type, building map[reflect.Type]*Shape) *Shape {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if v, ok := shapes.Load(t); ok {
		return v.(*Shape)
	}
	if sh, ok := building[t]; ok {
		return sh
	}
	sh := &Shape{}
	building[t] = sh
	if reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		sh.kind = shapeOpaque
		return sh
	}
	switch t.Kind() {
	case reflect.Struct:
		sh.kind = shapeStruct
		sh.members = map[string]*Shape{}
		addMembers(sh, t, building)
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 { // []byte: base64 text
			sh.kind = shapeScalar
			return sh
		}
		sh.kind = shapeList
		sh.elem = buildShape(t.Elem(), building)
	case reflect.Map:
		sh.kind = shapeList
		sh.elem = buildShape(t.Elem(), building)
	case reflect.Interface:
		sh.kind = shapeOpaque
	default:
		sh.kind = shapeScalar
	}
	return sh
}

// addMembers lists the json names of t's fields, promoting those of
// untagged embedded structs as encoding/json does.
func addMembers(sh *Shape, t reflect.Type, building map[reflect.Type]*Shape) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			addMembers(sh, ft, building)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if _, dup := sh.members[name]; !dup {
			sh.names = append(sh.names, name)
		}
		sh.members[name] = buildShape(f.Type, building)
	}
}

// member is the shape of member key of an object of shape sh and whether its
// strings may be multi-line; an error when key matches a member only when
// case is ignored.
func (sh *Shape) member(key []byte) (*Shape, bool, error) {
	if sh == nil || sh.kind == shapeOpaque {
		return nil, true, nil
	}
	switch sh.kind {
	case shapeList:
		return sh.elem, sh.elem.multiline(key), nil
	case shapeStruct:
		if c, ok := sh.members[string(key)]; ok {
			return c, c.multiline(key), nil
		}
		for _, n := range sh.names {
			if strings.EqualFold(n, string(key)) {
				return nil, false, newCaseError(string(key), n)
			}
		}
	}
	// An unknown member is ignored, as it always was.
	return nil, true, nil
}

// caseError refuses a member that differs from a known one only in case.
type caseError string

func (e caseError) Error() string { return string(e) }

func newCaseError(key, name string) error {
	return caseError("member names are case-sensitive: " + strconv.Quote(key) + " is not " + strconv.Quote(name))
}

// element is the shape of an array element of sh.
func (sh *Shape) element() (*Shape, bool) {
	if sh == nil || sh.kind != shapeList {
		return nil, sh == nil || sh.kind == shapeOpaque
	}
	return sh.elem, sh.elem.multiline(nil)
}

// multiline says whether strings of a value of shape sh held by member key
// may hold tab, line feed and carriage return.
func (sh *Shape) multiline(key []byte) bool {
	if sh == nil || sh.kind == shapeOpaque {
		return true
	}
	return freeTextMembers[string(key)]
}
