package api

import (
	"encoding/json"
	"net/http"
	"sort"

	"github.com/creditd/creditd/engine"
)

// Problem is the RFC 9457 body of every error response (docs/spec/addendum.md §3). Type is
// one of the engine.Kind values; Field names the offending input, also
// repeated in Errors so clients can read one shape for one or many fields.
type Problem struct {
	Type      string       `json:"type"`
	Title     string       `json:"title"`
	Status    int          `json:"status"`
	Detail    string       `json:"detail"`
	Field     string       `json:"field,omitempty"`
	Errors    []FieldError `json:"errors,omitempty"`
	RequestID string       `json:"request_id"`
}

// FieldError is one entry of a problem's errors list.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

// retryAfterOne is the Retry-After of a 503: a replica that missed a
// 50 ms WAIT has usually caught up a second later.
var retryAfterOne = []byte("1")

// internalDetail is all a 500 says; the cause goes to the log only.
const internalDetail = "an unexpected error occurred; quote the request_id when reporting it"

var (
	// errTooLarge is the 413: docs/spec/addendum.md §3 has no payload type, so bad-request.
	errTooLarge = &engine.Error{Kind: engine.KindBadRequest, Detail: "the request body is larger than the limit"}
	// errAdminUnauthorized: wrong or missing operator token.
	errAdminUnauthorized = &engine.Error{Kind: engine.KindUnauthorized, Detail: "missing or invalid admin bearer token"}
)

// statusOf maps an error kind to its HTTP status.
func statusOf(k engine.Kind) int {
	switch k {
	case engine.KindBadRequest:
		return http.StatusBadRequest
	case engine.KindUnauthorized:
		return http.StatusUnauthorized
	case engine.KindNotFound:
		return http.StatusNotFound
	case engine.KindConflict, engine.KindInsufficientCredits, engine.KindReservationExpired, engine.KindBudgetExceeded:
		return http.StatusConflict
	case engine.KindValidation:
		return http.StatusUnprocessableEntity
	case engine.KindRateLimited:
		return http.StatusTooManyRequests
	case engine.KindUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// titleOf is the short human summary of a kind.
func titleOf(k engine.Kind) string {
	switch k {
	case engine.KindBadRequest:
		return "Bad Request"
	case engine.KindUnauthorized:
		return "Unauthorized"
	case engine.KindNotFound:
		return "Not Found"
	case engine.KindConflict:
		return "Conflict"
	case engine.KindInsufficientCredits:
		return "Insufficient Credits"
	case engine.KindReservationExpired:
		return "Reservation Expired"
	case engine.KindBudgetExceeded:
		return "Budget Exceeded"
	case engine.KindValidation:
		return "Validation Error"
	case engine.KindRateLimited:
		return "Rate Limited"
	case engine.KindUnavailable:
		return "Service Unavailable"
	}
	return "Internal Server Error"
}

// fail writes err as a problem. Engine errors keep their kind, field and
// detail; a store that could not answer (Config.Unavailable) is a 503;
// anything else is logged and answered with a generic 500.
func (c *call) fail(err error) {
	e, ok := engine.AsError(err)
	if !ok && c.s.unavailable != nil && c.s.unavailable(err) {
		c.s.log.Warn().Bytes("request_id", c.reqID).Err(err).Msg("store unavailable")
		e, ok = engine.ErrRecordUnavailable, true
	}
	if !ok || statusOf(e.Kind) == http.StatusInternalServerError {
		detail := internalDetail
		if ok && e.Documented {
			detail = e.Detail
		} else {
			c.s.log.Error().Bytes("request_id", c.reqID).Err(err).Msg("internal error")
		}
		c.writeProblem(http.StatusInternalServerError, engine.KindInternal, titleOf(engine.KindInternal), "", detail, nil)
		return
	}
	status, title := statusOf(e.Kind), titleOf(e.Kind)
	if e == errTooLarge {
		status, title = http.StatusRequestEntityTooLarge, "Payload Too Large"
	}
	if status == http.StatusServiceUnavailable {
		// Retryable: the idempotency claim is dropped for a 5xx, so the
		// retry runs and replays what already applied.
		c.ctx.Response.Header.SetBytesKV(headerRetryAfter, retryAfterOne)
	}
	c.writeProblem(status, e.Kind, title, e.Field, e.Detail, e.Extra)
}

// failStatus writes a problem with an explicit status (405).
func (c *call) failStatus(status int, kind engine.Kind, title, field, detail string) {
	c.writeProblem(status, kind, title, field, detail, nil)
}

func (c *call) writeProblem(status int, kind engine.Kind, title, field, detail string, extra map[string]any) {
	p := Problem{Type: string(kind), Title: title, Status: status, Detail: detail, Field: field, RequestID: string(c.reqID)}
	if field != "" {
		p.Errors = []FieldError{{Field: field, Message: detail}}
	}
	body, err := json.Marshal(p)
	if err != nil { // a struct of strings always marshals
		body = []byte(`{"type":"internal","title":"Internal Server Error","status":500}`)
	}
	body = appendExtra(body, extra)
	ctx := c.ctx
	ctx.ResetBody()
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(contentProblem)
	ctx.SetBody(body)
}

// appendExtra splices kind-specific members (the gauge 409's current, cap,
// shortfall) into the problem object, in key order, never replacing a
// standard member.
func appendExtra(body []byte, extra map[string]any) []byte {
	if len(extra) == 0 {
		return body
	}
	keys := make([]string, 0, len(extra))
	for k := range extra {
		switch k {
		case "type", "title", "status", "detail", "field", "errors", "request_id":
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	body = body[:len(body)-1]
	for _, k := range keys {
		v, err := json.Marshal(extra[k])
		if err != nil {
			continue
		}
		kb, _ := json.Marshal(k)
		body = append(body, ',')
		body = append(body, kb...)
		body = append(body, ':')
		body = append(body, v...)
	}
	return append(body, '}')
}
