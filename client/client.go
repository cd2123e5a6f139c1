// Package client is the Go client of the creditd tenant API: one
// context-first method per operation of api/openapi.json, with the
// document's request and response types (types_gen.go, operations_gen.go,
// written by `go generate`).
//
// Every POST and PATCH (and override DELETE) carries an Idempotency-Key:
// the one WithIdempotencyKey gives, else a new UUID, and the same key on
// each of the call's own retries, so a retried write applies once. A call is
// sent at most DefaultMaxAttempts times (WithRetry changes it): again on
// 429 and 503 (after the Retry-After the server sent), on 409 "still in
// progress" (a twin request with the same key is running) and on a
// transport error of a request that is safe to repeat (a GET or one with an
// Idempotency-Key). Waits stop when the context is done. Errors the API
// answers are *Problem (RFC 9457). Lists that page have ...All iterators.
//
// The package imports nothing of the server: it is for integrators.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

//go:generate go run ./internal/gen -spec ../api/openapi.json -out .

// Version is this client's version, sent in the User-Agent.
const Version = "0.1.0"

// Defaults of the retry policy.
const (
	// DefaultMaxAttempts is how many times a call is sent at most, the first
	// one included.
	DefaultMaxAttempts = 4
	// DefaultBaseDelay is the first back-off wait when the server named no
	// Retry-After; each later wait doubles it (with jitter).
	DefaultBaseDelay = 200 * time.Millisecond
	// DefaultMaxDelay is the longest wait between two attempts: a
	// Retry-After longer than this ends the call with the problem instead.
	DefaultMaxDelay = 30 * time.Second
	// DefaultTimeout is the http.Client timeout of a client built without
	// WithHTTPClient, per attempt.
	DefaultTimeout = 30 * time.Second
)

// Limits on what the client reads from a response.
const (
	maxBodyBytes    = 64 << 20 // a success body
	maxProblemBytes = 1 << 20  // an error body
)

// Client calls one creditd with one API key. It is safe for concurrent use.
type Client struct {
	base        string
	apiKey      string
	http        *http.Client
	maxAttempts int
	baseDelay   time.Duration
	maxDelay    time.Duration
	newKey      func() string
	userAgent   string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sends requests through hc (its Timeout bounds each
// attempt) instead of a client with DefaultTimeout.
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.http = hc } }

// WithRetry sets the retry policy: maxAttempts sends in all (1 turns
// retries off), back-off from baseDelay doubling up to maxDelay, and no
// Retry-After longer than maxDelay is waited out. Zero values keep the
// defaults.
func WithRetry(maxAttempts int, baseDelay, maxDelay time.Duration) Option {
	return func(c *Client) {
		if maxAttempts > 0 {
			c.maxAttempts = maxAttempts
		}
		if baseDelay > 0 {
			c.baseDelay = baseDelay
		}
		if maxDelay > 0 {
			c.maxDelay = maxDelay
		}
	}
}

// WithIdempotencyKeys makes the keys of calls that give none with f
// instead of random UUIDs (a prefix for tracing, say). Each key must be
// unique per operation and at most 256 characters.
func WithIdempotencyKeys(f func() string) Option { return func(c *Client) { c.newKey = f } }

// WithUserAgent prefixes the User-Agent header with ua (an integration's
// name and version).
func WithUserAgent(ua string) Option {
	return func(c *Client) { c.userAgent = ua + " " + c.userAgent }
}

// New returns a client of the creditd at baseURL ("https://credits.example.com",
// with or without a trailing slash) calling with apiKey, sent as X-API-Key.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		base:        strings.TrimRight(baseURL, "/"),
		apiKey:      apiKey,
		http:        &http.Client{Timeout: DefaultTimeout},
		maxAttempts: DefaultMaxAttempts,
		baseDelay:   DefaultBaseDelay,
		maxDelay:    DefaultMaxDelay,
		newKey:      uuid.NewString,
		userAgent:   "creditd-go/" + Version,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// CallOption changes one call.
type CallOption func(*callOptions)

type callOptions struct {
	idempotencyKey string
	header         http.Header
	response       *Response
}

// WithIdempotencyKey sends key as the call's Idempotency-Key instead of a
// generated one: the way to make a retry of your own (after a crash, say)
// replay the first answer rather than apply twice.
func WithIdempotencyKey(key string) CallOption {
	return func(o *callOptions) { o.idempotencyKey = key }
}

// WithHeader adds a request header to the call.
func WithHeader(name, value string) CallOption {
	return func(o *callOptions) {
		if o.header == nil {
			o.header = http.Header{}
		}
		o.header.Add(name, value)
	}
}

// WithResponse fills *r with the call's last HTTP answer, also when the
// call fails.
func WithResponse(r *Response) CallOption { return func(o *callOptions) { o.response = r } }

// Response is what a call saw of its last HTTP answer (WithResponse).
type Response struct {
	// StatusCode is the last answer's status; 0 when none arrived.
	StatusCode int
	// Header is the last answer's headers (RateLimit-*, X-Request-Id).
	Header http.Header
	// Replayed is true when creditd answered from its idempotency record
	// (X-Idempotent-Replayed): the operation had already applied.
	Replayed bool
	// Attempts is how many times the call was sent.
	Attempts int
	// IdempotencyKey is the key the call sent ("" when it sends none): give
	// it to WithIdempotencyKey to retry the same operation later.
	IdempotencyKey string
}

