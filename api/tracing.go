package api

import (
	"context"
	"encoding/hex"

	"github.com/creditd/creditd/engine"
	"github.com/google/uuid"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// startSpan opens the request's server span, the child of the incoming
// traceparent when there is one; the engine calls run under its context
// (reqContext), so the Redis and Postgres spans are its children. Only
// called with tracing on.
func (s *Server) startSpan(c *call) {
	parent := s.propagator.Extract(context.Background(), requestCarrier{&c.ctx.Request.Header})
	c.tctx, c.span = s.tracer.Start(parent, string(c.ctx.Method()), trace.WithSpanKind(trace.SpanKindServer))
}

// endSpan names the span after the route template, records the status and
// ends it; nothing when the request has no span.
func (c *call) endSpan(route string, status int) {
	if c.span == nil {
		return
	}
	method := string(c.ctx.Method())
	c.span.SetName(method + " " + route)
	c.span.SetAttributes(
		attribute.String("http.request.method", method),
		attribute.String("http.route", route),
		attribute.Int("http.response.status_code", status),
	)
	if c.scope.TenantID != uuid.Nil {
		c.span.SetAttributes(attribute.String("creditd.tenant_id", c.scope.TenantID.String()))
	}
	if status >= 500 {
		c.span.SetStatus(codes.Error, "")
	}
	c.span.End()
}

// traceID is the request span's trace id in hex, for the access log.
func (c *call) traceID() []byte {
	id := c.span.SpanContext().TraceID()
	return hex.AppendEncode(c.logIDs[76:76], id[:])
}

// requestCarrier reads propagation headers from a fasthttp request.
type requestCarrier struct{ h *fasthttp.RequestHeader }

// Get implements propagation.TextMapCarrier.
func (r requestCarrier) Get(key string) string { return string(r.h.Peek(key)) }

// Set implements propagation.TextMapCarrier; a server never injects into
// its request.
func (r requestCarrier) Set(string, string) {}

// Keys implements propagation.TextMapCarrier.
func (r requestCarrier) Keys() []string {
	keys := make([]string, 0, r.h.Len())
	for k := range r.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}

// bareUUID writes u's canonical text (unquoted) into dst's space.
func bareUUID(dst []byte, u uuid.UUID) []byte {
	b := engine.AppendJSONUUID(dst[:0], u)
	return b[1 : len(b)-1]
}
