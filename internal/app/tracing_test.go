package app_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/creditd/creditd/internal/e2e"
	"github.com/creditd/creditd/internal/telemetry"
)

// otlpReceiver is a local OTLP/HTTP trace receiver: it decodes every
// export request and keeps its spans.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "unexpected export", http.StatusBadRequest)
		return
	}
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var export collectortrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &export); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range export.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			r.spans = append(r.spans, ss.GetSpans()...)
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (r *otlpReceiver) all() []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*tracepb.Span(nil), r.spans...)
}

func attr(s *tracepb.Span, key string) string {
	for _, kv := range s.GetAttributes() {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// TestTracingExportsRequestSpans: with OTEL_EXPORTER_OTLP_ENDPOINT set, a
// request carrying a traceparent produces a server span in that trace,
// child of the caller's span, with child spans for its Redis commands and
// Postgres queries, exported over OTLP/HTTP; the access log carries the
// trace id.
func TestTracingExportsRequestSpans(t *testing.T) {
	recv := &otlpReceiver{}
	collector := httptest.NewServer(recv)
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_TRACES_EXPORTER", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	tracing, err := telemetry.TracingFromEnv(context.Background(), telemetry.Build{Version: "v-test", Commit: "c0ffee"})
	if err != nil || tracing == nil {
		t.Fatalf("tracing from env: %v %v", tracing, err)
	}
	n := startNode(t, tracing, nil)
	client := &http.Client{Timeout: 30 * time.Second}
	tn := e2e.CreateTenant(t, client, n.URL, "tracing")

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	r := e2e.Call(t, client, n.URL, "POST", "/v1/customers", map[string]any{"external_id": "traced-1"},
		"X-API-Key", tn.Live, "Idempotency-Key", "traced-cust-1", "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if r.Status != 201 {
		t.Fatalf("create customer: %d %s", r.Status, r.Raw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tracing.Shutdown(ctx); err != nil {
		t.Fatalf("flush spans: %v", err)
	}

	var server *tracepb.Span
	var inTrace []*tracepb.Span
	for _, s := range recv.all() {
		if hex.EncodeToString(s.GetTraceId()) != traceID {
			continue
		}
		inTrace = append(inTrace, s)
		if s.GetKind() == tracepb.Span_SPAN_KIND_SERVER {
			server = s
		}
	}
	if server == nil {
		t.Fatalf("no server span in trace %s; spans: %d in trace, %d in all", traceID, len(inTrace), len(recv.all()))
	}
	if server.GetName() != "POST /v1/customers" || hex.EncodeToString(server.GetParentSpanId()) != parentID {
		t.Errorf("server span %q, parent %x; want POST /v1/customers under %s", server.GetName(), server.GetParentSpanId(), parentID)
	}
	if attr(server, "http.route") != "/v1/customers" || attr(server, "creditd.tenant_id") != tn.ID {
		t.Errorf("server span attributes: %v", server.GetAttributes())
	}
	var redisChild, pgChild bool
	for _, s := range inTrace {
		if !bytes.Equal(s.GetParentSpanId(), server.GetSpanId()) || s.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
			continue
		}
		switch {
		case attr(s, "db.system") == "redis" || attr(s, "db.system.name") == "redis":
			redisChild = true
		case attr(s, "db.system.name") == "postgresql" && strings.HasPrefix(s.GetName(), "postgres"):
			pgChild = true
		}
	}
	if !redisChild || !pgChild {
		for _, s := range inTrace {
			t.Logf("span %q kind %v parent %x attrs %v", s.GetName(), s.GetKind(), s.GetParentSpanId(), s.GetAttributes())
		}
		t.Fatalf("children of the server span: redis %v, postgres %v", redisChild, pgChild)
	}
	if !strings.Contains(n.log.String(), `"trace_id":"`+traceID+`"`) {
		t.Errorf("access log lacks trace_id %s", traceID)
	}
}
