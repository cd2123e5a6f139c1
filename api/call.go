package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"sync/atomic"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/creditd/creditd/engine"
)

// maxRequestIDChars bounds an incoming X-Request-Id we reuse.
const maxRequestIDChars = 128

var (
	headerRequestID = []byte("X-Request-Id")
	contentJSON     = []byte("application/json")
	contentProblem  = []byte("application/problem+json")
)

// call is the state of one request as it passes the middleware. Calls are
// pooled; nothing may keep one after serveHTTP returns.
type call struct {
	ctx    *fasthttp.RequestCtx
	s      *Server
	route  *route
	scope  engine.Scope
	tenant engine.Tenant
	idem   engine.Idempotency
	// door is what the request's first round trip did (door.go).
	door doorState
	// dry: the route takes dry runs and the body asks for one, so no
	// Idempotency-Key is claimed (dryRunAsked).
	dry   bool
	reqID []byte
	idBuf [maxRequestIDChars]byte
	// span and tctx are the request's server span and its context (nil
	// with tracing off); logIDs is scratch for the tenant, key and trace
	// ids of the access log line (two quoted UUIDs, 38 bytes each, and a
	// 32-digit trace id).
	span   trace.Span
	tctx   context.Context
	logIDs [108]byte
	// out is scratch for the appended bodies of the hot routes; it is kept
	// when the call returns to the pool.
	out []byte
}

// reset readies a pooled call for ctx (nil when returning it to the pool).
func (c *call) reset(ctx *fasthttp.RequestCtx, s *Server) {
	*c = call{ctx: ctx, s: s, out: c.out[:0]}
}

// reqContext is the context engine calls run under. It is not the
// RequestCtx: fasthttp's RequestCtx.Done races with Server.Shutdown when a
// context package goroutine watches it, and the Redis and Postgres clients
// bound every call with their own timeouts anyway.
// With tracing on it is the request span's context.
func (c *call) reqContext() context.Context {
	if c.tctx != nil {
		return c.tctx
	}
	return context.Background()
}

// requestID picks the request id: the client's X-Request-Id when it is
// 1-128 visible ASCII characters, else a fresh one.
func (c *call) requestID(ctx *fasthttp.RequestCtx) []byte {
	in := ctx.Request.Header.PeekBytes(headerRequestID)
	if saneRequestID(in) {
		c.reqID = append(c.idBuf[:0], in...)
	} else {
		c.reqID = newRequestID(c.idBuf[:0])
	}
	return c.reqID
}

func saneRequestID(b []byte) bool {
	if len(b) == 0 || len(b) > maxRequestIDChars {
		return false
	}
	for _, ch := range b {
		if ch <= ' ' || ch > '~' || ch == '"' || ch == '\\' {
			return false
		}
	}
	return true
}

// Request ids are a random per-process prefix and a counter: unique across
// processes with overwhelming odds, and free of a crypto/rand read per request.
var (
	requestIDPrefix = func() []byte {
		var b [8]byte
		_, _ = rand.Read(b[:])
		return []byte(hex.EncodeToString(b[:]))
	}()
	requestIDSeq atomic.Uint64
)

func newRequestID(dst []byte) []byte {
	dst = append(dst, requestIDPrefix...)
	dst = append(dst, '-')
	n := requestIDSeq.Add(1)
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, digits[(n>>uint(shift))&0xf])
	}
	return dst
}

// errPanic stands for a recovered panic; the problem says only "internal".
var errPanic = fmt.Errorf("api: handler panicked")

// invoke runs ep, turning a panic into errPanic so the middleware above
// (idempotency abort, access log) still runs. Every path and query
// parameter is checked first (the Idempotency-Key before its claim, in
// idempotent), so no handler sees text Postgres would refuse.
func (c *call) invoke(ep endpoint) (err error) {
	defer func() {
		if r := recover(); r != nil {
			c.logPanic(r)
			err = errPanic
		}
	}()
	if err := c.checkRequestText(); err != nil {
		return err
	}
	return ep(c)
}

// checkRequestText refuses (400, naming the parameter) a path parameter or
// query parameter that is not valid UTF-8 or holds a
// control character, once decoded. A path escape that does not decode is
// left to the handler, which answers 404 as before.
func (c *call) checkRequestText() error {
	var err error
	c.ctx.VisitUserValues(func(k []byte, v any) {
		raw, ok := v.(string)
		if !ok || err != nil {
			return
		}
		if val, ok := unescapePath(raw); ok {
			err = engine.CheckLine(string(k), val)
		}
	})
	if err != nil {
		return err
	}
	c.ctx.QueryArgs().VisitAll(func(k, v []byte) {
		if err != nil || (printableASCII(k) && printableASCII(v)) {
			return
		}
		name := string(k)
		if engine.CheckLine("query", name) != nil {
			err = engine.BadRequest("", "a query parameter name must be valid UTF-8 text without control characters")
			return
		}
		err = engine.CheckLine(name, string(v))
	})
	return err
}

// recovered answers a panic that escaped the middleware itself.
func (c *call) recovered(r any) {
	c.logPanic(r)
	c.fail(errPanic)
}

func (c *call) logPanic(r any) {
	c.s.log.Error().Bytes("request_id", c.reqID).Interface("panic", r).Bytes("stack", debug.Stack()).Msg("handler panicked")
}

// json writes v as the JSON body with status.
func (c *call) json(status int, v any) error {
	ctx := c.ctx
	ctx.ResetBody()
	if err := json.NewEncoder(ctx.Response.BodyWriter()).Encode(v); err != nil {
		ctx.ResetBody()
		return fmt.Errorf("api: encode response: %w", err)
	}
	ctx.SetStatusCode(status)
	ctx.Response.Header.SetContentTypeBytes(contentJSON)
	return nil
}

// noContent answers 204 without a body.
func (c *call) noContent() error {
	c.ctx.ResetBody()
	c.ctx.SetStatusCode(fasthttp.StatusNoContent)
	return nil
}

// pathParam is a path parameter, percent-decoded: the router matches the raw
// path so an external id may carry an escaped slash.
func (c *call) pathParam(name string) (string, bool) {
	raw, _ := c.ctx.UserValue(name).(string)
	return unescapePath(raw)
}

// printableASCII is the common case of a parameter: clean without a closer look.
func printableASCII(b []byte) bool {
	for _, ch := range b {
		if ch < ' ' || ch > '~' {
			return false
		}
	}
	return true
}
