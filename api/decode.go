package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"reflect"
	"strconv"
	"strings"

	"github.com/creditd/creditd/engine"
)

// Pagination limits (docs/spec/interface.md Common rules 2).
const (
	defaultPageLimit = 20
	maxPageLimit     = 100
)

// decodeBody reads a JSON object into v, a pointer to a request payload:
// api's own (the route family's file holds it) or, for the routes not moved
// yet, one of the engine's <Op>Input structs. Empty, unparseable or non-object bodies are
// 400; so is any text engine.ScanJSON refuses (bad UTF-8, control
// characters, unpaired surrogates, a repeated member, nesting past
// engine.MaxJSONDepth, a member named like a known one but in another case),
// naming the member. A member of the wrong JSON type (or a number outside
// its Go type) is 422 naming the member; unknown members are ignored.
func decodeBody(body []byte, v any) error {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 {
		return engine.BadRequest("", "the request body is required: a JSON object")
	}
	if trimmed[0] != '{' {
		if !json.Valid(trimmed) {
			return engine.BadRequest("", "the request body is not valid JSON")
		}
		return engine.BadRequest("", "the request body must be a JSON object")
	}
	// The scan runs first: encoding/json would replace bad text with U+FFFD,
	// keep the last of two equal members and bind members case-insensitively.
	if err := engine.ScanJSON(trimmed, "", engine.ShapeOf(reflect.TypeOf(v)), engine.MaxJSONDepth); err != nil {
		return err
	}
	err := json.Unmarshal(trimmed, v)
	if err == nil {
		return nil
	}
	var syntax *json.SyntaxError
	if errors.As(err, &syntax) {
		return engine.BadRequest("", "the request body is not valid JSON: "+syntax.Error()+" at byte "+strconv.FormatInt(syntax.Offset, 10))
	}
	var typ *json.UnmarshalTypeError
	if errors.As(err, &typ) && typ.Field != "" {
		return engine.Invalid(typ.Field, typ.Field+" must be "+jsonTypeName(typ))
	}
	return engine.BadRequest("", "the request body could not be decoded")
}

// jsonTypeName says what JSON a Go field accepts, for a 422 message.
func jsonTypeName(e *json.UnmarshalTypeError) string {
	t := e.Type
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "of another JSON type"
	}
	switch t.Kind() {
	case reflect.Int64:
		return "an integer between -9223372036854775808 and 9223372036854775807"
	case reflect.Int, reflect.Int32, reflect.Int16, reflect.Int8, reflect.Uint, reflect.Uint64, reflect.Uint32:
		if strings.HasPrefix(e.Value, "number") {
			return "an integer in range"
		}
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 { // json.RawMessage: any JSON value
			return "valid JSON"
		}
		return "an array"
	case reflect.Float64, reflect.Float32:
		return "a number"
	}
	return "of another JSON type"
}

// queryLimit reads the page size: default 20, else an integer 1..100.
func (c *call) queryLimit() (int, error) {
	args := c.ctx.QueryArgs()
	if !args.Has("limit") {
		return defaultPageLimit, nil
	}
	n, err := strconv.Atoi(string(args.Peek("limit")))
	if err != nil || n < 1 || n > maxPageLimit {
		return 0, engine.BadRequest("limit", "limit must be an integer between 1 and 100")
	}
	return n, nil
}

// queryBool reads a boolean query parameter (true/false in any letter case,
// as Python's requests writes True and False; or 1/0), false when absent.
func (c *call) queryBool(name string) (bool, error) {
	args := c.ctx.QueryArgs()
	if !args.Has(name) {
		return false, nil
	}
	v := args.Peek(name)
	switch {
	case bytes.EqualFold(v, []byte("true")) || string(v) == "1":
		return true, nil
	case bytes.EqualFold(v, []byte("false")) || string(v) == "0":
		return false, nil
	}
	return false, engine.BadRequest(name, name+" must be true, false, 1 or 0")
}

// query is a query parameter's decoded text ("" when absent).
func (c *call) query(name string) string {
	return string(c.ctx.QueryArgs().Peek(name))
}

// unescapePath percent-decodes one path segment; ok is false for a bad escape.
func unescapePath(raw string) (string, bool) {
	if strings.IndexByte(raw, '%') < 0 {
		return raw, true
	}
	v, err := url.PathUnescape(raw)
	return v, err == nil
}

// pageBody is the list envelope of docs/spec/interface.md Common rules 2.
type pageBody[T any] struct {
	Data       []T            `json:"data"`
	Pagination pageNavigation `json:"pagination"`
}

