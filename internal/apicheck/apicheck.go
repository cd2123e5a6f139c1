// Package apicheck checks creditd's HTTP responses against the OpenAPI
// document it serves (api/openapi.json): the e2e harness wraps its client
// with it, so every answer a test receives is also a conformance check.
package apicheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	"github.com/pb33f/libopenapi-validator/helpers"
	"github.com/pb33f/libopenapi-validator/schema_validation"
	"github.com/pb33f/libopenapi/datamodel/high/base"

	"github.com/creditd/creditd/api"
)

// Checker validates responses against the document's operations and
// remembers which operation and status pairs it saw.
type Checker struct {
	v   validator.Validator
	ops []operation
	// events are the request body schemas of the document's webhooks, by
	// event type; schemas validates a payload against one.
	events  map[string]*base.Schema
	schemas schema_validation.SchemaValidator

	// vmu serializes the validator: libopenapi renders schemas lazily and
	// not safely under concurrent validation (a data race seen by -race
	// when parallel e2e tests checked webhook payloads at once).
	vmu sync.Mutex

	mu      sync.Mutex
	seen    map[string]int
	samples map[string]*Sample
}

// Sample is the first request body and the first response body per status
// an operation had: the raw material of the document's examples.
type Sample struct {
	Request   json.RawMessage            `json:"request,omitempty"`
	Responses map[string]json.RawMessage `json:"responses"`
}

// operation is one documented method and path template.
type operation struct {
	id, method, path string
	re               *regexp.Regexp
}

var (
	loadOnce sync.Once
	shared   *Checker
	loadErr  error
)

// Shared is one Checker per process: building the validator compiles every
// schema of the document, too slow to repeat per test.
func Shared() (*Checker, error) {
	loadOnce.Do(func() { shared, loadErr = New(api.OpenAPI()) })
	return shared, loadErr
}

// New builds a Checker for the OpenAPI 3.1 document doc.
func New(doc []byte) (*Checker, error) {
	d, err := libopenapi.NewDocument(doc)
	if err != nil {
		return nil, fmt.Errorf("apicheck: parse document: %w", err)
	}
	model, buildErr := d.BuildV3Model()
	if buildErr != nil {
		return nil, fmt.Errorf("apicheck: build model: %w", buildErr)
	}
	events := map[string]*base.Schema{}
	for typ, item := range model.Model.Webhooks.FromOldest() {
		if item.Post == nil || item.Post.RequestBody == nil {
			continue
		}
		if mt, ok := item.Post.RequestBody.Content.Get("application/json"); ok && mt.Schema != nil {
			events[typ] = mt.Schema.Schema()
		}
	}
	v, errs := validator.NewValidator(d, formats()...)
	if len(errs) > 0 {
		return nil, fmt.Errorf("apicheck: build validator: %v", errs)
	}
	ops, err := operations(doc)
	if err != nil {
		return nil, err
	}
	return &Checker{v: v, ops: ops, events: events, schemas: schema_validation.NewSchemaValidator(formats()...),
		seen: map[string]int{}, samples: map[string]*Sample{}}, nil
}

// formats makes "uuid", "date-time" and the integer formats checks, not
// hints. "int64" is replaced: the validator decodes bodies into float64, in
// which math.MaxInt64 (a real balance in the overflow tests) rounds to 2^63
// and its own check then refuses it. Every whole float64 up to that rounded
// bound passes; a decoded float64 cannot tell the two apart.
func formats() []config.Option {
	return []config.Option{config.WithFormatAssertions(), config.WithCustomFormat("int64", func(v any) error {
		f, ok := v.(float64)
		if !ok {
			return nil // json.Number and int64 are not what the validator decodes
		}
		if f != math.Trunc(f) || f < math.MinInt64 || f > math.MaxInt64 {
			return fmt.Errorf("must be a whole number from %d to %d", int64(math.MinInt64), int64(math.MaxInt64))
		}
		return nil
	})}
}

