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

// decodeFlat is decodeConsume for another route whose plain body flat
// reads (flatReserve, flatCommit, flatUsage): anything else goes through
// decodeBody.
func decodeFlat[T any](body []byte, in *T, flat func([]byte, *T) bool) error {
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '{' && flat(trimmed, in) {
		return nil
	}
	var zero T
	*in = zero
	return decodeBody(body, in)
}

// flatConsume reads {"customer_id":"..","billable_metric_key":"..",
// "units":n,"metadata":null} in any order and spacing; false when the body
// has any other shape (an escape, a byte outside printable ASCII, a
// fraction, another member, a member twice...): what it reads,
// engine.ScanJSON passes (TestFlatConsumeScans).
func flatConsume(b []byte, in *consumePayload) bool {
	return flatObject(b, func(name []byte, i int) (int, bool) {
		return flatCharge(b, name, i, &in.CustomerID, &in.BillableMetricKey, &in.Units)
	})
}

// flatCharge reads the members a consume and a usage event share:
// customer_id, billable_metric_key, units and a null metadata.
func flatCharge(b, name []byte, i int, customer, metric **string, units **int64) (int, bool) {
	switch string(name) {
	case "customer_id":
		return flatStr(b, i, customer)
	case "billable_metric_key":
		return flatStr(b, i, metric)
	case "units":
		return flatInt(b, i, units)
	case "metadata":
		return flatNull(b, i)
	}
	return 0, false
}

// flatReserve is flatConsume for POST /v1/reservations: the single-metric
// form's members (customer_id or external_customer_id, billable_metric_key,
// estimated_units, ttl_seconds, a null metadata, dry_run); items and
// anything else take decodeBody's path.
func flatReserve(b []byte, in *reservePayload) bool {
	return flatObject(b, func(name []byte, i int) (int, bool) {
		switch string(name) {
		case "customer_id":
			return flatStr(b, i, &in.CustomerID)
		case "external_customer_id":
			return flatStr(b, i, &in.ExternalCustomerID)
		case "billable_metric_key":
			return flatStr(b, i, &in.BillableMetricKey)
		case "estimated_units":
			return flatInt(b, i, &in.EstimatedUnits)
		case "ttl_seconds":
			return flatInt(b, i, &in.TTLSeconds)
		case "metadata":
			return flatNull(b, i)
		case "dry_run":
			return flatBool(b, i, &in.DryRun)
		}
		return 0, false
	})
}

// flatCommit is flatConsume for POST /v1/reservations/{id}/commit:
// actual_units, final and a null metadata; items and anything else take
// decodeBody's path.
func flatCommit(b []byte, in *commitPayload) bool {
	return flatObject(b, func(name []byte, i int) (int, bool) {
		switch string(name) {
		case "actual_units":
			return flatInt(b, i, &in.ActualUnits)
		case "final":
			return flatBool(b, i, &in.Final)
		case "metadata":
			return flatNull(b, i)
		}
		return 0, false
	})
}

// flatGauge is flatConsume for a gauge increment or decrement: amount,
// policy, lease_seconds and a null metadata; anything else takes
// decodeBody's path.
func flatGauge(b []byte, in *gaugePayload) bool {
	return flatObject(b, func(name []byte, i int) (int, bool) {
		switch string(name) {
		case "amount":
			return flatInt(b, i, &in.Amount)
		case "policy":
			return flatStr(b, i, &in.Policy)
		case "lease_seconds":
			return flatInt(b, i, &in.LeaseSeconds)
		case "metadata":
			j, ok := flatNull(b, i)
			if ok {
				in.Meta = json.RawMessage("null")
			}
			return j, ok
		}
		return 0, false
	})
}

