package api

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestRequestSpan: with a tracer, each request is one server span named
// after its route template, in the trace of an incoming traceparent (child
// of the caller's span) or in a new trace without one; the engine calls
// run under the span's context.
func TestRequestSpan(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	h := setup(t, func(c *Config) { c.Tracer = tp.Tracer("test") })

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	if r := h.do("GET", "/v1/tenant", "", h.key("traceparent", "00-"+traceID+"-"+parentID+"-01")...); r.status != 200 {
		t.Fatalf("GET /v1/tenant: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/nowhere", ""); r.status != 404 {
		t.Fatalf("GET /nowhere: %d", r.status)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want 2", len(spans))
	}
	s := spans[0]
	if s.Name() != "GET /v1/tenant" || s.SpanKind() != trace.SpanKindServer ||
		s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != parentID || !s.Parent().IsRemote() {
		t.Errorf("span %q kind %v trace %s parent %s", s.Name(), s.SpanKind(), s.SpanContext().TraceID(), s.Parent().SpanID())
	}
	want := map[attribute.Key]string{"http.route": "/v1/tenant", "http.request.method": "GET", "creditd.tenant_id": h.tenant.String()}
	for _, kv := range s.Attributes() {
		if w, ok := want[kv.Key]; ok && kv.Value.Emit() == w {
			delete(want, kv.Key)
		}
	}
	if len(want) != 0 {
		t.Errorf("span lacks attributes %v (has %v)", want, s.Attributes())
	}
	u := spans[1]
	if u.Name() != "GET unmatched" || u.Parent().IsValid() || u.SpanContext().TraceID().String() == traceID {
		t.Errorf("unrouted span %q parent %v trace %s", u.Name(), u.Parent(), u.SpanContext().TraceID())
	}
}

// BenchmarkCheckHandlerTraced is BenchmarkCheckHandler with tracing on
// (every span sampled and ended, exported nowhere): the cost tracing adds when an
// operator turns it on. With it off the handler starts no span at all.
func BenchmarkCheckHandlerTraced(b *testing.B) {
	h := benchHarness(b)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sdktrace.NewSimpleSpanProcessor(tracetest.NewNoopExporter())), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	h.srv.tracer = tp.Tracer("bench")
	benchRequest(b, h, "GET", "/v1/entitlements/check?customer_id=c1&billable_metric_key=tok&units=3", "", false)
}