// operations lists the document's operations with a matcher per path
// template; literal templates sort first so /v1/plans/{id} never shadows a
// more specific literal path.
func operations(doc []byte) ([]operation, error) {
	var d struct {
		Paths map[string]map[string]struct {
			OperationID string `json:"operationId"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, fmt.Errorf("apicheck: read paths: %w", err)
	}
	param := regexp.MustCompile(`\\\{[^/]+?\\\}`)
	var out []operation
	for path, item := range d.Paths {
		re := regexp.MustCompile("^" + param.ReplaceAllString(regexp.QuoteMeta(path), `[^/]+`) + "$")
		for method, op := range item {
			if op.OperationID == "" {
				continue // a path-level member such as parameters
			}
			out = append(out, operation{id: op.OperationID, method: strings.ToUpper(method), path: path, re: re})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		pi, pj := strings.Count(out[i].path, "{"), strings.Count(out[j].path, "{")
		if pi != pj {
			return pi < pj
		}
		return out[i].path+out[i].method < out[j].path+out[j].method
	})
	return out, nil
}

// Operation is the operationId of req, "" when the document has no such
// method and path (an unknown route has no contract to check).
func (c *Checker) Operation(req *http.Request) string {
	for _, op := range c.ops {
		if op.method == req.Method && op.re.MatchString(req.URL.EscapedPath()) {
			return op.id
		}
	}
	return ""
}

// Check validates one answer to req: its status is documented for the
// operation, its Content-Type is the documented one, its body conforms to
// the schema and its documented headers to theirs. A request outside the
// document is not checked.
func (c *Checker) Check(req *http.Request, status int, header http.Header, body []byte) error {
	id := c.Operation(req)
	if id == "" {
		return nil
	}
	res := &http.Response{StatusCode: status, Header: header, Body: io.NopCloser(bytes.NewReader(body)),
		Request: req, ContentLength: int64(len(body))}
	c.vmu.Lock()
	ok, errs := c.v.ValidateHttpResponse(req, res)
	c.vmu.Unlock()
	c.remember(req, id, status, body)
	if ok {
		return nil
	}
	m := &Mismatch{Method: req.Method, Path: req.URL.Path, Operation: id, Status: status, Body: body, UndocumentedStatus: true}
	for _, e := range errs {
		line := e.Message
		if e.Reason != "" {
			line += ": " + e.Reason
		}
		for _, se := range e.SchemaValidationErrors {
			line += fmt.Sprintf("\n      %s: %s", se.FieldPath, se.Reason)
		}
		m.Problems = append(m.Problems, line)
		if e.ValidationSubType != helpers.ResponseBodyResponseCode {
			m.UndocumentedStatus = false
		}
	}
	return m
}

// Mismatch is an answer that does not conform to the document.
type Mismatch struct {
	Method, Path, Operation string
	Status                  int
	// UndocumentedStatus: the only fault is a status the operation does not
	// list (the body was not checked, having no schema to meet).
	UndocumentedStatus bool
	// Problems are the validator's findings, one per line.
	Problems []string
	Body     []byte
}

// Error lists the findings and the start of the body.
func (m *Mismatch) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s (%s) answered %d, which does not conform to api/openapi.json:", m.Method, m.Path, m.Operation, m.Status)
	for _, p := range m.Problems {
		fmt.Fprintf(&b, "\n  - %s", p)
	}
	fmt.Fprintf(&b, "\n  body: %.600s", m.Body)
	return b.String()
}

// remember counts the answer and keeps the first sample of its kind.
func (c *Checker) remember(req *http.Request, id string, status int, body []byte) {
	code := strconv.Itoa(status)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen[id+" "+code]++
	sm := c.samples[id]
	if sm == nil {
		sm = &Sample{Responses: map[string]json.RawMessage{}}
		c.samples[id] = sm
	}
	if sm.Request == nil && req.GetBody != nil {
		if rd, err := req.GetBody(); err == nil {
			if raw, err := io.ReadAll(rd); err == nil && json.Valid(raw) {
				sm.Request = raw
			}
		}
	}
	if _, ok := sm.Responses[code]; !ok && json.Valid(body) {
		sm.Responses[code] = append(json.RawMessage(nil), body...)
	}
}

// Samples is the first sample of each operation, by operationId.
func (c *Checker) Samples() map[string]Sample {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]Sample, len(c.samples))
	for id, sm := range c.samples {
		out[id] = *sm
	}
	return out
}

// CheckEvent validates a delivered webhook body against the payload schema
// the document's webhooks section gives its event_type; an event type the
// document does not list is a mismatch too.
func (c *Checker) CheckEvent(payload []byte) error {
	var head struct {
		EventType string `json:"event_type"`
	}
	if err := json.Unmarshal(payload, &head); err != nil {
		return fmt.Errorf("webhook payload is not a JSON object: %v: %.300s", err, payload)
	}
	sch, ok := c.events[head.EventType]
	if !ok {
		return fmt.Errorf("webhook event_type %q is not under webhooks in api/openapi.json", head.EventType)
	}
	c.vmu.Lock()
	ok, errs := c.schemas.ValidateSchemaBytes(sch, payload)
	c.vmu.Unlock()
	if !ok {
		var b strings.Builder
		fmt.Fprintf(&b, "webhook %s payload does not conform to api/openapi.json:", head.EventType)
		for _, e := range errs {
			fmt.Fprintf(&b, "\n  - %s", e.Message)
			for _, se := range e.SchemaValidationErrors {
				fmt.Fprintf(&b, "\n      %s: %s", se.FieldPath, se.Reason)
			}
		}
		fmt.Fprintf(&b, "\n  payload: %.600s", payload)
		return fmt.Errorf("%s", b.String())
	}
	return nil
}

// Seen is how many checked answers each "operationId status" pair had.
func (c *Checker) Seen() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.seen))
	for k, n := range c.seen {
		out[k] = n
	}
	return out
}

// Transport wraps next so that every answer is checked; fail receives each
// mismatch. A body that cannot be read whole is handed on with its error
// and not checked (a crash test's server may die mid-answer).
func (c *Checker) Transport(next http.RoundTripper, fail func(error)) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return roundTripper{c: c, next: next, fail: fail}
}

type roundTripper struct {
	c    *Checker
	next http.RoundTripper
	fail func(error)
}

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := t.next.RoundTrip(req)
	if err != nil {
		return res, err
	}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		// A stream never ends by itself: its status and headers are
		// checked, its body handed on unread.
		if err := t.c.Check(req, res.StatusCode, res.Header, nil); err != nil {
			t.fail(err)
		}
		return res, nil
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		res.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
		return res, nil
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	if err := t.c.Check(req, res.StatusCode, res.Header, body); err != nil {
		t.fail(err)
	}
	return res, nil
}

// errReader hands on a read error after the bytes that did arrive.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