// request is one operation call, built by the generated methods.
type request struct {
	method, path string
	// idempotent is set when the operation takes an Idempotency-Key.
	idempotent bool
	body       any
	out        any
	q          url.Values
	h          http.Header
}

// query adds a query parameter.
func (r *request) query(name string, v any) {
	if r.q == nil {
		r.q = url.Values{}
	}
	r.q.Add(name, formatParam(v))
}

// header sets a header parameter.
func (r *request) header(name string, v any) {
	if r.h == nil {
		r.h = http.Header{}
	}
	r.h.Set(name, formatParam(v))
}

// formatParam writes a parameter value as the API reads it.
func formatParam(v any) string {
	switch t := v.(type) {
	case string:
		return t
	case int:
		return strconv.Itoa(t)
	case int64:
		return strconv.FormatInt(t, 10)
	case bool:
		return strconv.FormatBool(t)
	case time.Time:
		return t.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprint(v)
}

// do sends r, retrying as the package documents, and decodes a 2xx body
// into r.out.
func (c *Client) do(ctx context.Context, r *request, opts []CallOption) error {
	var co callOptions
	for _, o := range opts {
		o(&co)
	}
	var payload []byte
	if r.body != nil {
		b, err := json.Marshal(r.body)
		if err != nil {
			return fmt.Errorf("creditd: encode the %s %s body: %w", r.method, r.path, err)
		}
		payload = b
	}
	key := ""
	if r.idempotent {
		key = co.idempotencyKey
		if key == "" {
			key = c.newKey()
		}
	}
	target := c.base + r.path
	if len(r.q) > 0 {
		target += "?" + r.q.Encode()
	}
	// A transport error leaves unknown whether the request applied: only a
	// request that cannot apply twice is sent again.
	repeatable := r.method == http.MethodGet || key != ""
	info := co.response
	if info == nil {
		info = &Response{}
	}
	*info = Response{IdempotencyKey: key}
	for attempt := 1; ; attempt++ {
		info.Attempts = attempt
		resp, err := c.send(ctx, r, target, payload, key, co.header)
		var last error
		var wait time.Duration
		retry := false
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("creditd: %s %s: %w", r.method, r.path, ctx.Err())
			}
			last = fmt.Errorf("creditd: %s %s: %w", r.method, r.path, err)
			retry, wait = repeatable, c.backoff(attempt)
		} else {
			info.StatusCode, info.Header = resp.StatusCode, resp.Header
			info.Replayed = resp.Header.Get("X-Idempotent-Replayed") == "true"
			if resp.StatusCode >= 200 && resp.StatusCode < 300 {
				return decodeBody(resp, r)
			}
			p := readProblem(resp)
			last = p
			retry, wait = c.retryable(p, attempt)
		}
		if !retry || attempt >= c.maxAttempts {
			return last
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return last // the context would end before the next attempt
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(ctx.Err(), last)
		case <-t.C:
		}
	}
}

// send is one attempt.
func (c *Client) send(ctx context.Context, r *request, target string, payload []byte, key string, extra http.Header) (*http.Response, error) {
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, target, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", c.apiKey)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for k, vs := range r.h {
		req.Header[k] = vs
	}
	for k, vs := range extra {
		req.Header[k] = vs
	}
	return c.http.Do(req)
}

// decodeBody reads a 2xx answer into r.out (nothing for a 204).
func decodeBody(resp *http.Response, r *request) error {
	defer resp.Body.Close()
	if r.out == nil || resp.StatusCode == http.StatusNoContent {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBodyBytes))
		return nil
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBodyBytes)).Decode(r.out); err != nil {
		return fmt.Errorf("creditd: decode the %s %s answer (%d): %w", r.method, r.path, resp.StatusCode, err)
	}
	return nil
}

// retryable tells whether an answered problem is worth another attempt
// and after how long.
func (c *Client) retryable(p *Problem, attempt int) (bool, time.Duration) {
	switch {
	case p.Status == http.StatusTooManyRequests || p.Status == http.StatusServiceUnavailable:
		if p.RetryAfter > 0 {
			// Honour the server: a wait longer than allowed ends the call.
			return p.RetryAfter <= c.maxDelay, p.RetryAfter
		}
		return true, c.backoff(attempt)
	case p.InProgress():
		return true, c.backoff(attempt)
	}
	return false, 0
}

// backoff is the wait before attempt+1 when the server named none:
// baseDelay doubled per attempt, capped at maxDelay, jittered to 50-100 %.
func (c *Client) backoff(attempt int) time.Duration {
	d := c.baseDelay << min(attempt-1, 20)
	if d <= 0 || d > c.maxDelay {
		d = c.maxDelay
	}
	return d/2 + rand.N(d/2+1)
}

// Ptr returns a pointer to v, for the optional members of inputs:
// client.UpdateCustomerInput{DisplayName: client.Ptr("Ada")}.
func Ptr[T any](v T) *T { return &v }
