package client

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Problem types creditd answers (the Problem schema's type enum).
const (
	ProblemBadRequest          = "bad-request"
	ProblemUnauthorized        = "unauthorized"
	ProblemNotFound            = "not-found"
	ProblemConflict            = "conflict"
	ProblemInsufficientCredits = "insufficient-credits"
	ProblemReservationExpired  = "reservation-expired"
	ProblemValidation          = "validation-error"
	ProblemRateLimited         = "rate-limited"
	ProblemInternal            = "internal"
	// ProblemUnavailable is the type of a 503 (a replica or store not
	// ready); the call was retried before it was returned.
	ProblemUnavailable = "unavailable"
)

// Problem is an error creditd answered: its RFC 9457 body (the Problem and
// GaugeCapProblem schemas) and the status. A body that is not a problem (a
// proxy's page, say) gives a Problem with an empty Type, the status and the
// start of the body as Detail.
type Problem struct {
	// Type is one of the Problem* constants.
	Type string `json:"type"`
	// Title is the short summary of Type.
	Title string `json:"title"`
	// Status is the HTTP status.
	Status int `json:"status"`
	// Detail says what went wrong with this request.
	Detail string `json:"detail"`
	// Field is the input member, query parameter or header at fault.
	Field string `json:"field,omitempty"`
	// Errors repeats Field and Detail as a list, one shape for one or many
	// fields.
	Errors []FieldError `json:"errors,omitempty"`
	// RequestID is also the X-Request-Id header: quote it when reporting.
	RequestID string `json:"request_id"`
	// Current is the gauge count of a 409 increment past the cap.
	Current *int64 `json:"current,omitempty"`
	// Cap is the gauge cap of a 409 increment past the cap.
	Cap *int64 `json:"cap,omitempty"`
	// Shortfall is how far past the cap the refused increment would go.
	Shortfall *int64 `json:"shortfall,omitempty"`
	// RetryAfter is the answer's Retry-After (0 when none).
	RetryAfter time.Duration `json:"-"`
}

// FieldError is one entry of a problem's errors list.
type FieldError struct {
	// Field is the input member, query parameter or header at fault.
	Field string `json:"field"`
	// Message says what is wrong with it.
	Message string `json:"message"`
}

// Error is "creditd: <status> <type>: <detail>".
func (p *Problem) Error() string {
	var b strings.Builder
	b.WriteString("creditd: ")
	b.WriteString(strconv.Itoa(p.Status))
	if p.Type != "" {
		b.WriteString(" " + p.Type)
	} else if p.Title != "" {
		b.WriteString(" " + p.Title)
	}
	if p.Field != "" {
		b.WriteString(" (" + p.Field + ")")
	}
	if p.Detail != "" {
		b.WriteString(": " + p.Detail)
	}
	return b.String()
}

// InProgress reports whether p is the 409 of a request whose
// Idempotency-Key a twin request still holds: the same call may be sent
// again with the same key. creditd says so only in the detail.
func (p *Problem) InProgress() bool {
	return p.Status == http.StatusConflict && p.Type == ProblemConflict && strings.Contains(p.Detail, "still in progress")
}

// AsProblem returns the *Problem in err's chain.
func AsProblem(err error) (*Problem, bool) {
	var p *Problem
	ok := errors.As(err, &p)
	return p, ok
}

// IsProblem reports whether err is a Problem of type typ (a Problem*
// constant).
func IsProblem(err error, typ string) bool {
	p, ok := AsProblem(err)
	return ok && p.Type == typ
}

// readProblem decodes a non-2xx answer and closes its body.
func readProblem(resp *http.Response) *Problem {
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxProblemBytes))
	p := &Problem{}
	if err := json.Unmarshal(raw, p); err != nil || p.Type == "" {
		detail := strings.TrimSpace(string(raw))
		if len(detail) > 200 {
			detail = detail[:200]
		}
		p = &Problem{Title: http.StatusText(resp.StatusCode), Detail: detail}
	}
	p.Status = resp.StatusCode // the status line wins over the body
	if p.RequestID == "" {
		p.RequestID = resp.Header.Get("X-Request-Id")
	}
	p.RetryAfter = retryAfter(resp.Header.Get("Retry-After"), time.Now())
	return p
}

// retryAfter reads a Retry-After of delay-seconds or an HTTP-date.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0
		}
		return time.Duration(min(s, 1<<30)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