// flatUsage is flatConsume for POST /v1/usage: {"events":[...]} whose
// events are flat objects of event_id, customer_id, billable_metric_key,
// units and a null metadata; anything else takes decodeBody's path.
func flatUsage(b []byte, in *usagePayload) bool {
	return flatObject(b, func(name []byte, i int) (int, bool) {
		if string(name) != "events" || i >= len(b) || b[i] != '[' {
			return 0, false
		}
		in.Events = []usageEventPayload{}
		if i = skipSpace(b, i+1); i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for len(in.Events) < engine.MaxUsageEvents {
			in.Events = append(in.Events, usageEventPayload{})
			e := &in.Events[len(in.Events)-1]
			j, ok := flatObjectAt(b, i, func(name []byte, i int) (int, bool) {
				if string(name) == "event_id" {
					return flatStr(b, i, &e.EventID)
				}
				return flatCharge(b, name, i, &e.CustomerID, &e.BillableMetricKey, &e.Units)
			})
			if !ok {
				return 0, false
			}
			if i = skipSpace(b, j); i >= len(b) {
				return 0, false
			}
			switch b[i] {
			case ',':
				i = skipSpace(b, i+1)
			case ']':
				return i + 1, true
			default:
				return 0, false
			}
		}
		return 0, false // more events than a batch takes: decodeBody's path says so
	})
}

// maxFlatMembers bounds the members a flat body may have; a body with more
// takes decodeBody's path.
const maxFlatMembers = 8

// flatObject reads the trimmed object body b ("{" first) member by member:
// member gets each name and the index of its value, reads the value
// (flatStr, flatInt, flatBool, flatNull) and answers the index past it, or
// false to give up (the body is not of the flat shape). A name twice, a
// member whose value member does not read, anything but spacing around the
// object, or more than maxFlatMembers members is false. What it reads is
// what engine.ScanJSON passes for a payload of those members as plain
// strings, integers, booleans and nulls (TestFlatConsumeScans,
// TestFlatBodiesScan).
func flatObject(b []byte, member func(name []byte, i int) (int, bool)) bool {
	j, ok := flatObjectAt(b, 0, member)
	return ok && allSpace(b[j:])
}

// flatObjectAt is flatObject for the object at b[i] ("{"), one member's
// value of a larger body: j is just past its "}".
func flatObjectAt(b []byte, i int, member func(name []byte, i int) (int, bool)) (j int, ok bool) {
	if i >= len(b) || b[i] != '{' {
		return 0, false
	}
	if i = skipSpace(b, i+1); i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	var seen [maxFlatMembers][]byte
	for n := 0; ; n++ {
		name, j, ok := plainString(b, i)
		if !ok || n == maxFlatMembers {
			return 0, false
		}
		for _, prev := range seen[:n] {
			if bytes.Equal(prev, name) {
				return 0, false
			}
		}
		seen[n] = name
		if i = skipSpace(b, j); i >= len(b) || b[i] != ':' {
			return 0, false
		}
		if j, ok = member(name, skipSpace(b, i+1)); !ok {
			return 0, false
		}
		if i = skipSpace(b, j); i >= len(b) {
			return 0, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return i + 1, true
		default:
			return 0, false
		}
	}
}

// flatStr, flatInt, flatBool and flatNull read one member's value of a flat
// body at b[i] into dst (a plain string, an integer, true or false, null)
// and answer the index past it; false when the value is not of their kind.
func flatStr(b []byte, i int, dst **string) (int, bool) {
	v, j, ok := plainString(b, i)
	if !ok {
		return 0, false
	}
	s := string(v)
	*dst = &s
	return j, true
}

func flatInt(b []byte, i int, dst **int64) (int, bool) {
	n, j, ok := plainInt(b, i)
	if !ok {
		return 0, false
	}
	*dst = &n
	return j, true
}

func flatBool(b []byte, i int, dst **bool) (int, bool) {
	for _, lit := range [...]string{"true", "false"} {
		if bytes.HasPrefix(b[i:], []byte(lit)) {
			v := lit == "true"
			*dst = &v
			return i + len(lit), true
		}
	}
	return 0, false
}

func flatNull(b []byte, i int) (int, bool) {
	if !bytes.HasPrefix(b[i:], []byte("null")) {
		return 0, false
	}
	return i + 4, true
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

func allSpace(b []byte) bool { return skipSpace(b, 0) == len(b) }

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