// pageNavigation says whether another page follows and how to ask for it.
type pageNavigation struct {
	HasMore    bool    `json:"has_more"`
	NextCursor *string `json:"next_cursor"`
}

// pageOf wraps an engine page; data is [] never null, next_cursor null when none.
func pageOf[T any](p engine.Page[T]) pageBody[T] {
	out := pageBody[T]{Data: p.Data, Pagination: pageNavigation{HasMore: p.HasMore}}
	if out.Data == nil {
		out.Data = []T{}
	}
	if p.NextCursor != "" {
		cur := p.NextCursor
		out.Pagination.NextCursor = &cur
	}
	return out
}

// decodeConsume is decodeBody for a consume, the hot money route: the body
// is scanned the same way, and the common shape (string ids, an integer
// units, no or null metadata, no other member) is read directly; anything
// else goes through decodeBody, so errors and edge cases are its.
func decodeConsume(body []byte, in *consumePayload) error {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return decodeBody(body, in)
	}
	// A body flatConsume reads is one ScanJSON passes (printable ASCII
	// strings without escapes, an integer, each member once, nothing
	// else), so it skips the scan: a few µs of a consume (issue 26).
	if flatConsume(trimmed, in) {
		return nil
	}
	*in = consumePayload{}
	if err := engine.ScanJSON(trimmed, "", consumeShape, engine.MaxJSONDepth); err != nil {
		return err
	}
	return decodeBody(body, in)
}

var consumeShape = engine.ShapeOf(reflect.TypeOf(&consumePayload{}))

// flatConsume reads {"customer_id":"..","billable_metric_key":"..",
// "units":n,"metadata":null} in any order and spacing; false when the body
// has any other shape (an escape, a byte outside printable ASCII, a
// fraction, another member, a member twice...): what it reads,
// engine.ScanJSON passes (TestFlatConsumeScans).
func flatConsume(b []byte, in *consumePayload) bool {
	i := skipSpace(b, 1)
	if i < len(b) && b[i] == '}' {
		return allSpace(b[i+1:])
	}
	var seen [4]bool // customer_id, billable_metric_key, units, metadata
	for {
		name, j, ok := plainString(b, i)
		if !ok {
			return false
		}
		k := flatMember(name)
		if k < 0 || seen[k] {
			return false
		}
		seen[k] = true
		if i = skipSpace(b, j); i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		switch string(name) {
		case "customer_id", "billable_metric_key":
			v, j, ok := plainString(b, i)
			if !ok {
				return false
			}
			s := string(v)
			if name[0] == 'c' {
				in.CustomerID = &s
			} else {
				in.BillableMetricKey = &s
			}
			i = j
		case "units":
			n, j, ok := plainInt(b, i)
			if !ok {
				return false
			}
			in.Units, i = &n, j
		case "metadata":
			if !bytes.HasPrefix(b[i:], []byte("null")) {
				return false
			}
			i += 4
		default:
			return false
		}
		if i = skipSpace(b, i); i >= len(b) {
			return false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return allSpace(b[i+1:])
		default:
			return false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func allSpace(b []byte) bool { return skipSpace(b, 0) == len(b) }

// flatMember is the index of a member flatConsume reads, -1 for another.
func flatMember(name []byte) int {
	switch string(name) {
	case "customer_id":
		return 0
	case "billable_metric_key":
		return 1
	case "units":
		return 2
	case "metadata":
		return 3
	}
	return -1
}

// plainString reads a string at b[i] of printable ASCII without escapes
// (so valid UTF-8 without control bytes); j is just past its closing quote.
func plainString(b []byte, i int) (s []byte, j int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j = i + 1; j < len(b); j++ {
		switch ch := b[j]; {
		case ch == '"':
			return b[i+1 : j], j + 1, true
		case ch == '\\' || ch < ' ' || ch > '~':
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// plainInt reads an integer literal at b[i] that fits int64 (no fraction,
// exponent or leading zero).
func plainInt(b []byte, i int) (n int64, j int, ok bool) {
	j = i
	if j < len(b) && b[j] == '-' {
		j++
	}
	start := j
	for j < len(b) && b[j] >= '0' && b[j] <= '9' {
		j++
	}
	digits := j - start
	if digits == 0 || (digits > 1 && b[start] == '0') {
		return 0, 0, false
	}
	if j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E') {
		return 0, 0, false
	}
	n, err := strconv.ParseInt(string(b[i:j]), 10, 64)
	if err != nil {
		return 0, 0, false
	}
	return n, j, true
}
